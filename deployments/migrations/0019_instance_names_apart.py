from django.db import migrations
from django.db.models.functions import Lower

NAME_MAX = 100


def names_apart(apps, schema_editor):
    """Instances that share a name in their organization before the constraint: the oldest
    keeps it, each other one is called after it with " (2)", " (3)", … (the first number no
    live instance of the organization holds). Names are compared as the constraint compares
    them, lower-cased by PostgreSQL (whose `lower` and Python's differ on some letters)."""
    Instance = apps.get_model("deployments", "Instance")
    live = list(
        Instance.objects.exclude(state="deleted")
        .annotate(lowered=Lower("name"))
        .order_by("created_at", "id")
        .values_list("id", "tenant_id", "name", "lowered")
    )

    def lowered(text: str) -> str:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT lower(%s)", [text])
            return cursor.fetchone()[0]

    taken: dict[int, set[str]] = {}  # every live name, so that a new one takes none of them
    for _, tenant_id, _, low in live:
        taken.setdefault(tenant_id, set()).add(low)
    kept: set[tuple[int, str]] = set()
    for pk, tenant_id, name, low in live:
        if (tenant_id, low) not in kept:
            kept.add((tenant_id, low))
            continue
        number = 2
        while True:
            suffix = f" ({number})"
            new = name[: NAME_MAX - len(suffix)] + suffix
            if lowered(new) not in taken[tenant_id]:
                break
            number += 1
        taken[tenant_id].add(lowered(new))
        kept.add((tenant_id, lowered(new)))
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
