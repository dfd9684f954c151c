"""Staff's lists of the tables that grow with the fleet — the audit log, operations, usage
records, the Stripe outbox — read one page of their rows, and only the columns they show, however
many rows the table holds; the filters offer their values without reading every row.

Counted with PostgreSQL's own counters of the rows and index entries each scan of a table read
(`rows_read`), on tables analyzed as autovacuum keeps them. A list counts the rows it finds
(every row, unfiltered): that is the one read that grows with the table.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from accounts.models import AuditEvent, Membership, Tenant
from bench.support import rows_read
from billing.models import MeteredHour, MeterEvent, Plan, Price, UsageRecord
from deployments.models import Cell, Instance, Operation, Snapshot
from tests.deployments.factories import cell, make_instances, postgres_version

pytestmark = pytest.mark.django_db

ROWS = 3000  # in the table: many pages of 100
ACTIONS = ["instance.create", "instance.delete", "instance.stop", "member.invite", "user.login"]


def _list_read(client, model, query: str = "") -> tuple[int, str, list[str]]:
    """What one request of the model's admin list read of its table, the page, and its SQL."""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {model._meta.db_table}")
    assert client.get(url).status_code == 200  # warm: the session, the content types
    before = rows_read(model)
    with CaptureQueriesContext(connection) as statements:
        page = client.get(url + query)
    assert page.status_code == 200
    return rows_read(model) - before, page.content.decode(), [s["sql"] for s in statements]


def _read_a_page(read: int) -> bool:
    """The rows counted once, and a page: not the table again for a DISTINCT, a date
    hierarchy, a second count or a sort (each of which reads every row)."""
    return read < 1.5 * ROWS


def _audit_events(tenant) -> None:
    """ROWS events of the ACTIONS in turn, a minute apart."""
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(tenant=tenant, actor_kind="user", action=ACTIONS[n % len(ACTIONS)],
                   created_at=now - timedelta(minutes=n))
        for n in range(ROWS)
    )  # fmt: skip


def test_the_audit_logs_list_reads_a_page_and_finds_its_actions_along_their_index(
    staff_client, tenant
):
    _audit_events(tenant)

    read, page, _ = _list_read(staff_client, AuditEvent)

    assert _read_a_page(read), read
    events = AuditEvent.objects.count()  # with the organization's own
    assert f"{events} audit events" in page  # counted: fewer than OPSDECK_ADMIN_ESTIMATE_ABOVE
    for action in ACTIONS:  # each offered to filter on
        assert f"?action={action}" in page, action
    read, page, _ = _list_read(staff_client, AuditEvent, "?action=instance.stop")
    assert "600 audit events" in page  # an action's, each counted
    assert read < ROWS / 2, read  # along the index: the 600 found, counted and a page of them


def test_a_large_tables_list_shows_its_rows_estimated_unfiltered_and_counted_filtered(
    staff_client, tenant, settings
):
    settings.OPSDECK_ADMIN_ESTIMATE_ABOVE = 1000
    _audit_events(tenant)

    read, page, _ = _list_read(staff_client, AuditEvent)

    assert read < ROWS / 2, read  # a page of 100, and the actions: no row counted
    events = AuditEvent.objects.count()  # ANALYZE read every row: its estimate is exact
    assert f"about {events:,} audit events" in page
    assert "results (" not in page  # nor the estimate beside the search box, without "about"
    assert f'href="?p={-(-events // 100)}" class="end"' in page  # the last page, 100 a page
    read, page, _ = _list_read(staff_client, AuditEvent, "?action=user.login")
    paginator = page.split('class="paginator">')[1].split("</p>")[0]
    logins = AuditEvent.objects.filter(action="user.login").count()
    assert paginator.split()[-3:] == [str(logins), "audit", "events"]  # counted, not estimated


def test_the_operations_list_reads_a_page_without_the_runs_state_or_secrets(staff_client, tenant):
    version = postgres_version()
    (instance,) = make_instances(tenant, version, cell(), 1)
    now = timezone.now()
    verbs = {0: "backup", ROWS - 1: "delete"}  # the newest, the oldest; "modify" between
    Operation.objects.bulk_create(
        Operation(instance=instance, verb=verbs.get(n, "modify"),
                  request_id=f"r-{n}", plan_version=version, state="succeeded",
                  created_at=now - timedelta(minutes=n), finished_at=now,
                  engine_state='{"phase": "Succeeded"}', secret_parameters='{"p": "s3cret"}')
        for n in range(ROWS)
    )  # fmt: skip

    read, page, statements = _list_read(staff_client, Operation)

    assert _read_a_page(read), read
    listed = [s for s in statements if s.startswith('SELECT "deployments_operation"."id"')]
    assert listed, statements
    for column in ["engine_state", "secret_parameters", "requested_secret", "parameters"]:
        assert not any(f'"{column}"' in s for s in listed), column
    # Newest first, and the verbs the plan defines offered to filter on.
    assert '"field-verb">backup<' in page and '"field-verb">delete<' not in page
    for verb in ["create", "modify", "restart", "delete", "backup"]:
        assert f"?verb={verb}" in page, verb


