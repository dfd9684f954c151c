"""Simulated storage: a default dynamic provisioner that binds claims, and volume expansion.

A Pending claim is provisioned and bound after a simulated delay (spec.volumeName
`pvc-<uid>`, status.capacity = the request). A bound claim whose storage request grew is
expanded: `allocatedResources` and a Resizing condition at once, the new capacity after a
simulated delay. Claims bound by someone else (the CloudNativePG simulation binds its own) are
only expanded. Only claims that changed are looked at in a round.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

from ..core import Ctx, now_iso
from ..errors import ApiError
from ..store import ObjKey
from ..workloads import parse_quantity, storage_capacity, storage_request
from .machinery import ChangeFeed, EventRecorder, Timers

if TYPE_CHECKING:
    from ..api import Sandbox

log = logging.getLogger("sandbox.volumes")

MANAGER = "kube-controller-manager"
PROVISIONER = "sandbox.k8s.io/hostpath"
# Realistic durations in seconds at speed 1.0.
PROVISION_SECONDS = 1.0
EXPAND_SECONDS = 3.0


class VolumeController:
    """Binds pending claims and expands grown ones."""

    name = "volumes"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sb = sandbox
        self.core = sandbox.core
        self.claims = self.core.builtin("persistentvolumeclaims")
        self.feed = ChangeFeed(self.core.store, [self.claims.key])
        self.timers = Timers(sandbox.scaled)
        self.events = EventRecorder(self.core, "persistentvolume-controller")
        self.ctx = Ctx(field_manager=MANAGER)
        self.changed = False

    def next_due(self) -> float | None:
        """The earliest provisioning or expansion in flight."""
        return self.timers.next_due()

    def busy(self) -> bool:
        """True while a claim is being provisioned or expanded."""
        return bool(self.timers)

    def reconcile(self) -> bool:
        """Look at the claims that changed since the last round (all of them on a resync)."""
        self.changed = False
        with self.core.lock:
            events = self.feed.poll()
            dirty = set(self.timers.expired())
            if events is None:
                dirty |= set(self.core.store.objects.get(self.claims.key, {}))
            else:
                for event in events:
                    if event.type != "DELETED":
                        meta = event.obj["metadata"]
                        dirty.add((meta.get("namespace", ""), meta["name"]))
        for key in sorted(dirty):
            try:
                with self.core.lock:
                    self.timers.begin(key)
                    try:
                        self._sync(key)
                    finally:
                        self.timers.end(key)
            except ApiError as exc:
                log.debug("claim %s/%s: %s", *key, exc.message)
            except Exception:
                log.exception("claim %s/%s failed", *key)
        return self.changed

    def _sync(self, key: ObjKey) -> None:
        claim = self.core.store.get(self.claims.key, *key)
        if claim is None or claim["metadata"].get("deletionTimestamp"):
            return
        status = claim.get("status") or {}
        if status.get("phase", "Pending") == "Pending":
            if self.timers.due(key, "provision", PROVISION_SECONDS):
                self._bind(key, claim)
            return
        if status.get("phase") != "Bound":
            return
        wanted, has = storage_request(claim), storage_capacity(claim)
        want_size, has_size = parse_quantity(wanted), parse_quantity(has)
        if want_size is None or has_size is None or want_size <= has_size:
            return
        volume = claim["spec"].get("volumeName") or f"pvc-{claim['metadata']['uid']}"
        if (status.get("allocatedResources") or {}).get("storage") != wanted:
            now = now_iso()
            self._write_status(
                claim,
                {
                    **status,
                    "allocatedResources": {"storage": wanted},
                    "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                    "conditions": [
                        {
                            "type": "Resizing",
                            "status": "True",
                            "lastProbeTime": None,
                            "lastTransitionTime": now,
                        }
                    ],
                },
            )
            self._event(claim, "Resizing", f"External resizer is resizing volume {volume}")
        if self.timers.due(key, f"expand:{wanted}", EXPAND_SECONDS):
            current = self.core.store.get(self.claims.key, *key) or claim
            done = {
                k: v
                for k, v in (current.get("status") or {}).items()
                if k not in ("conditions", "allocatedResourceStatuses")
            }
            done["capacity"] = {**(done.get("capacity") or {}), "storage": wanted}
            self._write_status(current, done)
            self._event(
                current,
                "FileSystemResizeSuccessful",
                f"MountVolume.NodeExpandVolume succeeded for volume {volume!r} sandbox-node",
            )

    def _bind(self, key: ObjKey, claim: dict[str, Any]) -> None:
        volume = f"pvc-{claim['metadata']['uid']}"
        body = copy.deepcopy(claim)
        annotations = body["metadata"].setdefault("annotations", {})
        annotations.setdefault("pv.kubernetes.io/bind-completed", "yes")
        annotations.setdefault("pv.kubernetes.io/bound-by-controller", "yes")
        annotations.setdefault("volume.kubernetes.io/storage-provisioner", PROVISIONER)
        body["spec"].setdefault("volumeName", volume)
        updated = self.core.update(self.claims, key[0], key[1], body, self.ctx)
        self._write_status(
            updated,
            {
                "phase": "Bound",
                "accessModes": list(body["spec"].get("accessModes") or ["ReadWriteOnce"]),
                "capacity": {"storage": storage_request(claim) or "1Gi"},
            },
        )
        self._event(
            updated,
            "ProvisioningSucceeded",
            f"Successfully provisioned volume {volume}",
        )

    def _write_status(self, claim: dict[str, Any], status: dict[str, Any]) -> None:
        body = {**claim, "status": status}
        meta = claim["metadata"]
        self.core.update(self.claims, meta["namespace"], meta["name"], body, self.ctx, "status")
        self.changed = True

    def _event(self, claim: dict[str, Any], reason: str, message: str) -> None:
        obj = {**claim, "apiVersion": "v1", "kind": "PersistentVolumeClaim"}
        if self.events.record(obj, reason, message):
            self.changed = True
