"""What the garbage collector looks up, kept from the store's event log.

Every object by uid, every dependent by owner uid, the objects whose owners must be checked,
the objects being deleted in the foreground, terminating namespaces, the objects in each
namespace (so emptying one costs its own objects) and when Events expire. A
round reads only the events since the previous one; everything is indexed again only at start
or when the log was trimmed past what the collector had read.
"""

from __future__ import annotations

import heapq
from typing import Any

from .store import ChangeFeed, Event, Key, ObjKey, Store

Where = tuple[Key, ObjKey]

NAMESPACES: Key = ("", "namespaces")
EVENTS: Key = ("", "events")


def event_stamp(event: dict[str, Any]) -> str | None:
    """When an Event was last seen (RFC 3339 strings compare in time order)."""
    return event.get("lastTimestamp") or event["metadata"].get("creationTimestamp")


class GcIndex:
    """The garbage collector's view of the store, updated from its change feed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.feed = ChangeFeed(store)
        self.uids: dict[str, Where] = {}
        self.dependents: dict[str, set[Where]] = {}
        # Objects whose owners may be gone: new or changed references, or a deleted owner.
        self.unchecked: set[Where] = set()
        self.foreground: set[Where] = set()
        self.terminating: set[str] = set()
        self.in_namespace: dict[str, set[Where]] = {}
        # (last seen, where): an entry is stale if the Event was seen again since.
        self.expiry: list[tuple[str, Where]] = []

    def sync(self) -> None:
        """Catch up with the store (call with the store's lock held)."""
        events = self.feed.poll()
        if events is None:
            self._rebuild()
            return
        for event in events:
            self._apply(event)

    def dependents_of(self, uid: str) -> list[tuple[Key, dict[str, Any]]]:
        """The stored objects with an owner reference to uid, in a stable order."""
        self.sync()
        return self._stored(self.dependents.get(uid, ()))

    def take_unchecked(self) -> list[tuple[Key, dict[str, Any]]]:
        """The objects whose owners must be checked, forgotten once taken."""
        self.sync()
        out = self._stored(self.unchecked)
        self.unchecked = set()
        return out

    def objects_in(self, namespace: str) -> list[tuple[Key, dict[str, Any]]]:
        """The stored objects in a namespace, by resource then name."""
        self.sync()
        return self._stored(self.in_namespace.get(namespace, ()))

    def _stored(self, refs) -> list[tuple[Key, dict[str, Any]]]:
        """The objects `refs` ((resource key, object key) pairs) name that are still stored, in
        a stable order."""
        out = []
        for key, okey in sorted(refs):
            obj = self.store.get(key, *okey)
            if obj is not None:
                out.append((key, obj))
        return out

    def expired_events(self, cutoff: str) -> list[ObjKey]:
        """Events last seen before cutoff."""
        self.sync()
        out = []
        while self.expiry and self.expiry[0][0] < cutoff:
            stamp, (_, okey) = heapq.heappop(self.expiry)
            event = self.store.get(EVENTS, *okey)
            if event is not None and event_stamp(event) == stamp:
                out.append(okey)
        return out

    def _rebuild(self) -> None:
        self.uids, self.dependents = {}, {}
        self.unchecked, self.foreground, self.terminating = set(), set(), set()
        self.in_namespace, self.expiry = {}, []
        for key, bucket in self.store.objects.items():
            for obj in bucket.values():
                self._add(key, obj)

    def _apply(self, event: Event) -> None:
        if event.old is not None:
            self._forget(event.key, event.old)
        if event.type == "DELETED":
            self._forget(event.key, event.obj)
            # Its dependents lost an owner.
            self.unchecked |= self.dependents.get(event.obj["metadata"]["uid"], set())
        else:
            self._add(event.key, event.obj)

    def _add(self, key: Key, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        where = (key, (meta.get("namespace", ""), meta["name"]))
        self.uids[meta["uid"]] = where
        if where[1][0]:
            self.in_namespace.setdefault(where[1][0], set()).add(where)
        refs = meta.get("ownerReferences") or []
        for ref in refs:
            self.dependents.setdefault(ref.get("uid", ""), set()).add(where)
        if refs:
            self.unchecked.add(where)
        if "foregroundDeletion" in (meta.get("finalizers") or []):
            self.foreground.add(where)
        if key == NAMESPACES and meta.get("deletionTimestamp"):
            self.terminating.add(meta["name"])
        if key == EVENTS and (stamp := event_stamp(obj)):
            heapq.heappush(self.expiry, (stamp, where))

    def _forget(self, key: Key, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        where = (key, (meta.get("namespace", ""), meta["name"]))
        if self.uids.get(meta["uid"]) == where:
            del self.uids[meta["uid"]]
        inside = self.in_namespace.get(where[1][0])
        if inside is not None:
            inside.discard(where)
            if not inside:
                del self.in_namespace[where[1][0]]
        for ref in meta.get("ownerReferences") or []:
            deps = self.dependents.get(ref.get("uid", ""))
            if deps is not None:
                deps.discard(where)
                if not deps:
                    del self.dependents[ref.get("uid", "")]
        self.foreground.discard(where)
        if key == NAMESPACES:
            self.terminating.discard(meta["name"])