def test_the_snapshot_list_reads_a_page_without_each_snapshots_metadata(staff_client, tenant):
    version = postgres_version()
    (instance,) = make_instances(tenant, version, cell(), 1)
    now = timezone.now()
    Snapshot.objects.bulk_create(
        Snapshot(tenant=tenant, instance=instance, source_instance_id=instance.pk,
                 plan_version=version, name=f"daily-{n}", status=Snapshot.Status.COMPLETED,
                 metadata={"backupName": f"daily-{n}"}, created_at=now - timedelta(days=n))
        for n in range(ROWS)
    )  # fmt: skip

    read, page, statements = _list_read(staff_client, Snapshot)

    assert _read_a_page(read), read
    listed = [s for s in statements if s.startswith('SELECT "deployments_snapshot"."id"')]
    assert listed and not any('"metadata"' in s or '"parameters"' in s for s in listed)
    assert ">daily-0<" in page and ">daily-100<" not in page  # the newest first


def test_the_instance_list_reads_no_secret_nor_its_cells_credentials(staff_client, tenant):
    make_instances(tenant, postgres_version(), cell(), 3, name="orders")
    for query in ["", "?q=orders-1"]:  # a page, and all found on one
        _, page, statements = _list_read(staff_client, Instance, query)
        assert "orders-1" in page
        listed = [s for s in statements if s.startswith('SELECT "deployments_instance"."id"')]
        assert listed, statements
        for column in ["secret_parameters", "parameters", "observed", "outputs", "kubeconfig",
                       "backup_credentials"]:  # fmt: skip
            assert not any(f'"{column}"' in s for s in listed), (query, column)
    assert Cell.objects.count() == 1


def _listed(statements: list[str], table: str) -> list[str]:
    """The select lists (up to FROM) of the statements that read `table`'s rows."""
    heads = [s.split(" FROM ")[0] for s in statements if s.startswith("SELECT")]
    return [head for head in heads if f'"{table}"."id"' in head]


def test_the_backup_schedule_list_names_its_instances_without_their_secrets(staff_client, tenant):
    from deployments.models import BackupSchedule

    for instance in make_instances(tenant, postgres_version(), cell(), 3, name="orders"):
        Instance.objects.filter(pk=instance.pk).update(
            secret_parameters='{"password": "s3cret"}', parameters={"big": "x" * 2000}
        )
        BackupSchedule.objects.create(instance=instance, interval_hours=24, retention_days=7)

    _, page, statements = _list_read(staff_client, BackupSchedule)

    assert "orders-1 (inst-" in page  # each row names its instance
    listed = _listed(statements, "deployments_instance")
    assert listed, statements
    for column in ["secret_parameters", "parameters", "observed", "outputs"]:
        assert not any(f'"deployments_instance"."{column}"' in s for s in listed), column


@pytest.mark.parametrize(
    ("model_name", "shown", "unshown"),
    [
        ("billing.StripeEvent", "event_id", ["payload"]),
        ("deployments.PlanVersion", "digest", ["spec_text", "parsed"]),
        ("deployments.Cell", "name", ["kubeconfig", "backup_credentials"]),
        ("deployments.PlatformSecret", "name", ["value"]),
    ],
)
def test_a_list_reads_no_payload_spec_or_secret_it_does_not_show(
    staff_client, tenant, model_name, shown, unshown
):
    from django.apps import apps

    from billing.models import StripeEvent
    from deployments.models import PlatformSecret

    make_instances(tenant, postgres_version(), cell(), 1)  # a plan version, a cell
    PlatformSecret.objects.create(name="TOKEN", value="s3cret")
    StripeEvent.objects.create(
        event_id="evt_1", type="invoice.paid", created=timezone.now(),
        payload={"data": {"object": {"lines": ["x" * 5000]}}},
    )  # fmt: skip
    model = apps.get_model(model_name)

    _, page, statements = _list_read(staff_client, model)

    assert f">{getattr(model.objects.get(), shown)}<" in page
    listed = _listed(statements, model._meta.db_table)
    assert listed, statements
    for column in unshown:
        assert not any(f'"{column}"' in s for s in listed), column


