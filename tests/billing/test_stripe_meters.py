"""Each plan's usage reaches Stripe on meters of its own, so a tenant subscribed to two plans
is billed each plan's usage once, on that plan's subscription."""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing import meter_events, stripe_sync, usage
from billing import services as billing_services
from billing.models import (
    Invoice,
    MeterEvent,
    Plan,
    Price,
    StripeMeter,
    StripePrice,
    Subscription,
    UsageRecord,
)
from billing.usage import UsageRow
from stripe_emulator import sign
from tests.billing.conftest import WEBHOOK_SECRET

pytestmark = pytest.mark.unsubscribed


@pytest.fixture
def second_plan(db):
    """A second plan pricing cpu too, at $0.02 an hour."""
    plan = Plan.objects.create(key="kv", name="Valkey", service="valkey")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.02"))
    return plan


def _page(owner_client, tenant, plan, request_id: str = "") -> str:
    """The Checkout page the Billing page sends the tenant to for `plan`."""
    response = owner_client.post(
        f"/t/{tenant.slug}/billing/subscribe/{plan.key}/",
        {"request_id": request_id or f"sub-{plan.key}"},
    )
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    return session_id


def _deliver(client, event: dict) -> None:
    body = json.dumps(event).encode()
    client.post(
        "/billing/stripe/webhook/", body, content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body, WEBHOOK_SECRET, int(time.time())),
    )  # fmt: skip


def _paid(client, emulator, session_id: str) -> None:
    emulator.complete_checkout(session_id)
    _deliver(client, emulator.events("checkout.session.completed")[-1])


def _subscribed(client, owner_client, tenant, emulator, plan) -> Subscription:
    _paid(client, emulator, _page(owner_client, tenant, plan))
    subscribed = Subscription.objects.get(tenant=tenant, plan=plan)
    assert subscribed.status == "active"
    return subscribed


def _this_hour():
    return timezone.now().replace(minute=0, second=0, microsecond=0)


def _cpu_used(tenant, core_hours: dict[Plan, str]) -> None:
    """This hour's cpu usage of one instance on each plan."""
    usage.record(_this_hour(), [
        UsageRow(tenant_id=tenant.pk, plan_id=plan.pk, instance_id=f"inst-{plan.key}",
                 instance_name=plan.key, dimension="cpu", unit="core", quantity=Decimal(quantity))
        for plan, quantity in core_hours.items()
    ])  # fmt: skip


def _cpu_billed(invoice: dict) -> Decimal:
    """Core-hours an emulator invoice bills on cpu prices."""
    cpu = set(
        StripePrice.objects.filter(price__dimension="cpu").values_list("stripe_price_id", flat=True)
    )
    return sum(
        (Decimal(line["quantity_decimal"]) / 1_000_000 for line in invoice["lines"]["data"]
         if line["pricing"]["price_details"]["price"] in cpu),
        Decimal(0),
    )  # fmt: skip


def test_a_tenant_on_two_plans_is_billed_each_plans_usage_once(
    client, owner_client, tenant, gw, emulator, customer, priced_plan, second_plan
):
    stripe_sync.catalog_sync(gw)
    pg = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    kv = _subscribed(client, owner_client, tenant, emulator, second_plan)
    _cpu_used(tenant, {priced_plan: "2.5", second_plan: "4"})
    meter_events.enqueue()
    assert meter_events.flush().sent == 2

    pg_invoice = emulator.close_period(pg.stripe_subscription_id)
    kv_invoice = emulator.close_period(kv.stripe_subscription_id)

    assert _cpu_billed(pg_invoice) == Decimal("2.5")
    assert _cpu_billed(kv_invoice) == Decimal("4")
    # 2.5 core-hours at $0.05 and 4 at $0.02: no plan bills the other's usage.
    assert (pg_invoice["total"], kv_invoice["total"]) == (13, 8)
    per_plan = StripeMeter.objects.filter(plan__isnull=False)
    assert set(per_plan.values_list("event_name", flat=True)) == {
        "opsdeck_pg_cpu", "opsdeck_pg_storage", "opsdeck_kv_cpu",
    }  # fmt: skip


