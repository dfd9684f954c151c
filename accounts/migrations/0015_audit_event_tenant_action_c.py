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
        # An earlier 0015, since removed, made a plain (tenant, action) index, which the planner
        # chose to count the admin's one-action filter along: a database that ran it drops it.
        migrations.RunSQL(
            "DROP INDEX CONCURRENTLY IF EXISTS audit_tenant_action", migrations.RunSQL.noop
        ),
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(
                models.F("tenant"),
                django.db.models.functions.comparison.Collate("action", "C"),
                name="audit_tenant_action_c",
            ),
        ),
    ]
