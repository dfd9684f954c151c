"""Object storage: one global resourceVersion counter and a bounded log of watch events."""

from __future__ import annotations

import bisect
import copy
import threading
import time
from collections import deque
from collections.abc import Iterable
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
    # The wall-clock time (`time.time()`) it was stored: how long a client took to notice a
    # change is measured from here.
    at: float = 0.0


class Store:
    """All objects by resource, guarded by one lock; writers notify waiting watchers."""

    def __init__(self, window: int = 20000) -> None:
        self.lock = threading.RLock()
        # Notified on every change: what waits on any resource (the controllers).
        self.changed = threading.Condition(self.lock)
        # Per resource, notified on its changes only: its watches, which a change of another
        # resource would wake for nothing (each then takes the lock every request needs).
        self._changed_of: dict[Key, threading.Condition] = {}
        self.rv = 0
        self.objects: dict[Key, dict[ObjKey, dict[str, Any]]] = {}
        self.log: deque[Event] = deque()
        self.window = window
        # Watches and continue tokens older than this are answered 410 Gone.
        self.compacted_rv = 0
        # resource -> label -> (namespace, label value) -> names, kept up to date on write.
        self.indexes: dict[Key, dict[str, dict[ObjKey, set[str]]]] = {}

    def changed_of(self, key: Key) -> threading.Condition:
        """The condition a watch of one resource waits on (with the lock held)."""
        found = self._changed_of.get(key)
        if found is None:
            found = self._changed_of[key] = threading.Condition(self.lock)
        return found

    def notify_all(self) -> None:
        """Wake everything that waits, whatever it waits on: the sandbox stops, or forgot its
        event history (with the lock held)."""
        self.changed.notify_all()
        for waiting in self._changed_of.values():
            waiting.notify_all()

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
        keys = bucket if ns is None else [k for k in bucket if k[0] == ns]
        return [bucket[k] for k in sorted(keys)]

    def index_label(self, key: Key, label: str) -> None:
        """Keep one resource's objects findable by namespace and the value of a label."""
        with self.lock:
            if label in self.indexes.get(key, {}):
                return
            self.indexes.setdefault(key, {})[label] = {}
            for obj in self.objects.get(key, {}).values():
                self._index(key, obj, True)

    def labelled(self, key: Key, ns: str, label: str, value: str) -> list[dict[str, Any]]:
        """Objects in ns whose label has this value, sorted by name (index_label first)."""
        bucket = self.objects.get(key, {})
        found = (
            bucket.get((ns, name)) for name in sorted(self.indexes[key][label].get((ns, value), ()))
        )
        # Checked again, in case a caller changed a stored object in place.
        return [o for o in found if o and (o["metadata"].get("labels") or {}).get(label) == value]

    def _index(self, key: Key, obj: dict[str, Any] | None, add: bool) -> None:
        if obj is None:
            return
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        for label, index in self.indexes.get(key, {}).items():
            if label not in labels:
                continue
            entry = (meta.get("namespace", ""), labels[label])
            if add:
                index.setdefault(entry, set()).add(meta["name"])
            elif entry in index:
                index[entry].discard(meta["name"])
                if not index[entry]:
                    del index[entry]

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
        if key in self.indexes:
            self._index(key, old, False)
            self._index(key, None if etype == "DELETED" else obj, True)
        self._record(Event(self.rv, key, etype, copy.deepcopy(obj), old, time.time()))
        return obj

    def _record(self, event: Event) -> None:
        self.log.append(event)
        while len(self.log) > self.window:
            self.compacted_rv = self.log.popleft().rv
        self.changed.notify_all()
        waiting = self._changed_of.get(event.key)
        if waiting is not None:
            waiting.notify_all()

    def compact(self) -> None:
        """Forget the whole event log (tests use it to provoke 410 Gone)."""
        with self.lock:
            self.log.clear()
            self.compacted_rv = self.rv

    def stored_at(self, rv: int) -> float | None:
        """When the change with resourceVersion rv was stored (`time.time()`); None once the
        event log has forgotten it, or when no change has that version."""
        with self.lock:
            at = bisect.bisect_left(self.log, rv, key=lambda event: event.rv)
            if at < len(self.log) and self.log[at].rv == rv:
                return self.log[at].at
            return None

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
            for key, labels in self.indexes.items():
                for label in labels:
                    labels[label] = {}
                for obj in self.objects.get(key, {}).values():
                    self._index(key, obj, True)


class ChangeFeed:
    """The store's events for some resources (all without keys) since the previous poll."""

    def __init__(self, store: Store, keys: Iterable[Key] | None = None) -> None:
        self.store = store
        self.keys = None if keys is None else set(keys)
        self.rv: int | None = None

    def poll(self) -> list[Event] | None:
        """New events; None when the caller must resync (first poll, or events were lost)."""
        with self.store.lock:
            if self.rv is None or self.rv < self.store.compacted_rv:
                self.rv = self.store.rv
                return None
            events = self.store.events_after(self.rv)
            if self.keys is not None:
                events = [e for e in events if e.key in self.keys]
            self.rv = self.store.rv
            return events
