from django.db import migrations
from django.utils import timezone


def older_open_invitations_revoke(apps, schema_editor):
    """Invitations still open (neither accepted nor withdrawn) to an address an organization
    invited more than once before the constraint: the newest stays open, the older ones are
    withdrawn, as inviting the address again does now."""
    Invitation = apps.get_model("accounts", "Invitation")
    open_ = Invitation.objects.filter(accepted_at=None, revoked_at=None).order_by(
        "-created_at", "-id"
    )
    kept: set[tuple[int, str]] = set()
    older: list[int] = []
    for pk, tenant_id, email in open_.values_list("id", "tenant_id", "email"):
        key = (tenant_id, email.lower())
        if key in kept:
            older.append(pk)
        else:
            kept.add(key)
    Invitation.objects.filter(pk__in=older).update(revoked_at=timezone.now())


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0006_invitation_unsent_index"),
    ]

    # The constraint comes in the next migration: PostgreSQL refuses an index on a table with
    # writes pending in the same transaction.
    operations = [
        migrations.RunPython(older_open_invitations_revoke, migrations.RunPython.noop),
    ]
