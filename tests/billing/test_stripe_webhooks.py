"""`POST /billing/stripe/webhook/`: verified, stored once, acted on with what Stripe holds now."""

from __future__ import annotations

import json
import time

import pytest
from django.urls import reverse

from accounts.models import Tenant
from billing import stripe_sync, webhooks
from billing.models import Plan, StripeCustomer, StripeEvent, Subscription
from stripe_emulator import sign
from tests.billing.conftest import WEBHOOK_SECRET

URL = "/billing/stripe/webhook/"


def _post(client, event: dict, *, secret: str = WEBHOOK_SECRET, body: bytes | None = None):
    body = json.dumps(event).encode() if body is None else body
    return client.post(
        URL,
        body,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body, secret, int(time.time())),
    )


@pytest.fixture
def subscribed(gw, emulator, tenant):
    """A tenant that went through Checkout: a customer, a metered price, a subscription."""
    ours = Subscription.objects.get(tenant=tenant, plan=_plan())
    return _checkout(gw, emulator, _metered_price(gw), reference=tenant.pk, ours=ours.pk)


def _plan() -> Plan:
    """A plan, which every tenant is subscribed to (`tests/conftest.py`)."""
    plan, _ = Plan.objects.get_or_create(key="pg", name="PostgreSQL", service="postgresql")
    return plan


