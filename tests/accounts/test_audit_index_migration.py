"""accounts 0015 on a database that ran an earlier 0015, since removed
(0015_audit_event_tenant_action): its plain (tenant, action) index is dropped."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

OLD = "0015_audit_event_tenant_action"
NEW = "0015_audit_event_tenant_action_c"
BEFORE = ("accounts", "0014_audit_event_target_and_source")


def _indexes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'accounts_auditevent'")
        return {name for (name,) in cursor.fetchall()}


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_migrating_a_database_that_ran_the_old_0015_drops_its_tenant_action_index():
    """A database migrated while the earlier 0015 was on main (a developer's `make run`, a
    staging server) holds its plain (tenant, action) index `audit_tenant_action`, along which
    the planner counted the admin's one-action filter, reading every entry."""
    # Every app's leaf: going back to accounts 0014 also unapplies what depends on a later
    # accounts migration in other apps (deployments' operations naming an API token).
    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        # The database as 365163c left it: 0014, then the old 0015 applied.
        _migrate([BEFORE])
        with connection.cursor() as cursor:
            cursor.execute(
                'CREATE INDEX "audit_tenant_action"'
                ' ON "accounts_auditevent" ("tenant_id", "action")'
            )
            cursor.execute(
                "INSERT INTO django_migrations (app, name, applied) VALUES ('accounts', %s, now())",
                [OLD],
            )
        assert "audit_tenant_action" in _indexes()

        _migrate(leaf)  # today's `migrate`

        found = _indexes()
        assert "audit_tenant_action_c" in found
        assert "audit_tenant_action" not in found, sorted(found)
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP INDEX IF EXISTS "audit_tenant_action"')
            cursor.execute(
                "DELETE FROM django_migrations WHERE app = 'accounts' AND name = %s", [OLD]
            )
        _migrate(leaf)
