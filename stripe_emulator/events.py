"""GET /v1/events and /v1/events/{id}: the events the emulator emitted."""

from __future__ import annotations

from typing import Any

from .forms import Params
from .state import State, page


def event_retrieve(state: State, params: Params, event_id: str) -> dict[str, Any]:
    """GET /v1/events/{id}."""
    params.only()
    return state.get("event", event_id)


def event_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/events, newest first, by `type` (a trailing `*` matches a prefix)."""
    params.only("type", "limit", "starting_after", "ending_before")
    wanted = params.text("type")
    events = [e for e in state.all("event") if wanted is None or type_matches(e["type"], wanted)]
    return page(events, params, "/v1/events")


def type_matches(event_type: str, pattern: str) -> bool:
    """`invoice.paid` matches `invoice.paid` and `invoice.*`."""
    if pattern.endswith("*"):
        return event_type.startswith(pattern[:-1])
    return event_type == pattern
