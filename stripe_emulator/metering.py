"""Billing meters, meter events (with Stripe's identifier and timestamp rules), adjustments,
and event summaries."""

from __future__ import annotations

import hashlib
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import StripeError, invalid, missing
from .forms import Params
from .state import DAY, MeterEvent, State, new_id, page

MAX_IDENTIFIER = 100
PAST_LIMIT = 35 * DAY
FUTURE_LIMIT = 5 * 60
IDENTIFIER_WINDOW = DAY
WINDOWS = {"hour": 3600, "day": DAY}


def meter_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/billing/meters: an event name belongs to one active meter at a time."""
    params.only(
        "display_name",
        "event_name",
        "default_aggregation",
        "customer_mapping",
        "value_settings",
        "event_time_window",
    )
    display_name = params.text("display_name", required=True, max_length=250)
    event_name = params.text("event_name", required=True, max_length=100)
    aggregation = params.hash("default_aggregation", required=True)
    aggregation.only("formula")
    formula = aggregation.choice("formula", ("sum", "count", "last"), required=True)
    mapping = params.hash("customer_mapping") or Params({}, "customer_mapping")
    mapping.only("type", "event_payload_key")
    mapping.choice("type", ("by_id",))
    value_settings = params.hash("value_settings") or Params({}, "value_settings")
    value_settings.only("event_payload_key")
    for meter in state.all("billing.meter"):
        if meter["event_name"] == event_name and meter["status"] == "active":
            raise invalid(
                f"An active meter with event_name `{event_name}` already exists: {meter['id']}.",
                param="event_name",
            )
    now = state.now()
    meter = {
        "id": new_id("mtr_test_"),
        "object": "billing.meter",
        "created": now,
        "customer_mapping": {
            "event_payload_key": mapping.text("event_payload_key") or "stripe_customer_id",
            "type": "by_id",
        },
        "default_aggregation": {"formula": formula},
        "display_name": display_name,
        "event_name": event_name,
        "event_time_window": params.choice("event_time_window", ("hour", "day")),
        "livemode": False,
        "status": "active",
        "status_transitions": {"deactivated_at": None},
        "updated": now,
        "value_settings": {
            "event_payload_key": value_settings.text("event_payload_key") or "value"
        },
    }
    return state.add("billing.meter", meter)


def meter_retrieve(state: State, params: Params, meter_id: str) -> dict[str, Any]:
    """GET /v1/billing/meters/{id}."""
    params.only()
    return state.get("billing.meter", meter_id, label="billing meter")


def meter_update(state: State, params: Params, meter_id: str) -> dict[str, Any]:
    """POST /v1/billing/meters/{id}: only the display name can change."""
    params.only("display_name")
    meter = state.get("billing.meter", meter_id, label="billing meter")
    if params.has("display_name"):
        meter["display_name"] = params.text("display_name", required=True, max_length=250)
        meter["updated"] = state.now()
    return meter


def meter_set_status(state: State, params: Params, meter_id: str, status: str) -> dict[str, Any]:
    """POST /v1/billing/meters/{id}/deactivate|reactivate."""
    params.only()
    meter = state.get("billing.meter", meter_id, label="billing meter")
    now = state.now()
    meter["status"] = status
    meter["status_transitions"]["deactivated_at"] = now if status == "inactive" else None
    meter["updated"] = now
    return meter


def meter_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/billing/meters (`status` filter)."""
    params.only("status", "limit", "starting_after", "ending_before")
    status = params.choice("status", ("active", "inactive"))
    meters = [m for m in state.all("billing.meter") if status is None or m["status"] == status]
    return page(meters, params, "/v1/billing/meters")


