"""Subscriptions: started by checkout, read, updated, cancelled. A period lasts a month from the
subscription's start, as Stripe's do by default, or is a calendar month (UTC) when the checkout
anchored its billing cycle to the 1st at midnight (`billing_cycle_anchor_config`)."""

from __future__ import annotations

import calendar
import copy
from datetime import UTC, datetime
from typing import Any

from .errors import invalid
from .forms import Params, merge_metadata
from .state import State, changed, list_object, new_id, page


def month_bounds(timestamp: int) -> tuple[int, int]:
    """The UTC calendar month holding timestamp, as [start, end) epoch seconds."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return int(start.timestamp()), int(end.timestamp())


def month_later(timestamp: int, anchor: int) -> int:
    """A month after `timestamp`, on the anchor's day of the month (the month's last day when
    it is shorter) and time of day, as Stripe moves a billing period on."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    day_and_time = datetime.fromtimestamp(anchor, UTC)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    day = min(day_and_time.day, calendar.monthrange(year, month)[1])
    later = day_and_time.replace(year=year, month=month, day=day)
    return int(later.timestamp())


def next_period(subscription: dict[str, Any], stop: int) -> tuple[int, int]:
    """The period after the one ending at `stop`: a calendar month for a subscription
    anchored to the 1st at midnight, else a month on from its start's day and time."""
    anchor = subscription["billing_cycle_anchor"]
    if month_bounds(anchor)[0] == anchor:  # the 1st, 00:00:00 UTC
        return month_bounds(stop)
    return stop, month_later(stop, anchor)


def subscription_start(
    state: State,
    customer: str,
    items: list[dict[str, Any]],
    metadata: dict[str, str],
    *,
    calendar_months: bool = False,
) -> dict[str, Any]:
    """An active subscription for the line items, from now until a month later, or until the
    next 1st when `calendar_months` (its checkout anchored it there: calendar months after); emits
    `customer.subscription.created`. Since 2025-03-31.basil the period lives on each item."""
    now = state.now()
    if calendar_months:  # a first, shorter period until the 1st; whole months from then
        period_start, period_end = now, month_bounds(now)[1]
        anchor = period_end
    else:
        period_start, period_end = now, month_later(now, now)
        anchor = now
    subscription_id = new_id("sub_")
    subscription_items = [
        _item(subscription_id, item["price"], item["quantity"], now, (period_start, period_end))
        for item in items
    ]
    subscription = {
        "id": subscription_id,
        "object": "subscription",
        "billing_cycle_anchor": anchor,
        "cancel_at": None,
        "cancel_at_period_end": False,
        "canceled_at": None,
        "cancellation_details": {"comment": None, "feedback": None, "reason": None},
        "collection_method": "charge_automatically",
        "created": now,
        "currency": items[0]["price"]["currency"],
        "customer": customer,
        "default_payment_method": None,
        "description": None,
        "discounts": [],
        "ended_at": None,
        "items": list_object(
            subscription_items, f"/v1/subscription_items?subscription={subscription_id}"
        ),
        "latest_invoice": None,
        "livemode": False,
        "metadata": dict(metadata),
        "start_date": now,
        "status": "active",
        "test_clock": None,
        "trial_end": None,
        "trial_start": None,
    }
    state.add("subscription", subscription)
    state.emit("customer.subscription.created", subscription)
    return subscription


def _item(
    subscription_id: str, price: dict[str, Any], quantity: int | None, now: int,
    period: tuple[int, int],
) -> dict[str, Any]:  # fmt: skip
    """A subscription item on `price` over `period` (every item shares the period here)."""
    item = {
        "id": new_id("si_", 14),
        "object": "subscription_item",
        "created": now,
        "current_period_end": period[1],
        "current_period_start": period[0],
        "discounts": [],
        "metadata": {},
        "price": copy.deepcopy(price),
        "subscription": subscription_id,
        "tax_rates": [],
    }
    if quantity is not None:  # Stripe leaves quantity out for metered prices
        item["quantity"] = quantity
    return item


