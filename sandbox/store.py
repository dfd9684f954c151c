"""Object storage: one global resourceVersion counter and a bounded log of watch events."""

from __future__ import annotations

import copy
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]  # (group, plural)
ObjKey = tuple[str, str]  # (namespace, name)


@dataclass
class Event:
    """One committed change, as watches see it."""

    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


class Store:
    """All objects by resource, guarded by one lock; writers notify waiting watchers."""

    def __init__(self, window: int = 20000) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 0
        self.objects: dict[Key, dict[ObjKey, dict[str, Any]]] = {}
        self.log: deque[Event] = deque()
        self.window = window
        # Watches and continue tokens older than this are answered 410 Gone.
        self.compacted_rv = 0

    def next_rv(self) -> int:
        """Take the next resourceVersion from the global counter."""
        self.rv += 1
        return self.rv

    def get(self, key: Key, ns: str, name: str) -> dict[str, Any] | None:
        """The stored object (not a copy: callers must not mutate it)."""
        return self.objects.get(key, {}).get((ns, name))

    def items(self, key: Key, ns: str | None = None) -> list[dict[str, Any]]:
        """Objects of one resource, sorted by namespace and name, optionally in one namespace."""
        bucket = self.objects.get(key, {})
        return [bucket[k] for k in sorted(bucket) if ns is None or k[0] == ns]

    def write(self, key: Key, obj: dict[str, Any], etype: str) -> dict[str, Any]:
        """Store an object under a fresh resourceVersion and log the event."""
        meta = obj["metadata"]
        okey = (meta.get("namespace", ""), meta["name"])
        bucket = self.objects.setdefault(key, {})
        old = bucket.get(okey)
        meta["resourceVersion"] = str(self.next_rv())
        if etype == "DELETED":
            bucket.pop(okey, None)
        else:
            bucket[okey] = obj
        self._record(Event(self.rv, key, etype, copy.deepcopy(obj), old))
        return obj

    def _record(self, event: Event) -> None:
        self.log.append(event)
        while len(self.log) > self.window:
            self.compacted_rv = self.log.popleft().rv
        self.changed.notify_all()

    def compact(self) -> None:
        """Forget the whole event log (tests use it to provoke 410 Gone)."""
        with self.lock:
            self.log.clear()
            self.compacted_rv = self.rv

    def events_after(self, rv: int) -> list[Event]:
        """Logged events with a resourceVersion above rv."""
        if not self.log or self.log[-1].rv <= rv:
            return []
        out = []
        for event in reversed(self.log):
            if event.rv <= rv:
                break
            out.append(event)
        out.reverse()
        return out

    def snapshot(self, key: Key, rv: int) -> dict[ObjKey, dict[str, Any]]:
        """The objects of a resource as they were at resourceVersion rv (for continue tokens)."""
        state = dict(self.objects.get(key, {}))
        for event in reversed(self.events_after(rv)):
            if event.key != key:
                continue
            meta = event.obj["metadata"]
            okey = (meta.get("namespace", ""), meta["name"])
            if event.type == "ADDED":
                state.pop(okey, None)
            elif event.old is not None:
                state[okey] = event.old
        return state

    def dump(self) -> dict[str, Any]:
        """Everything needed to restore the store (for --state)."""
        with self.lock:
            return {
                "rv": self.rv,
                "objects": [
                    {"group": k[0], "plural": k[1], "items": list(bucket.values())}
                    for k, bucket in self.objects.items()
                ],
            }

    def load(self, data: dict[str, Any]) -> None:
        """Restore a dump; the event log starts empty, so older watches get 410."""
        with self.lock:
            self.rv = int(data.get("rv", 0))
            self.compacted_rv = self.rv
            self.objects = {}
            for entry in data.get("objects", []):
                bucket = self.objects.setdefault((entry["group"], entry["plural"]), {})
                for obj in entry["items"]:
                    meta = obj["metadata"]
                    bucket[(meta.get("namespace", ""), meta["name"])] = obj