def test_a_price_changed_before_the_plan_is_used_moves_its_subscribers_at_once(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    """No usage to price yet: the change applies to all of it, so at once (on a plan in use,
    from the next billing period: `test_price_changes`)."""
    stripe_sync.catalog_sync(gw)
    subscription = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    billing_services.plan_prices_replace(plan=priced_plan, currency="usd", prices=[
        {"dimension": "cpu", "unit": "core", "unit_price": "0.08"},
        {"dimension": "storage", "unit": "GiB", "time_unit": "month", "unit_price": "0.10"},
    ])  # fmt: skip

    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)

    new_price = StripePrice.objects.get(price__dimension="cpu").stripe_price_id
    moved = f"moved subscription item {subscription.stripe_subscription_id}: {new_price}"
    assert moved in out.getvalue()
    assert "1 subscription item put on the prices of their period." in out.getvalue()
    held = gw.subscription(subscription.stripe_subscription_id)
    assert new_price in {item.price.id for item in held["items"].data}
    _cpu_used(tenant, {priced_plan: "2.5"})
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    invoice = emulator.close_period(subscription.stripe_subscription_id)
    # 2.5 core-hours at the new $0.08, as the Billing page now shows: 20 cents.
    assert _cpu_billed(invoice) == Decimal("2.5") and invoice["total"] == 20
    # Running it again moves nothing.
    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)
    assert "moved" not in out.getvalue() and "0 created, 5 found." in out.getvalue()


def test_subscriptions_on_the_shared_meters_of_earlier_versions_move_to_their_plans(
    client, owner_client, tenant, gw, emulator, customer, priced_plan, second_plan
):
    # As earlier versions left the catalog: one meter per dimension, every plan's price on it.
    shared = {}
    for dimension in ("cpu", "storage"):
        meter = gw.client.v1.billing.meters.create({
            "display_name": f"Opsdeck {dimension}", "event_name": f"opsdeck_{dimension}",
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
            "value_settings": {"event_payload_key": "value"},
        })  # fmt: skip
        StripeMeter.objects.create(dimension=dimension, event_name=meter.event_name,
                                   meter_id=meter.id)  # fmt: skip
        shared[dimension] = meter.id
    for plan in (priced_plan, second_plan):
        gw.product_create(product_id=stripe_sync.product_id_for(plan), name=plan.name,
                          plan_key=plan.key)  # fmt: skip
    for price in Price.objects.select_related("plan"):
        created = gw.metered_price_create(
            lookup_key=stripe_sync.lookup_key_for(price),
            product_id=stripe_sync.product_id_for(price.plan),
            meter_id=shared[price.dimension], currency="usd",
            unit_amount_decimal=str(stripe_sync.unit_amount_decimal(price)), nickname="",
        )  # fmt: skip
        StripePrice.objects.create(
            price=price, stripe_product_id=created.product, stripe_price_id=created.id,
            lookup_key=created.lookup_key, unit_amount_decimal=created.unit_amount_decimal,
        )  # fmt: skip
    pg = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    kv = _subscribed(client, owner_client, tenant, emulator, second_plan)
    # An hour metered before the upgrade, still waiting in the outbox for the shared meter.
    usage.record(_this_hour(), [
        UsageRow(tenant_id=tenant.pk, plan_id=second_plan.pk, instance_id="inst-old",
                 instance_name="old", dimension="cpu", unit="core", quantity=Decimal("1"))
    ])  # fmt: skip
    MeterEvent.objects.create(
        usage_record=UsageRecord.objects.get(), identifier="opsdeck-usage-waiting",
        customer_id=customer.customer_id, event_name="opsdeck_cpu", value="1000000",
        timestamp=timezone.now(), next_attempt_at=timezone.now(),  # in the Stripe period
    )  # fmt: skip

    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)

    assert out.getvalue().count("moved subscription item") == 3  # pg's cpu and storage, kv's cpu
    _cpu_used(tenant, {priced_plan: "2.5", second_plan: "4"})
    meter_events.enqueue()
    assert meter_events.flush().sent == 3
    assert _cpu_billed(emulator.close_period(pg.stripe_subscription_id)) == Decimal("2.5")
    assert _cpu_billed(emulator.close_period(kv.stripe_subscription_id)) == Decimal("5")


