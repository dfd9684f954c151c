from django.db import migrations

NAME_MAX = 100


def names_apart(apps, schema_editor):
    """Instances that share a name in their organization before the constraint: the oldest
    keeps it, each other one is called after it with " (2)", " (3)", … (the first number no
    live instance of the organization holds)."""
    Instance = apps.get_model("deployments", "Instance")
    live = list(
        Instance.objects.exclude(state="deleted")
        .order_by("created_at", "id")
        .values_list("id", "tenant_id", "name")
    )
    taken: dict[int, set[str]] = {}  # every live name, so that a new one takes none of them
    for _, tenant_id, name in live:
        taken.setdefault(tenant_id, set()).add(name.lower())
    kept: set[tuple[int, str]] = set()
    for pk, tenant_id, name in live:
        if (tenant_id, name.lower()) not in kept:
            kept.add((tenant_id, name.lower()))
            continue
        number = 2
        while True:
            suffix = f" ({number})"
            new = name[: NAME_MAX - len(suffix)] + suffix
            if new.lower() not in taken[tenant_id]:
                break
            number += 1
        taken[tenant_id].add(new.lower())
        kept.add((tenant_id, new.lower()))
        Instance.objects.filter(pk=pk).update(name=new)


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0018_planversion_text_again"),
    ]

    # The constraint comes in the next migration: PostgreSQL refuses an index on a table with
    # writes pending in the same transaction.
    operations = [
        migrations.RunPython(names_apart, migrations.RunPython.noop),
    ]
