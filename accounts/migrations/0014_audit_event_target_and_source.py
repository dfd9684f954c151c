from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models.fields.json import KeyTransform


class Migration(migrations.Migration):
    # The indexes are built without locking the audit log's writes (every action appends one).
    atomic = False

    dependencies = [
        ("accounts", "0013_outgoing_email_encrypted"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(fields=["target_type", "target_id"], name="audit_target"),
        ),
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(
                KeyTransform("source", "payload"),
                condition=models.Q(payload__has_key="source"),
                name="audit_source",
            ),
        ),
    ]
