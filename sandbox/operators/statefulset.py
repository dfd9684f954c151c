"""Simulated StatefulSet controller (kube-controller-manager's), with the kubelet's part of it.

Pods `<name>-<ordinal>` from the template, claims `<claim>-<name>-<ordinal>` from the
volumeClaimTemplates before their pod, OrderedReady or Parallel pod management, scale down from
the highest ordinal, RollingUpdate (highest ordinal first, honouring the partition) or OnDelete,
ControllerRevisions named `<name>-<hash>`, and the status kubectl rollout status reads. A pod
becomes Running and Ready once its claims are bound and a simulated start delay has passed;
termination takes a simulated stop delay. Only StatefulSets that changed (or whose pods, claims
or timers did) are looked at in a round.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from ..core import Ctx, now_iso
from ..errors import ApiError
from ..store import ObjKey
from .kubelet import crash_status, crashed, record_backoff, restarted_status
from .machinery import ChangeFeed, EventRecorder, Timers

if TYPE_CHECKING:
    from ..api import Sandbox

log = logging.getLogger("sandbox.statefulset")

MANAGER = "kube-controller-manager"
COMPONENT = "statefulset-controller"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = "controller-revision-hash"
HASH_LABEL = "controller.kubernetes.io/hash"
# Realistic durations in seconds at speed 1.0.
POD_START_SECONDS = 2.0
POD_STOP_SECONDS = 1.0
# A refused create is tried again after a backoff, as the controller's work queue does:
# 5 ms doubling to 1000 s (simulated: divided by the speed like every duration).
RETRY_FIRST_SECONDS = 0.005
RETRY_MAX_SECONDS = 1000.0
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def template_hash(template: dict[str, Any]) -> str:
    """ControllerRevision hash of a pod template: FNV-32a, then rand.SafeEncodeString."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE[ord(ch) % len(_SAFE)] for ch in str(value))


def is_ready(pod: dict[str, Any]) -> bool:
    """Running with a Ready condition that is True."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _log_stamp() -> str:
    """`30 Nov 2026 12:00:00.123`, the time format of many servers' logs."""
    now = dt.datetime.now(dt.UTC)
    month = _MONTHS[now.month - 1]
    return f"{now.day:02d} {month} {now.year} {now:%H:%M:%S}.{now.microsecond // 1000:03d}"


