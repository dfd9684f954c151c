"""Checkout's hosted page, the billing portal, subscription changes, and signed webhooks."""

from __future__ import annotations

import calendar
from datetime import UTC, datetime

import pytest
import requests
import stripe

from .conftest import WEBHOOK_SECRET, subscribed


@pytest.fixture
def session(client, metered):
    return client.v1.checkout.sessions.create(
        {
            "mode": "subscription",
            "customer": metered["customer"].id,
            "line_items": [{"price": metered["price"].id}],
            "client_reference_id": "tenant-7",
            "success_url": "https://opsdeck.test/billing/done?session={CHECKOUT_SESSION_ID}",
            "cancel_url": "https://opsdeck.test/billing",
            "metadata": {"tenant": "7"},
        }
    )


def _pay(session):
    """Open the hosted page, then press Pay (the browser would follow the 303 returned)."""
    page = requests.get(session.url, allow_redirects=False, timeout=10)
    assert page.status_code == 200 and ">Pay</button>" in page.text
    return requests.post(session.url, data={"pay": "1"}, allow_redirects=False, timeout=10)


def _month_bounds(timestamp):
    moment = datetime.fromtimestamp(timestamp, UTC)
    days = calendar.monthrange(moment.year, moment.month)[1]
    start = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    return int(start.timestamp()), int(start.timestamp()) + days * 86400


def test_a_checkout_anchored_to_the_first_of_the_month_bills_calendar_months(client, metered):
    anchored = client.v1.checkout.sessions.create({
        "mode": "subscription", "customer": metered["customer"].id,
        "line_items": [{"price": metered["price"].id}],
        "success_url": "https://opsdeck.test/done", "cancel_url": "https://opsdeck.test/",
        "subscription_data": {
            "billing_cycle_anchor_config": {"day_of_month": 1, "hour": 0, "minute": 0},
        },
    })  # fmt: skip

    _pay(anchored)

    subscription = client.v1.subscriptions.retrieve(
        client.v1.checkout.sessions.retrieve(anchored.id).subscription
    )
    item = subscription["items"].data[0]
    # A first, shorter period from the start to the next 1st, whole calendar months after.
    assert item.current_period_start == subscription.created == subscription.start_date
    assert item.current_period_end == _month_bounds(subscription.created)[1]
    assert subscription.billing_cycle_anchor == item.current_period_end
    with pytest.raises(stripe.InvalidRequestError, match="1st of the month"):
        client.v1.checkout.sessions.create({
            "mode": "subscription", "customer": metered["customer"].id,
            "line_items": [{"price": metered["price"].id}],
            "success_url": "https://opsdeck.test/done", "cancel_url": "https://opsdeck.test/",
            "subscription_data": {"billing_cycle_anchor_config": {"day_of_month": 15}},
        })  # fmt: skip


def test_paying_on_the_checkout_page_starts_the_subscription(client, emulator, session):
    assert session.id.startswith("cs_") and session.url.startswith(emulator.url)
    assert session.status == "open" and session.subscription is None

    answer = _pay(session)

    assert answer.status_code == 303
    assert answer.headers["Location"] == (f"https://opsdeck.test/billing/done?session={session.id}")
    done = client.v1.checkout.sessions.retrieve(session.id)
    assert (done.status, done.payment_status) == ("complete", "paid")
    subscription = client.v1.subscriptions.retrieve(done.subscription)
    assert subscription.status == "active" and subscription.customer == session.customer
    item = subscription["items"].data[0]
    assert item.id.startswith("si_") and item.price.id == session_price(client, session)
    # Stripe's default billing cycle: a month from the start, on its day and time.
    start = datetime.fromtimestamp(subscription.created, UTC)
    year, month = start.year + start.month // 12, start.month % 12 + 1
    day = min(start.day, calendar.monthrange(year, month)[1])  # the 31st: the month's last
    a_month_on = start.replace(year=year, month=month, day=day)
    assert item.current_period_start == subscription.created
    assert item.current_period_end == int(a_month_on.timestamp())
    listed = client.v1.subscriptions.list({"customer": session.customer})
    assert [s.id for s in listed.data] == [subscription.id]


def session_price(client, session):
    """The price the session's single line item was created with."""
    return client.v1.prices.list({"lookup_keys": ["vcpu_hours"]}).data[0].id


def test_paying_twice_starts_one_subscription(client, session):
    _pay(session)
    # A completed session's page sends the browser on to success_url; Pay again changes nothing.
    assert requests.get(session.url, allow_redirects=False, timeout=10).status_code == 303
    again = requests.post(session.url, data={"pay": "1"}, allow_redirects=False, timeout=10)
    assert again.status_code == 303
    assert len(client.v1.subscriptions.list({"customer": session.customer}).data) == 1


