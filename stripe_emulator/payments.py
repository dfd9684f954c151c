"""An invoice's payment as Stripe records it, and refunds of it: a paid invoice's charge (made
through a payment intent) and its `invoice_payment`; `POST /v1/refunds` gives money back
(`charge.refunded`)."""

from __future__ import annotations

from typing import Any

from .errors import invalid
from .forms import Params
from .state import State, list_object, matching, new_id, page

REFUND_REASONS = ("duplicate", "fraudulent", "requested_by_customer")


def invoices_charge(state: State, invoices: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One charge that pays each of `invoices` its amount due, as Stripe records a successful
    payment: its payment intent, and an invoice payment per invoice linking the two (Stripe
    names no invoice on a charge since 2025-03-31.basil); several invoices are paid by one
    payment intent attached to each (`POST /v1/invoices/{id}/attach_payment`). None when
    nothing is due."""
    due = [(invoice, invoice["amount_due"] - invoice["amount_paid"]) for invoice in invoices]
    due = [(invoice, amount) for invoice, amount in due if amount > 0]
    if not due:
        return None
    amount = sum(part for _, part in due)
    now = state.now()
    intent_id, charge_id = new_id("pi_"), new_id("ch_")
    charge = {
        "id": charge_id,
        "object": "charge",
        "amount": amount,
        "amount_captured": amount,
        "amount_refunded": 0,
        "captured": True,
        "created": now,
        "currency": due[0][0]["currency"],
        "customer": due[0][0]["customer"],
        "description": None,
        "livemode": False,
        "metadata": {},
        "paid": True,
        "payment_intent": intent_id,
        "refunded": False,
        "refunds": list_object([], f"/v1/charges/{charge_id}/refunds"),
        "status": "succeeded",
    }
    state.add("charge", charge)
    for invoice, part in due:
        state.add(
            "invoice_payment",
            {
                "id": new_id("inpay_"),
                "object": "invoice_payment",
                "amount_paid": part,
                "amount_requested": part,
                "created": now,
                "currency": invoice["currency"],
                "invoice": invoice["id"],
                "is_default": True,
                "livemode": False,
                "payment": {"type": "payment_intent", "payment_intent": intent_id},
                "status": "paid",
                "status_transitions": {"canceled_at": None, "paid_at": now},
            },
        )
    return charge


def charge_retrieve(state: State, params: Params, charge_id: str) -> dict[str, Any]:
    """GET /v1/charges/{id}."""
    params.only()
    return state.get("charge", charge_id)


def invoice_payment_retrieve(state: State, params: Params, payment_id: str) -> dict[str, Any]:
    """GET /v1/invoice_payments/{id}."""
    params.only()
    return state.get("invoice_payment", payment_id, label="invoice_payment")


def invoice_payment_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/invoice_payments by `invoice`, `status`, `payment[type]` and
    `payment[payment_intent]`."""
    params.only("invoice", "status", "payment", "limit", "starting_after", "ending_before")
    invoice = params.text("invoice")
    status = params.choice("status", ("canceled", "open", "paid"))
    payment = params.hash("payment")
    intent = None
    if payment is not None:
        payment.only("type", "payment_intent", "payment_record")
        payment.choice("type", ("payment_intent", "payment_record"), required=True)
        intent = payment.text("payment_intent")
    found = [
        p
        for p in state.all("invoice_payment")
        if (invoice is None or p["invoice"] == invoice)
        and (status is None or p["status"] == status)
        and (intent is None or p["payment"].get("payment_intent") == intent)
    ]
    return page(found, params, "/v1/invoice_payments")


def refund_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/refunds: `charge` or `payment_intent`, `amount` (what is left, when absent),
    `reason`, `metadata`; `charge.refunded` (and `refund.created`)."""
    params.only("charge", "payment_intent", "amount", "reason", "metadata")
    charge = _charge_of(state, params)
    left = charge["amount"] - charge["amount_refunded"]
    amount = params.integer("amount", minimum=1)
    amount = left if amount is None else amount
    if left <= 0:
        raise invalid(
            f"Charge {charge['id']} has already been refunded.", code="charge_already_refunded"
        )
    if amount > left:
        raise invalid(
            f"Refund amount ({amount}) is greater than unrefunded amount on charge ({left})",
            param="amount",
        )
    return refund_make(
        state, charge, amount, params.choice("reason", REFUND_REASONS), params.metadata() or {}
    )


def refund_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/refunds by `charge`, `payment_intent`."""
    params.only("charge", "payment_intent", "limit", "starting_after", "ending_before")
    found = matching(state, "refund", params, "charge", "payment_intent")
    return page(found, params, "/v1/refunds")


def refund_make(
    state: State, charge: dict[str, Any], amount: int, reason: str | None, metadata: dict
) -> dict[str, Any]:
    """`amount` of `charge` given back: the refund, `charge.refunded` and `refund.created`."""
    refund = {
        "id": new_id("re_"),
        "object": "refund",
        "amount": amount,
        "charge": charge["id"],
        "created": state.now(),
        "currency": charge["currency"],
        "metadata": dict(metadata),
        "payment_intent": charge["payment_intent"],
        "reason": reason,
        "status": "succeeded",
    }
    state.add("refund", refund)
    charge["amount_refunded"] += amount
    charge["refunded"] = charge["amount_refunded"] == charge["amount"]
    charge["refunds"]["data"].insert(0, refund)
    state.emit("charge.refunded", charge, {"amount_refunded": charge["amount_refunded"] - amount})
    state.emit("refund.created", refund)
    return refund


def _charge_of(state: State, params: Params) -> dict[str, Any]:
    charge_id, intent = params.text("charge"), params.text("payment_intent")
    if charge_id is not None:
        return state.get("charge", charge_id, param="charge")
    if intent is None:
        raise invalid(
            "One of the following params should be provided for this request: "
            "payment_intent or charge."
        )
    found = next((c for c in state.all("charge") if c["payment_intent"] == intent), None)
    if found is None:
        raise invalid(
            f"No such payment_intent: '{intent}'", param="payment_intent", code="resource_missing"
        )
    return found


def invoice_charges(state: State, invoice_id: str) -> list[dict[str, Any]]:
    """The charges that paid an invoice, newest first."""
    intents = {
        p["payment"].get("payment_intent")
        for p in state.all("invoice_payment")
        if p["invoice"] == invoice_id and p["status"] == "paid"
    }
    return [c for c in state.all("charge") if c["payment_intent"] in intents]


def invoice_refund(state: State, invoice_id: str, amount: int | None = None) -> dict[str, Any]:
    """Refund a paid invoice's payment, as Stripe's dashboard refunds one (no credit note):
    `amount` (all that is left, when None) of its newest charge that has any left."""
    charge = next(
        (c for c in invoice_charges(state, invoice_id) if c["amount"] > c["amount_refunded"]),
        None,
    )
    if charge is None:
        state.get("invoice", invoice_id)  # 404 for an unknown one
        raise invalid(f"Invoice {invoice_id} has no payment left to refund.", param="invoice")
    left = charge["amount"] - charge["amount_refunded"]
    amount = left if amount is None else amount
    if not 0 < amount <= left:
        raise invalid(f"The refund must be from 1 to {left}.", param="amount")
    return refund_make(state, charge, amount, "requested_by_customer", {})