def subscription_retrieve(state: State, params: Params, subscription_id: str) -> dict[str, Any]:
    """GET /v1/subscriptions/{id}."""
    params.only()
    return state.get("subscription", subscription_id)


def subscription_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/subscriptions: by `customer`, `price`, `status` (cancelled ones only when asked
    for, as Stripe lists them)."""
    params.only("customer", "price", "status", "limit", "starting_after", "ending_before")
    customer, price = params.text("customer"), params.text("price")
    status = params.choice(
        "status",
        ("active", "all", "canceled", "ended", "incomplete", "past_due", "trialing", "unpaid"),
    )
    subscriptions = [
        s
        for s in state.all("subscription")
        if (customer is None or s["customer"] == customer)
        and (price is None or any(i["price"]["id"] == price for i in s["items"]["data"]))
        and _status_matches(s["status"], status)
    ]
    return page(subscriptions, params, "/v1/subscriptions")


def _status_matches(actual: str, wanted: str | None) -> bool:
    if wanted == "all":
        return True
    if wanted is None:
        return actual != "canceled"
    if wanted == "ended":
        return actual == "canceled"
    return actual == wanted


PRORATION_BEHAVIORS = ("always_invoice", "create_prorations", "none")


def subscription_update(state: State, params: Params, subscription_id: str) -> dict[str, Any]:
    """POST /v1/subscriptions/{id}: `cancel_at_period_end`, `metadata`, `description`, and
    `items`: moving an existing item to another price (`items[0][id]`, `items[0][price]`; a
    metered item's usage is billed at the price it holds when the period is invoiced, so
    `proration_behavior` is checked and changes nothing), adding a metered item
    (`items[0][price]` alone), or removing one (`items[0][id]`, `items[0][deleted]=true`);
    emits
    `customer.subscription.updated` with the previous values when something changed."""
    params.only("cancel_at_period_end", "metadata", "description", "items", "proration_behavior")
    subscription = state.get("subscription", subscription_id)
    for key in ("cancel_at_period_end", "items"):
        if subscription["status"] == "canceled" and params.has(key):
            raise invalid("A canceled subscription can only update its metadata.", param=key)
    # Read every value before writing any: a refused update changes nothing.
    at_period_end = params.flag("cancel_at_period_end")
    description = params.text("description", max_length=500)
    metadata = params.metadata()
    params.choice("proration_behavior", PRORATION_BEHAVIORS)
    updates = params.hashes("items")
    prices = _item_prices(state, subscription, [u for u in updates if u.has("id")])
    added = _added_prices(state, subscription, [u for u in updates if not u.has("id")])
    before = copy.deepcopy(subscription)
    if at_period_end is not None:
        subscription["cancel_at_period_end"] = at_period_end
        subscription["cancel_at"] = current_period(subscription)[1] if at_period_end else None
    if params.has("description"):
        subscription["description"] = description or None
    subscription["metadata"] = merge_metadata(subscription["metadata"], metadata)
    for item in subscription["items"]["data"]:
        if prices.get(item["id"]) is not None:
            item["price"] = copy.deepcopy(prices[item["id"]])
    subscription["items"]["data"] = [
        item
        for item in subscription["items"]["data"]
        if item["id"] not in prices or prices[item["id"]] is not None
    ]
    for price in added:
        subscription["items"]["data"].append(
            _item(subscription["id"], price, None, state.now(), current_period(subscription))
        )
    emit_if_changed(state, before, subscription)
    return subscription


def _added_prices(
    state: State, subscription: dict[str, Any], items: list[Params]
) -> list[dict[str, Any]]:
    """The prices of `items` updates without an id: new metered items, in the subscription's
    currency, on prices it has no item on yet."""
    held = {item["price"]["id"] for item in subscription["items"]["data"]}
    prices = []
    for update in items:
        update.only("price")
        price = state.get(
            "price", update.text("price", required=True) or "", param=update.name("price")
        )
        recurring = price["recurring"] or {}
        if (
            recurring.get("usage_type") != "metered"
            or price["currency"] != subscription["currency"]
        ):
            raise invalid(
                "A new item's price must be metered and in the subscription's currency.",
                param=update.name("price"),
            )
        if price["id"] in held:
            raise invalid(
                f"The subscription already has an item on {price['id']}.",
                param=update.name("price"),
            )
        held.add(price["id"])
        prices.append(price)
    return prices


def _item_prices(
    state: State, subscription: dict[str, Any], items: list[Params]
) -> dict[str, dict[str, Any]]:
    """{item id: its new price, or None to remove it} for `items` updates naming an item of
    the subscription and a recurring price of its currency and usage type, or `deleted`
    (a subscription keeps at least one item)."""
    held = {item["id"]: item for item in subscription["items"]["data"]}
    prices: dict[str, dict[str, Any] | None] = {}
    for update in items:
        update.only("id", "price", "deleted")
        item_id = update.text("id", required=True) or ""
        if item_id not in held:
            raise invalid(
                f"No such subscription item: '{item_id}' on this subscription.",
                param=update.name("id"),
            )
        if update.flag("deleted"):
            prices[item_id] = None
            if all(prices.get(i, held[i]) is None for i in held):
                raise invalid(
                    "A subscription must keep at least one item; cancel it instead.",
                    param=update.name("deleted"),
                )
            continue
        price = state.get(
            "price", update.text("price", required=True) or "", param=update.name("price")
        )
        old = held[item_id]["price"]
        if (
            price["recurring"] is None
            or price["currency"] != old["currency"]
            or price["recurring"]["usage_type"] != old["recurring"]["usage_type"]
        ):
            raise invalid(
                "An item's new price must be recurring, in the subscription's currency and of "
                "the same usage type.",
                param=update.name("price"),
            )
        prices[item_id] = price
    return prices


def emit_if_changed(state: State, before: dict[str, Any], subscription: dict[str, Any]) -> None:
    """`customer.subscription.updated`, with previous_attributes, unless nothing changed."""
    previous = changed(before, subscription)
    if previous:
        state.emit("customer.subscription.updated", subscription, previous)


def subscription_pause(state: State, subscription_id: str) -> dict[str, Any]:
    """Its trial ended with no payment method, and it was set to pause then
    (`trial_settings.end_behavior.missing_payment_method=pause`): status `paused`, it bills
    nothing; `customer.subscription.paused`, then `customer.subscription.updated`."""
    subscription = state.get("subscription", subscription_id)
    if subscription["status"] not in ("active", "trialing"):
        raise invalid(
            f"Subscription {subscription_id} is {subscription['status']}: only an active or "
            "trialing subscription can be paused.",
            param="id",
        )
    before = copy.deepcopy(subscription)
    subscription["status"] = "paused"
    state.emit("customer.subscription.paused", subscription)
    emit_if_changed(state, before, subscription)
    return subscription


def current_period(subscription: dict[str, Any]) -> tuple[int, int]:
    """The [start, end) of the period in progress (every item shares it here)."""
    item = subscription["items"]["data"][0]
    return item["current_period_start"], item["current_period_end"]


def subscription_cancel(state: State, params: Params, subscription_id: str) -> dict[str, Any]:
    """DELETE /v1/subscriptions/{id}: cancelled now; emits `customer.subscription.deleted`.
    `invoice_now` and `prorate` are accepted but no final invoice is made."""
    params.only("invoice_now", "prorate", "cancellation_details")
    params.flag("invoice_now")  # checked as booleans, then ignored
    params.flag("prorate")
    details = params.hash("cancellation_details") or Params({}, "cancellation_details")
    details.only("comment", "feedback")
    subscription = state.get("subscription", subscription_id)
    if subscription["status"] == "canceled":
        raise invalid(
            f"This subscription has already been canceled: {subscription_id}.", param="id"
        )
    end(state, subscription, "cancellation_requested", details.text("comment"))
    return subscription


def end(state: State, subscription: dict[str, Any], reason: str, comment: str | None) -> None:
    """Cancel now (on request, or at the end of a period marked cancel_at_period_end)."""
    now = state.now()
    subscription.update(status="canceled", canceled_at=now, ended_at=now)
    subscription["cancellation_details"] = {"comment": comment, "feedback": None, "reason": reason}
    state.emit("customer.subscription.deleted", subscription)
