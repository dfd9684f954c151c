"""Closing a period: invoices priced from the recorded meter events, and their payment events."""

from __future__ import annotations

import pytest
import requests

from stripe_emulator import StripeError

from .conftest import WEBHOOK_SECRET, subscribed


@pytest.fixture
def subscription(client, emulator, metered):
    return subscribed(client, emulator, metered)


def _usage(client, subscription, values):
    """Meter events inside the subscription's current period (its first minutes, which are
    always in the past and within Stripe's 35 days)."""
    start = subscription["items"].data[0].current_period_start
    for n, value in enumerate(values):
        client.v1.billing.meter_events.create(
            {
                "event_name": "vcpu_hours",
                "payload": {"stripe_customer_id": subscription.customer, "value": value},
                "identifier": f"{subscription.id}-{n}",
                "timestamp": start + 60 + n,
            }
        )


def test_an_invoice_bills_the_periods_usage_times_the_price(client, emulator, subscription):
    _usage(client, subscription, ["1000", "250.5", "31"])  # 1281.5 units at 0.5 cent

    invoice = emulator.close_period(subscription.id)

    line = invoice["lines"]["data"][0]
    assert (line["quantity_decimal"], line["amount"]) == ("1281.5", 641)  # 640.75, rounded
    assert (invoice["total"], invoice["amount_due"], invoice["status"]) == (641, 641, "draft")
    item = subscription["items"].data[0]
    assert (invoice["period_start"], invoice["period_end"]) == (
        item.current_period_start,
        item.current_period_end,
    )
    fetched = client.v1.invoices.retrieve(invoice["id"])
    assert fetched.parent.subscription_details.subscription == subscription.id
    listed = client.v1.invoices.list({"subscription": subscription.id, "status": "draft"})
    assert [i.id for i in listed.data] == [invoice["id"]]


def test_usage_outside_the_period_or_cancelled_is_not_billed(client, emulator, subscription):
    _usage(client, subscription, ["10", "20"])
    client.v1.billing.meter_event_adjustments.create(
        {
            "event_name": "vcpu_hours",
            "type": "cancel",
            "cancel": {"identifier": f"{subscription.id}-1"},
        }
    )

    first = emulator.close_period(subscription.id)
    second = emulator.close_period(subscription.id)

    assert first["total"] == 5  # 10 units at 0.5 cent
    assert second["total"] == 0 and second["period_start"] == first["period_end"]
    moved = client.v1.subscriptions.retrieve(subscription.id)["items"].data[0]
    assert moved.current_period_start == second["period_end"]


def test_finalize_and_pay_send_their_events(client, emulator, receiver, subscription):
    _usage(client, subscription, ["200"])
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)

    invoice = emulator.close_period(subscription.id)
    finalized = emulator.finalize_invoice(invoice["id"])
    paid = emulator.pay_invoice(invoice["id"])
    emulator.wait_for_webhooks()

    assert finalized["number"] and finalized["status"] == "open"
    assert (paid["status"], paid["amount_paid"], paid["amount_remaining"]) == ("paid", 100, 0)
    events = receiver.verified()
    by_type = {e.type: e for e in events}
    assert [e.type for e in events if e.type.startswith("invoice.")] == [
        "invoice.created",
        "invoice.finalized",
        "invoice.paid",
        "invoice.payment_succeeded",
    ]
    assert by_type["invoice.created"].data.object.amount_due == 100
    assert by_type["invoice.paid"].data.object.id == invoice["id"]
    page = requests.get(finalized["hosted_invoice_url"], timeout=10)
    assert page.status_code == 200 and finalized["number"] in page.text
    pdf = requests.get(finalized["invoice_pdf"], timeout=10)
    assert pdf.headers["Content-Type"] == "application/pdf" and pdf.content.startswith(b"%PDF")


def test_a_failed_payment_makes_the_subscription_past_due(client, emulator, receiver, subscription):
    _usage(client, subscription, ["30"])
    invoice = emulator.close_period(subscription.id)
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)

    emulator.fail_invoice(invoice["id"])
    emulator.wait_for_webhooks()

    assert receiver.types() == [
        "invoice.finalized",
        "invoice.payment_failed",
        "customer.subscription.updated",
    ]
    updated = receiver.verified()[2].data
    assert (updated.object.status, updated.previous_attributes.status) == ("past_due", "active")
    assert client.v1.subscriptions.retrieve(subscription.id).status == "past_due"
    assert client.v1.invoices.retrieve(invoice["id"]).status == "open"

    emulator.pay_invoice(invoice["id"])
    assert client.v1.subscriptions.retrieve(subscription.id).status == "active"


def test_a_subscription_set_to_cancel_ends_with_its_period(client, emulator, subscription):
    client.v1.subscriptions.update(subscription.id, {"cancel_at_period_end": True})

    emulator.close_period(subscription.id)

    assert client.v1.subscriptions.retrieve(subscription.id).status == "canceled"
    assert emulator.events()[-1]["type"] == "customer.subscription.deleted"
    with pytest.raises(StripeError, match="canceled"):
        emulator.close_period(subscription.id)


def test_a_draft_has_no_hosted_page(emulator, subscription):
    invoice = emulator.close_period(subscription.id)
    assert invoice["hosted_invoice_url"] is None
    assert requests.get(f"{emulator.url}/i/{invoice['id']}", timeout=10).status_code == 404


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [(1234, "usd", "12.34 USD"), (1234, "jpy", "1234 JPY"), (1500, "kwd", "1.500 KWD")],
)
def test_the_hosted_invoice_page_writes_amounts_in_their_currency(amount, currency, shown):
    """Stripe counts a yen in yen and a Kuwaiti dinar in fils: the emulator's invoice page read
    every amount as hundredths (1.500 KWD as 15.00 KWD)."""
    from stripe_emulator.pages import money

    assert money(amount, currency) == shown
