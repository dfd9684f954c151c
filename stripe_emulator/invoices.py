"""Invoices: read through the API; made, finalized, paid or failed through the control API,
or as the clock passes with `--auto-bill` (`billing_cycle_run`).

An invoice closes one subscription period: each metered item is billed its meter's aggregate
over the period's accepted meter events times the price's unit amount; a licensed item its
quantity times the unit amount (Stripe bills those in advance; here they ride along). As
Stripe does, finalizing the draft brings its metered lines to the meters' sums by then: usage
reported after the period ended, before the draft is finalized (Stripe's finalization grace
period, an hour by default), is billed on it; usage reported later is on no invoice.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from .errors import StripeError, invalid
from .forms import Params
from .metering import aggregate, meter_usage_events
from .payments import invoices_charge
from .state import State, list_object, new_id, page
from .subscriptions import current_period, emit_if_changed, end, next_period

log = logging.getLogger("stripe_emulator.invoices")


def invoice_retrieve(state: State, params: Params, invoice_id: str) -> dict[str, Any]:
    """GET /v1/invoices/{id}."""
    params.only()
    return state.get("invoice", invoice_id)


def invoice_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/invoices by `customer`, `subscription`, `status`."""
    params.only("customer", "subscription", "status", "limit", "starting_after", "ending_before")
    customer, subscription = params.text("customer"), params.text("subscription")
    status = params.choice("status", ("draft", "open", "paid", "uncollectible", "void"))
    invoices = [
        i
        for i in state.all("invoice")
        if (customer is None or i["customer"] == customer)
        and (subscription is None or invoice_subscription(i) == subscription)
        and (status is None or i["status"] == status)
    ]
    return page(invoices, params, "/v1/invoices")


def invoice_lines(state: State, params: Params, invoice_id: str) -> dict[str, Any]:
    """GET /v1/invoices/{id}/lines: the invoice's lines, a page at a time."""
    invoice = state.get("invoice", invoice_id)
    return page(invoice["lines"]["data"], params, f"/v1/invoices/{invoice_id}/lines")


def invoice_subscription(invoice: dict[str, Any]) -> str | None:
    """The subscription an invoice bills (under `parent` since 2025-03-31.basil)."""
    details = (invoice.get("parent") or {}).get("subscription_details") or {}
    return details.get("subscription")


def period_close(state: State, subscription_id: str) -> dict[str, Any]:
    """Close the subscription's current period: a draft invoice for it (`invoice.created`),
    then the next period starts (`customer.subscription.updated`), or, when the subscription
    was set to cancel at period end, it ends (`customer.subscription.deleted`)."""
    subscription = state.get("subscription", subscription_id)
    if subscription["status"] == "canceled":
        raise invalid(f"Subscription {subscription_id} is canceled.", param="subscription")
    start, stop = current_period(subscription)
    invoice = _invoice(state, subscription, start, stop)
    state.add("invoice", invoice)
    state.emit("invoice.created", invoice)
    before = copy.deepcopy(subscription)
    subscription["latest_invoice"] = invoice["id"]
    if subscription["cancel_at_period_end"]:
        end(state, subscription, "cancellation_requested", None)
        return invoice
    next_start, next_end = next_period(subscription, stop)
    for item in subscription["items"]["data"]:
        item.update(current_period_start=next_start, current_period_end=next_end)
    emit_if_changed(state, before, subscription)
    return invoice


