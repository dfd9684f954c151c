import django.db.models.functions.comparison
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # As in 0014: the index is built without locking the audit log's writes.
    atomic = False

    dependencies = [
        ("accounts", "0014_audit_event_target_and_source"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(
                models.F("tenant"),
                django.db.models.functions.comparison.Collate("action", "C"),
                name="audit_tenant_action_c",
            ),
        ),
    ]
