"""Credit notes: an amount taken off a finalized invoice, as Stripe's dashboard issues one.

On an open invoice a credit note first lowers what is still due (its `pre_payment_amount`;
brought to 0, the invoice is paid); the rest (`post_payment_amount`) is refunded to the
payment (`refund_amount`, `charge.refunded`), credited to the customer's balance
(`credit_amount`) or outside Stripe (`out_of_band_amount`), which must add up to it. Only a
credit note of an open invoice can be voided, as Stripe allows."""

from __future__ import annotations

import copy
from typing import Any

from .errors import invalid
from .forms import Params
from .payments import invoice_charges, refund_make
from .state import State, matching, new_id, page

REASONS = ("duplicate", "fraudulent", "order_change", "product_unsatisfactory")


def credit_note_retrieve(state: State, params: Params, credit_note_id: str) -> dict[str, Any]:
    """GET /v1/credit_notes/{id}."""
    params.only()
    return state.get("credit_note", credit_note_id, label="credit_note")


def credit_note_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/credit_notes by `invoice`, `customer`."""
    params.only("invoice", "customer", "limit", "starting_after", "ending_before")
    found = matching(state, "credit_note", params, "invoice", "customer")
    return page(found, params, "/v1/credit_notes")


def credit_note_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/credit_notes: `invoice` and `amount` (no lines), how the part beyond what is
    due goes back (`refund_amount`, `credit_amount`, `out_of_band_amount`), `reason`, `memo`,
    `metadata`; `credit_note.created`."""
    params.only(
        "invoice",
        "amount",
        "refund_amount",
        "credit_amount",
        "out_of_band_amount",
        "reason",
        "memo",
        "metadata",
    )
    invoice = state.get("invoice", params.text("invoice", required=True) or "", param="invoice")
    if invoice["status"] not in ("open", "paid"):
        raise invalid(
            f"Invoice {invoice['id']} is {invoice['status']}: a credit note needs an "
            "open or paid invoice.",
            param="invoice",
        )
    amount = params.integer("amount", required=True, minimum=1) or 0
    credited = sum(c["total"] for c in _issued(state, invoice["id"]))
    if credited + amount > invoice["total"]:
        raise invalid(
            f"The credit note's amount ({amount}) is more than the invoice's "
            f"uncredited amount ({invoice['total'] - credited}).",
            param="amount",
        )
    pre = min(amount, invoice["amount_remaining"]) if invoice["status"] == "open" else 0
    post = amount - pre
    parts = {
        k: params.integer(k, minimum=0) or 0
        for k in ("refund_amount", "credit_amount", "out_of_band_amount")
    }
    if sum(parts.values()) != post:
        raise invalid(
            f"refund_amount, credit_amount and out_of_band_amount must add up to "
            f"{post}, the part of the credit note beyond what is due."
        )
    charges = invoice_charges(state, invoice["id"])
    if parts["refund_amount"] > sum(c["amount"] - c["amount_refunded"] for c in charges):
        raise invalid(
            "The refund amount is more than the invoice's payments hold.", param="refund_amount"
        )
    credit_note_id = new_id("cn_")
    refunds = _refunds(state, charges, parts["refund_amount"], credit_note_id)
    number = sum(1 for c in state.all("credit_note") if c["invoice"] == invoice["id"]) + 1
    now = state.now()
    credit_note = {
        "id": credit_note_id,
        "object": "credit_note",
        "amount": amount,
        "amount_shipping": 0,
        "created": now,
        "currency": invoice["currency"],
        "customer": invoice["customer"],
        # The credit to the customer's balance is a transaction of its own.
        "customer_balance_transaction": new_id("cbtxn_") if parts["credit_amount"] else None,
        "discount_amount": 0,
        "discount_amounts": [],
        "effective_at": now,
        "invoice": invoice["id"],
        "livemode": False,
        "memo": params.text("memo"),
        "metadata": params.metadata() or {},
        "number": f"{invoice['number']}-CN-{number:02d}",
        "out_of_band_amount": parts["out_of_band_amount"] or None,
        "pdf": f"{state.base_url}/cn/{credit_note_id}/pdf",
        "post_payment_amount": post,
        "pre_payment_amount": pre,
        "reason": params.choice("reason", REASONS),
        "refunds": refunds,
        "status": "issued",
        "subtotal": amount,
        "subtotal_excluding_tax": amount,
        "total": amount,
        "total_excluding_tax": amount,
        "type": "mixed" if pre and post else ("pre_payment" if pre else "post_payment"),
        "voided_at": None,
    }
    state.add("credit_note", credit_note)
    state.emit("credit_note.created", credit_note)
    _invoice_credited(state, invoice, pre, post)
    return credit_note


