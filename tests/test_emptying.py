"""What a transactional test leaves is gone before the next one, as Django's flush leaves it
(`tests/emptying.py`): no row, even one another connection was writing meanwhile or one the
database refuses to delete; no dead row for the next test's scans to read."""

import threading
import uuid
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, connections, transaction

from accounts.models import AuditEvent, Tenant
from billing.models import Invoice, InvoiceLine, Plan
from tests import emptying

pytestmark = pytest.mark.django_db(transaction=True)


def _counts() -> dict[str, int]:
    names = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        counted = {}
        for name in names:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(name)}")  # noqa: S608
            counted[name] = cursor.fetchone()[0]
    return counted


def test_every_table_is_emptied_even_a_finalized_invoice_the_database_keeps(tenant, owner):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-10", currency="usd", total=Decimal("1.00"),
        number="2026-000001",
    )  # fmt: skip
    InvoiceLine.objects.create(
        invoice=invoice, instance_id="inst-abcdefgh", instance_name="orders", dimension="cpu",
        unit="core", quantity=Decimal("1"), unit_price=Decimal("1"), amount=Decimal("1.00"),
    )  # fmt: skip
    Invoice.objects.filter(pk=invoice.pk).update(status="open")
    with pytest.raises(Exception, match="finalized"), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).delete()

    emptying.tables_empty("default")

    left = {name: count for name, count in _counts().items() if count}
    assert left == {}


def test_a_large_table_is_emptied_too(tenant):
    AuditEvent.objects.bulk_create(
        AuditEvent(tenant=tenant, actor_kind="user", action="instance.stop", payload={"n": n})
        for n in range(6000)
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size('accounts_auditevent')")
        assert cursor.fetchone()[0] > emptying.LARGE_TABLE

    emptying.tables_empty("default")

    assert not AuditEvent.objects.exists() and not Tenant.objects.exists()


def test_a_row_another_connection_was_writing_meanwhile_is_emptied_with_the_rest(tenant):
    """The DELETE waits for a write in flight, as TRUNCATE does: a row committed after the
    DELETE read the table would otherwise be the next test's."""
    written, commit = threading.Event(), threading.Event()

    def write():
        try:
            with transaction.atomic():
                Tenant.objects.create(name="Elsewhere", slug=f"elsewhere-{uuid.uuid4().hex[:8]}")
                written.set()
                commit.wait(10)
        finally:
            connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    assert written.wait(10)
    # The writer commits once the emptying waits on its lock (or after 2 s, if it never does).
    threading.Timer(2.0, commit.set).start()
    waited = threading.Thread(target=_commit_once_waited_on, args=(commit,))
    waited.start()

    emptying.tables_empty("default")
    writer.join(10)
    waited.join(10)

    assert not Tenant.objects.exists()


def _commit_once_waited_on(commit: threading.Event) -> None:
    try:
        with connections["default"].cursor() as cursor:
            while not commit.is_set():
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                if cursor.fetchone()[0]:
                    commit.set()
                commit.wait(0.05)
    finally:
        connections.close_all()


def test_no_dead_row_is_left_for_the_next_tests_scans(tenant):
    AuditEvent.objects.bulk_create(
        AuditEvent(tenant=tenant, actor_kind="user", action="instance.stop") for _ in range(20)
    )

    emptying.tables_empty("default")

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size('accounts_auditevent')")
        (size,) = cursor.fetchone()
    assert size == 0  # vacuumed to no page at all: no dead row for a scan to read


def test_content_types_and_permissions_left_as_post_migrate_made_them_are_kept(tenant):
    made = list(Permission.objects.values_list("pk", "content_type_id", "codename", "name"))
    types = list(ContentType.objects.values_list("pk", "app_label", "model"))

    assert emptying.tables_empty("default", keep=emptying._fingerprint(connection))

    assert not Tenant.objects.exists()
    assert list(Permission.objects.values_list("pk", "content_type_id", "codename", "name")) == made
    assert list(ContentType.objects.values_list("pk", "app_label", "model")) == types


def test_content_types_and_permissions_a_test_changed_are_emptied_to_be_made_again(tenant):
    """As the flush's: `post_migrate` then makes them as they were."""
    made = emptying._fingerprint(connection)
    Permission.objects.filter(codename="view_tenant").update(name="Can look at an organization")

    assert not emptying.tables_empty("default", keep=made)

    assert not Permission.objects.exists() and not ContentType.objects.exists()