def test_checkout_sends_signed_webhooks(emulator, receiver, session):
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)

    _pay(session)
    emulator.wait_for_webhooks()

    events = receiver.verified()
    assert [e.type for e in events] == [
        "customer.subscription.created",
        "checkout.session.completed",
    ]
    completed = events[1].data.object
    assert completed.id == session.id and completed.client_reference_id == "tenant-7"
    assert completed.subscription == events[0].data.object.id
    assert all(
        e.id.startswith("evt_") and e.api_version == emulator.events()[0]["api_version"]
        for e in events
    )


def test_a_webhook_signed_with_another_secret_does_not_verify(emulator, receiver, session):
    emulator.set_webhook(receiver.url, "whsec_someone_else")
    _pay(session)
    emulator.wait_for_webhooks()

    with pytest.raises(stripe.SignatureVerificationError):
        receiver.verified()


def test_a_failed_delivery_is_retried(emulator, receiver, session):
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET, retry_delay=0.01)
    receiver.statuses = [500, 503]

    _pay(session)
    emulator.wait_for_webhooks()

    assert receiver.types() == ["customer.subscription.created", "checkout.session.completed"]
    first = [d for d in emulator.deliveries() if d["type"] == "customer.subscription.created"]
    assert [(d["attempt"], d["status"]) for d in first] == [(1, 500), (2, 503), (3, 200)]


def test_replay_delivers_the_same_event_again(emulator, receiver, session):
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)
    _pay(session)
    emulator.wait_for_webhooks()
    completed = emulator.events("checkout.session.completed")[0]

    attempt = emulator.replay(completed["id"])

    assert attempt["ok"]
    ids = [e.id for e in receiver.verified()]
    assert ids.count(completed["id"]) == 2


def test_held_events_are_delivered_in_the_order_asked(emulator, receiver, session):
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET, auto_deliver=False)
    _pay(session)
    assert receiver.deliveries == []
    created, completed = emulator.events()

    emulator.deliver([completed["id"], created["id"]])

    assert receiver.types() == ["checkout.session.completed", "customer.subscription.created"]
    assert [e.id for e in receiver.verified()] == [completed["id"], created["id"]]


def test_metered_line_items_take_no_quantity(client, metered):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.checkout.sessions.create(
            {
                "mode": "subscription",
                "customer": metered["customer"].id,
                "line_items": [{"price": metered["price"].id, "quantity": 1}],
                "success_url": "https://opsdeck.test/done",
            }
        )
    assert exc.value.param == "line_items[0][quantity]"
    assert client.v1.checkout.sessions.list().data == []


def test_a_session_without_customer_creates_one_from_its_email(client, emulator, metered):
    session = client.v1.checkout.sessions.create(
        {
            "mode": "subscription",
            "customer_email": "new@example.com",
            "line_items": [{"price": metered["price"].id}],
        }
    )

    done = emulator.complete_checkout(session.id)

    customer = client.v1.customers.retrieve(done["customer"])
    assert customer.email == "new@example.com"
    assert client.v1.subscriptions.retrieve(done["subscription"]).customer == customer.id
    assert [e["type"] for e in emulator.events()] == [
        "customer.created",
        "customer.subscription.created",
        "checkout.session.completed",
    ]


def test_portal_page_links_back_to_the_return_url(client, metered):
    portal = client.v1.billing_portal.sessions.create(
        {"customer": metered["customer"].id, "return_url": "https://opsdeck.test/billing"}
    )

    assert portal.id.startswith("bps_")
    page = requests.get(portal.url, timeout=10)
    assert page.status_code == 200 and "href='https://opsdeck.test/billing'" in page.text


def test_update_and_cancel_send_their_events(client, emulator, receiver, session):
    _pay(session)
    subscription_id = client.v1.checkout.sessions.retrieve(session.id).subscription
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)

    updated = client.v1.subscriptions.update(subscription_id, {"cancel_at_period_end": True})
    cancelled = client.v1.subscriptions.cancel(subscription_id)
    emulator.wait_for_webhooks()

    assert updated.cancel_at_period_end and updated.cancel_at is not None
    assert (cancelled.status, cancelled.canceled_at is not None) == ("canceled", True)
    events = receiver.verified()
    assert [e.type for e in events] == [
        "customer.subscription.updated",
        "customer.subscription.deleted",
    ]
    assert events[0].data.previous_attributes.cancel_at_period_end is False
    assert client.v1.subscriptions.list({"customer": session.customer}).data == []
    every = client.v1.subscriptions.list({"customer": session.customer, "status": "all"})
    assert [s.id for s in every.data] == [subscription_id]


