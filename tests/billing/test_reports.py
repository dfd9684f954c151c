"""The cost of a tenant's usage in a period: on the Billing page, with its daily chart."""

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import invoicing, reports, usage
from billing.models import MeteredHour, Plan, Price
from billing.usage import UsageRow

NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    Price.objects.create(plan=plan, dimension="storage", unit="GiB", unit_price=Decimal("0.00014"))
    return plan


def _use(tenant, plan, hour, instance, name, **quantities):
    usage.record(
        hour,
        [
            UsageRow(tenant.pk, plan.pk, instance, name, dimension, "", Decimal(quantity))
            for dimension, quantity in quantities.items()
        ],
    )


def _november(tenant, plan):
    """orders: 2 cores and 100 GiB for 30 hours from the 2nd; cache: 1 core on the 3rd."""
    for n in range(30):
        hour = NOVEMBER + timedelta(days=1, hours=n)
        _use(tenant, plan, hour, "inst-orders00", "orders", cpu="2", storage="100", replica="1")
    for n in range(5):
        _use(tenant, plan, NOVEMBER + timedelta(days=2, hours=n), "inst-cache000", "cache", cpu="1")


def test_the_cost_so_far_is_what_the_invoice_will_say(tenant, plan):
    _november(tenant, plan)

    cost = reports.period_cost(tenant, "2026-11")

    (money,) = cost.currencies
    assert money.currency == "usd"
    # orders: 60 core-hours = 2.10, 3,000 GiB-hours = 0.42; cache: 5 core-hours = 0.175 → 0.18
    assert money.by_dimension == {"cpu": Decimal("2.28"), "storage": Decimal("0.42")}
    assert [(i.name, i.amount) for i in money.by_instance] == [
        ("orders", Decimal("2.52")), ("cache", Decimal("0.18")),
    ]  # fmt: skip
    assert money.total == Decimal("2.70")
    # Closing the period gives the same total.
    hours = [NOVEMBER + timedelta(hours=n) for n in range(30 * 24)]
    MeteredHour.objects.bulk_create([MeteredHour(hour=h) for h in hours], ignore_conflicts=True)
    closed = invoicing.period_close("2026-11", now=datetime(2026, 12, 2, tzinfo=UTC))
    assert closed.invoices[0].total == money.total


def test_the_chart_has_a_bar_per_day_stacked_by_dimension(tenant, plan):
    _november(tenant, plan)

    chart = reports.period_cost(tenant, "2026-11").currencies[0].chart

    assert chart["kind"] == "bar" and chart["stacked"] and chart["unit"] == "USD"
    assert len(chart["labels"]) == 30 and chart["labels"][0] == "01 Nov"
    cpu = next(s for s in chart["series"] if s["label"] == "CPU")["values"]
    # The 2nd: orders 24 h x 2 cores; the 3rd: orders 6 h x 2 + cache 5 h.
    assert cpu[:4] == [0.0, 1.68, 0.6, 0.0]
    assert [s["label"] for s in chart["series"]] == ["CPU", "Storage"]  # replica: not priced
    # The table beside it writes amounts as amounts are written everywhere: 0.00, not 0.0.
    assert chart["rows"][:2] == [["01 Nov", ["0.00", "0.00"]], ["02 Nov", ["1.68", "0.34"]]]


def test_the_chart_figures_of_a_dimension_add_up_to_its_total(tenant, plan):
    # Twelve instances, a core-hour each: 0.035 → 0.04 on each instance's line, 0.48 in all;
    # the days by themselves would say 0.25 + 0.18 (7 and 5 core-hours).
    for n in range(12):
        day = NOVEMBER + timedelta(days=1 if n < 7 else 2)
        _use(tenant, plan, day, f"inst-many{n:04d}", f"db-{n}", cpu="1")

    money = reports.period_cost(tenant, "2026-11").currencies[0]

    assert money.by_dimension == {"cpu": Decimal("0.48")}
    cpu = next(s for s in money.chart["series"] if s["label"] == "CPU")["values"]
    assert cpu[1:3] == [0.28, 0.2] and sum(Decimal(str(v)) for v in cpu) == Decimal("0.48")
    assert money.chart["rows"][1:3] == [["02 Nov", ["0.28"]], ["03 Nov", ["0.20"]]]
    assert money.chart["rows"][0] == ["01 Nov", ["0.00"]]  # a day without usage shows none


def test_another_tenants_usage_is_not_counted(tenant, plan, make_user):
    from accounts.models import Tenant

    other = Tenant.objects.create(name="Other", slug="other-abcdef")
    _use(other, plan, NOVEMBER, "inst-other000", "theirs", cpu="100")

    assert reports.period_cost(tenant, "2026-11").currencies == []


