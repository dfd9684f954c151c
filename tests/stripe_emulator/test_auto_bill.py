"""`--auto-bill`: periods close, drafts are finalized an hour later and charged, as the
emulator's clock passes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from stripe_emulator import StripeEmulator

from .conftest import WEBHOOK_SECRET, subscribed

TICK = 0.05


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    with StripeEmulator(auto_bill=True, auto_bill_interval=TICK) as em:
        yield em


def _eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """check()'s first true answer, polled until the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(TICK / 2)
    raise AssertionError(f"not true within {timeout}s: {check.__doc__ or check}")


def _advance(emulator: StripeEmulator, seconds: int) -> None:
    """As the README tells a developer to: the control API over HTTP."""
    answer = requests.post(f"{emulator.url}/_emulator/clock", json={"seconds": seconds}, timeout=10)
    assert answer.status_code == 200


@pytest.fixture
def subscription(client, emulator, metered) -> Any:
    subscription = subscribed(client, emulator, metered)
    start = subscription["items"].data[0].current_period_start
    client.v1.billing.meter_events.create(
        {
            "event_name": "vcpu_hours",
            "payload": {"stripe_customer_id": metered["customer"].id, "value": "300"},
            "timestamp": start + 60,
        }
    )
    return subscription


def test_an_ended_period_is_invoiced_then_finalized_and_paid_an_hour_later(
    client, emulator, receiver, subscription
):
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)
    period_end = subscription["items"].data[0].current_period_end
    time.sleep(TICK * 4)
    assert client.v1.invoices.list().data == []  # nothing while the period runs

    _advance(emulator, period_end - emulator.advance_clock(0) + 60)
    draft = _eventually(lambda: client.v1.invoices.list().data)[0]
    time.sleep(TICK * 4)
    assert client.v1.invoices.retrieve(draft.id).status == "draft"  # not an hour old yet
    _advance(emulator, 3600)
    paid = _eventually(lambda: (i := client.v1.invoices.retrieve(draft.id)).status == "paid" and i)
    emulator.wait_for_webhooks()

    assert (draft.total, draft.period_end) == (150, period_end)  # 300 units at 0.5 cent
    assert paid.number and paid.amount_paid == 150
    moved = client.v1.subscriptions.retrieve(subscription.id)["items"].data[0]
    assert moved.current_period_start == period_end
    assert [t for t in receiver.types() if t != "customer.subscription.updated"] == [
        "invoice.created",
        "invoice.finalized",
        "invoice.paid",
        "invoice.payment_succeeded",
    ]
    assert len(client.v1.invoices.list().data) == 1


def test_a_failed_payment_is_left_for_the_developer(client, emulator, subscription):
    draft = emulator.close_period(subscription.id)
    emulator.fail_invoice(draft["id"])

    _advance(emulator, 3600)
    time.sleep(TICK * 6)

    assert client.v1.invoices.retrieve(draft["id"]).status == "open"
    assert client.v1.subscriptions.retrieve(subscription.id).status == "past_due"
