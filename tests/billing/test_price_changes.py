"""A plan's changed prices apply from the next billing period, and Stripe charges each period
what Opsdeck's own invoices and cost reports price it at: a metered item bills its whole period
at the price it holds when the period is invoiced, so a subscription's items move to a changed
price only once its period from the change on has begun."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from accounts.audit import SYSTEM
from accounts.models import Tenant
from billing import invoicing, meter_events, reports, stripe_sync, usage
from billing import services as billing_services
from billing.models import Invoice, MeteredHour, PastPrice, StripePrice, Subscription
from billing.usage import UsageRow
from stripe_emulator import sign
from tests.billing.conftest import WEBHOOK_SECRET

pytestmark = pytest.mark.unsubscribed

OLD = [
    {"dimension": "cpu", "unit": "core", "unit_price": "0.05"},
    {"dimension": "storage", "unit": "GiB", "time_unit": "month", "unit_price": "0.10"},
]
NEW = [
    {"dimension": "cpu", "unit": "core", "unit_price": "0.08"},
    {"dimension": "storage", "unit": "GiB", "time_unit": "month", "unit_price": "0.20"},
]


class Clock:
    """Opsdeck's clock and the emulator's, moved forward together (the emulator's only moves
    forward, so the story is told in a month to come)."""

    def __init__(self, emulator, monkeypatch):
        self.emulator = emulator
        self.offset = timedelta(0)
        real = timezone.now
        monkeypatch.setattr(timezone, "now", lambda: real() + self.offset)

    def to(self, moment: datetime) -> None:
        seconds = math.ceil((moment - timezone.now()).total_seconds())
        self.emulator.advance_clock(seconds)
        self.offset += timedelta(seconds=seconds)


def _next(month: datetime) -> datetime:
    """The first of the month after the one `month` is in, 00:00 UTC."""
    return (month.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            + timedelta(days=32)).replace(day=1)  # fmt: skip


def _month_to_come() -> datetime:
    """The first of the month after next: a whole month ahead of any clock."""
    return _next(_next(datetime.now(UTC)))


def _deliver(client, event: dict) -> None:
    body = json.dumps(event).encode()
    response = client.post(
        "/billing/stripe/webhook/", body, content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body, WEBHOOK_SECRET, int(time.time())),
    )  # fmt: skip
    assert response.status_code == 200, response.content


def _subscribed(client, owner, tenant, emulator, plan) -> Subscription:
    """Subscribed by its owner (signed in now: the clock may have passed a session's age)
    through Stripe's Checkout, paid."""
    client.force_login(owner)
    response = client.post(
        f"/t/{tenant.slug}/billing/subscribe/{plan.key}/", {"request_id": f"sub-{plan.key}"}
    )
    (page,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    emulator.complete_checkout(page)
    _deliver(client, emulator.events("checkout.session.completed")[-1])
    subscription = Subscription.objects.get(tenant=tenant, plan=plan)
    assert subscription.status == "active"
    return subscription


def _held(gw, subscription) -> set[str]:
    """The Stripe prices the subscription's items are on."""
    held = gw.subscription(subscription.stripe_subscription_id)
    return {item.price.id for item in held["items"].data}


def _stripe_prices(plan) -> set[str]:
    return set(
        StripePrice.objects.filter(price__plan=plan).values_list("stripe_price_id", flat=True)
    )


def _used(hour: datetime, plan, tenants: dict[Tenant, str]) -> None:
    """An hour of 2 cores and 500 GiB on one instance of each tenant, metered and sent."""
    usage.record(hour, [
        UsageRow(tenant_id=tenant.pk, plan_id=plan.pk, instance_id=instance,
                 instance_name=instance, dimension=dimension, unit=unit, quantity=Decimal(amount))
        for tenant, instance in tenants.items()
        for dimension, unit, amount in (("cpu", "core", "2"), ("storage", "GiB", "500"))
    ])  # fmt: skip
    meter_events.enqueue()
    meter_events.flush()


def _metered(start: datetime, end: datetime) -> None:
    hours = int((end - start) / usage.HOUR)
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + n * usage.HOUR) for n in range(hours)], ignore_conflicts=True
    )


def _lines(invoice: Invoice) -> list[tuple]:
    """An invoice's lines as both kinds can be compared: dimension, unit-hours, the price of a
    unit-hour (Stripe holds it to 12 decimal places of a cent per millionth: to 8 here) and
    the amount."""
    return sorted(
        (line.dimension, line.quantity, line.unit_price.quantize(Decimal("1e-8")), line.amount)
        for line in invoice.lines.all()
    )