def test_the_billing_page_shows_the_months_cost_with_its_chart_and_figures(
    owner_client, tenant, plan
):
    # The hour under way: in this month at any time, its first hour too (the one before it is
    # last month's then).
    now = usage.hour_start(timezone.now())
    _use(tenant, plan, now, "inst-orders00", "orders", cpu="4")

    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()

    assert '<span class="figure">0.14 USD</span>' in page
    data = re.search(
        r'<script id="daily-cost-usd-data" type="application/json">(.*?)</script>', page
    )
    assert json.loads(data.group(1))["series"][0]["label"] == "CPU"
    assert 'data-chart="daily-cost-usd-data"' in page
    assert "/static/vendor/chartjs/chart.umd.min." in page
    assert '<details class="chart-table" open>' in page  # readable without JavaScript
    assert "orders" in page
    # A line that rounds to 0.00 early in the month is not read as free.
    assert "rounded as an invoice line is, so early in the month a small one may read 0.00" in (
        page
    )


def test_the_billing_page_makes_as_many_queries_for_many_instances_as_for_few(
    owner_client, tenant, plan
):
    hour = usage.hour_start(timezone.now()) - timedelta(hours=1)
    _use(tenant, plan, hour, "inst-00000000", "db-0", cpu="1")
    url = f"/t/{tenant.slug}/billing/"
    owner_client.get(url)
    with CaptureQueriesContext(connection) as few:
        owner_client.get(url)
    for n in range(1, 30):
        _use(tenant, plan, hour - timedelta(hours=n), f"inst-{n:08d}", f"db-{n}", cpu="1")
    with CaptureQueriesContext(connection) as many:
        owner_client.get(url)

    assert len(many.captured_queries) == len(few.captured_queries)


def test_usage_sent_to_stripe_costs_what_stripes_invoice_says(tenant, plan):
    from billing.models import MeterEvent, UsageRecord

    for n in range(5):  # 5 core-hours each: 0.175, rounded 0.18 on a line of its own
        hour = NOVEMBER + timedelta(hours=n)
        _use(tenant, plan, hour, "inst-orders00", "orders", cpu="1")
        _use(tenant, plan, hour, "inst-cache000", "cache", cpu="1")
    local = reports.period_cost(tenant, "2026-11").currencies[0]
    for record in UsageRecord.objects.all():  # both sent to Stripe's cpu meter
        MeterEvent.objects.create(
            usage_record=record, identifier=f"u{record.pk}", customer_id="cus_1",
            event_name="cpu", value=str(record.quantity), timestamp=record.hour, status="sent",
        )  # fmt: skip

    (money,) = reports.period_cost(tenant, "2026-11").currencies

    assert local.total == Decimal("0.36")  # Opsdeck's invoice: a line per instance
    # Stripe's invoice: one line for the plan's cpu price, 10 core-hours = 0.35
    assert money.total == money.by_dimension["cpu"] == Decimal("0.35")
    assert [i.amount for i in money.by_instance] == [Decimal("0.18"), Decimal("0.18")]


def test_the_cost_so_far_follows_the_tenants_price_override(tenant, plan):
    from billing.models import PlanOverride

    _november(tenant, plan)
    PlanOverride.objects.create(
        tenant=tenant, plan=plan, effective_from=NOVEMBER + timedelta(days=2), prices={"cpu": "0"}
    )

    (money,) = reports.period_cost(tenant, "2026-11").currencies

    # CPU is free from the 3rd: orders' first 24 hours (1.68) are all that is charged of it.
    assert money.by_dimension["cpu"] == Decimal("1.68")
    cpu = next(s for s in money.chart["series"] if s["label"] == "CPU")["values"]
    assert cpu[:4] == [0.0, 1.68, 0.0, 0.0]


def test_usage_sent_to_stripe_costs_its_catalog_price_whatever_the_override(tenant, plan):
    """An override set while billing was local (cpu at 0.02) prices what Opsdeck bills;
    Stripe's catalog holds none of it, and charges its own price (0.035)."""
    from billing.models import MeterEvent, PlanOverride, UsageRecord

    PlanOverride.objects.create(
        tenant=tenant, plan=plan, effective_from=NOVEMBER - timedelta(days=30),
        prices={"cpu": "0.02"},
    )  # fmt: skip
    for n in range(10):
        _use(tenant, plan, NOVEMBER + timedelta(hours=n), "inst-orders00", "orders", cpu="1")
    local = reports.period_cost(tenant, "2026-11").currencies[0]
    for record in UsageRecord.objects.all():  # sent to Stripe's cpu meter
        MeterEvent.objects.create(
            usage_record=record, identifier=f"u{record.pk}", customer_id="cus_1",
            event_name="cpu", value=str(record.quantity), timestamp=record.hour, status="sent",
        )  # fmt: skip

    (money,) = reports.period_cost(tenant, "2026-11").currencies

    assert local.total == Decimal("0.20")  # 10 core-hours at the override's 0.02
    assert money.total == Decimal("0.35")  # at Stripe's 0.035
    cpu = next(s for s in money.chart["series"] if s["label"] == "CPU")["values"]
    assert sum(cpu) == pytest.approx(0.35)
