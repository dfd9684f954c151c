"""What a simulated controller is built from: a change feed, step timers and an event recorder.

A controller that reads the store's event log instead of every object each round costs what
changed, like an informer's work queue; the timers carry simulated durations on the sandbox's
clock (divided by its speed). The change feed lives in the store: the garbage collector reads
it too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..core import Core, Ctx, now_iso
from ..store import ChangeFeed, ObjKey

__all__ = ["ChangeFeed", "EventRecorder", "Timers", "event_stamp"]

_stamp_lock = threading.Lock()
_last_stamp = 0


class Timers:
    """Simulated steps in flight, by object: each finishes a scaled number of seconds later."""

    def __init__(self, scaled: Callable[[float], float]) -> None:
        self.scaled = scaled
        self.steps: dict[ObjKey, dict[str, float]] = {}
        self.asked: dict[ObjKey, set[str]] = {}

    def due(self, key: ObjKey, step: str, seconds: float) -> bool:
        """Start a step, or tell whether the one in flight is done (then forget it)."""
        self.asked.setdefault(key, set()).add(step)
        steps = self.steps.setdefault(key, {})
        now = time.monotonic()
        if step not in steps:
            steps[step] = now + self.scaled(seconds)
            return False
        if now >= steps[step]:
            del steps[step]
            return True
        return False

    def begin(self, key: ObjKey) -> None:
        """Start reconciling one object: steps it does not ask for again are dropped."""
        self.asked[key] = set()

    def end(self, key: ObjKey) -> None:
        """Drop the object's steps nobody asked for since begin()."""
        asked = self.asked.pop(key, set())
        steps = {s: d for s, d in self.steps.get(key, {}).items() if s in asked}
        if steps:
            self.steps[key] = steps
        else:
            self.steps.pop(key, None)

    def expired(self) -> list[ObjKey]:
        """Objects with a step that is done by now."""
        now = time.monotonic()
        return [k for k, steps in self.steps.items() if any(d <= now for d in steps.values())]

    def next_due(self) -> float | None:
        """The earliest step end."""
        return min((d for steps in self.steps.values() for d in steps.values()), default=None)

    def __bool__(self) -> bool:
        return bool(self.steps)


def event_stamp() -> int:
    """A nanosecond stamp unique in this process (Event names sort chronologically)."""
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        return _last_stamp


class EventRecorder:
    """Writes core/v1 Events about objects, as client-go's recorder does."""

    def __init__(self, core: Core, component: str) -> None:
        self.core = core
        self.component = component
        self.ctx = Ctx(field_manager=component)

    def record(self, obj: dict[str, Any], reason: str, message: str, kind: str = "Normal") -> bool:
        """Record one Event about obj (with apiVersion and kind); False if its namespace is gone."""
        meta = obj["metadata"]
        ns = meta["namespace"]
        ns_rt = self.core.builtin("namespaces")
        namespace = self.core.store.get(ns_rt.key, "", ns)
        if namespace is None or namespace["metadata"].get("deletionTimestamp"):
            return False
        now = now_iso()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            # Named like client-go's recorder: object name and a hex timestamp, so lists run in
            # chronological order.
            "metadata": {"name": f"{meta['name']}.{event_stamp():x}", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": ns,
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": None,
            "count": 1,
        }
        self.core.create(self.core.builtin("events"), ns, body, self.ctx)
        return True