def _refunds(
    state: State, charges: list[dict[str, Any]], amount: int, credit_note_id: str
) -> list[dict[str, Any]]:
    """Refund `amount` of the invoice's charges, newest first, for the credit note."""
    made = []
    for charge in charges:
        part = min(amount, charge["amount"] - charge["amount_refunded"])
        if part <= 0:
            continue
        refund = refund_make(state, charge, part, None, {"credit_note": credit_note_id})
        made.append(
            {
                "amount_refunded": part,
                "payment_record_refund": None,
                "refund": refund["id"],
                "type": "refund",
            }
        )
        amount -= part
    return made


def _invoice_credited(state: State, invoice: dict[str, Any], pre: int, post: int) -> None:
    """What a credit note does to its invoice: less due (paid once nothing is), and the
    credited amounts counted."""
    before = copy.deepcopy(invoice)
    invoice["amount_due"] -= pre
    invoice["amount_remaining"] -= pre
    invoice["pre_payment_credit_notes_amount"] += pre
    invoice["post_payment_credit_notes_amount"] += post
    if invoice["status"] == "open" and invoice["amount_remaining"] <= 0:
        invoice["status"] = "paid"
        invoice["status_transitions"]["paid_at"] = state.now()
        state.emit("invoice.paid", invoice)
    state.emit("invoice.updated", invoice, {k: before[k] for k in ("amount_due", "status")})


def credit_note_update(state: State, params: Params, credit_note_id: str) -> dict[str, Any]:
    """POST /v1/credit_notes/{id}: `memo`, `metadata`; `credit_note.updated`."""
    params.only("memo", "metadata")
    credit_note = state.get("credit_note", credit_note_id, label="credit_note")
    before = copy.deepcopy(credit_note)
    if params.has("memo"):
        credit_note["memo"] = params.text("memo") or None
    metadata = params.metadata()
    if metadata is not None:
        credit_note["metadata"] = {**credit_note["metadata"], **metadata}
    state.emit(
        "credit_note.updated",
        credit_note,
        {k: before[k] for k in ("memo", "metadata") if before[k] != credit_note[k]},
    )
    return credit_note


def credit_note_void(state: State, params: Params, credit_note_id: str) -> dict[str, Any]:
    """POST /v1/credit_notes/{id}/void: an issued credit note of an open invoice no longer
    counts (what it took off is due again); `credit_note.voided`."""
    params.only()
    credit_note = state.get("credit_note", credit_note_id, label="credit_note")
    invoice = state.get("invoice", credit_note["invoice"])
    if credit_note["status"] != "issued" or invoice["status"] != "open":
        raise invalid(
            f"Credit note {credit_note_id} cannot be voided: only an issued credit "
            "note of an open invoice can be."
        )
    credit_note.update(status="void", voided_at=state.now())
    state.emit("credit_note.voided", credit_note)
    before = copy.deepcopy(invoice)
    invoice["amount_due"] += credit_note["pre_payment_amount"]
    invoice["amount_remaining"] += credit_note["pre_payment_amount"]
    invoice["pre_payment_credit_notes_amount"] -= credit_note["pre_payment_amount"]
    invoice["post_payment_credit_notes_amount"] -= credit_note["post_payment_amount"]
    state.emit("invoice.updated", invoice, {"amount_due": before["amount_due"]})
    return credit_note


def _issued(state: State, invoice_id: str) -> list[dict[str, Any]]:
    return [
        c
        for c in state.all("credit_note")
        if c["invoice"] == invoice_id and c["status"] == "issued"
    ]