def test_a_checkout_page_made_before_a_price_changed_is_not_offered_again(
    owner_client, tenant, gw, emulator, customer, priced_plan
):
    stripe_sync.catalog_sync(gw)
    stale = _page(owner_client, tenant, priced_plan)
    Price.objects.filter(plan=priced_plan, dimension="cpu").update(unit_price=Decimal("0.08"))
    stripe_sync.catalog_sync(gw)

    fresh = _page(owner_client, tenant, priced_plan, request_id="continue")  # Continue to payment

    assert fresh != stale and gw.checkout_session(stale).status == "expired"
    asked = gw.checkout_session(fresh).metadata.to_dict()["opsdeck_prices"].split()
    assert StripePrice.objects.get(price__dimension="cpu").stripe_price_id in asked


def test_a_checkout_page_made_before_a_price_changed_and_paid_bills_the_new_price(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    """Kept open in a tab through the change, then paid: the subscription it starts is put on
    the plan's prices as they are now when its webhook arrives."""
    stripe_sync.catalog_sync(gw)
    stale = _page(owner_client, tenant, priced_plan)
    Price.objects.filter(plan=priced_plan, dimension="cpu").update(unit_price=Decimal("0.08"))
    stripe_sync.catalog_sync(gw)

    _paid(client, emulator, stale)

    subscription = Subscription.objects.get(tenant=tenant, plan=priced_plan)
    assert subscription.status == "active"
    _cpu_used(tenant, {priced_plan: "2.5"})
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    invoice = emulator.close_period(subscription.stripe_subscription_id)
    assert invoice["total"] == 20  # 2.5 core-hours at the new $0.08
    # Its lines are read as the plan's prices, also those on the replaced price.
    assert _cpu_billed(invoice) == Decimal("2.5")


def test_a_price_changed_back_and_forth_within_a_day_moves_its_subscribers_each_time(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    stripe_sync.catalog_sync(gw)
    subscription = _subscribed(client, owner_client, tenant, emulator, priced_plan)

    for cents in ("0.08", "0.05", "0.08"):  # Stripe keeps an idempotency key for 24 hours
        Price.objects.filter(plan=priced_plan, dimension="cpu").update(unit_price=Decimal(cents))
        stripe_sync.catalog_sync(gw)

        current = StripePrice.objects.get(price__dimension="cpu").stripe_price_id
        held = gw.subscription(subscription.stripe_subscription_id)
        assert current in {item.price.id for item in held["items"].data}, cents
        assert len(held["items"].data) == 2
    _cpu_used(tenant, {priced_plan: "2.5"})
    meter_events.enqueue()
    meter_events.flush()
    invoice = emulator.close_period(subscription.stripe_subscription_id)
    assert invoice["total"] == 20  # 2.5 core-hours at $0.08


def test_a_dimension_dropped_and_priced_again_is_billed_again(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    stripe_sync.catalog_sync(gw)
    subscription = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    cpu = {"dimension": "cpu", "unit": "core", "unit_price": "0.05"}
    storage = {"dimension": "storage", "unit": "GiB", "time_unit": "month", "unit_price": "0.10"}

    for prices in ([storage], [cpu, storage], [storage], [cpu, storage]):
        billing_services.plan_prices_replace(plan=priced_plan, currency="USD", prices=prices)
        stripe_sync.catalog_sync(gw)

        held = gw.subscription(subscription.stripe_subscription_id)
        assert len(held["items"].data) == len(prices), prices


def test_a_price_a_plan_adds_is_added_to_its_subscriptions(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    stripe_sync.catalog_sync(gw)
    subscription = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    Price.objects.create(
        plan=priced_plan, dimension="memory", unit="GiB", unit_price=Decimal("0.01")
    )

    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)

    memory = StripePrice.objects.get(price__dimension="memory").stripe_price_id
    assert f"added subscription item {subscription.stripe_subscription_id}: {memory}" in (
        out.getvalue()
    )
    held = gw.subscription(subscription.stripe_subscription_id)
    assert memory in {item.price.id for item in held["items"].data}


def test_an_invoice_line_on_a_replaced_price_is_read_as_that_prices_dimension(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    stripe_sync.catalog_sync(gw)
    subscription = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    _cpu_used(tenant, {priced_plan: "2.5"})
    meter_events.enqueue()
    meter_events.flush()
    emulator.close_period(subscription.stripe_subscription_id)  # a draft, on the old price
    Price.objects.filter(plan=priced_plan, dimension="cpu").update(unit_price=Decimal("0.08"))
    stripe_sync.catalog_sync(gw)

    _deliver(client, emulator.events("invoice.created")[-1])

    lines = {line.dimension: line for line in Invoice.objects.get().lines.all()}
    assert lines.keys() == {"cpu", "storage"}  # no "other"
    assert lines["cpu"].quantity == Decimal("2.5") and lines["cpu"].unit_price == Decimal("0.05")


def test_prices_changed_twice_by_the_plan_leave_each_dimension_billed_once_at_its_price(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    """A page made before two price changes (each a new spec loaded), paid: its cpu item moves
    to the current price, and no second cpu item is added beside it."""
    stripe_sync.catalog_sync(gw)
    stale = _page(owner_client, tenant, priced_plan)
    for cents in ("0.08", "0.09"):
        billing_services.plan_prices_replace(plan=priced_plan, currency="USD", prices=[
            {"dimension": "cpu", "unit": "core", "unit_price": cents},
            {"dimension": "storage", "unit": "GiB", "time_unit": "month", "unit_price": "0.10"},
        ])  # fmt: skip
        stripe_sync.catalog_sync(gw)

    _paid(client, emulator, stale)

    subscription = Subscription.objects.get(tenant=tenant, plan=priced_plan)
    held = gw.subscription(subscription.stripe_subscription_id)
    cpu = StripePrice.objects.get(price__dimension="cpu")
    assert len(held["items"].data) == 2 and cpu.stripe_price_id in {
        item.price.id for item in held["items"].data
    }
    assert len(cpu.replaced_price_ids) == 2  # both earlier prices, kept with the price
    _cpu_used(tenant, {priced_plan: "1"})
    meter_events.enqueue()
    meter_events.flush()
    assert emulator.close_period(subscription.stripe_subscription_id)["total"] == 9


def test_a_subscription_stripe_no_longer_has_does_not_stop_the_sync(
    client, owner_client, tenant, gw, emulator, customer, priced_plan, second_plan
):
    stripe_sync.catalog_sync(gw)
    Subscription.objects.create(
        tenant=tenant, plan=priced_plan, status="active", stripe_subscription_id="sub_gone"
    )
    kv = _subscribed(client, owner_client, tenant, emulator, second_plan)
    Price.objects.create(plan=second_plan, dimension="memory", unit="GiB", unit_price="0.01")

    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)

    memory = StripePrice.objects.get(price__plan=second_plan, price__dimension="memory")
    held = gw.subscription(kv.stripe_subscription_id)
    assert memory.stripe_price_id in {item.price.id for item in held["items"].data}


def test_a_price_the_plan_no_longer_has_is_taken_off_its_subscriptions(
    client, owner_client, tenant, gw, emulator, customer, priced_plan
):
    stripe_sync.catalog_sync(gw)
    subscription = _subscribed(client, owner_client, tenant, emulator, priced_plan)
    storage = StripePrice.objects.get(price__dimension="storage").stripe_price_id
    billing_services.plan_prices_replace(plan=priced_plan, currency="USD", prices=[
        {"dimension": "cpu", "unit": "core", "unit_price": "0.05"},
    ])  # fmt: skip

    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)

    assert f"removed subscription item {subscription.stripe_subscription_id}: {storage}" in (
        out.getvalue()
    )
    held = gw.subscription(subscription.stripe_subscription_id)
    assert storage not in {item.price.id for item in held["items"].data}
    assert len(held["items"].data) == 1  # cpu's
