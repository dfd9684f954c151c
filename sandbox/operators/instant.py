"""Instant operators: a stand-in for the simulated ones when what is measured is the client.

`InstantOperator` makes the status objects of the plans Opsdeck ships with ready in the round
after they are written, and creates nothing else: a CloudNativePG Cluster gets a healthy status
with every requested instance ready, a StatefulSet a rolled-out status with every replica ready.
A round reads only the objects written since the one before (the store's change feed; all of
them in its first round, or when events were lost) and writes the new status of those not
ready, so its cost follows what changed, not the size of the cluster. Benchmarks choose it with
`Sandbox.use_instant_operators()`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core import Ctx
from ..errors import ApiError
from ..store import ChangeFeed
from .cnpg import HEALTHY

if TYPE_CHECKING:
    from ..api import Sandbox

Obj = dict[str, Any]


def _cluster_status(obj: Obj) -> Obj:
    spec, name = obj.get("spec") or {}, obj["metadata"]["name"]
    want = int(spec.get("instances", 1))
    return {
        "phase": HEALTHY,
        "instances": want,
        "readyInstances": want,
        "currentPrimary": f"{name}-1",
        "targetPrimary": f"{name}-1",
        "writeService": f"{name}-rw",
        "readService": f"{name}-r",
        "image": spec.get("imageName", ""),
    }


def _statefulset_status(obj: Obj) -> Obj:
    replicas = int((obj.get("spec") or {}).get("replicas", 1))
    revision = f"{obj['metadata']['name']}-{obj['metadata'].get('generation', 1)}"
    status: Obj = {
        "observedGeneration": obj["metadata"].get("generation", 1),
        "replicas": replicas,
        "currentReplicas": replicas,
        "updatedReplicas": replicas,
        "currentRevision": revision,
        "updateRevision": revision,
        "availableReplicas": replicas,
    }
    if replicas:  # as Kubernetes, no readyReplicas while none is ready
        status["readyReplicas"] = replicas
    return status


@dataclass(frozen=True)
class Kind:
    """A resource whose objects are made ready: where it is served and its ready status."""

    group: str
    version: str
    plural: str
    status: Callable[[Obj], Obj]


KINDS = (
    Kind("postgresql.cnpg.io", "v1", "clusters", _cluster_status),
    Kind("apps", "v1", "statefulsets", _statefulset_status),
)


class InstantOperator:
    """Gives every object of `KINDS` whose status is not its ready one that status at once."""

    name = "instant"

    def __init__(self, sandbox: Sandbox) -> None:
        self.core = sandbox.core
        self.ctx = Ctx(field_manager="instant-operator", field_validation="Ignore")
        self.feeds: dict[Any, ChangeFeed] = {}  # by resource, once it is served
        # By resource, the objects whose status write was refused (a schema that did not allow
        # it): tried again every round, as nothing else may write them.
        self.refused: dict[Any, set[tuple[str, str]]] = {}

    def next_due(self) -> float | None:
        return None

    def busy(self) -> bool:
        return False

    def reconcile(self) -> bool:
        changed = False
        for kind in KINDS:
            rt = self.core.resolve(kind.group, kind.version, kind.plural)
            if rt is not None:
                changed |= self._ready(rt, kind)
        return changed

    def _written(self, rt: Any) -> list[Obj]:
        """The kind's stored objects written since the last round (all, in the first one or
        when events were lost: the feed says so), and those whose status was refused."""
        if rt.key not in self.feeds:
            self.feeds[rt.key] = ChangeFeed(self.core.store, [rt.key])
        bucket = self.core.store.objects.get(rt.key, {})
        events = self.feeds[rt.key].poll()
        refused = self.refused.pop(rt.key, set())
        if events is None:
            return list(bucket.values())
        keys = {(e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]) for e in events}
        return [bucket[key] for key in keys | refused if key in bucket]

    def _ready(self, rt: Any, kind: Kind) -> bool:
        changed = False
        with self.core.lock:
            waiting = []
            for obj in self._written(rt):
                status, current = kind.status(obj), obj.get("status") or {}
                if obj["metadata"].get("deletionTimestamp"):
                    continue
                if any(current.get(key) != value for key, value in status.items()):
                    waiting.append((obj, status))
            for obj, status in waiting:
                body = copy.deepcopy(obj)
                body["status"] = {**(obj.get("status") or {}), **status}
                meta = obj["metadata"]
                try:
                    self.core.update(rt, meta.get("namespace", ""), meta["name"], body, self.ctx,
                                     "status")  # fmt: skip
                except ApiError:  # refused (its schema): the next round tries again
                    self.refused.setdefault(rt.key, set()).add(
                        (meta.get("namespace", ""), meta["name"])
                    )
                    continue
                changed = True
        return changed
