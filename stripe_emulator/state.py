"""The emulator's memory: Stripe objects (events too) by kind, accepted meter events, the clock."""

from __future__ import annotations

import copy
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import invalid, no_such
from .forms import Params

# The API version whose object shapes the emulator answers with (stripe-python 16.1's default).
API_VERSION = "2026-10-28.endive"
_ALPHABET = string.ascii_letters + string.digits
DAY = 86400


def new_id(prefix: str, length: int = 24) -> str:
    """A Stripe-like id: `cus_` + random letters and digits."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


@dataclass
class MeterEvent:
    """One accepted meter event, as tests read it back."""

    event_name: str
    identifier: str
    payload: dict[str, str]
    timestamp: int
    created: int
    cancelled: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (the control API's and the Python API's)."""
        return {
            "event_name": self.event_name,
            "identifier": self.identifier,
            "payload": dict(self.payload),
            "timestamp": self.timestamp,
            "created": self.created,
            "cancelled": self.cancelled,
        }


@dataclass
class State:
    """Everything the emulator holds; every read and write happens under `lock`."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    # Where the emulator serves its pages (checkout, portal, invoices); set once bound.
    base_url: str = ""
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    meter_events: list[MeterEvent] = field(default_factory=list)
    # Every API request answered (method, path, params, status), for tests to read back.
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Seconds added to the wall clock, so tests can step past Stripe's 24-hour windows.
    clock_offset: int = 0
    invoice_numbers: int = 0
    # Called with each new event (the webhook sender queues it); set by the emulator.
    on_event: Callable[[dict[str, Any]], None] | None = None

    def now(self) -> int:
        """Epoch seconds on the emulator's clock."""
        return int(time.time()) + self.clock_offset

    def reset(self) -> None:
        """Forget every object, event, meter event and recorded request (the clock stays)."""
        with self.lock:
            self.objects.clear()
            self.meter_events.clear()
            self.requests.clear()
            self.invoice_numbers = 0

    # ---- objects ---------------------------------------------------------------------------

    def add(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object under its kind (its `object` field unless told otherwise)."""
        self.objects.setdefault(kind, {})[obj["id"]] = obj
        return obj

    def find(self, kind: str, object_id: str) -> dict[str, Any] | None:
        """The stored object, or None."""
        return self.objects.get(kind, {}).get(object_id)

    def get(
        self, kind: str, object_id: str, *, label: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        """The stored object; Stripe's 404 for an id in the path, or its 400 for a parameter."""
        obj = self.find(kind, object_id)
        if obj is None:
            label = label or kind
            if param is None:
                raise no_such(label, object_id)
            raise no_such(label, object_id, param=param, status=400)
        return obj

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Objects of a kind, newest first (Stripe's list order)."""
        return list(reversed(self.objects.get(kind, {}).values()))

    # ---- events ----------------------------------------------------------------------------

    def emit(
        self, event_type: str, obj: dict[str, Any], previous: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Record an event holding a snapshot of obj, and hand it to the webhook sender."""
        data: dict[str, Any] = {"object": copy.deepcopy(obj)}
        if previous:
            data["previous_attributes"] = copy.deepcopy(previous)
        event = {
            "id": new_id("evt_"),
            "object": "event",
            "api_version": API_VERSION,
            "created": self.now(),
            "data": data,
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": event_type,
        }
        self.add("event", event)
        if self.on_event is not None:
            self.on_event(event)
        return event


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """`previous_attributes`: the old values of the top-level fields an update changed."""
    return {k: before.get(k) for k in after if before.get(k) != after[k]}


def matching(state: State, kind: str, params: Params, *fields: str) -> list[dict[str, Any]]:
    """The objects of `kind`, in Stripe's order, whose `fields` hold what the request's
    parameters of those names say (a field the request does not name: any)."""
    wanted = [(name, params.text(name)) for name in fields]
    return [
        obj
        for obj in state.all(kind)
        if all(value is None or obj[name] == value for name, value in wanted)
    ]


def page(objects: Iterable[dict[str, Any]], params: Params, url: str) -> dict[str, Any]:
    """One page of a Stripe list object: `limit` (1..100, default 10), `starting_after`,
    `ending_before`, over objects already in Stripe's order (newest first)."""
    items = list(objects)
    limit = params.integer("limit")
    limit = 10 if limit is None else limit
    if not 1 <= limit <= 100:
        raise invalid("This value must be between 1 and 100.", param="limit")
    after, before = params.text("starting_after"), params.text("ending_before")
    ids = [o.get("id") for o in items]
    if after is not None:
        if after not in ids:
            raise invalid(f"No such object: '{after}'", param="starting_after")
        items = items[ids.index(after) + 1 :]
        chosen = items[:limit]
        more = len(items) > limit
    elif before is not None:
        if before not in ids:
            raise invalid(f"No such object: '{before}'", param="ending_before")
        items = items[: ids.index(before)]
        chosen = items[-limit:]
        more = len(items) > limit
    else:
        chosen = items[:limit]
        more = len(items) > limit
    return {"object": "list", "data": chosen, "has_more": more, "url": url}


def list_object(items: list[dict[str, Any]], url: str) -> dict[str, Any]:
    """A complete embedded list (a subscription's items, an invoice's lines)."""
    return {"object": "list", "data": items, "has_more": False, "url": url}
