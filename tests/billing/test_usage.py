"""Usage records: stored once per (instance, plan, dimension, hour), billed in the hour's period
or, once that one is closed, in the next open one as an adjustment; which hours are unmetered."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError
from django.urls import reverse
from django.utils import timezone

from billing import usage
from billing.models import BillingPeriod, MeteredHour, Plan, Price, UsageRecord
from billing.usage import UsageRow

HOUR = datetime(2026, 11, 29, 13, tzinfo=UTC)


@pytest.fixture
def plan(db):
    return Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")


@pytest.fixture
def rows(tenant, plan):
    def make(*quantities: tuple[str, str, str]) -> list[UsageRow]:
        return [
            UsageRow(
                tenant_id=tenant.pk,
                plan_id=plan.pk,
                instance_id=instance_id,
                instance_name=f"name of {instance_id}",
                dimension=dimension,
                unit="core" if dimension == "cpu" else "GiB",
                quantity=Decimal(quantity),
            )
            for instance_id, dimension, quantity in quantities
        ]

    return make


def test_an_hour_is_stored_with_its_period_and_marked_metered(rows, tenant):
    recorded = usage.record(
        HOUR, rows(("inst-a", "cpu", "2.333333"), ("inst-a", "storage", "10")), instances=3
    )

    stored = UsageRecord.objects.get(instance_id="inst-a", dimension="cpu")
    assert (stored.tenant, stored.hour, stored.quantity, stored.unit) == (
        tenant, HOUR, Decimal("2.333333"), "core",
    )  # fmt: skip
    assert (stored.period, stored.adjustment) == ("2026-11", False)
    assert (recorded.inserted, recorded.period, recorded.adjustment) == (2, "2026-11", False)
    assert MeteredHour.objects.get(hour=HOUR).instances == 3
    assert usage.last_metered_hour() == HOUR


def test_recording_an_hour_again_changes_nothing(rows):
    usage.record(HOUR, rows(("inst-a", "cpu", "1"), ("inst-b", "cpu", "3")))
    before = list(UsageRecord.objects.values_list("pk", "instance_id", "quantity", "recorded_at"))

    again = usage.record(HOUR, rows(("inst-a", "cpu", "5"), ("inst-b", "cpu", "3")))

    assert again.inserted == 0
    assert (
        list(UsageRecord.objects.values_list("pk", "instance_id", "quantity", "recorded_at"))
        == before
    )
    assert MeteredHour.objects.count() == 1


def test_the_database_refuses_a_second_record_of_the_same_hour(rows, tenant, plan):
    usage.record(HOUR, rows(("inst-a", "cpu", "1")))

    with pytest.raises(IntegrityError):
        UsageRecord.objects.create(
            tenant=tenant, plan=plan, instance_id="inst-a", dimension="cpu", hour=HOUR,
            quantity=Decimal(1), period="2026-11",
        )  # fmt: skip


def test_an_hour_whose_period_is_closed_goes_to_the_next_open_one_as_an_adjustment(rows):
    BillingPeriod.objects.create(key="2026-10", closed_at=timezone.now())
    BillingPeriod.objects.create(key="2026-11", closed_at=timezone.now())
    BillingPeriod.objects.create(key="2026-12")  # open
    october = datetime(2026, 10, 31, 23, tzinfo=UTC)

    recorded = usage.record(october, rows(("inst-a", "cpu", "1")))

    stored = UsageRecord.objects.get()
    assert (stored.period, stored.adjustment) == ("2026-12", True)
    assert (recorded.period, recorded.adjustment) == ("2026-12", True)


def test_an_hour_of_an_open_period_is_billed_in_it_even_after_a_later_one_closed(rows):
    BillingPeriod.objects.create(key="2026-12", closed_at=timezone.now())

    usage.record(HOUR, rows(("inst-a", "cpu", "1")))

    assert UsageRecord.objects.get().period == "2026-11"


def test_a_closed_december_sends_its_late_hours_to_january(rows):
    BillingPeriod.objects.create(key="2026-12", closed_at=timezone.now())

    usage.record(datetime(2026, 12, 31, 23, tzinfo=UTC), rows(("inst-a", "cpu", "1")))

    assert UsageRecord.objects.get().period == "2027-01"


def test_only_the_start_of_an_hour_can_be_recorded(rows):
    with pytest.raises(ValueError, match="not the start of an hour"):
        usage.record(HOUR + timedelta(minutes=5), rows(("inst-a", "cpu", "1")))

    assert not MeteredHour.objects.exists()


def test_unmetered_hours_are_those_no_run_covered(rows):
    for n in (0, 1, 4):
        usage.record(HOUR + timedelta(hours=n), [])

    assert usage.unmetered_hours(HOUR, HOUR + timedelta(hours=6)) == [
        HOUR + timedelta(hours=2), HOUR + timedelta(hours=3), HOUR + timedelta(hours=5),
    ]  # fmt: skip
    assert usage.unmetered_hours(HOUR + timedelta(minutes=30), HOUR + timedelta(hours=2)) == []


def test_a_period_is_ready_to_close_only_once_every_one_of_its_hours_is_metered(db):
    november = datetime(2026, 11, 1, tzinfo=UTC)
    hours = [november + timedelta(hours=n) for n in range(30 * 24)]
    MeteredHour.objects.bulk_create(MeteredHour(hour=hour) for hour in hours if hour != HOUR)

    assert usage.period_close_check("2026-11") == [HOUR]
    assert len(usage.period_close_check("2026-12")) == 31 * 24

    usage.record(HOUR, [])

    assert usage.period_close_check("2026-11") == []


def test_staff_read_usage_records_in_the_admin_and_cannot_change_them(client, make_user, rows):
    usage.record(HOUR, rows(("inst-a", "cpu", "2.333333")))
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    record = UsageRecord.objects.get()

    listing = client.get(reverse("admin:billing_usagerecord_changelist"))
    detail = client.get(reverse("admin:billing_usagerecord_change", args=[record.pk]))

    assert listing.status_code == 200
    assert "2.333333" in listing.content.decode()
    assert "name of inst-a" in listing.content.decode()
    assert b'type="submit" value="Save"' not in detail.content


def test_an_hours_cost_prices_what_was_recorded_and_leaves_unpriced_dimensions_free(rows, plan):
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    Price.objects.create(
        plan=plan, dimension="storage", unit="GiB", time_unit="month", unit_price=Decimal("7.3")
    )
    usage.record(
        HOUR,
        rows(("inst-a", "cpu", "2.333333"), ("inst-b", "cpu", "1"), ("inst-a", "storage", "10"),
             ("inst-a", "replica", "3")),
    )  # fmt: skip

    # 3.333333 cores at 0.035 and 10 GiB at 7.3 / 730 = 0.01 an hour.
    assert usage.hour_cost(HOUR) == {"usd": Decimal("0.2167")}
    assert usage.hour_cost(HOUR + timedelta(hours=1)) == {}


def test_an_hours_cost_prices_a_tenant_at_the_override_in_effect_in_that_hour(rows, tenant, plan):
    from billing.models import PlanOverride

    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    PlanOverride.objects.create(
        tenant=tenant, plan=plan, prices={"cpu": "0.01"}, effective_from=HOUR - timedelta(days=1)
    )
    PlanOverride.objects.create(  # from the next hour on
        tenant=tenant, plan=plan, prices={"cpu": "1"}, effective_from=HOUR + timedelta(hours=1)
    )
    usage.record(HOUR, rows(("inst-a", "cpu", "2"), ("inst-b", "cpu", "1")))

    assert usage.hour_cost(HOUR) == {"usd": Decimal("0.0300")}  # 3 cores at 0.01