def test_the_instance_list_reads_a_page_of_the_fleet_newest_first(staff_client, tenant):
    made = make_instances(tenant, postgres_version(), cell(), ROWS, name="db")

    read, page, _ = _list_read(staff_client, Instance)

    assert _read_a_page(read), read  # counted, and a page: not sorted whole
    newest = max(made, key=lambda instance: instance.created_at)
    assert page.index(f">{newest.name}<") < page.index(f">{made[-2].name}<")


@pytest.fixture
def usage(tenant):
    """ROWS usage records, 10 instances' cpu and storage for 150 hours back from 2026-02-01,
    so over two periods; the hours metered, and the plan's prices."""
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Price.objects.bulk_create(
        Price(plan=plan, dimension=dimension, unit_price=Decimal("0.01"))
        for dimension in ["cpu", "storage"]
    )
    end = datetime(2026, 2, 1, tzinfo=UTC)
    hours = [end - timedelta(hours=n) for n in range(ROWS // 20)]
    MeteredHour.objects.bulk_create(MeteredHour(hour=hour) for hour in hours)
    return UsageRecord.objects.bulk_create(
        UsageRecord(tenant=tenant, plan=plan, instance_id=f"inst-{n:08d}", instance_name=f"db-{n}",
                    dimension=dimension, hour=hour, quantity=Decimal(1),
                    period=f"{hour:%Y-%m}")
        for hour in hours for n in range(10) for dimension in ["cpu", "storage"]
    )  # fmt: skip


def test_the_usage_list_reads_a_page_newest_hour_first(staff_client, usage):
    read, page, _ = _list_read(staff_client, UsageRecord)

    assert _read_a_page(read), read
    assert "Feb. 1, 2026" in page and "Jan. 26, 2026" not in page  # the newest hours first
    for choice in ["?period=2026-01", "?period=2026-02", "?dimension=cpu", "?dimension=storage"]:
        assert choice in page, choice


def test_the_stripe_outbox_list_reads_a_page(staff_client, usage):
    MeterEvent.objects.bulk_create(
        MeterEvent(usage_record=record, identifier=f"opsdeck-usage-{record.pk}",
                   customer_id="cus_1", event_name=f"opsdeck_{record.dimension}", value="1000000",
                   timestamp=record.hour)
        for record in usage
    )  # fmt: skip

    read, page, _ = _list_read(staff_client, MeterEvent)

    assert _read_a_page(read), read
    assert "Feb. 1, 2026" in page and "Jan. 26, 2026" not in page  # the newest first


def test_an_hour_of_a_whole_fleets_usage_is_listed_without_sorting_the_hour(staff_client, tenant):
    """One row per instance and dimension share an hour: the lists order them by id within it
    along their index, rather than reading every row of the hour to sort them."""
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    hour = datetime(2026, 2, 1, tzinfo=UTC)
    records = UsageRecord.objects.bulk_create(
        UsageRecord(tenant=tenant, plan=plan, instance_id=f"inst-{n:08d}", instance_name=f"db-{n}",
                    dimension=dimension, hour=hour, quantity=Decimal(1), period="2026-02")
        for n in range(ROWS // 2) for dimension in ["cpu", "storage"]
    )  # fmt: skip
    MeterEvent.objects.bulk_create(
        MeterEvent(usage_record=record, identifier=f"opsdeck-usage-{record.pk}",
                   customer_id="cus_1", event_name="opsdeck_cpu", value="1", timestamp=hour)
        for record in records
    )  # fmt: skip

    for model in (UsageRecord, MeterEvent):
        read, _, _ = _list_read(staff_client, model)
        assert _read_a_page(read), (model, read)


def test_the_organization_list_counts_the_members_of_its_page_only(staff_client, make_user):
    ann, bob = make_user("ann@example.com"), make_user("bob@example.com")
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"Org {n:04}", slug=f"org-{n:04}") for n in range(ROWS)
    )
    Membership.objects.bulk_create(
        Membership(tenant=tenant, user=user, role="owner" if user == ann else "member")
        for tenant in tenants
        for user in (ann, bob)
    )
    url = reverse("admin:accounts_tenant_changelist")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE accounts_membership")
    assert staff_client.get(url).status_code == 200  # warm
    before = rows_read(Membership)

    page = staff_client.get(url).content.decode()

    read = rows_read(Membership) - before
    assert read <= 4 * 100, read  # the page's 100 organizations' members (3 times all, before)
    assert f"{ROWS} tenants" in page
    assert '<td class="field-member_count">2</td>' in page
    # Sorted by their members, and searched by a member's address: each still counted once.
    Membership.objects.filter(tenant=tenants[0], user=bob).delete()
    assert (
        '<td class="field-member_count">1</td>' in staff_client.get(url + "?o=3").content.decode()
    )
    found = staff_client.get(url + "?q=bob%40example.com").content.decode()
    assert f"{ROWS - 1} tenants" in found
    assert '<td class="field-member_count">1</td>' not in found
