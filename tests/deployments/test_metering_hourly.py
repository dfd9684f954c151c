"""Hourly metering: each instance's usage of an hour from its state history and the values its
succeeded operations left, to the second (histories made straight in the database, at chosen
times)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import BillingPeriod, MeteredHour, UsageRecord
from deployments import metering, services
from deployments.models import Instance, InstanceStateChange, Operation
from tests.deployments import factories
from tests.deployments.conftest import SPEC

HOUR = datetime(2026, 11, 29, 13, tzinfo=UTC)
DEFAULTS = {
    "version": "17",
    "instances": 1,
    "cpu": 1,
    "memoryGi": 2,
    "storageGi": 10,
    "database": "app",
    "owner": "app",
}


def at(minutes: float, hour: datetime = HOUR) -> datetime:
    return hour + timedelta(minutes=minutes)


@pytest.fixture
def version(db):
    return factories.postgres_version()


@pytest.fixture
def cell(db):
    return factories.cell()


@pytest.fixture
def make(tenant, version, cell):
    """An instance created at `created` whose create succeeded a minute later."""

    def make_instance(created: datetime, *, name: str = "db", **values) -> Instance:
        parameters = {**DEFAULTS, **values}
        instance = Instance.objects.create(
            tenant=tenant,
            name=name,
            plan_version=version,
            cell=cell,
            parameters=parameters,
            state=Instance.State.CREATING,
            created_at=created,
        )
        move(instance, Instance.State.CREATING, created)
        succeed(instance, "create", created + timedelta(minutes=1), requested=parameters)
        move(instance, Instance.State.RUNNING, created + timedelta(minutes=1))
        return instance

    return make_instance


def move(instance: Instance, state: str, when: datetime) -> None:
    InstanceStateChange.objects.create(
        instance=instance,
        from_state="" if state == Instance.State.CREATING else instance.state,
        to_state=state,
        at=when,
    )
    instance.state = state
    instance.save(update_fields=["state"])


def succeed(instance, verb, when, *, requested=None, version=None) -> Operation:
    """A succeeded operation as the runner leaves it: the values it applied (the instance's
    when it started) and the changes it was asked for."""
    version = version or instance.plan_version
    operation = Operation.objects.create(
        instance=instance,
        verb=verb,
        request_id=f"{verb}-{when.isoformat()}-{instance.pk}",
        plan_version=version,
        requested=requested or {},
        parameters=dict(instance.parameters),
        state=Operation.State.SUCCEEDED,
        created_at=when - timedelta(minutes=1),
        started_at=when - timedelta(minutes=1),
        finished_at=when,
    )
    instance.parameters = {**instance.parameters, **(requested or {})}
    instance.plan_version = version
    instance.save(update_fields=["parameters", "plan_version"])
    return operation


def used(instance, hour=HOUR) -> dict[str, Decimal]:
    return {
        row.dimension: row.quantity
        for row in metering.usage_rows(hour)
        if row.instance_id == instance.pk
    }


def every(cpu, memory, storage, replica, base) -> dict[str, Decimal]:
    values = {"cpu": cpu, "memory": memory, "storage": storage, "replica": replica, "base": base}
    return {dimension: Decimal(value) for dimension, value in values.items()}


def test_an_instance_running_the_whole_hour_uses_its_size_for_one_hour(make):
    instance = make(at(-90))

    rows = [row for row in metering.usage_rows(HOUR) if row.instance_id == instance.pk]

    assert {row.dimension: row.quantity for row in rows} == every(1, 2, 10, 1, 1)
    assert {row.dimension: row.unit for row in rows} == {
        "cpu": "core", "memory": "GiB", "storage": "GiB", "replica": "", "base": "",
    }  # fmt: skip
    assert {(row.tenant_id, row.plan_id, row.instance_name) for row in rows} == {
        (instance.tenant_id, instance.plan_version.plan_id, "db")
    }


def test_an_instance_created_at_quarter_past_counts_from_then_while_creating_too(make):
    instance = make(at(15))

    assert used(instance) == every("0.75", "1.5", "7.5", "0.75", "0.75")
    assert used(instance, HOUR - timedelta(hours=1)) == {}


def test_a_stopped_instance_counts_only_its_storage(make):
    instance = make(at(-90))
    move(instance, Instance.State.UPDATING, at(30))
    succeed(instance, "stop", at(31))
    move(instance, Instance.State.STOPPED, at(31))

    assert used(instance) == {
        **every("0.516667", "1.033333", 10, "0.516667", "0.516667"),
    }
    assert used(instance, HOUR + timedelta(hours=1)) == {"storage": Decimal(10)}


def test_a_started_instance_counts_everything_again_from_its_start(make):
    instance = make(at(-180))
    move(instance, Instance.State.UPDATING, at(-120))
    move(instance, Instance.State.STOPPED, at(-119))
    move(instance, Instance.State.UPDATING, at(40))
    succeed(instance, "start", at(41))
    move(instance, Instance.State.RUNNING, at(41))

    # Updating counts everything: 20 minutes from 13:40.
    assert used(instance) == every("0.333333", "0.666667", 10, "0.333333", "0.333333")


def test_a_modify_from_one_to_three_servers_bills_20_minutes_of_one_and_40_of_three(make):
    instance = make(at(-90))
    move(instance, Instance.State.UPDATING, at(10))
    succeed(instance, "modify", at(20), requested={"instances": 3})
    move(instance, Instance.State.RUNNING, at(20))

    usage = used(instance)

    # One server for 20 minutes, then three for 40: 1/3 + 2 server-hours.
    assert usage["replica"] == Decimal("2.333333")
    assert usage["cpu"] == Decimal("2.333333")
    assert usage["memory"] == Decimal("4.666667")
    assert usage["storage"] == Decimal("23.333333")
    assert usage["base"] == Decimal(1)
    assert used(instance, HOUR + timedelta(hours=1))["replica"] == Decimal(3)


def test_a_modify_that_finished_before_the_hour_counts_its_values_all_hour(make):
    instance = make(at(-90))
    succeed(instance, "modify", at(-30), requested={"instances": 2, "storageGi": 50})
    # What the instance holds now does not matter for an hour gone by.
    instance.parameters = DEFAULTS
    instance.save(update_fields=["parameters"])

    assert used(instance)["storage"] == Decimal(100)
    assert used(instance)["replica"] == Decimal(2)


def test_a_failed_modify_changes_nothing_and_the_failed_state_counts_storage_only(make):
    instance = make(at(-90))
    move(instance, Instance.State.UPDATING, at(0))
    Operation.objects.create(
        instance=instance, verb="modify", request_id="m", plan_version=instance.plan_version,
        requested={"instances": 5}, parameters=DEFAULTS, state=Operation.State.FAILED,
        started_at=at(0), finished_at=at(30),
    )  # fmt: skip
    move(instance, Instance.State.FAILED, at(30))

    assert used(instance) == every("0.5", 1, 10, "0.5", "0.5")


def failed_create(tenant, version, cell, created: datetime) -> Instance:
    """An instance whose create failed ten minutes after it was asked for."""
    instance = Instance.objects.create(
        tenant=tenant, name="never-ran", plan_version=version, cell=cell,
        parameters=DEFAULTS, state=Instance.State.CREATING, created_at=created,
    )  # fmt: skip
    move(instance, Instance.State.CREATING, created)
    move(instance, Instance.State.FAILED, created + timedelta(minutes=10))
    return instance


def test_a_create_that_failed_counts_its_minutes_creating_and_nothing_while_it_stays_failed(
    tenant, version, cell
):
    instance = failed_create(tenant, version, cell, at(20))

    # Twenty minutes of nothing, ten creating, thirty failed: the customer never had it.
    sixth = "0.166667"
    assert used(instance) == every(sixth, "0.333333", "1.666667", sixth, sixth)
    assert used(instance, HOUR + timedelta(hours=5)) == {}


def test_a_failed_create_retried_counts_from_the_retry_and_once_it_ran_failing_keeps_storage(
    tenant, version, cell
):
    instance = failed_create(tenant, version, cell, at(-180))
    move(instance, Instance.State.CREATING, at(-30))  # "Retry"
    move(instance, Instance.State.RUNNING, at(-20))
    move(instance, Instance.State.UPDATING, at(-15))
    move(instance, Instance.State.FAILED, at(-10))  # a modify failed before the hour

    assert used(instance, HOUR - timedelta(hours=2)) == {}  # failed all hour, never ran
    assert used(instance) == {"storage": Decimal(10)}  # it ran: its volumes hold its data


def test_a_long_create_metered_late_bills_its_first_hour_at_the_size_it_was_made_with(
    tenant, version, cell
):
    """Created with one server at 13:00, its create running until 14:10, a modify to three
    servers done at 14:40: metered late (beat down until 15:00), 13:00-14:00 was billed at
    three servers, the size it had only later, as its own values by then."""
    instance = Instance.objects.create(
        tenant=tenant, name="big", plan_version=version, cell=cell, parameters=DEFAULTS,
        state=Instance.State.CREATING, created_at=at(0),
    )  # fmt: skip
    move(instance, Instance.State.CREATING, at(0))
    succeed(instance, "create", at(70), requested=DEFAULTS)
    move(instance, Instance.State.RUNNING, at(70))
    move(instance, Instance.State.UPDATING, at(95))
    succeed(instance, "modify", at(100), requested={"instances": 3})
    move(instance, Instance.State.RUNNING, at(100))

    assert used(instance) == every(1, 2, 10, 1, 1)


def test_an_upgrade_bills_the_newer_versions_rules_from_when_it_finished(make):
    instance = make(at(-90))
    # The newer version counts a 2 GiB WAL volume beside the data volume.
    newer = services.plan_load(
        text=SPEC.read_text().replace(
            'storage: "double(var.storageGi) * double(var.instances)"',
            'storage: "(double(var.storageGi) + 2.0) * double(var.instances)"',
        )
    ).version
    assert newer.pk != instance.plan_version_id
    move(instance, Instance.State.UPDATING, at(25))
    succeed(instance, "upgrade", at(30), version=newer)
    move(instance, Instance.State.RUNNING, at(30))

    assert used(instance)["storage"] == Decimal(11)
    assert used(instance, HOUR + timedelta(hours=1))["storage"] == Decimal(12)


def test_an_hour_split_by_a_move_to_another_plan_is_recorded_on_each_plan_for_its_part(make):
    instance = make(at(-90))
    small = services.plan_load(
        text=SPEC.read_text()
        .replace("  plan: postgres-cnpg\n", "  plan: postgres-small\n", 1)
        .replace("name: PostgreSQL\n", "name: PostgreSQL Small\n", 1)
    ).version
    assert small.plan_id != instance.plan_version.plan_id
    move(instance, Instance.State.UPDATING, at(15))
    succeed(instance, "upgrade", at(15), version=small)  # the move finishes at :15
    move(instance, Instance.State.RUNNING, at(15))

    metering.meter_hour(HOUR)
    metering.meter_hour(HOUR)  # again: nothing changes

    recorded = {
        (plan_key, dimension): quantity
        for plan_key, dimension, quantity in UsageRecord.objects.filter(
            instance_id=instance.pk, hour=HOUR
        ).values_list("plan__key", "dimension", "quantity")
    }
    # 15 minutes on the plan it left, 45 on the one it moved to: each billed at its own prices.
    assert recorded == {
        **{("postgres-cnpg", d): q for d, q in every("0.25", "0.5", "2.5", "0.25", "0.25").items()},
        **{
            ("postgres-small", d): q for d, q in every("0.75", "1.5", "7.5", "0.75", "0.75").items()
        },
    }
    later = metering.usage_rows(HOUR + timedelta(hours=1))
    assert {row.plan_id for row in later if row.instance_id == instance.pk} == {small.plan_id}


def test_a_deleted_instance_counts_until_its_delete_started_and_not_after(make):
    instance = make(at(-90))
    move(instance, Instance.State.DELETING, at(40))
    move(instance, Instance.State.DELETED, at(45))

    assert used(instance) == every("0.666667", "1.333333", "6.666667", "0.666667", "0.666667")
    assert used(instance, HOUR + timedelta(hours=1)) == {}


def test_a_restore_is_a_new_instance_counted_from_its_own_creation(make):
    old = make(at(-90), name="old")
    move(old, Instance.State.DELETING, at(-10))
    move(old, Instance.State.DELETED, at(-5))
    restored = make(at(30), name="restored", instances=2)

    assert used(old) == {}
    assert used(restored) == every(1, 2, 10, 1, "0.5")
    assert {row.instance_name for row in metering.usage_rows(HOUR)} == {"restored"}


def test_each_distinct_parameter_set_is_measured_once(make, monkeypatch):
    for n in range(30):
        make(at(-90), name=f"db-{n}", instances=1 + n % 3)
    calls = []
    original = metering.quantities

    def counted(plan, parameters):
        calls.append(parameters["instances"])
        return original(plan, parameters)

    monkeypatch.setattr(metering, "quantities", counted)

    rows = metering.usage_rows(HOUR)

    assert len({row.instance_id for row in rows}) == 30
    assert sorted(calls) == [1, 2, 3]


def test_the_query_count_does_not_grow_with_the_instances(make, tenant, version, cell):
    for n in range(10):
        make(at(-90), name=f"db-{n}")
    metering.usage_rows(HOUR)  # the spec parsed, as in any running process
    with CaptureQueriesContext(connection) as ten:
        assert len(metering.usage_rows(HOUR)) == 50
    for n in range(10, 200):
        instance = make(at(-90 + n % 60), name=f"db-{n}")
        if n % 2:
            move(instance, Instance.State.UPDATING, at(n % 50))
            succeed(instance, "modify", at(n % 50 + 1), requested={"cpu": 2})
            move(instance, Instance.State.RUNNING, at(n % 50 + 1))

    with CaptureQueriesContext(connection) as two_hundred:
        assert len({row.instance_id for row in metering.usage_rows(HOUR)}) == 200

    assert len(two_hundred.captured_queries) == len(ten.captured_queries)
    assert len(ten.captured_queries) <= 5


def test_metering_an_hour_twice_changes_nothing(make):
    make(at(-90), name="a")
    second = make(at(20), name="b")
    move(second, Instance.State.UPDATING, at(30))
    succeed(second, "modify", at(40), requested={"instances": 3})
    move(second, Instance.State.RUNNING, at(40))

    first = metering.meter_hour(HOUR)
    stored = list(UsageRecord.objects.values_list("instance_id", "dimension", "quantity"))
    again = metering.meter_hour(HOUR)

    assert (first.inserted, again.inserted) == (10, 0)
    assert list(UsageRecord.objects.values_list("instance_id", "dimension", "quantity")) == stored
    assert MeteredHour.objects.get(hour=HOUR).instances == 2


def test_hours_missed_for_three_hours_are_back_filled_by_the_next_run(make):
    instance = make(at(-300))
    metering.meter_due(at(-118))  # every hour up to HOUR - 3h
    # Workers were down from HOUR - 2h; the next run comes at HOUR + 1h + 1 min.

    recorded = metering.meter_due(at(62))

    assert [r.hour for r in recorded] == [
        HOUR - timedelta(hours=2),
        HOUR - timedelta(hours=1),
        HOUR,
    ]
    hours = UsageRecord.objects.filter(instance_id=instance.pk, dimension="replica")
    assert hours.count() == 6
    assert metering.meter_due(at(63)) == []


def test_on_an_empty_table_metering_starts_at_the_first_hour_of_the_first_instances_month(
    make,
):
    make(at(-150))
    november = datetime(2026, 11, 1, tzinfo=UTC)

    recorded = metering.meter_due(at(62))

    # The hours before the instance are metered too (empty): the month can close.
    hours = int((HOUR - november) / timedelta(hours=1)) + 1
    assert [r.hour for r in recorded] == [november + timedelta(hours=n) for n in range(hours)]
    assert MeteredHour.objects.count() == hours
    assert UsageRecord.objects.filter(hour__lt=HOUR - timedelta(hours=3)).count() == 0


def test_the_first_month_an_instance_ran_in_closes_on_its_own(make):
    from billing import invoicing

    make(datetime(2026, 11, 30, 20, tzinfo=UTC))  # the hours of November before it, too
    early_december = datetime(2026, 12, 1, 2, 5, tzinfo=UTC)

    metering.meter_due(early_december)
    closed = invoicing.period_close_due(now=early_december)

    assert [c.period for c in closed] == ["2026-11"]


def test_an_hour_is_due_once_what_ended_in_it_has_had_time_to_commit(make):
    """Metered the moment it ended, an hour missed a run whose end, stamped in it, committed
    moments later; metered again, it then counted that time twice."""
    make(at(-90))

    assert HOUR not in metering.hours_due(at(60) + timedelta(seconds=30))
    assert metering.hours_due(at(60) + metering.SETTLE)[-1] == HOUR


def test_back_filling_looks_back_at_most_31_days(make):
    make(at(-60 * 24 * 40))

    due = metering.hours_due(at(60) + metering.SETTLE)

    assert due[0] == HOUR - timedelta(days=31)
    assert due[-1] == HOUR
    assert len(due) == 31 * 24 + 1


def test_an_instance_whose_usage_rule_fails_is_logged_and_the_others_are_recorded(make, caplog):
    odd = services.plan_load(
        text=SPEC.read_text().replace(
            'storage: "double(var.storageGi) * double(var.instances)"',
            'storage: "double(var.storageGi) / (3.0 - double(var.instances))"',
        )
    ).version
    fine = make(at(-90), name="fine")
    broken = make(at(-90), name="broken", instances=3)
    Instance.objects.filter(pk__in=[fine.pk, broken.pk]).update(plan_version=odd)
    Operation.objects.filter(instance__in=[fine, broken]).update(plan_version=odd)

    found = metering.hour_usage(HOUR)

    assert found.failed == [broken.pk]
    assert {row.instance_id for row in found.rows} == {fine.pk}
    assert next(r.quantity for r in found.rows if r.dimension == "storage") == Decimal(5)
    assert f"metering {broken.pk}" in caplog.text
    assert "The usage rule for storage gives" in caplog.text


def test_a_back_filled_hour_of_a_closed_period_is_billed_in_the_next_one(make):
    october = datetime(2026, 10, 31, 23, tzinfo=UTC)
    instance = make(october - timedelta(hours=2))
    BillingPeriod.objects.create(key="2026-10", closed_at=HOUR)

    metering.meter_hour(october)

    stored = UsageRecord.objects.filter(instance_id=instance.pk)
    assert {(r.period, r.adjustment, r.hour) for r in stored} == {("2026-11", True, october)}
    assert stored.get(dimension="replica").quantity == Decimal(1)