def _cost(tenant, period: str) -> Decimal:
    (currency,) = reports.period_cost(tenant, period).currencies
    return currency.total


def test_a_price_changed_mid_month_is_charged_alike_by_opsdeck_and_by_stripe(
    client, owner, tenant, gw, emulator, customer, priced_plan, monkeypatch
):
    clock = Clock(emulator, monkeypatch)
    month = _month_to_come()
    next_month = _next(month)
    clock.to(month + timedelta(days=9, hours=10))
    stripe_sync.catalog_sync(gw)
    # One organization billed by Stripe, one billed by Opsdeck's own invoices.
    billed_by_stripe = _subscribed(client, owner, tenant, emulator, priced_plan)
    local = Tenant.objects.create(name="Local", slug="local-a1b2c3")
    billing_services.subscription_create_active(actor=SYSTEM, tenant=local, plan=priced_plan)
    instances = {tenant: "inst-aaaaaaaa", local: "inst-bbbbbbbb"}
    old_prices = _stripe_prices(priced_plan)
    assert _held(gw, billed_by_stripe) == old_prices

    # The 10th: an hour of use, then the plan's prices change (a new spec loaded).
    clock.to(month + timedelta(days=9, hours=12, minutes=5))
    _used(month + timedelta(days=9, hours=11), priced_plan, instances)
    assert billing_services.plan_prices_replace(plan=priced_plan, currency="usd", prices=NEW)
    call_command("stripe_sync_catalog", stdout=StringIO())  # as `make run` does when it starts
    stripe_sync.subscription_mirror(gw.subscription(billed_by_stripe.stripe_subscription_id), gw)

    # The subscription stays on the prices its period began with.
    assert _held(gw, billed_by_stripe) == old_prices
    new_prices = _stripe_prices(priced_plan)
    assert new_prices.isdisjoint(old_prices)
    # The 20th: another hour of use, after the change.
    clock.to(month + timedelta(days=19, hours=12, minutes=5))
    _used(month + timedelta(days=19, hours=11), priced_plan, instances)

    # The month ends: Stripe invoices the subscription's period and renews it; Opsdeck closes
    # the month into its own invoice of the other organization.
    clock.to(next_month + timedelta(minutes=30))
    charged = emulator.close_period(billed_by_stripe.stripe_subscription_id)
    _deliver(client, emulator.events("invoice.created")[-1])
    _deliver(client, emulator.events("customer.subscription.updated")[-1])
    _metered(month, next_month)
    (opsdeck_invoice,) = invoicing.period_close(f"{month:%Y-%m}").invoices
    stripe_invoice = Invoice.objects.get(source="stripe", tenant=tenant)

    # Both hours at the prices the month began with: 4 core-hours at 0.05 and 1,000 GiB-hours
    # at 0.10 a GiB-month; not the new prices for the whole month.
    assert opsdeck_invoice.tenant == local and stripe_invoice.period == f"{month:%Y-%m}"
    assert _lines(opsdeck_invoice) == [
        ("cpu", Decimal(4), Decimal("0.05"), Decimal("0.20")),
        ("storage", Decimal(1000), Decimal("0.00013699"), Decimal("0.14")),
    ]
    assert _lines(stripe_invoice) == _lines(opsdeck_invoice)  # line by line
    assert charged["total"] == 34
    assert stripe_invoice.total == opsdeck_invoice.total == Decimal("0.34")
    assert _cost(tenant, f"{month:%Y-%m}") == _cost(local, f"{month:%Y-%m}") == Decimal("0.34")
    # The renewal put the subscription on the new prices, for the period they apply to.
    assert _held(gw, billed_by_stripe) == new_prices

    # The next month: an hour of use, at the new prices on both invoices.
    after = _next(next_month)
    clock.to(next_month + timedelta(days=4, hours=12, minutes=5))
    _used(next_month + timedelta(days=4, hours=11), priced_plan, instances)
    clock.to(after + timedelta(minutes=30))
    charged = emulator.close_period(billed_by_stripe.stripe_subscription_id)
    _deliver(client, emulator.events("invoice.created")[-1])
    _metered(next_month, after)
    (opsdeck_invoice,) = invoicing.period_close(f"{next_month:%Y-%m}").invoices
    stripe_invoice = Invoice.objects.get(source="stripe", period=f"{next_month:%Y-%m}")

    assert _lines(opsdeck_invoice) == [
        ("cpu", Decimal(2), Decimal("0.08"), Decimal("0.16")),
        ("storage", Decimal(500), Decimal("0.00027397"), Decimal("0.14")),
    ]
    assert _lines(stripe_invoice) == _lines(opsdeck_invoice)
    assert charged["total"] == 30 and stripe_invoice.total == opsdeck_invoice.total
    assert _cost(tenant, f"{next_month:%Y-%m}") == Decimal("0.30")


