from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    """The index the daily pruning of old request ids reads by, built without locking out the
    requests that write to the table meanwhile."""

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("accounts", "0003_request_keys"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="requestkey",
            index=models.Index(fields=["created_at"], name="requestkey_created"),
        ),
    ]