def _owner(sts: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": sts["metadata"]["name"],
        "uid": sts["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owning_set(obj: dict[str, Any] | None) -> tuple[ObjKey, str] | None:
    """(namespace, name) and uid of the StatefulSet controlling obj, if one does."""
    if obj is None:
        return None
    meta = obj["metadata"]
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "StatefulSet":
            return (meta.get("namespace", ""), ref.get("name", "")), ref.get("uid", "")
    return None


class StatefulSetController:
    """The StatefulSet controller, reconciling only what changed."""

    name = "statefulsets"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sb = sandbox
        self.core = sandbox.core
        self.sets = self.core.builtin("statefulsets")
        self.pods = self.core.builtin("pods")
        self.claims = self.core.builtin("persistentvolumeclaims")
        self.revisions = self.core.builtin("controllerrevisions")
        self.feed = ChangeFeed(self.core.store, [self.sets.key, self.pods.key, self.claims.key])
        self.timers = Timers(sandbox.scaled)
        self.events = EventRecorder(self.core, COMPONENT)
        self.kubelet_events = EventRecorder(self.core, "kubelet")
        # Pod failures (Faults.fail_pod) as last seen, and when a failing pod's set looks again.
        self.pod_failures: dict[ObjKey, float] = {}
        self.wakeups: dict[ObjKey, float] = {}
        self.ctx = Ctx(field_manager=MANAGER)
        # Which pods each StatefulSet controls, and which set a claim name belongs to.
        self.pods_of: dict[ObjKey, set[str]] = {}
        self.claim_owner: dict[ObjKey, ObjKey] = {}
        # Creates refused in a row, by set (a quota exceeded, say): how long the next wait is.
        self.refusals: dict[ObjKey, int] = {}
        self.changed = False

    # ---- controller protocol ---------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest simulated step in flight or end of a pod failure."""
        times = [self.timers.next_due(), *self.wakeups.values()]
        return min((t for t in times if t is not None), default=None)

    def busy(self) -> bool:
        """True while a pod is starting or stopping."""
        return bool(self.timers)

    def reconcile(self) -> bool:
        """Reconcile the StatefulSets touched since the last round (all of them on a resync)."""
        self.changed = False
        with self.core.lock:
            dirty = self._dirty()
        for key in sorted(dirty):
            try:
                with self.core.lock:
                    self.timers.begin(key)
                    try:
                        self._sync(key)
                    finally:
                        self.timers.end(key)
            except ApiError as exc:
                # A conflicting client write: the next round sees the new version.
                log.debug("statefulset %s/%s: %s", *key, exc.message)
            except Exception:
                log.exception("statefulset %s/%s failed", *key)
        return self.changed

    def _dirty(self) -> set[ObjKey]:
        events = self.feed.poll()
        dirty = set(self.timers.expired())
        now = time.monotonic()
        for key in [k for k, when in self.wakeups.items() if when <= now]:
            del self.wakeups[key]
            dirty.add(key)
        failures = self.sb.faults.pod_failures()
        if failures != self.pod_failures:
            changed = failures.keys() ^ self.pod_failures.keys()
            changed |= {k for k, until in failures.items() if self.pod_failures.get(k) != until}
            self.pod_failures = failures
            for ns, pod_name in changed:
                owning = _owning_set(self.core.store.get(self.pods.key, ns, pod_name))
                if owning is not None:
                    dirty.add(owning[0])
        if events is None:
            self.pods_of = {}
            for pod in self.core.store.objects.get(self.pods.key, {}).values():
                self._index(None, pod)
            return dirty | set(self.core.store.objects.get(self.sets.key, {}))
        for event in events:
            meta = event.obj["metadata"]
            okey = (meta.get("namespace", ""), meta["name"])
            if event.key == self.sets.key:
                dirty.add(okey)
            elif event.key == self.pods.key:
                new = None if event.type == "DELETED" else event.obj
                dirty |= self._index(event.old, new, okey[1])
            elif okey in self.claim_owner:
                owner = self.claim_owner[okey]
                dirty.add(owner)
                if event.type == "DELETED":
                    del self.claim_owner[okey]
        return dirty

    def _index(
        self, old: dict[str, Any] | None, new: dict[str, Any] | None, name: str = ""
    ) -> set[ObjKey]:
        """Move a pod between sets in the index; the sets concerned."""
        touched = set()
        name = name or (new or old or {"metadata": {"name": ""}})["metadata"]["name"]
        for obj, add in ((old, False), (new, True)):
            owning = _owning_set(obj)
            if owning is None:
                continue
            key = owning[0]
            touched.add(key)
            if add:
                self.pods_of.setdefault(key, set()).add(name)
            else:
                self.pods_of.get(key, set()).discard(name)
        return touched

    # ---- one StatefulSet -------------------------------------------------------------------

    def _sync(self, key: ObjKey) -> None:
        ns, name = key
        stored = self.core.store.get(self.sets.key, ns, name)
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            # The garbage collector removes the pods; the claims stay (retention: Retain).
            if stored is None and not self.pods_of.get(key):
                self.pods_of.pop(key, None)
            return
        sts = {**stored, "apiVersion": "apps/v1", "kind": "StatefulSet"}
        spec = sts["spec"]
        uid = sts["metadata"]["uid"]
        replicas = int(spec.get("replicas", 1))
        start = int((spec.get("ordinals") or {}).get("start", 0))
        strategy = spec.get("updateStrategy") or {}
        rolling = strategy.get("type") == "RollingUpdate"
        partition = int((strategy.get("rollingUpdate") or {}).get("partition", 0)) if rolling else 0
        monotonic = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        update_revision = self._revision(sts)
        status = stored.get("status") or {}
        current_revision = status.get("currentRevision") or update_revision

        pods = self._owned_pods(key, uid)
        wanted = range(start, start + replicas)
        condemned = sorted((o for o in pods if o not in wanted), reverse=True)

        failures = self.sb.faults.pod_failures()
        for pod in pods.values():
            self._kubelet(key, pod, failures)
        pods = self._owned_pods(key, uid)

        blocked = False
        for ordinal in wanted:
            pod = pods.get(ordinal)
            if pod is None:
                revision = current_revision if ordinal < start + partition else update_revision
                created = self._create_pod(sts, ordinal, revision, update_revision)
                if created is not None:
                    pods[ordinal] = created
                if created is None or monotonic:
                    blocked = True
                    break
            elif monotonic and not is_ready(pod):
                blocked = True
                break

        healthy = all(is_ready(pods[o]) for o in wanted if o in pods) and len(pods) >= replicas
        if not blocked and condemned and (healthy or not monotonic):
            victims = condemned[:1] if monotonic else condemned
            for ordinal in victims:
                self._terminate(key, sts, pods, ordinal)
        elif not blocked and not condemned and rolling and healthy:
            for ordinal in sorted(wanted, reverse=True):
                if ordinal < start + partition:
                    break
                pod = pods[ordinal]
                if pod["metadata"]["labels"].get(REVISION_LABEL) != update_revision:
                    self._terminate(key, sts, pods, ordinal)
                    break

        self._write_status(stored, pods, current_revision, update_revision, rolling)

    def _owned_pods(self, key: ObjKey, uid: str) -> dict[int, dict[str, Any]]:
        out = {}
        for pod_name in self.pods_of.get(key, ()):
            pod = self.core.store.get(self.pods.key, key[0], pod_name)
            owning = _owning_set(pod)
            prefix, _, ordinal = pod_name.rpartition("-")
            if pod is None or owning is None or owning[1] != uid or prefix != key[1]:
                continue
            if ordinal.isdigit():
                out[int(ordinal)] = pod
        return out

    def _kubelet(self, key: ObjKey, pod: dict[str, Any], failures: dict[ObjKey, float]) -> None:
        """Start a pending pod once its claims are bound, after the simulated start delay.

        A pod named in a fault (Faults.fail_pod) crashes and stays down until the fault ends,
        then starts again after the same delay.
        """
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        until = failures.get((key[0], meta["name"]))
        if until is not None:
            if until != math.inf:
                current = self.wakeups.get(key)
                self.wakeups[key] = until if current is None else min(current, until)
            if is_ready(pod):
                self._set_pod_status(pod, crash_status(pod))
                self._log(pod, "# Exiting on fatal signal SIGKILL (injected by the sandbox)")
                record_backoff(self.kubelet_events, pod)
            return
        if crashed(pod):
            if self.timers.due(key, f"restart:{meta['name']}:{meta['uid']}", POD_START_SECONDS):
                self._set_pod_status(pod, restarted_status(pod))
                self._log_start(pod)
            return
        if (pod.get("status") or {}).get("phase") != "Pending":
            return
        for volume in pod["spec"].get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim_name is None:
                continue
            claim = self.core.store.get(self.claims.key, key[0], claim_name)
            self.claim_owner[(key[0], claim_name)] = key
            if claim is None or (claim.get("status") or {}).get("phase") != "Bound":
                return
        if not self.timers.due(key, f"start:{meta['name']}:{meta['uid']}", POD_START_SECONDS):
            return
        now = now_iso()
        containers = pod["spec"].get("containers") or []
        status = {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
            ]
            + [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [
                {
                    "name": c.get("name", ""),
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
            "hostIP": "10.89.0.2",
            "podIP": f"10.244.1.{int(meta['labels'].get(POD_INDEX_LABEL, '0')) % 250 + 2}",
            "qosClass": "BestEffort",
            "startTime": now,
        }
        self._set_pod_status(pod, status)
        self._log_start(pod)

    def _set_pod_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        body = copy.deepcopy(pod)
        body["status"] = status
        meta = pod["metadata"]
        self.core.update(self.pods, meta["namespace"], meta["name"], body, self.ctx, "status")
        self.changed = True

    def _log(self, pod: dict[str, Any], *messages: str) -> None:
        """Write lines into every container's log, in the common `pid:role date level` form."""
        meta = pod["metadata"]
        for container in pod["spec"].get("containers") or []:
            lines = [f"1:M {_log_stamp()} {message}" for message in messages]
            self.core.logs.write(
                meta["namespace"], meta["name"], meta["uid"], container.get("name", ""), *lines
            )

    def _log_start(self, pod: dict[str, Any]) -> None:
        self._log(
            pod,
            "# Configuration loaded",
            "* Server initialized",
            "* Ready to accept connections tcp",
        )

    def _terminate(
        self, key: ObjKey, sts: dict[str, Any], pods: dict[int, dict[str, Any]], ordinal: int
    ) -> None:
        """Delete one pod after the simulated stop delay (its graceful termination)."""
        pod = pods[ordinal]
        meta = pod["metadata"]
        if not self.timers.due(key, f"stop:{meta['name']}:{meta['uid']}", POD_STOP_SECONDS):
            return
        retention = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        if retention.get("whenScaled") == "Delete" and ordinal not in self._wanted(sts):
            self._claims_follow_pod(sts, pod)
        try:
            self.core.delete(self.pods, key[0], meta["name"])
        except ApiError as exc:
            if exc.code != 404:
                raise
        self.pods_of.get(key, set()).discard(meta["name"])
        del pods[ordinal]
        self.changed = True
        self.events.record(
            sts, "SuccessfulDelete", f"delete Pod {meta['name']} in StatefulSet {key[1]} successful"
        )

    @staticmethod
    def _wanted(sts: dict[str, Any]) -> range:
        start = int((sts["spec"].get("ordinals") or {}).get("start", 0))
        return range(start, start + int(sts["spec"].get("replicas", 1)))

    def _claims_follow_pod(self, sts: dict[str, Any], pod: dict[str, Any]) -> None:
        """whenScaled: Delete — a condemned pod's claims get it as owner, so they go with it."""
        ns = pod["metadata"]["namespace"]
        ref = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
            "controller": False,
            "blockOwnerDeletion": True,
        }
        for claim_name in self._claim_names(sts, pod["metadata"]["name"]):
            claim = self.core.store.get(self.claims.key, ns, claim_name)
            if claim is None:
                continue
            body = copy.deepcopy(claim)
            # The pod replaces the set as owner (whenDeleted: Delete made the set one).
            refs = body["metadata"].get("ownerReferences") or []
            refs = [r for r in refs if r.get("uid") != sts["metadata"]["uid"]]
            body["metadata"]["ownerReferences"] = [*refs, ref]
            self.core.update(self.claims, ns, claim_name, body, self.ctx)

    @staticmethod
    def _claim_names(sts: dict[str, Any], pod_name: str) -> list[str]:
        ordinal = pod_name.rpartition("-")[2]
        return [
            f"{t['metadata']['name']}-{sts['metadata']['name']}-{ordinal}"
            for t in sts["spec"].get("volumeClaimTemplates") or []
        ]

    # ---- creation --------------------------------------------------------------------------

    def _create_pod(
        self, sts: dict[str, Any], ordinal: int, revision: str, update_revision: str
    ) -> dict[str, Any] | None:
        """Create a pod's claims, then the pod; None if the API server refused one (a
        `FailedCreate` Warning Event says why, and the set is looked at again later)."""
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        pod_name = f"{name}-{ordinal}"
        template = sts["spec"]["template"]
        if revision != update_revision:
            template = self._revision_template(ns, revision) or template
        refused = self._create_claims(sts, ordinal, pod_name)
        if refused:
            self._refused(sts, pod_name, refused)
            return None
        tmeta = template.get("metadata") or {}
        spec = copy.deepcopy(template.get("spec") or {})
        claims = {
            t["metadata"]["name"]: f"{t['metadata']['name']}-{name}-{ordinal}"
            for t in sts["spec"].get("volumeClaimTemplates") or []
        }
        spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") not in claims] + [
            {"name": volume, "persistentVolumeClaim": {"claimName": claim}}
            for volume, claim in claims.items()
        ]
        if not spec["volumes"]:
            del spec["volumes"]
        spec["hostname"] = pod_name
        if sts["spec"].get("serviceName"):
            spec["subdomain"] = sts["spec"]["serviceName"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "generateName": f"{name}-",
                "labels": {
                    **(tmeta.get("labels") or {}),
                    POD_NAME_LABEL: pod_name,
                    POD_INDEX_LABEL: str(ordinal),
                    REVISION_LABEL: revision,
                },
                **({"annotations": dict(tmeta["annotations"])} if tmeta.get("annotations") else {}),
                "ownerReferences": [_owner(sts)],
            },
            "spec": spec,
        }
        try:
            created = self.core.create(self.pods, ns, body, self.ctx)
        except ApiError as exc:
            self._refused(sts, pod_name, exc.message, exists=exc.code == 409)
            return None
        self.refusals.pop((ns, name), None)
        stored = self.core.store.get(self.pods.key, ns, pod_name) or created
        self.pods_of.setdefault((ns, name), set()).add(pod_name)
        self.changed = True
        self.events.record(
            sts, "SuccessfulCreate", f"create Pod {pod_name} in StatefulSet {name} successful"
        )
        return stored

    def _refused(self, sts: dict[str, Any], pod_name: str, why: str, exists: bool = False) -> None:
        """A create was refused: say so as the controller does (not for a pod that already
        exists), and try again after the work queue's backoff."""
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        if not exists:
            self.events.record(
                sts,
                "FailedCreate",
                f"create Pod {pod_name} in StatefulSet {name} failed error: {why}",
                "Warning",
            )
        refusals = self.refusals.get((ns, name), 0)
        self.refusals[(ns, name)] = refusals + 1
        delay = min(RETRY_FIRST_SECONDS * 2**refusals, RETRY_MAX_SECONDS)
        when = time.monotonic() + self.sb.scaled(delay)
        current = self.wakeups.get((ns, name))
        self.wakeups[(ns, name)] = when if current is None else min(current, when)

    def _create_claims(self, sts: dict[str, Any], ordinal: int, pod_name: str) -> str:
        """Create the pod's missing claims; why one was refused ("" if none was)."""
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        match_labels = (sts["spec"].get("selector") or {}).get("matchLabels") or {}
        retention = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            tmeta = template.get("metadata") or {}
            claim_name = f"{tmeta['name']}-{name}-{ordinal}"
            self.claim_owner[(ns, claim_name)] = (ns, name)
            if self.core.store.get(self.claims.key, ns, claim_name) is not None:
                continue
            owner = {**_owner(sts), "controller": False}
            body = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": claim_name,
                    "labels": {**(tmeta.get("labels") or {}), **match_labels},
                    **(
                        {"annotations": dict(tmeta["annotations"])}
                        if tmeta.get("annotations")
                        else {}
                    ),
                    # whenDeleted: Delete — the claims go with the StatefulSet.
                    **(
                        {"ownerReferences": [owner]}
                        if retention.get("whenDeleted") == "Delete"
                        else {}
                    ),
                },
                "spec": copy.deepcopy(template.get("spec") or {}),
            }
            try:
                self.core.create(self.claims, ns, body, self.ctx)
            except ApiError as exc:
                self.events.record(
                    sts,
                    "FailedCreate",
                    f"create Claim {claim_name} for Pod {pod_name} in StatefulSet {name} "
                    f"failed error: {exc.message}",
                    "Warning",
                )
                return f"failed to create PVC {claim_name}: {exc.message}"
            self.changed = True
            self.events.record(
                sts,
                "SuccessfulCreate",
                f"create Claim {claim_name} Pod {pod_name} in StatefulSet {name} success",
            )
        return ""

    # ---- revisions and status --------------------------------------------------------------

    def _revision(self, sts: dict[str, Any]) -> str:
        """The update revision's name; its ControllerRevision is created when new."""
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        template = sts["spec"]["template"]
        digest = template_hash(template)
        revision = f"{name}-{digest}"
        if self.core.store.get(self.revisions.key, ns, revision) is not None:
            return revision
        owned = [
            r
            for r in self.core.store.items(self.revisions.key, ns)
            if (_owning_set(r) or ((), ""))[1] == sts["metadata"]["uid"]
        ]
        number = max((int(r.get("revision", 0)) for r in owned), default=0) + 1
        body = {
            "apiVersion": "apps/v1",
            "kind": "ControllerRevision",
            "metadata": {
                "name": revision,
                "labels": {
                    **((template.get("metadata") or {}).get("labels") or {}),
                    HASH_LABEL: digest,
                },
                "ownerReferences": [_owner(sts)],
            },
            "data": {"spec": {"template": {**copy.deepcopy(template), "$patch": "replace"}}},
            "revision": number,
        }
        self.core.create(self.revisions, ns, body, self.ctx)
        self.changed = True
        limit = int(sts["spec"].get("revisionHistoryLimit", 10))
        current = (sts.get("status") or {}).get("currentRevision")
        old = sorted(
            (r for r in owned if r["metadata"]["name"] != current), key=lambda r: r["revision"]
        )
        for stale in old[: max(len(old) - limit, 0)]:
            self.core.delete(self.revisions, ns, stale["metadata"]["name"])
        return revision

    def _revision_template(self, ns: str, revision: str) -> dict[str, Any] | None:
        stored = self.core.store.get(self.revisions.key, ns, revision)
        if stored is None:
            return None
        template = dict(((stored.get("data") or {}).get("spec") or {}).get("template") or {})
        template.pop("$patch", None)
        return template

    def _write_status(
        self,
        stored: dict[str, Any],
        pods: dict[int, dict[str, Any]],
        current_revision: str,
        update_revision: str,
        rolling: bool,
    ) -> None:
        revisions = [p["metadata"]["labels"].get(REVISION_LABEL) for p in pods.values()]
        ready = sum(1 for p in pods.values() if is_ready(p))
        counts = {
            "replicas": len(pods),
            "readyReplicas": ready,
            "currentReplicas": revisions.count(current_revision),
            "updatedReplicas": revisions.count(update_revision),
        }
        if rolling and counts["updatedReplicas"] == len(pods) == ready:
            current_revision = update_revision
            counts["currentReplicas"] = counts["updatedReplicas"]
        status = {
            "observedGeneration": stored["metadata"].get("generation", 1),
            # Go omits these when zero.
            **{k: v for k, v in counts.items() if v or k == "replicas"},
            "availableReplicas": ready,
            "currentRevision": current_revision,
            "updateRevision": update_revision,
            "collisionCount": 0,
        }
        if stored.get("status") == status:
            return
        body = {**stored, "apiVersion": "apps/v1", "kind": "StatefulSet", "status": status}
        ns, name = stored["metadata"]["namespace"], stored["metadata"]["name"]
        self.core.update(self.sets, ns, name, body, self.ctx, "status")
        self.changed = True
