from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # As in 0025: the index is built without locking the table's writes.
    atomic = False

    dependencies = [
        ("deployments", "0028_operation_created_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="snapshot",
            index=models.Index(fields=["created_at"], name="snapshot_created"),
        ),
    ]
