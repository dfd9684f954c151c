from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The index beat's minutely look for unsent invitation emails reads by, built without
    locking out the requests that write to the table meanwhile."""

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("accounts", "0005_invitation_emailed"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="invitation",
            index=models.Index(
                condition=models.Q(accepted_at=None, emailed_at=None, revoked_at=None),
                fields=["created_at"],
                name="invitation_unsent",
            ),
        ),
    ]
