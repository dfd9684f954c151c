"""Checkout sessions (hosted by the emulator, completed by its Pay button) and billing portal
sessions."""

from __future__ import annotations

import copy
from typing import Any

from .catalog import customer_create
from .errors import invalid, missing
from .forms import Params, merge_metadata
from .state import DAY, State, new_id, page
from .subscriptions import subscription_start


def checkout_session_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/checkout/sessions (mode=subscription only)."""
    params.only(
        "mode",
        "customer",
        "customer_email",
        "line_items",
        "client_reference_id",
        "success_url",
        "cancel_url",
        "metadata",
        "subscription_data",
    )
    mode = params.choice("mode", ("payment", "setup", "subscription"), required=True)
    if mode != "subscription":
        raise invalid("The emulator only serves mode=subscription sessions.", param="mode")
    customer = params.text("customer")
    if customer is not None:
        state.get("customer", customer, param="customer")
        if params.has("customer_email"):
            raise invalid(
                "You may only specify one of these parameters: customer, customer_email.",
                param="customer_email",
            )
    items = _line_items(state, params.hashes("line_items"))
    subscription_data = params.hash("subscription_data") or Params({}, "subscription_data")
    subscription_data.only("metadata", "billing_cycle_anchor_config")
    subscription_metadata = merge_metadata({}, subscription_data.metadata())
    calendar_months = _calendar_anchor(subscription_data.hash("billing_cycle_anchor_config"))
    now = state.now()
    session_id = new_id("cs_test_", 58)
    session = {
        "id": session_id,
        "object": "checkout.session",
        "amount_subtotal": sum(i["amount"] for i in items),
        "amount_total": sum(i["amount"] for i in items),
        "cancel_url": params.text("cancel_url"),
        "client_reference_id": params.text("client_reference_id", max_length=200),
        "created": now,
        "currency": items[0]["price"]["currency"],
        "customer": customer,
        "customer_email": params.text("customer_email"),
        "expires_at": now + DAY,
        "invoice": None,
        "livemode": False,
        "metadata": merge_metadata({}, params.metadata()),
        "mode": "subscription",
        "payment_status": "unpaid",
        "status": "open",
        "subscription": None,
        "success_url": params.text("success_url"),
        "ui_mode": "hosted",
        "url": f"{state.base_url}/c/pay/{session_id}",
    }
    state.add("checkout.session", session)
    # Kept beside the session: Stripe only shows line items through their own endpoint.
    state.add(
        "checkout.line_items",
        {
            "id": session_id,
            "items": items,
            "subscription_metadata": subscription_metadata,
            "calendar_months": calendar_months,
        },
    )
    return session


def _calendar_anchor(config: Params | None) -> bool:
    """Whether `subscription_data.billing_cycle_anchor_config` anchors the billing cycle to
    the 1st of the month at midnight UTC (calendar months); False when it is not given (a
    month from the start). The emulator serves no other anchor."""
    if config is None:
        return False
    config.only("day_of_month", "hour", "minute", "second", "month")
    day = config.integer("day_of_month", required=True, minimum=1)
    at = [config.integer(key, minimum=0) or 0 for key in ("hour", "minute", "second")]
    if day != 1 or any(at) or config.has("month"):
        raise invalid(
            "The emulator anchors a billing cycle to the 1st of the month at 00:00:00 only.",
            param=config.name("day_of_month"),
        )
    return True


def _line_items(state: State, line_items: list[Params]) -> list[dict[str, Any]]:
    if not line_items:
        raise missing("line_items")
    items = []
    for item in line_items:
        item.only("price", "quantity")
        price = state.get(
            "price", item.text("price", required=True) or "", param=item.name("price")
        )
        if price["recurring"] is None:
            raise invalid(
                "In subscription mode every line item needs a recurring price.",
                param=item.name("price"),
            )
        metered = price["recurring"]["usage_type"] == "metered"
        quantity = item.integer("quantity", minimum=1)
        if metered and quantity is not None:
            raise invalid(
                "Quantity should not be specified where usage_type is `metered`. "
                f"Remove quantity from `{item.prefix}`.",
                param=item.name("quantity"),
            )
        if not metered and quantity is None:
            raise missing(item.name("quantity"))
        amount = 0 if metered else quantity * (price["unit_amount"] or 0)
        items.append({"price": copy.deepcopy(price), "quantity": quantity, "amount": amount})
    currencies = {i["price"]["currency"] for i in items}
    if len(currencies) > 1:
        raise invalid("All line items must share one currency.", param="line_items")
    return items


def checkout_session_retrieve(state: State, params: Params, session_id: str) -> dict[str, Any]:
    """GET /v1/checkout/sessions/{id}."""
    params.only()
    return state.get("checkout.session", session_id, label="checkout.session")


def checkout_session_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/checkout/sessions (`customer`, `subscription`, `status` filters)."""
    params.only("customer", "subscription", "status", "limit", "starting_after", "ending_before")
    wanted = {k: params.text(k) for k in ("customer", "subscription", "status")}
    sessions = [
        s
        for s in state.all("checkout.session")
        if all(v is None or s[k] == v for k, v in wanted.items())
    ]
    return page(sessions, params, "/v1/checkout/sessions")


def checkout_session_expire(state: State, params: Params, session_id: str) -> dict[str, Any]:
    """POST /v1/checkout/sessions/{id}/expire: an open session can no longer be paid;
    emits `checkout.session.expired`."""
    params.only()
    session = state.get("checkout.session", session_id, label="checkout.session")
    if session["status"] != "open":
        raise invalid(
            f'Only Checkout Sessions with a status in ["open"] can be expired. This Checkout '
            f'Session has a status of "{session["status"]}".'
        )
    session["status"] = "expired"
    state.emit("checkout.session.expired", session)
    return session


def checkout_session_complete(state: State, session_id: str) -> dict[str, Any]:
    """What paying on the hosted page does: the customer (created from customer_email when
    the session had none) gets an active subscription; `customer.subscription.created` then
    `checkout.session.completed`. Completing a completed session changes nothing."""
    session = state.get("checkout.session", session_id, label="checkout.session")
    if session["status"] != "open":
        return session
    extra = state.get("checkout.line_items", session_id)
    customer_id = session["customer"]
    if customer_id is None:
        email = session["customer_email"]
        customer = customer_create(state, Params({"email": email} if email else {}))
        state.emit("customer.created", customer)
        customer_id = customer["id"]
    subscription = subscription_start(
        state, customer_id, extra["items"], extra["subscription_metadata"],
        # A session stored before the emulator knew anchors: the calendar months it had then.
        calendar_months=extra.get("calendar_months", True),
    )  # fmt: skip
    session.update(
        customer=customer_id,
        payment_status="paid",
        status="complete",
        subscription=subscription["id"],
    )
    state.emit("checkout.session.completed", session)
    return session


def portal_session_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/billing_portal/sessions: a page listing the customer's subscriptions."""
    params.only("customer", "return_url", "configuration", "locale")
    customer = params.text("customer", required=True) or ""
    state.get("customer", customer, param="customer")
    session_id = new_id("bps_")
    session = {
        "id": session_id,
        "object": "billing_portal.session",
        "configuration": params.text("configuration") or "bpc_emulator",
        "created": state.now(),
        "customer": customer,
        "flow": None,
        "livemode": False,
        "locale": params.text("locale"),
        "on_behalf_of": None,
        "return_url": params.text("return_url"),
        "url": f"{state.base_url}/p/session/{session_id}",
    }
    return state.add("billing_portal.session", session)