def meter_event_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/billing/meter_events.

    Stripe checks the identifier and timestamp when the event arrives; it checks the payload
    against the meter later and reports problems asynchronously. The emulator refuses a bad
    payload at once instead, so a test sees the mistake where it was made.
    """
    params.only("event_name", "payload", "identifier", "timestamp")
    event_name = params.text("event_name", required=True, max_length=100)
    payload = params.hash("payload", required=True)
    if not all(isinstance(v, str) for v in payload.data.values()):
        raise invalid("Invalid payload: values must be strings", param="payload")
    now = state.now()
    timestamp = params.integer("timestamp")
    timestamp = now if timestamp is None else timestamp
    _check_timestamp(timestamp, now)
    identifier = params.text("identifier", max_length=MAX_IDENTIFIER) or new_id("mevt_")
    _check_identifier(state, identifier, now)
    for meter in state.all("billing.meter"):
        if meter["event_name"] == event_name and meter["status"] == "active":
            _check_payload(meter, payload)
    event = MeterEvent(event_name, identifier, dict(payload.data), timestamp, now)
    state.meter_events.append(event)
    return {
        "object": "billing.meter_event",
        "created": event.created,
        "event_name": event_name,
        "identifier": identifier,
        "livemode": False,
        "payload": dict(event.payload),
        "timestamp": timestamp,
    }


def _check_timestamp(timestamp: int, now: int) -> None:
    if timestamp < now - PAST_LIMIT:
        raise invalid(
            "The timestamp must be within the past 35 calendar days.",
            param="timestamp",
            code="timestamp_too_far_in_past",
        )
    if timestamp > now + FUTURE_LIMIT:
        raise invalid(
            "The timestamp must not be more than 5 minutes in the future.",
            param="timestamp",
            code="timestamp_in_future",
        )


def _check_identifier(state: State, identifier: str, now: int) -> None:
    """Stripe refuses an identifier it saw in the last 24 hours (and says not to retry)."""
    for event in state.meter_events:
        if event.identifier == identifier and event.created > now - IDENTIFIER_WINDOW:
            raise StripeError(
                400,
                f"An event already exists with identifier {identifier}.",
                param="identifier",
                should_retry=False,
            )


def _check_payload(meter: dict[str, Any], payload: Params) -> None:
    customer_key = meter["customer_mapping"]["event_payload_key"]
    if not payload.text(customer_key):
        raise missing(payload.name(customer_key))
    if meter["default_aggregation"]["formula"] != "count":
        value_key = meter["value_settings"]["event_payload_key"]
        _number(payload.text(value_key, required=True) or "", payload.name(value_key))


def _number(text: str, param: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise invalid(f"Invalid meter event value: {text!r}", param=param) from None
    if not value.is_finite():
        raise invalid(f"Invalid meter event value: {text!r}", param=param)
    return value


def meter_event_adjustment_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/billing/meter_event_adjustments: cancel one event by identifier (Stripe allows
    it within 24 hours of receiving the event)."""
    params.only("event_name", "type", "cancel")
    event_name = params.text("event_name", required=True, max_length=100)
    params.choice("type", ("cancel",), required=True)
    cancel = params.hash("cancel", required=True)
    cancel.only("identifier")
    identifier = cancel.text("identifier", required=True, max_length=MAX_IDENTIFIER)
    now = state.now()
    for event in state.meter_events:
        if event.identifier == identifier and event.event_name == event_name:
            if event.cancelled:
                raise invalid(
                    f"The event with identifier {identifier} is already cancelled.",
                    param="cancel[identifier]",
                )
            if event.created <= now - IDENTIFIER_WINDOW:
                raise invalid(
                    "Only events received in the last 24 hours can be cancelled.",
                    param="cancel[identifier]",
                )
            event.cancelled = True
            return {
                "object": "billing.meter_event_adjustment",
                "cancel": {"identifier": identifier},
                "event_name": event_name,
                "livemode": False,
                "status": "complete",
                "type": "cancel",
            }
    raise invalid(
        f"No meter event with identifier {identifier} for event_name {event_name}.",
        param="cancel[identifier]",
    )


def meter_event_summaries(state: State, params: Params, meter_id: str) -> dict[str, Any]:
    """GET /v1/billing/meters/{id}/event_summaries: the aggregated value per window (one window
    for the whole range without `value_grouping_window`), newest first, windows holding at
    least one event only."""
    params.only(
        "customer",
        "start_time",
        "end_time",
        "value_grouping_window",
        "limit",
        "starting_after",
        "ending_before",
    )
    meter = state.get("billing.meter", meter_id, label="billing meter")
    customer = params.text("customer", required=True) or ""
    start = params.integer("start_time", required=True) or 0
    end = params.integer("end_time", required=True) or 0
    grouping = params.choice("value_grouping_window", tuple(WINDOWS))
    step = WINDOWS[grouping] if grouping else end - start
    if end <= start:
        raise invalid("end_time must be after start_time.", param="end_time")
    for name, value in (("start_time", start), ("end_time", end)):
        if value % (WINDOWS[grouping] if grouping else 60):
            unit = grouping or "minute"
            raise invalid(f"{name} must be aligned to a {unit} boundary.", param=name)
    summaries = []
    for window_start in range(start, end, step):
        window_end = min(window_start + step, end)
        events = meter_usage_events(state, meter, customer, window_start, window_end)
        if events:
            summaries.append(_summary(meter, customer, window_start, window_end, events))
    summaries.reverse()
    return page(summaries, params, f"/v1/billing/meters/{meter_id}/event_summaries")


def _summary(
    meter: dict[str, Any], customer: str, start: int, end: int, events: list[MeterEvent]
) -> dict[str, Any]:
    # Ids are derived from the window so that `starting_after` works across calls.
    digest = hashlib.sha256(f"{meter['id']}:{customer}:{start}:{end}".encode()).hexdigest()
    return {
        "id": "mtrusg_" + digest[:24],
        "object": "billing.meter_event_summary",
        "aggregated_value": float(aggregate(meter, events)),
        "end_time": end,
        "livemode": False,
        "meter": meter["id"],
        "start_time": start,
    }


def meter_usage_events(
    state: State, meter: dict[str, Any], customer: str, start: int, end: int
) -> list[MeterEvent]:
    """The customer's live (not cancelled) events of this meter with start <= timestamp < end."""
    customer_key = meter["customer_mapping"]["event_payload_key"]
    return [
        e
        for e in state.meter_events
        if e.event_name == meter["event_name"]
        and not e.cancelled
        and e.payload.get(customer_key) == customer
        and start <= e.timestamp < end
    ]


def aggregate(meter: dict[str, Any], events: list[MeterEvent]) -> Decimal:
    """The meter's formula over events: sum of values, number of events, or the latest value."""
    formula = meter["default_aggregation"]["formula"]
    if formula == "count":
        return Decimal(len(events))
    key = meter["value_settings"]["event_payload_key"]
    values = [(e.timestamp, Decimal(e.payload.get(key, "0"))) for e in events]
    if formula == "last":
        # sorted() is stable: of events with the same timestamp, the last received wins.
        return sorted(values, key=lambda pair: pair[0])[-1][1] if values else Decimal(0)
    return sum((v for _, v in values), Decimal(0))
