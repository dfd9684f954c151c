"""Refunds and credit notes of a paid or open invoice, read back through the SDK as Stripe's."""

from __future__ import annotations

import pytest
import requests
import stripe

from .conftest import WEBHOOK_SECRET, subscribed
from .test_invoices import _usage


@pytest.fixture
def subscription(client, emulator, metered):
    return subscribed(client, emulator, metered)


@pytest.fixture
def invoice(client, emulator, subscription):
    """A finalized invoice of 40.00 USD (8,000 units at 0.5 cent)."""
    _usage(client, subscription, ["8000"])
    return emulator.finalize_invoice(emulator.close_period(subscription.id)["id"])


def _charge_of(client, invoice_id):
    """The charge that paid the invoice, found as Stripe links them since basil."""
    (payment,) = client.v1.invoice_payments.list({"invoice": invoice_id}).data
    intent = payment.payment.payment_intent
    by_intent = client.v1.invoice_payments.list(
        {"payment": {"type": "payment_intent", "payment_intent": intent}}
    )
    assert [p.invoice for p in by_intent.data] == [invoice_id]
    return payment


def test_a_refund_of_a_paid_invoice_is_on_its_charge(client, emulator, receiver, invoice):
    emulator.set_webhook(receiver.url, WEBHOOK_SECRET)
    emulator.pay_invoice(invoice["id"])
    payment = _charge_of(client, invoice["id"])

    refund = emulator.refund_invoice(invoice["id"], 1200)
    emulator.wait_for_webhooks()

    (event,) = [e for e in receiver.verified() if e.type == "charge.refunded"]
    charge = client.v1.charges.retrieve(event.data.object.id)
    assert charge.payment_intent == payment.payment.payment_intent
    assert (charge.amount, charge.amount_refunded, charge.refunded) == (4000, 1200, False)
    assert refund["charge"] == charge.id
    with pytest.raises(stripe.InvalidRequestError, match="greater than unrefunded"):
        client.v1.refunds.create({"charge": charge.id, "amount": 2801})
    rest = client.v1.refunds.create({"payment_intent": charge.payment_intent})
    assert client.v1.charges.retrieve(charge.id).refunded is True
    listed = client.v1.refunds.list({"charge": charge.id}).data
    assert [r.id for r in listed] == [rest.id, refund["id"]]  # newest first
    assert not client.v1.refunds.list({"charge": "ch_other"}).data


def test_a_credit_note_of_a_paid_invoice_refunds_and_credits(client, emulator, invoice):
    emulator.pay_invoice(invoice["id"])

    note = client.v1.credit_notes.create(
        {"invoice": invoice["id"], "amount": 1500, "refund_amount": 1000, "credit_amount": 500,
         "reason": "product_unsatisfactory", "memo": "Sorry"}
    )  # fmt: skip

    assert (note.status, note.total, note.pre_payment_amount, note.post_payment_amount) == (
        "issued", 1500, 0, 1500,
    )  # fmt: skip
    assert note.number == f"{invoice['number']}-CN-01" and note.reason == "product_unsatisfactory"
    assert [r.amount_refunded for r in note.refunds] == [1000]
    assert note.customer_balance_transaction
    (payment,) = client.v1.invoice_payments.list({"invoice": invoice["id"]}).data
    charges = [e["data"]["object"] for e in emulator.events("charge.refunded")]
    assert charges[-1]["amount_refunded"] == 1000
    assert charges[-1]["payment_intent"] == payment.payment.payment_intent
    assert [c.id for c in client.v1.credit_notes.list({"invoice": invoice["id"]}).data] == [note.id]
    assert client.v1.credit_notes.retrieve(note.id).memo == "Sorry"
    pdf = requests.get(note.pdf, timeout=10)
    assert pdf.headers["Content-Type"] == "application/pdf" and pdf.content.startswith(b"%PDF")
    with pytest.raises(stripe.InvalidRequestError, match="must add up to 2000"):
        client.v1.credit_notes.create({"invoice": invoice["id"], "amount": 2000})
    with pytest.raises(stripe.InvalidRequestError, match="uncredited amount"):
        client.v1.credit_notes.create(
            {"invoice": invoice["id"], "amount": 2600, "out_of_band_amount": 2600}
        )
    with pytest.raises(stripe.InvalidRequestError, match="cannot be voided"):
        client.v1.credit_notes.void_credit_note(note.id)


def test_a_credit_note_of_an_open_invoice_lowers_what_is_due_until_voided(
    client, emulator, invoice
):
    note = emulator.create_credit_note(invoice["id"], amount=1000, reason="order_change")

    held = client.v1.invoices.retrieve(invoice["id"])
    assert (note["pre_payment_amount"], held.amount_due, held.status) == (1000, 3000, "open")
    client.v1.credit_notes.update(note["id"], {"memo": "Agreed on the phone"})
    assert emulator.events("credit_note.updated")[-1]["data"]["object"]["memo"] == (
        "Agreed on the phone"
    )

    emulator.void_credit_note(note["id"])

    assert client.v1.credit_notes.retrieve(note["id"]).status == "void"
    assert client.v1.invoices.retrieve(invoice["id"]).amount_due == 4000
    emulator.create_credit_note(invoice["id"], amount=4000)
    paid = client.v1.invoices.retrieve(invoice["id"])
    assert (paid.status, paid.amount_remaining) == ("paid", 0)  # nothing left to pay
    assert [e["type"] for e in emulator.events("credit_note.*")] == [
        "credit_note.created", "credit_note.updated", "credit_note.voided", "credit_note.created",
    ]  # fmt: skip
