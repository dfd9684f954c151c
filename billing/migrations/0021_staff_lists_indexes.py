from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The indexes are built without locking the tables' writes (metering, the Stripe outbox).
    atomic = False

    dependencies = [
        ("billing", "0020_stripecustomer_name"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="meterevent",
            index=models.Index(fields=["-timestamp", "id"], name="meterevent_timestamp"),
        ),
        AddIndexConcurrently(
            model_name="usagerecord",
            index=models.Index(fields=["hour", "id"], name="usagerecord_hour"),
        ),
    ]