def _metered_price(gw) -> str:
    meter = gw.client.v1.billing.meters.create(
        {
            "display_name": "cpu",
            "event_name": "opsdeck_cpu",
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    return gw.client.v1.prices.create(
        {
            "currency": "usd",
            "unit_amount_decimal": "0.000005",
            "product_data": {"name": "cpu"},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
        }
    ).id


def _checkout(gw, emulator, price_id: str, *, reference, ours=None):
    """A paid checkout page of the Stripe account naming `reference`, and our subscription
    `ours` in its metadata as Opsdeck's pages do (None: a page made elsewhere)."""
    params = {
        "mode": "subscription",
        "line_items": [{"price": price_id}],
        "client_reference_id": str(reference),
        "success_url": "https://opsdeck.test/done",
        "cancel_url": "https://opsdeck.test/",
    }
    if ours is not None:
        params["metadata"] = {"opsdeck_subscription": str(ours)}
    session = gw.client.v1.checkout.sessions.create(params)
    emulator.complete_checkout(session.id)
    return gw.client.v1.checkout.sessions.retrieve(session.id)


@pytest.fixture
def mirrored(monkeypatch):
    """What the subscription seam was handed, in order (then doing what it does)."""
    seen: list[dict] = []
    real = stripe_sync.subscription_mirror

    def record(subscription, gw):
        seen.append(stripe_sync.subscription_values(subscription))
        return real(subscription, gw)

    monkeypatch.setattr(stripe_sync, "subscription_mirror", record)
    return seen


def _event(emulator, event_type: str, index: int = -1) -> dict:
    return emulator.events(event_type)[index]


def test_checkout_completed_remembers_the_tenants_customer(
    stripe_settings, emulator, subscribed, tenant, client, mirrored
):
    answer = _post(client, _event(emulator, "checkout.session.completed"))

    assert answer.status_code == 200
    assert StripeCustomer.objects.get(tenant=tenant).customer_id == subscribed.customer
    stored = StripeEvent.objects.get()
    assert stored.type == "checkout.session.completed" and stored.processed_at is not None
    assert stored.payload["data"]["object"]["id"] == subscribed.id
    assert [m["stripe_subscription_id"] for m in mirrored] == [subscribed.subscription]
    assert mirrored[0]["status"] == "active" and len(mirrored[0]["price_ids"]) == 1
    assert mirrored[0]["current_period_start"] < mirrored[0]["current_period_end"]


def test_a_bad_signature_is_refused_and_nothing_is_stored(
    stripe_settings, emulator, subscribed, client
):
    event = _event(emulator, "checkout.session.completed")

    assert _post(client, event, secret="whsec_someone_else").status_code == 400
    unsigned = client.post(URL, json.dumps(event), content_type="application/json")
    assert unsigned.status_code == 400
    assert _post(client, event, body=b"{not json").status_code == 400
    assert StripeEvent.objects.count() == 0 and StripeCustomer.objects.count() == 0


def test_only_post_is_answered(stripe_settings, client):
    assert client.get(URL).status_code == 405


def test_a_replayed_event_changes_nothing(
    stripe_settings, emulator, subscribed, client, monkeypatch
):
    calls = []
    monkeypatch.setitem(
        webhooks.HANDLERS,
        "checkout.session.completed",
        lambda event, gw: calls.append(event.event_id),
    )
    event = _event(emulator, "checkout.session.completed")
    assert _post(client, event).status_code == 200
    first = StripeEvent.objects.get()

    again = _post(client, event)

    assert again.status_code == 200
    assert calls == [event["id"]]
    assert list(StripeEvent.objects.values("processed_at", "received_at")) == [
        {"processed_at": first.processed_at, "received_at": first.received_at}
    ]


def test_a_failing_handler_answers_500_and_runs_again_on_the_retry(
    stripe_settings, emulator, subscribed, client, monkeypatch
):
    calls = []

    def flaky(event, gw):
        calls.append(event.event_id)
        if len(calls) == 1:
            StripeCustomer.objects.create(
                tenant_id=subscribed.client_reference_id, customer_id="cus_half_done"
            )
            raise RuntimeError("database hiccup")
        webhooks.checkout_session_completed(event, gw)

    monkeypatch.setitem(webhooks.HANDLERS, "checkout.session.completed", flaky)
    event = _event(emulator, "checkout.session.completed")

    failed = _post(client, event)

    assert failed.status_code == 500
    stored = StripeEvent.objects.get()
    assert stored.processed_at is None and stored.error == "RuntimeError: database hiccup"
    assert StripeCustomer.objects.count() == 0  # the failed handler's writes are undone

    retried = _post(client, event)

    assert retried.status_code == 200 and len(calls) == 2
    stored.refresh_from_db()
    assert stored.processed_at is not None and stored.error == ""
    assert StripeCustomer.objects.get().customer_id == subscribed.customer


def test_events_delivered_out_of_order_act_on_the_current_subscription(
    stripe_settings, emulator, gw, subscribed, client, mirrored
):
    subscriptions = gw.client.v1.subscriptions
    subscriptions.update(subscribed.subscription, {"cancel_at_period_end": True})
    subscriptions.update(subscribed.subscription, {"cancel_at_period_end": False})
    older, newer = emulator.events("customer.subscription.updated")[-2:]
    assert older["data"]["object"]["cancel_at_period_end"] is True

    assert _post(client, newer).status_code == 200
    assert _post(client, older).status_code == 200

    # Both acted on Stripe's subscription as it is now, not on the older event's copy.
    assert [m["cancel_at_period_end"] for m in mirrored] == [False, False]
    assert StripeEvent.objects.count() == 2


def test_a_late_event_about_a_cancelled_subscription_sees_it_cancelled(
    stripe_settings, emulator, gw, subscribed, client, mirrored
):
    gw.client.v1.subscriptions.update(subscribed.subscription, {"cancel_at_period_end": True})
    gw.client.v1.subscriptions.cancel(subscribed.subscription)
    deleted = _event(emulator, "customer.subscription.deleted")
    updated = _event(emulator, "customer.subscription.updated")

    assert _post(client, deleted).status_code == 200
    assert _post(client, updated).status_code == 200

    assert [m["status"] for m in mirrored] == ["cancelled", "cancelled"]
    assert stripe_sync.subscription_status_next("cancelled", "active") == "cancelled"
    assert stripe_sync.subscription_status_next("active", "past_due") == "past_due"


def test_invoice_events_act_on_the_invoice_stripe_holds_now(
    stripe_settings, emulator, gw, subscribed, client, monkeypatch
):
    seen = []
    monkeypatch.setattr(
        stripe_sync,
        "invoice_mirror",
        lambda invoice, lines: seen.append(stripe_sync.invoice_values(invoice)),
    )
    invoice = emulator.close_period(subscribed.subscription)
    emulator.finalize_invoice(invoice["id"])
    emulator.pay_invoice(invoice["id"])

    for event_type in ("invoice.created", "invoice.finalized", "invoice.paid"):
        assert _post(client, _event(emulator, event_type)).status_code == 200

    assert [v["status"] for v in seen] == ["paid", "paid", "paid"]
    assert seen[0]["stripe_subscription_id"] == subscribed.subscription
    assert seen[0]["hosted_invoice_url"]


def test_an_event_without_a_handler_is_recorded(stripe_settings, emulator, subscribed, client):
    event = _event(emulator, "customer.created")  # Checkout made the customer

    assert _post(client, event).status_code == 200
    stored = StripeEvent.objects.get()
    assert stored.type == event["type"] and stored.processed_at is not None


def test_without_stripe_the_endpoint_is_not_there(settings, client):
    settings.STRIPE_API_KEY = ""

    assert (
        client.post(reverse("stripe_webhook"), b"{}", content_type="application/json").status_code
        == 404
    )


def test_without_a_webhook_secret_no_event_is_accepted(
    stripe_settings, emulator, subscribed, client
):
    stripe_settings.STRIPE_WEBHOOK_SECRET = ""

    assert (
        _post(client, _event(emulator, "checkout.session.completed"), secret="").status_code == 400
    )
    assert StripeEvent.objects.count() == 0


# Signed, as only Stripe (or whoever holds the secret) can send them, but not events.
NOT_EVENTS = {
    "a list": b"[1, 2]",
    "a string": b'"hi"',
    "null": b"null",
    "no id": b'{"type": "invoice.paid", "created": 1}',
    "an id too long": json.dumps({"id": "e" * 256, "type": "x", "created": 1}).encode(),
    "a NUL in the id": b'{"id": "evt_\\u0000", "type": "x", "created": 1}',
    "a list for the type": b'{"id": "evt_1", "type": ["a"], "created": 1}',
    "no type": b'{"id": "evt_1", "type": null, "created": 1}',
    "no created": b'{"id": "evt_1", "type": "x"}',
    "a created out of range": b'{"id": "evt_1", "type": "x", "created": 1000000000000000}',
}


@pytest.mark.parametrize("body", NOT_EVENTS.values(), ids=NOT_EVENTS.keys())
def test_a_signed_body_that_is_no_event_is_refused_and_nothing_is_stored(
    db, stripe_settings, client, body
):
    response = _post(client, {}, body=body)

    assert response.status_code == 400
    assert not StripeEvent.objects.exists()


@pytest.mark.parametrize("text", ["a\\u0000b", "\\ud800"])
def test_an_event_holding_text_postgresql_cannot_store_is_stored_without_it(
    stripe_settings, emulator, subscribed, client, text
):
    # A customer-entered name with a NUL, or a lone surrogate: JSON escapes both, jsonb
    # refuses both. The handler reads Stripe's objects again; the copy keeps the rest.
    event = _event(emulator, "customer.created")
    body = json.dumps(event).replace('"object": "event"', f'"object": "event", "note": "{text}"')

    response = _post(client, {}, body=body.encode())

    assert response.status_code == 200
    stored = StripeEvent.objects.get()
    assert stored.processed_at is not None and stored.payload["id"] == event["id"]
    assert "\x00" not in stored.payload["note"]


def test_an_event_whose_object_stripe_no_longer_holds_is_done_with(
    stripe_settings, emulator, subscribed, client
):
    # A draft invoice deleted since: Stripe answers 404 for it on every delivery, for days.
    event = _event(emulator, "checkout.session.completed")
    event["data"]["object"]["id"] = "cs_deleted_since"
    event["id"] = "evt_gone"

    response = _post(client, event)

    assert response.status_code == 200
    stored = StripeEvent.objects.get(event_id="evt_gone")
    assert stored.processed_at is not None and stored.error == ""
    assert not StripeCustomer.objects.exists()


@pytest.mark.parametrize("written", ["²", "\u0661", "+{pk}", " {pk}", "{pk}_0"])
def test_a_checkout_naming_no_tenant_in_plain_digits_remembers_no_customer(tenant, written):
    # Our checkout writes the tenant's id in plain digits; nothing else names one ("²" is a
    # digit to Python's isdigit, and int() then fails on it).
    reference = written.format(pk=tenant.pk)
    session = type("Session", (), {"client_reference_id": reference, "customer": "cus_x"})()

    assert stripe_sync.checkout_completed(session) is None
    assert not StripeCustomer.objects.exists()


@pytest.mark.parametrize("named", ["nothing", "another tenant's subscription"])
def test_a_checkout_opsdeck_did_not_make_binds_no_customer_to_the_tenant_it_names(
    stripe_settings, emulator, gw, tenant, make_user, client, named
):
    """Another sale of the same Stripe account: a payment link lets its buyer set the
    reference in its address, and it names a number that is a tenant's id."""
    other = Tenant.objects.create(name="Globex", slug="globex")
    elsewhere = Subscription.objects.get(tenant=other, plan=_plan())
    ours = elsewhere.pk if named != "nothing" else None
    session = _checkout(gw, emulator, _metered_price(gw), reference=tenant.pk, ours=ours)

    answer = _post(client, _event(emulator, "checkout.session.completed"))

    assert answer.status_code == 200
    assert StripeEvent.objects.get().processed_at is not None
    assert not StripeCustomer.objects.filter(customer_id=session.customer).exists()