def _invoice(state: State, subscription: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    invoice_id = new_id("in_")
    customer = state.get("customer", subscription["customer"])
    lines = [
        _line(state, invoice_id, subscription, item, start, stop)
        for item in subscription["items"]["data"]
    ]
    total = sum(line["amount"] for line in lines)
    return {
        "id": invoice_id,
        "object": "invoice",
        "amount_due": total,
        "amount_overpaid": 0,
        "amount_paid": 0,
        "amount_remaining": total,
        "amount_shipping": 0,
        "attempt_count": 0,
        "attempted": False,
        "auto_advance": True,
        "billing_reason": "subscription_cycle",
        "collection_method": "charge_automatically",
        "created": state.now(),
        "currency": subscription["currency"],
        "customer": customer["id"],
        "customer_email": customer["email"],
        "customer_name": customer["name"],
        "default_payment_method": None,
        "description": None,
        "discounts": [],
        "due_date": None,
        "effective_at": None,
        "ending_balance": None,
        "hosted_invoice_url": None,
        "invoice_pdf": None,
        "last_finalization_error": None,
        "lines": list_object(lines, f"/v1/invoices/{invoice_id}/lines"),
        "livemode": False,
        "metadata": {},
        "next_payment_attempt": None,
        "number": None,
        "parent": {
            "type": "subscription_details",
            "quote_details": None,
            "subscription_details": {
                "metadata": dict(subscription["metadata"]),
                "subscription": subscription["id"],
            },
        },
        "period_end": stop,
        "period_start": start,
        "post_payment_credit_notes_amount": 0,
        "pre_payment_credit_notes_amount": 0,
        "starting_balance": 0,
        "status": "draft",
        "status_transitions": {
            "finalized_at": None,
            "marked_uncollectible_at": None,
            "paid_at": None,
            "voided_at": None,
        },
        "subtotal": total,
        "subtotal_excluding_tax": total,
        "total": total,
        "total_discount_amounts": [],
        "total_excluding_tax": total,
        "total_taxes": [],
        "webhooks_delivered_at": None,
    }


def _line(
    state: State,
    invoice_id: str,
    subscription: dict[str, Any],
    item: dict[str, Any],
    start: int,
    stop: int,
) -> dict[str, Any]:
    price = item["price"]
    quantity = _quantity(state, subscription["customer"], item, start, stop)
    return {
        "id": new_id("il_"),
        "object": "line_item",
        **_priced(state, price, quantity),
        "currency": price["currency"],
        "discount_amounts": [],
        "discountable": True,
        "discounts": [],
        "invoice": invoice_id,
        "livemode": False,
        "metadata": {},
        "parent": {
            "type": "subscription_item_details",
            "invoice_item_details": None,
            "subscription_item_details": {
                "invoice_item": None,
                "proration": False,
                "proration_details": {"credited_items": None},
                "subscription": subscription["id"],
                "subscription_item": item["id"],
            },
        },
        "period": {"end": stop, "start": start},
        "pretax_credit_amounts": [],
        "pricing": {
            "type": "price_details",
            "price_details": {"price": price["id"], "product": price["product"]},
            "unit_amount_decimal": price["unit_amount_decimal"],
        },
        "taxes": [],
    }


def _priced(state: State, price: dict[str, Any], quantity: Decimal) -> dict[str, Any]:
    """A line's quantity, amount and description for `quantity` of `price`."""
    unit = Decimal(price["unit_amount_decimal"])
    # Amounts are whole units of the currency's smallest denomination, rounded half up.
    amount = int((quantity * unit).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    product = state.find("product", price["product"]) or {"name": price["product"]}
    whole = quantity == quantity.to_integral_value()
    return {
        "amount": amount,
        # "3 <U+00D7> Product": the multiplication sign Stripe's descriptions use.
        "description": f"{format(quantity.normalize(), 'f')} \u00d7 {product['name']}",
        "quantity": int(quantity) if whole else None,
        "quantity_decimal": format(quantity.normalize(), "f"),
        "subtotal": amount,
    }


def _requantified(state: State, invoice: dict[str, Any]) -> None:
    """A subscription's draft brought to its meters' sums as Stripe finalizes it: usage
    reported after the period ended, within the finalization grace period, is billed."""
    for line in invoice["lines"]["data"]:
        price = state.get("price", line["pricing"]["price_details"]["price"])
        recurring = price["recurring"] or {}
        if recurring.get("usage_type") != "metered":
            continue
        meter = state.get("billing.meter", recurring["meter"], label="billing meter")
        events = meter_usage_events(
            state, meter, invoice["customer"], line["period"]["start"], line["period"]["end"]
        )
        line.update(_priced(state, price, aggregate(meter, events)))
    total = sum(line["amount"] for line in invoice["lines"]["data"])
    invoice.update(
        amount_due=total, amount_remaining=total, subtotal=total,
        subtotal_excluding_tax=total, total=total, total_excluding_tax=total,
    )  # fmt: skip


def _quantity(state: State, customer: str, item: dict[str, Any], start: int, stop: int) -> Decimal:
    recurring = item["price"]["recurring"] or {}
    if recurring.get("usage_type") != "metered":
        return Decimal(item.get("quantity", 1))
    meter = state.get("billing.meter", recurring["meter"], label="billing meter")
    return aggregate(meter, meter_usage_events(state, meter, customer, start, stop))


def invoice_finalize(state: State, invoice_id: str) -> dict[str, Any]:
    """draft → open, with a number and the hosted page and PDF (a subscription's metered lines
    at their meters' sums by then); emits `invoice.finalized`."""
    invoice = state.get("invoice", invoice_id)
    if invoice["status"] != "draft":
        raise invalid(f"Invoice {invoice_id} is {invoice['status']}, not draft.", param="invoice")
    customer = state.get("customer", invoice["customer"])
    if invoice_subscription(invoice):
        _requantified(state, invoice)
    state.invoice_numbers += 1
    now = state.now()
    invoice.update(
        number=f"{customer['invoice_prefix']}-{state.invoice_numbers:04d}",
        status="open",
        effective_at=now,
        hosted_invoice_url=f"{state.base_url}/i/{invoice_id}",
        invoice_pdf=f"{state.base_url}/i/{invoice_id}/pdf",
    )
    invoice["status_transitions"]["finalized_at"] = now
    state.emit("invoice.finalized", invoice)
    return invoice


def invoice_pay(state: State, invoice_id: str) -> dict[str, Any]:
    """The payment succeeds (a draft is finalized first, as Stripe's pay does): `invoice.paid`
    and `invoice.payment_succeeded`; a past_due subscription becomes active again."""
    return invoices_pay(state, [invoice_id])[0]


def invoices_pay(state: State, invoice_ids: list[str]) -> list[dict[str, Any]]:
    """One payment pays each of the invoices (a customer paying several at once: a payment
    intent attached to each), each as `invoice_pay` pays one."""
    paid = [_payable(state, invoice_id) for invoice_id in invoice_ids]
    now = state.now()
    invoices_charge(state, paid)
    for invoice in paid:
        invoice.update(
            amount_paid=invoice["amount_due"],
            amount_remaining=0,
            attempt_count=invoice["attempt_count"] + 1,
            attempted=True,
            next_payment_attempt=None,
            status="paid",
        )
        invoice["status_transitions"]["paid_at"] = now
        state.emit("invoice.paid", invoice)
        state.emit("invoice.payment_succeeded", invoice)
        _subscription_status(state, invoice, "past_due", "active")
    return paid


def invoice_fail(state: State, invoice_id: str) -> dict[str, Any]:
    """The payment fails: `invoice.payment_failed`, and the subscription goes past_due."""
    invoice = _payable(state, invoice_id)
    invoice.update(attempt_count=invoice["attempt_count"] + 1, attempted=True)
    state.emit("invoice.payment_failed", invoice)
    _subscription_status(state, invoice, "active", "past_due")
    return invoice


def invoice_void(state: State, invoice_id: str) -> dict[str, Any]:
    """An open invoice voided, as Stripe's dashboard voids one: nothing is owed any more;
    `invoice.voided`, then `invoice.updated`."""
    invoice = state.get("invoice", invoice_id)
    if invoice["status"] not in ("open", "uncollectible"):
        raise invalid(f"Invoice {invoice_id} is {invoice['status']}: only an open or "
                      "uncollectible invoice can be voided.", param="invoice")  # fmt: skip
    was = invoice["status"]
    invoice.update(status="void", amount_remaining=0)
    invoice["status_transitions"]["voided_at"] = state.now()
    state.emit("invoice.voided", invoice)
    state.emit("invoice.updated", invoice, {"status": was})
    return invoice


def invoice_draft_delete(state: State, invoice_id: str) -> dict[str, Any]:
    """A draft deleted, as Stripe's dashboard deletes one (only a draft can be): it is gone;
    `invoice.deleted`."""
    invoice = state.get("invoice", invoice_id)
    if invoice["status"] != "draft":
        raise invalid(f"Invoice {invoice_id} is {invoice['status']}: only a draft can be deleted.",
                      param="invoice")  # fmt: skip
    del state.objects["invoice"][invoice_id]
    state.emit("invoice.deleted", invoice)
    return invoice


def _payable(state: State, invoice_id: str) -> dict[str, Any]:
    invoice = state.get("invoice", invoice_id)
    if invoice["status"] == "draft":
        invoice_finalize(state, invoice_id)
    if invoice["status"] != "open":
        raise invalid(f"Invoice {invoice_id} is already {invoice['status']}.", param="invoice")
    return invoice


def _subscription_status(state: State, invoice: dict[str, Any], old: str, new: str) -> None:
    subscription = state.find("subscription", invoice_subscription(invoice) or "")
    if subscription is not None and subscription["status"] == old:
        before = copy.deepcopy(subscription)
        subscription["status"] = new
        emit_if_changed(state, before, subscription)


# Stripe finalizes a subscription's draft invoice about an hour after making it.
FINALIZE_AFTER = 3600


def billing_cycle_run(state: State) -> int:
    """What Stripe does by itself as its clock passes (`--auto-bill`): close every period
    that has ended (several, when the clock jumped months), finalize drafts an hour old, and
    charge open invoices no payment was attempted for (a failed one waits for `pay`). Oldest
    first; one object that fails is logged and skipped. The number of steps taken."""
    steps = 0
    now = state.now()
    for subscription in reversed(state.all("subscription")):
        while subscription["status"] != "canceled" and current_period(subscription)[1] <= now:
            if not _step(period_close, state, subscription["id"]):
                break
            steps += 1
    for invoice in reversed(state.all("invoice")):
        if invoice["status"] == "draft" and invoice["created"] <= now - FINALIZE_AFTER:
            steps += _step(invoice_finalize, state, invoice["id"])
        if invoice["status"] == "open" and not invoice["attempted"]:
            steps += _step(invoice_pay, state, invoice["id"])
    return steps


def _step(action: Callable[[State, str], dict[str, Any]], state: State, object_id: str) -> bool:
    try:
        action(state, object_id)
    except StripeError as err:
        log.warning("auto-bill: %s %s failed: %s", action.__name__, object_id, err.message)
        return False
    return True
