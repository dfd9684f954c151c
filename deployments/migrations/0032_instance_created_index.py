from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # As in 0025: the index is built without locking the table's writes.
    atomic = False

    dependencies = [
        ("deployments", "0031_serverhour"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="instance",
            index=models.Index(fields=["created_at", "id"], name="instance_created"),
        ),
    ]