def test_an_item_moved_to_another_price_is_billed_at_it_and_bad_moves_change_nothing(
    client, emulator, metered
):
    subscription = subscribed(client, emulator, metered)
    (item,) = subscription["items"].data
    dearer = client.v1.prices.create({
        "currency": "usd", "unit_amount_decimal": "2", "product_data": {"name": "vCPU hours"},
        "recurring": {"interval": "month", "usage_type": "metered", "meter": metered["meter"].id},
    })  # fmt: skip
    euros = client.v1.prices.create({
        "currency": "eur", "unit_amount_decimal": "2", "product_data": {"name": "vCPU hours"},
        "recurring": {"interval": "month", "usage_type": "metered", "meter": metered["meter"].id},
    })  # fmt: skip
    for bad, param in [
        ({"id": "si_unknown", "price": dearer.id}, "items[0][id]"),
        ({"id": item.id, "price": euros.id}, "items[0][price]"),
        ({"id": item.id, "price": "price_unknown"}, "items[0][price]"),
    ]:
        with pytest.raises(stripe.InvalidRequestError) as refused:
            client.v1.subscriptions.update(subscription.id, {"items": [bad]})
        assert refused.value.param == param
    assert client.v1.subscriptions.retrieve(subscription.id)["items"].data[0].price.id == (
        metered["price"].id
    )

    moved = client.v1.subscriptions.update(
        subscription.id,
        {"items": [{"id": item.id, "price": dearer.id}], "proration_behavior": "none"},
    )
    client.v1.billing.meter_events.create(
        {"event_name": "vcpu_hours", "payload": {"stripe_customer_id": metered["customer"].id,
                                                 "value": "10"}}
    )  # fmt: skip
    invoice = emulator.close_period(subscription.id)

    assert moved["items"].data[0].price.id == dearer.id
    assert invoice["total"] == 20  # 10 units at the 2 cents the item holds when invoiced
    client.v1.subscriptions.cancel(subscription.id)
    with pytest.raises(stripe.InvalidRequestError, match="canceled subscription"):
        client.v1.subscriptions.update(
            subscription.id, {"items": [{"id": item.id, "price": metered["price"].id}]}
        )


def test_a_metered_item_added_to_a_subscription_is_billed_and_bad_additions_change_nothing(
    client, emulator, metered
):
    subscription = subscribed(client, emulator, metered)
    memory = client.v1.billing.meters.create({
        "display_name": "GiB hours", "event_name": "gib_hours",
        "default_aggregation": {"formula": "sum"},
        "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
        "value_settings": {"event_payload_key": "value"},
    })  # fmt: skip
    added = client.v1.prices.create({
        "currency": "usd", "unit_amount_decimal": "3", "product_data": {"name": "GiB hours"},
        "recurring": {"interval": "month", "usage_type": "metered", "meter": memory.id},
    })  # fmt: skip
    licensed = client.v1.prices.create({
        "currency": "usd", "unit_amount": 500, "product_data": {"name": "Support"},
        "recurring": {"interval": "month"},
    })  # fmt: skip
    for bad in (metered["price"].id, licensed.id):
        with pytest.raises(stripe.InvalidRequestError) as refused:
            client.v1.subscriptions.update(subscription.id, {"items": [{"price": bad}]})
        assert refused.value.param == "items[0][price]"
    assert len(client.v1.subscriptions.retrieve(subscription.id)["items"].data) == 1

    grown = client.v1.subscriptions.update(subscription.id, {"items": [{"price": added.id}]})
    client.v1.billing.meter_events.create(
        {"event_name": "gib_hours", "payload": {"stripe_customer_id": metered["customer"].id,
                                                "value": "4"}}
    )  # fmt: skip

    assert [item.price.id for item in grown["items"].data] == [metered["price"].id, added.id]
    assert emulator.close_period(subscription.id)["total"] == 12  # 4 units at 3 cents


def test_an_item_removed_from_a_subscription_bills_no_more_and_its_last_item_stays(
    client, emulator, metered
):
    subscription = subscribed(client, emulator, metered)
    (item,) = subscription["items"].data

    with pytest.raises(stripe.InvalidRequestError, match="at least one item") as refused:
        client.v1.subscriptions.update(
            subscription.id, {"items": [{"id": item.id, "deleted": True}]}
        )

    assert refused.value.param == "items[0][deleted]"
    assert len(client.v1.subscriptions.retrieve(subscription.id)["items"].data) == 1