def test_a_checkout_after_a_change_pays_this_months_prices_and_moves_at_the_renewal(
    client, owner, tenant, gw, emulator, customer, priced_plan, monkeypatch
):
    clock = Clock(emulator, monkeypatch)
    month = _month_to_come()
    clock.to(month + timedelta(days=9, hours=12))
    stripe_sync.catalog_sync(gw)
    old_prices = _stripe_prices(priced_plan)
    other = Tenant.objects.create(name="Other", slug="other-a1b2c3")
    _used(month + timedelta(days=9, hours=11), priced_plan, {other: "inst-bbbbbbbb"})  # in use
    billing_services.plan_prices_replace(plan=priced_plan, currency="usd", prices=NEW)
    stripe_sync.catalog_sync(gw)

    clock.to(month + timedelta(days=19))
    subscription = _subscribed(client, owner, tenant, emulator, priced_plan)

    assert _held(gw, subscription) == old_prices
    clock.to(_next(month) + timedelta(minutes=5))
    emulator.close_period(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("customer.subscription.updated")[-1])
    assert _held(gw, subscription) == _stripe_prices(priced_plan) != old_prices


def test_a_dimension_dropped_mid_month_is_billed_until_the_renewal_and_read_as_its_own(
    client, owner, tenant, gw, emulator, customer, priced_plan, monkeypatch
):
    clock = Clock(emulator, monkeypatch)
    month = _month_to_come()
    clock.to(month + timedelta(days=9, hours=10))
    stripe_sync.catalog_sync(gw)
    storage = StripePrice.objects.get(price__dimension="storage").stripe_price_id
    subscription = _subscribed(client, owner, tenant, emulator, priced_plan)
    clock.to(month + timedelta(days=9, hours=12, minutes=5))
    _used(month + timedelta(days=9, hours=11), priced_plan, {tenant: "inst-aaaaaaaa"})

    billing_services.plan_prices_replace(plan=priced_plan, currency="usd", prices=OLD[:1])
    stripe_sync.catalog_sync(gw)

    # Its Stripe price stays known with the price it charges until the next month.
    assert PastPrice.objects.get(dimension="storage").stripe_price_id == storage
    assert storage in _held(gw, subscription)
    clock.to(_next(month) + timedelta(minutes=5))
    emulator.close_period(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("invoice.created")[-1])
    lines = {line.dimension: line for line in Invoice.objects.get(source="stripe").lines.all()}
    assert lines.keys() == {"cpu", "storage"}  # no "other"
    assert (lines["storage"].quantity, lines["storage"].unit) == (Decimal(500), "GiB")
    assert _held(gw, subscription) == _stripe_prices(priced_plan)  # cpu's alone


def test_a_price_in_effect_that_stripe_never_had_is_made_by_the_catalog_sync(
    client, owner, tenant, gw, emulator, customer, priced_plan
):
    """Changed in two months in a row with no sync between: the price of the second month,
    now in effect, was never in Stripe's catalog."""
    stripe_sync.catalog_sync(gw)
    usage.record(_next(timezone.now() - timedelta(days=32)) - usage.HOUR, [
        UsageRow(tenant_id=tenant.pk, plan_id=priced_plan.pk, instance_id="inst-aaaaaaaa",
                 instance_name="a", dimension="cpu", unit="core", quantity=Decimal(1))
    ])  # fmt: skip
    last_month = timezone.now() - timedelta(days=32)
    billing_services.plan_prices_replace(
        plan=priced_plan, currency="usd", prices=[NEW[0], OLD[1]], at=last_month
    )  # 0.08 from this month
    billing_services.plan_prices_replace(plan=priced_plan, currency="usd", prices=OLD)

    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)

    kept = PastPrice.objects.get(dimension="cpu", until=_next(timezone.now()))
    assert kept.unit_price == Decimal("0.08") and kept.stripe_price_id
    assert f"created price opsdeck-pg-cpu-until-{kept.until:%Y%m%dT%H%MZ}" in out.getvalue()
    subscription = _subscribed(client, owner, tenant, emulator, priced_plan)
    assert kept.stripe_price_id in _held(gw, subscription)
    made = gw.client.v1.prices.retrieve(kept.stripe_price_id)
    assert made.unit_amount_decimal == Decimal("0.000008")  # cents per millionth of a core-hour
