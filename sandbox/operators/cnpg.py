"""Simulated CloudNativePG operator: Cluster, Backup and ScheduledBackup controllers.

It writes through the same object model the API serves, so clients see exactly what a real
operator would leave behind: status phases and conditions, pods, PVCs, services, secrets and
Events. Durations (bootstrap, replica creation, backups) are divided by the sandbox speed.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import hashlib
import json
import logging
import math
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import Ctx, now_iso
from ..errors import ApiError, FieldError, forbidden_field, invalid
from ..store import ObjKey
from ..workloads import parse_quantity, storage_request
from .cron import CronError, next_time
from .kubelet import crash_status, crashed, record_backoff
from .machinery import ChangeFeed, EventRecorder, Timers
from .pglog import InstanceLog

if TYPE_CHECKING:
    from ..api import Sandbox

log = logging.getLogger("sandbox.cnpg")

GROUP, VERSION = "postgresql.cnpg.io", "v1"
PLURALS = ("clusters", "backups", "scheduledbackups")
CLUSTER_LABEL = "cnpg.io/cluster"
MANAGER = "cloudnative-pg"
DEFAULT_IMAGE = "ghcr.io/cloudnative-pg/postgresql:18.1-system-trixie"

HEALTHY = "Cluster in healthy state"
SETTING_UP = "Setting up primary"
CREATING_REPLICA = "Creating a new replica"
SWITCHOVER = "Switchover in progress"
FAILING_OVER = "Failing over"
APPLYING_CONFIG = "Applying configuration"
UPGRADING = "Upgrading cluster"
WAITING_USER = "Waiting for user action"
RESTARTING_PRIMARY = "Primary instance is being restarted in-place"
CANNOT_CREATE = "Unable to create required cluster objects"
UNRECOVERABLE = "Cluster is unrecoverable and needs manual intervention"
WAITING_ACTIVE = "Waiting for the instances to become active"

# Realistic durations in seconds at speed 1.0 (a 3-instance cluster is healthy in about 10 s).
PRIMARY_SECONDS = 4.0
REPLICA_SECONDS = 3.0
ROLL_SECONDS = 2.0
SWITCHOVER_SECONDS = 2.0
HIBERNATE_SECONDS = 2.0
BACKUP_START_SECONDS = 0.5
BACKUP_SECONDS = 3.0
# A primary's restore Job whose restore keeps failing (no such backup in the object store) gives
# up after Kubernetes' pod backoff (10 s, doubling) over the Job's default six retries.
RECOVERY_JOB_SECONDS = 10.0 * (2**6 - 1)
# PostgreSQL's checkpoint_timeout: a timed checkpoint (restartpoint on replicas) is logged so often.
CHECKPOINT_SECONDS = 300.0

HIBERNATION = "cnpg.io/hibernation"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
# Where a simulated instance remembers which spec.postgresql it runs with.
CONFIG_HASH = "sandbox.cnpg.io/postgresql-config-hash"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _ts(value: str | None) -> dt.datetime | None:
    """Parse RFC 3339 (and CNPG's `2020-11-26 15:22:00.00000+00` form); no zone means UTC."""
    if not value:
        return None
    text = value.strip().replace(" ", "T").replace("Z", "+00:00")
    if len(text) >= 3 and text[-3] in "+-" and ":" not in text[-3:]:
        text += ":00"
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _fmt(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner(obj: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


class CnpgOperator:
    """The Cluster, Backup and ScheduledBackup controllers of CloudNativePG, simulated."""

    name = "cnpg"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sb = sandbox
        self.core = sandbox.core
        self.pods = self.core.builtin("pods")
        self.claims = self.core.builtin("persistentvolumeclaims")
        # Instances are found by their cluster label, through an index the store keeps.
        for rt in (self.pods, self.claims):
            self.core.store.index_label(rt.key, CLUSTER_LABEL)
        # Built-in objects a Cluster owns: a change to one (say a deleted pod) wakes its Cluster.
        self.owned = {rt.key for rt in (self.pods, self.claims)} | {
            self.core.builtin(p).key for p in ("secrets", "services")
        }
        self.feed: ChangeFeed | None = None
        # Objects to reconcile, by plural: changed since they were last looked at.
        self.dirty: dict[str, set[ObjKey]] = {p: set() for p in PLURALS}
        # Simulated steps in flight, by plural.
        self.timers = {p: Timers(sandbox.scaled) for p in PLURALS}
        # Schedules and retention: not work in progress, so they do not keep the sandbox busy.
        self.wakeups: dict[tuple[str, ObjKey], float] = {}
        # Clusters waiting on what sends no events (the object store, a bootstrap fault).
        self.polled: set[ObjKey] = set()
        self.failing: set[ObjKey] = set()
        # Pod failures (Faults.fail_pod) as last seen: a change wakes the pod's Cluster.
        self.pod_failures: dict[ObjKey, float] = {}
        # The operator writes only fields its CRDs declare; Ignore keeps no warnings around.
        self.ctx = Ctx(field_manager=MANAGER, field_validation="Ignore")
        self.changed = False
        # How often each object was looked at: what a round costs, for tests.
        self.visits: Counter[tuple[str, ObjKey]] = Counter()
        self.events = EventRecorder(self.core, MANAGER)
        self.kubelet_events = EventRecorder(self.core, "kubelet")
        self.core.defaulters[(GROUP, "clusters")] = default_cluster
        self.core.validators[(GROUP, "clusters")] = ("vcluster.cnpg.io", validate_cluster)

    # ---- controller protocol ---------------------------------------------------------------

    def next_due(self) -> float | None:
        """The earliest pending simulated step or schedule."""
        times = [t.next_due() for t in self.timers.values()] + list(self.wakeups.values())
        return min((t for t in times if t is not None), default=None)

    def busy(self) -> bool:
        """True while a simulated step is in flight."""
        return any(self.timers.values())

    def reconcile(self) -> bool:
        """Reconcile the Clusters, Backups and ScheduledBackups that changed or are due."""
        self.changed = False
        core = self.core
        rts = {p: core.resolve(GROUP, VERSION, p) for p in PLURALS}
        if any(rt is None for rt in rts.values()):
            return False
        with core.lock:
            self._collect(rts)
        for plural, handler in (
            ("clusters", self._cluster),
            ("backups", self._backup),
            ("scheduledbackups", self._scheduled),
        ):
            timers = self.timers[plural]
            if plural in self.sb.faults.frozen:
                # A frozen controller's steps start again once it thaws.
                self.dirty[plural] |= set(timers.steps)
                timers.steps.clear()
                continue
            with core.lock:
                todo, self.dirty[plural] = self.dirty[plural], set()
                todo |= set(timers.expired())
                if plural == "clusters":
                    todo |= self.polled | self._bootstrap_faults()
            for key in sorted(todo):
                try:
                    with core.lock:
                        timers.begin(key)
                        try:
                            self._visit(rts[plural], key, handler)
                        finally:
                            timers.end(key)
                except ApiError as exc:
                    # A conflicting client write: the next round looks again.
                    self.dirty[plural].add(key)
                    log.debug("cnpg %s %s/%s: %s", plural, *key, exc.message)
                except Exception:
                    # One odd object must not stop the others from being reconciled.
                    self.dirty[plural].add(key)
                    log.exception("cnpg %s %s/%s failed", plural, *key)
        return self.changed

    def _visit(self, rt: Any, key: ObjKey, handler: Callable[[dict[str, Any]], None]) -> None:
        self.wakeups.pop((rt.plural, key), None)
        if rt.plural == "clusters":
            self.polled.discard(key)
        stored = self.core.store.get(rt.key, *key)
        if stored is None:
            return
        self.visits[(rt.plural, key)] += 1
        obj = copy.deepcopy(stored)
        obj["apiVersion"], obj["kind"] = f"{GROUP}/{VERSION}", rt.kind
        handler(obj)

    def _collect(self, rts: dict[str, Any]) -> None:
        """Turn the store's events since the last round into objects to look at."""
        if self.feed is None:
            self.feed = ChangeFeed(self.core.store, {rt.key for rt in rts.values()} | self.owned)
        events = self.feed.poll()
        due = [k for k, when in self.wakeups.items() if when <= time.monotonic()]
        for plural, key in due:
            self.dirty[plural].add(key)
        self._pod_faults()
        if events is None:
            # First round, or events were lost: look at everything once.
            for plural, rt in rts.items():
                self.dirty[plural] |= set(self.core.store.objects.get(rt.key, {}))
            return
        plural_of = {rt.key: plural for plural, rt in rts.items()}
        clusters = self.dirty["clusters"]
        for event in events:
            meta = event.obj["metadata"]
            ns = meta.get("namespace", "")
            if event.key in plural_of:
                plural = plural_of[event.key]
                self.dirty[plural].add((ns, meta["name"]))
                if event.type == "DELETED":
                    # A Cluster created again under the same name starts afresh.
                    self.timers[plural].steps.pop((ns, meta["name"]), None)
                continue
            for obj in (event.old, event.obj):
                cluster = ((obj or {}).get("metadata", {}).get("labels") or {}).get(CLUSTER_LABEL)
                if cluster:
                    clusters.add((ns, cluster))
        # A backup in flight stops when its cluster stops being fit for one.
        for ns, name in self.timers["backups"].steps:
            backup = self.core.store.get(rts["backups"].key, ns, name)
            cname = ((backup or {}).get("spec", {}).get("cluster") or {}).get("name")
            if (ns, cname) in clusters:
                self.dirty["backups"].add((ns, name))

    def _pod_faults(self) -> None:
        """Wake the Clusters whose pods started or stopped failing (Faults.fail_pod)."""
        failures = self.sb.faults.pod_failures()
        if failures == self.pod_failures:
            return
        changed = failures.keys() ^ self.pod_failures.keys()
        changed |= {k for k, until in failures.items() if self.pod_failures.get(k) != until}
        self.pod_failures = failures
        for ns, pod_name in changed:
            pod = self.core.store.get(self.pods.key, ns, pod_name)
            cluster = ((pod or {}).get("metadata", {}).get("labels") or {}).get(CLUSTER_LABEL)
            if cluster:
                self.dirty["clusters"].add((ns, cluster))

    def _wake(self, key: tuple[str, ObjKey], when: float) -> None:
        """Look at an object again at monotonic time `when` (the earliest asked wins)."""
        current = self.wakeups.get(key)
        self.wakeups[key] = when if current is None else min(current, when)

    def _bootstrap_faults(self) -> set[ObjKey]:
        """Clusters named in fail_bootstrap now or in the previous round."""
        named = (n.partition("/") for n in self.sb.faults.fail_bootstrap)
        failing = {(ns, name) for ns, _, name in named if name}
        both, self.failing = self.failing | failing, failing
        return both

    # ---- helpers ---------------------------------------------------------------------------

    def _rt(self, group: str, plural: str) -> Any:
        return self.core.builtin(plural)

    def _get(self, plural: str, ns: str, name: str, group: str = "") -> dict[str, Any] | None:
        rt = self._rt(group, plural)
        obj = self.core.store.get(rt.key, ns, name)
        return copy.deepcopy(obj) if obj is not None else None

    def _ensure(self, plural: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        existing = self._get(plural, ns, body["metadata"]["name"])
        if existing is not None:
            return existing
        created = self.core.create(self._rt("", plural), ns, body, self.ctx)
        self.changed = True
        return created

    def _delete(self, plural: str, ns: str, name: str) -> None:
        try:
            self.core.delete(self._rt("", plural), ns, name)
            self.changed = True
        except ApiError:
            pass

    def _set_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if obj.get("status") == status:
            return
        rt = self.core.resolve(GROUP, VERSION, _plural(obj["kind"]))
        body = copy.deepcopy(obj)
        body["status"] = status
        updated = self.core.update(
            rt, obj["metadata"]["namespace"], obj["metadata"]["name"], body, self.ctx, "status"
        )
        obj["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]
        obj["status"] = status
        self.changed = True

    def _event(self, obj: dict[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
        if self.events.record(obj, reason, message, kind):
            self.changed = True

    def _due(self, obj: dict[str, Any], step: str, seconds: float) -> bool:
        """Start a simulated step for obj, or tell whether the one in flight is done."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        return self.timers[_plural(obj["kind"])].due(key, step, seconds)

    # ---- Cluster ---------------------------------------------------------------------------

    def _cluster(self, c: dict[str, Any]) -> None:
        meta = c["metadata"]
        annotations = meta.get("annotations") or {}
        if (
            meta.get("deletionTimestamp")
            or annotations.get("cnpg.io/reconciliationLoop") == "disabled"
        ):
            return
        ns, name = meta["namespace"], meta["name"]
        spec = c.get("spec") or {}
        status = copy.deepcopy(c.get("status") or {})
        image = spec.get("imageName") or DEFAULT_IMAGE
        want = int(spec.get("instances", 1))
        status.setdefault("instances", want)
        status.setdefault("readyInstances", 0)
        status.setdefault("writeService", f"{name}-rw")
        status.setdefault("readService", f"{name}-r")
        status.setdefault("latestGeneratedNode", 0)
        status.setdefault("timelineID", 1)
        status.setdefault("image", image)
        # The scale subresource's labelSelectorPath.
        status["selector"] = f"cnpg.io/cluster={name},cnpg.io/podRole=instance"

        if f"{ns}/{name}" in self.sb.faults.fail_bootstrap and not status.get("currentPrimary"):
            if status.get("phase") != CANNOT_CREATE:
                self._event(
                    c, "BootstrapFailed", "bootstrap failed: injected by the sandbox", "Warning"
                )
            self._phase(status, CANNOT_CREATE, "bootstrap failed: injected by the sandbox")
            self._set_status(c, status)
            return

        source: dict[str, Any] | None = None
        recovery = (spec.get("bootstrap") or {}).get("recovery")
        if recovery is not None and not status.get("currentPrimary"):
            if status.get("phase") == UNRECOVERABLE:
                return  # its restore Job failed for good: only a person can help now
            source, why, job = self._recovery_source(c, recovery)
            if source is None and job:
                self._recovery_failing(c, status, why)
                return
            if source is None:
                # The backup may reach the object store without any event: look again next round.
                self.polled.add((ns, name))
                if status.get("phaseReason") != why:
                    self._event(c, "ErrorNoBackup", why, "Warning")
                self._phase(status, SETTING_UP, why)
                self._set_status(c, status)
                return

        try:
            self._cluster_objects(c, status)
        except ApiError as exc:
            # As CloudNativePG registers it (a quota exceeded, say); the Cluster is looked at
            # again in the next round.
            self._phase(status, CANNOT_CREATE, exc.message)
            self._set_status(c, status)
            raise
        self._archiving(c, status)
        pods = self._pods(ns, name)
        pvcs = self._pvcs(ns, name)
        self._resize(spec, pvcs)

        if annotations.get(HIBERNATION) == "on":
            self._hibernate(c, status, pods, pvcs)
            self._set_status(c, status)
            return
        if self._condition(status, HIBERNATION).get("status") == "True":
            self._set_condition(
                status, HIBERNATION, "False", "Rehydrated", "Cluster has been rehydrated"
            )
            self._event(c, "Rehydrated", "Cluster has been rehydrated")

        serials = sorted(
            {
                int(p["metadata"]["labels"]["cnpg.io/instanceName"].rsplit("-", 1)[1])
                for p in pvcs.values()
            }
        )
        instances = [f"{name}-{n}" for n in serials]
        status["instances"] = len(instances) if instances else want
        primary = status.get("currentPrimary")

        # Bootstrap or rehydration: every instance with a PVC needs a pod.
        if not instances:
            status["latestGeneratedNode"] = 1
            status["targetPrimary"] = f"{name}-1"
            status["phase"] = SETTING_UP
            reason = (
                "Creating primary instance"
                if source is None
                else f"Recovering from backup {source['backupId']}"
            )
            self._phase(status, SETTING_UP, reason)
            self._new_instance(c, 1, image, "primary")
            self._event(
                c,
                "CreatingInstance",
                f"Primary instance ({'initdb' if source is None else 'recovery'})",
            )
            self._set_status(c, status)
            return
        held = self._hold_failed(c, pods, instances)
        if self._failover(c, status, pods, instances, held):
            self._set_status(c, status)
            return
        for inst in instances:
            if inst not in pods:
                role = "primary" if inst == (primary or f"{name}-1") else "replica"
                self._create_pod(c, inst, image, role)
                pods = self._pods(ns, name)

        not_ready = [p for p in instances if not self._ready(pods[p]) and p not in held]
        if not_ready:
            inst = not_ready[0]
            first_boot = not primary
            seconds = PRIMARY_SECONDS if first_boot else REPLICA_SECONDS
            if self._due(c, f"ready:{inst}", seconds):
                was_crashed = crashed(pods[inst])
                self._mark_ready(pods[inst])
                if first_boot:
                    status["currentPrimary"] = inst
                    status["targetPrimary"] = inst
                    status["currentPrimaryTimestamp"] = now_iso()
                    self._event(c, "ClusterPrimaryReady", f"Primary instance {inst} is ready")
                else:
                    self._event(c, "InstanceReady", f"Instance {inst} is ready")
                self._log_ready(status, self._get("pods", ns, inst), crashed=was_crashed)
            self._counts(status, instances, self._pods(ns, name))
            if not primary:
                self._phase(
                    status, SETTING_UP, status.get("phaseReason") or "Creating primary instance"
                )
            elif status.get("phase") == HEALTHY:
                self._phase(status, CREATING_REPLICA, f"Waiting for instance {inst} to be ready")
            self._set_status(c, status)
            return

        self._counts(status, instances, pods)
        if held:
            self._held_phase(c, status, sorted(held))
            self._set_status(c, status)
            return
        if len(instances) < want:
            serial = int(status.get("latestGeneratedNode", 0)) + 1
            status["latestGeneratedNode"] = serial
            self._new_instance(c, serial, image, "replica")
            self._phase(status, CREATING_REPLICA, f"Creating replica {name}-{serial}")
            self._event(c, "CreatingInstance", f"Creating instance {name}-{serial}")
            status["instances"] = len(instances) + 1
            self._set_status(c, status)
            return
        if len(instances) > want:
            victim = max(
                (i for i in instances if i != primary), key=lambda i: int(i.rsplit("-", 1)[1])
            )
            self._delete("pods", ns, victim)
            for pvc in [
                k
                for k in pvcs
                if pvcs[k]["metadata"]["labels"].get("cnpg.io/instanceName") == victim
            ]:
                self._delete("persistentvolumeclaims", ns, pvc)
            self._event(c, "ScaleDown", f"Scaling down: removing instance {victim}")
            remaining = [i for i in instances if i != victim]
            self._counts(status, remaining, self._pods(ns, name))
            status["instances"] = len(remaining)
            self._set_status(c, status)
            return

        target = status.get("targetPrimary")
        if target and primary and target != primary and target in instances:
            if status.get("phase") != SWITCHOVER:
                self._phase(status, SWITCHOVER, f"Switching over to {target}")
                self._event(c, "SwitchoverInitiated", f"Switching over from {primary} to {target}")
            if self._due(c, f"switchover:{target}", SWITCHOVER_SECONDS):
                self._promote(c, status, pods, target)
            self._set_status(c, status)
            return

        if self._roll(c, status, pods, instances, image, annotations.get(RESTARTED_AT)):
            self._set_status(c, status)
            return
        if self._reconfigure(c, status, pods, instances):
            self._set_status(c, status)
            return

        status["image"] = image
        if status.get("phase") != HEALTHY:
            self._event(c, "ClusterReady", "Cluster is ready")
        self._phase(status, HEALTHY, "")
        self._set_status(c, status)

    def _reconfigure(
        self, c: dict[str, Any], status: dict[str, Any], pods: dict[str, Any], instances: list[str]
    ) -> bool:
        """spec.postgresql changed: every instance reloads its configuration. True meanwhile."""
        wanted = _config_hash(c)
        stale = [
            i
            for i in instances
            if (pods[i]["metadata"].get("annotations") or {}).get(CONFIG_HASH) != wanted
        ]
        if not stale:
            return False
        if status.get("phase") != APPLYING_CONFIG:
            self._phase(status, APPLYING_CONFIG, "Reloading PostgreSQL configuration")
            self._event(c, "ApplyingConfiguration", "Applying the new PostgreSQL configuration")
        if self._due(c, f"config:{wanted}", ROLL_SECONDS):
            for inst in stale:
                self._log(pods[inst], InstanceLog(inst).reload())
                self.core.patch(
                    self._rt("", "pods"),
                    c["metadata"]["namespace"],
                    inst,
                    "application/merge-patch+json",
                    {"metadata": {"annotations": {CONFIG_HASH: wanted}}},
                    self.ctx,
                )
            self.changed = True
        return True

    def _failover(
        self,
        c: dict[str, Any],
        status: dict[str, Any],
        pods: dict[str, Any],
        instances: list[str],
        held: set[str],
    ) -> bool:
        """The primary's pod is gone or failing: promote the first ready replica.

        True while failing over.
        """
        primary = status.get("currentPrimary")
        replicas = [
            i
            for i in instances
            if i != primary and i in pods and self._ready(pods[i]) and i not in held
        ]
        if not primary or (primary in pods and primary not in held) or not replicas:
            return False
        if status.get("phase") != FAILING_OVER:
            why = "is gone" if primary not in pods else "is not ready"
            status["targetPrimary"] = "pending"
            self._phase(status, FAILING_OVER, f"Primary {primary} {why}")
            self._event(
                c, "FailingOver", f"Current primary {primary} {why}, failing over", "Warning"
            )
        self._counts(status, instances, pods)
        if self._due(c, f"failover:{primary}", SWITCHOVER_SECONDS):
            self._promote(c, status, pods, replicas[0])
            self._event(c, "FailoverTarget", f"Promoted {replicas[0]} to primary")
        return True

    def _hold_failed(
        self, c: dict[str, Any], pods: dict[str, Any], instances: list[str]
    ) -> set[str]:
        """Crash the instances a fault names (Faults.fail_pod); those held down now."""
        ns, name = c["metadata"]["namespace"], c["metadata"]["name"]
        failures = self.sb.faults.pod_failures()
        held = set()
        for inst in instances:
            until = failures.get((ns, inst))
            pod = pods.get(inst)
            if until is None or pod is None:
                continue
            held.add(inst)
            if until != math.inf:
                self._wake(("clusters", (ns, name)), until)
            if crashed(pod) or not (pod.get("status") or {}).get("containerStatuses"):
                continue
            self._write_status("pods", pod, crash_status(pod))
            self._log(pod, InstanceLog(inst).crash())
            record_backoff(self.kubelet_events, pod)
            pods[inst] = self._get("pods", ns, inst)
        return held

    def _held_phase(self, c: dict[str, Any], status: dict[str, Any], held: list[str]) -> None:
        """The phase while instances are failing and no failover can help."""
        primary = status.get("currentPrimary")
        if primary in held:
            reason = f"Primary {primary} is not ready and there is no replica to promote"
            if status.get("phase") != FAILING_OVER:
                self._event(c, "FailingOver", reason, "Warning")
            self._phase(status, FAILING_OVER, reason)
            return
        names = ", ".join(held)
        self._phase(status, WAITING_ACTIVE, f"Instance {names} is not active")

    def _log(self, pod: dict[str, Any] | None, lines: list[str]) -> None:
        """Write lines into the postgres container's log of pod."""
        if pod is not None:
            meta = pod["metadata"]
            self.core.logs.write(meta["namespace"], meta["name"], meta["uid"], "postgres", *lines)

    def _log_ready(
        self, status: dict[str, Any], pod: dict[str, Any] | None, crashed: bool = False
    ) -> None:
        """PostgreSQL is up on pod, as primary or replica (by its role label)."""
        if pod is None:
            return
        meta = pod["metadata"]
        ns, inst = meta["namespace"], meta["name"]
        log = InstanceLog(inst, image=pod["spec"]["containers"][0]["image"])
        replica = (meta.get("labels") or {}).get("cnpg.io/instanceRole") != "primary"
        if replica:
            primary = status.get("currentPrimary") or ""
            self._log(pod, log.replica_ready(primary, int(status.get("timelineID", 1))))
            self._log(self._get("pods", ns, primary), InstanceLog(primary).replica_connected(inst))
        else:
            self._log(pod, log.primary_ready(crashed=crashed))
        self._checkpoints(pod, replica)

    def _checkpoints(self, pod: dict[str, Any], replica: bool) -> None:
        """Timed checkpoints (restartpoints on a replica) in pod's log from now on."""
        meta = pod["metadata"]
        log = InstanceLog(meta["name"])
        self.core.logs.every(
            meta["namespace"],
            meta["name"],
            meta["uid"],
            "postgres",
            max(self.sb.scaled(CHECKPOINT_SECONDS), 1.0),
            lambda when: log.checkpoint(when, replica),
        )

    def _counts(self, status: dict[str, Any], instances: list[str], pods: dict[str, Any]) -> None:
        ready = [i for i in instances if i in pods and self._ready(pods[i])]
        status["pvcCount"] = len(instances)
        status["healthyPVC"] = sorted(instances)
        status["readyInstances"] = len(ready)
        status["instanceNames"] = sorted(instances, key=lambda i: int(i.rsplit("-", 1)[1]))
        status["instancesStatus"] = {
            "healthy": ready,
            **(
                {"failed": [i for i in instances if i not in ready]}
                if len(ready) < len(instances)
                else {}
            ),
        }

    def _phase(self, status: dict[str, Any], phase: str, reason: str) -> None:
        status["phase"] = phase
        if reason:
            status["phaseReason"] = reason
        else:
            status.pop("phaseReason", None)
        if phase == HEALTHY:
            self._set_condition(status, "Ready", "True", "ClusterIsReady", "Cluster is Ready")
        else:
            self._set_condition(
                status, "Ready", "False", "ClusterIsNotReady", reason or "Cluster Is Not Ready"
            )

    @staticmethod
    def _condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
        return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})

    def _set_condition(
        self, status: dict[str, Any], ctype: str, value: str, reason: str, message: str
    ) -> None:
        conditions = status.setdefault("conditions", [])
        current = next((c for c in conditions if c.get("type") == ctype), None)
        if current and (current["status"], current["reason"], current["message"]) == (
            value,
            reason,
            message,
        ):
            return
        entry = {
            "type": ctype,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso()
            if not current or current["status"] != value
            else current["lastTransitionTime"],
        }
        if current:
            conditions[conditions.index(current)] = entry
        else:
            conditions.append(entry)

    def _cluster_objects(self, c: dict[str, Any], status: dict[str, Any]) -> None:
        """Secrets and services a Cluster owns."""
        meta, spec = c["metadata"], c.get("spec") or {}
        ns, name = meta["namespace"], meta["name"]
        owner = [_owner(c)]
        labels = {"cnpg.io/cluster": name}
        initdb = (spec.get("bootstrap") or {}).get("initdb") or {}
        recovery = (spec.get("bootstrap") or {}).get("recovery") or {}
        boot = initdb or recovery
        dbname = boot.get("database") or "app"
        owner_name = boot.get("owner") or dbname
        if not (boot.get("secret") or {}).get("name"):
            existing = self._get("secrets", ns, f"{name}-app")
            if existing is None:
                self._ensure(
                    "secrets", ns, self._credentials(c, f"{name}-app", owner_name, dbname, owner)
                )
        wants_superuser = spec.get("enableSuperuserAccess") and not (
            spec.get("superuserSecret") or {}
        ).get("name")
        if wants_superuser and self._get("secrets", ns, f"{name}-superuser") is None:
            self._ensure(
                "secrets", ns, self._credentials(c, f"{name}-superuser", "postgres", "*", owner)
            )
        for suffix, cert in (("ca", "ca"), ("server", "tls"), ("replication", "tls")):
            if self._get("secrets", ns, f"{name}-{suffix}") is None:
                data = (
                    {"ca.crt": _b64("sandbox CA"), "ca.key": _b64("sandbox key")}
                    if cert == "ca"
                    else {
                        "tls.crt": _b64(f"sandbox {suffix} cert"),
                        "tls.key": _b64(f"sandbox {suffix} key"),
                    }
                )
                self._ensure(
                    "secrets",
                    ns,
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {
                            "name": f"{name}-{suffix}",
                            "labels": dict(labels),
                            "ownerReferences": owner,
                        },
                        "type": "Opaque" if cert == "ca" else "kubernetes.io/tls",
                        "data": data,
                    },
                )
        for suffix, selector in (
            ("rw", {"cnpg.io/cluster": name, "cnpg.io/instanceRole": "primary"}),
            ("ro", {"cnpg.io/cluster": name, "cnpg.io/instanceRole": "replica"}),
            ("r", {"cnpg.io/cluster": name, "cnpg.io/podRole": "instance"}),
        ):
            self._ensure(
                "services",
                ns,
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {
                        "name": f"{name}-{suffix}",
                        "labels": {**labels, "cnpg.io/isManaged": "true"},
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "type": "ClusterIP",
                        "selector": selector,
                        "ports": [
                            {
                                "name": "postgres",
                                "port": 5432,
                                "protocol": "TCP",
                                "targetPort": 5432,
                            }
                        ],
                    },
                },
            )
        status.setdefault("secretsResourceVersion", {})

    def _credentials(
        self, c: dict[str, Any], secret: str, user: str, dbname: str, owner: list[dict[str, Any]]
    ) -> dict[str, Any]:
        ns, name = c["metadata"]["namespace"], c["metadata"]["name"]
        password = secrets.token_urlsafe(48)[:64]
        host = f"{name}-rw"
        fqdn = f"{host}.{ns}.svc.cluster.local"
        values = {
            "username": user,
            "user": user,
            "password": password,
            "dbname": dbname,
            "host": host,
            "port": "5432",
            "pgpass": f"{host}:5432:{dbname}:{user}:{password}\n",
            "uri": f"postgresql://{user}:{password}@{host}.{ns}:5432/{dbname}",
            "jdbc-uri": f"jdbc:postgresql://{host}.{ns}:5432/{dbname}?password={password}&user={user}",
            "fqdn-uri": f"postgresql://{user}:{password}@{fqdn}:5432/{dbname}",
            "fqdn-jdbc-uri": f"jdbc:postgresql://{fqdn}:5432/{dbname}?password={password}&user={user}",
        }
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret,
                "labels": {"cnpg.io/cluster": name, "cnpg.io/reload": "true"},
                "ownerReferences": owner,
            },
            "type": "kubernetes.io/basic-auth",
            "data": {k: _b64(v) for k, v in values.items()},
        }

    def _pods(self, ns: str, name: str) -> dict[str, dict[str, Any]]:
        return self._instances(self.pods.key, ns, name, ("cnpg.io/podRole", "instance"))

    def _pvcs(self, ns: str, name: str) -> dict[str, dict[str, Any]]:
        return self._instances(self.claims.key, ns, name, ("cnpg.io/pvcRole", "PG_DATA"))

    def _instances(
        self, key: Any, ns: str, name: str, role: tuple[str, str]
    ) -> dict[str, dict[str, Any]]:
        """A Cluster's pods or claims of one role, by name (copies)."""
        label, value = role
        return {
            p["metadata"]["name"]: copy.deepcopy(p)
            for p in self.core.store.labelled(key, ns, CLUSTER_LABEL, name)
            if p["metadata"]["labels"].get(label) == value
        }

    @staticmethod
    def _ready(pod: dict[str, Any]) -> bool:
        return (pod.get("status") or {}).get("phase") == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )

    def _resize(self, spec: dict[str, Any], pvcs: dict[str, Any]) -> None:
        """Grow the claims to a larger `storage.size` (`resizeInUseVolumes`, true by default):
        their request is raised, and the volume is expanded as any claim's is (`volumes`)."""
        if (spec.get("storage") or {}).get("resizeInUseVolumes") is False:
            return
        size = (spec.get("storage") or {}).get("size")
        wanted = parse_quantity(size)
        for pvc in pvcs.values():
            has = parse_quantity(storage_request(pvc))
            if wanted is None or has is None or wanted <= has:
                continue
            body = copy.deepcopy(pvc)
            body["spec"].setdefault("resources", {}).setdefault("requests", {})["storage"] = size
            meta = pvc["metadata"]
            try:
                self.core.update(self._rt("", "persistentvolumeclaims"), meta["namespace"],
                                 meta["name"], body, self.ctx)  # fmt: skip
            except ApiError as exc:  # the claim refuses (not bound): the rest of the round goes on
                log.info("claim %s/%s not resized: %s", meta["namespace"], meta["name"], exc)
                continue
            self.changed = True

    def _new_instance(self, c: dict[str, Any], serial: int, image: str, role: str) -> None:
        meta, spec = c["metadata"], c.get("spec") or {}
        ns, name = meta["namespace"], meta["name"]
        inst = f"{name}-{serial}"
        for suffix, role_label, storage in (
            ("", "PG_DATA", spec.get("storage")),
            ("-wal", "PG_WAL", spec.get("walStorage")),
        ):
            if storage is None and suffix:
                continue
            storage = storage or {}
            pvc = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": inst + suffix,
                    "labels": {
                        **_inherited(c, "labels"),
                        "cnpg.io/cluster": name,
                        "cnpg.io/instanceName": inst,
                        "cnpg.io/pvcRole": role_label,
                    },
                    **_annotations(_inherited(c, "annotations")),
                    "ownerReferences": [_owner(c)],
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": storage.get("size", "1Gi")}},
                    **(
                        {"storageClassName": storage["storageClass"]}
                        if storage.get("storageClass")
                        else {}
                    ),
                },
            }
            created = self._ensure("persistentvolumeclaims", ns, pvc)
            if (created.get("status") or {}).get("phase") != "Bound":
                self._write_status(
                    "persistentvolumeclaims",
                    created,
                    {
                        "phase": "Bound",
                        "accessModes": ["ReadWriteOnce"],
                        "capacity": {"storage": storage.get("size", "1Gi")},
                    },
                )
        self._create_pod(c, inst, image, role)

    def _create_pod(self, c: dict[str, Any], inst: str, image: str, role: str) -> None:
        meta = c["metadata"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": inst,
                "labels": {
                    **_inherited(c, "labels"),
                    "cnpg.io/cluster": meta["name"],
                    "cnpg.io/instanceName": inst,
                    "cnpg.io/instanceRole": role,
                    "role": role,
                    "cnpg.io/podRole": "instance",
                },
                "annotations": {
                    **_inherited(c, "annotations"),
                    CONFIG_HASH: _config_hash(c),
                    **(
                        {RESTARTED_AT: (meta.get("annotations") or {})[RESTARTED_AT]}
                        if RESTARTED_AT in (meta.get("annotations") or {})
                        else {}
                    ),
                },
                "ownerReferences": [_owner(c)],
            },
            "spec": {
                "containers": [
                    {
                        "name": "postgres",
                        "image": image,
                        "ports": [{"containerPort": 5432, "name": "postgresql", "protocol": "TCP"}],
                    }
                ],
                "volumes": [{"name": "pgdata", "persistentVolumeClaim": {"claimName": inst}}],
                "hostname": inst,
            },
        }
        resources = (c.get("spec") or {}).get("resources")
        if resources:
            # CloudNativePG gives the postgres container the Cluster's resources.
            pod["spec"]["containers"][0]["resources"] = copy.deepcopy(resources)
        if self._get("pods", meta["namespace"], inst) is None:
            self._log(
                self._ensure("pods", meta["namespace"], pod), InstanceLog(inst).manager_start()
            )

    def _write_status(
        self, plural: str, obj: dict[str, Any], status: dict[str, Any]
    ) -> dict[str, Any]:
        body = copy.deepcopy(obj)
        body["status"] = status
        self.changed = True
        return self.core.update(
            self._rt("", plural),
            obj["metadata"]["namespace"],
            obj["metadata"]["name"],
            body,
            self.ctx,
            "status",
        )

    def _mark_ready(self, pod: dict[str, Any], restarts: int | None = None) -> None:
        image = pod["spec"]["containers"][0]["image"]
        prior = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get(
            "restartCount", 0
        )
        now = now_iso()
        self._write_status(
            "pods",
            pod,
            {
                "phase": "Running",
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": "postgres",
                        "image": image,
                        "imageID": _image_id(image),
                        "ready": True,
                        "started": True,
                        "restartCount": prior if restarts is None else restarts,
                        "state": {"running": {"startedAt": now}},
                    }
                ],
                "podIP": f"10.244.0.{abs(hash(pod['metadata']['name'])) % 250 + 2}",
                "startTime": now,
            },
        )

    def _set_role(self, pod: dict[str, Any], role: str) -> None:
        labels = pod["metadata"].get("labels") or {}
        if labels.get("cnpg.io/instanceRole") == role:
            return
        self.core.patch(
            self._rt("", "pods"),
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            "application/merge-patch+json",
            {"metadata": {"labels": {"cnpg.io/instanceRole": role, "role": role}}},
            self.ctx,
        )
        self.changed = True

    def _promote(
        self, c: dict[str, Any], status: dict[str, Any], pods: dict[str, Any], target: str
    ) -> None:
        old = status.get("currentPrimary")
        for name, pod in pods.items():
            self._set_role(pod, "primary" if name == target else "replica")
        status["currentPrimary"] = target
        status["targetPrimary"] = target
        status["currentPrimaryTimestamp"] = now_iso()
        status["timelineID"] = int(status.get("timelineID", 1)) + 1
        if target in pods:
            self._log(pods[target], InstanceLog(target).promoted(status["timelineID"]))
            self._checkpoints(pods[target], replica=False)
        if old in pods and self._ready(pods[old]):
            # The former primary shuts down and follows the new one.
            self._log(pods[old], InstanceLog(old).shutdown())
            self._log_ready(status, self._get("pods", c["metadata"]["namespace"], old))
        self._event(c, "SwitchoverCompleted", f"Switchover completed: {old} -> {target}")

    def _roll(
        self,
        c: dict[str, Any],
        status: dict[str, Any],
        pods: dict[str, Any],
        instances: list[str],
        image: str,
        restarted_at: str | None,
    ) -> bool:
        """Image upgrades, resource changes and restarts: replicas first, primary last. True
        while rolling."""
        spec = c.get("spec") or {}
        primary = status.get("currentPrimary")
        resources = spec.get("resources")

        def stale(inst: str) -> bool:
            pod = pods[inst]
            annotations = pod["metadata"].get("annotations") or {}
            container = pod["spec"]["containers"][0]
            return (
                container["image"] != image
                or (resources is not None and container.get("resources") != resources)
                or (restarted_at is not None and annotations.get(RESTARTED_AT) != restarted_at)
            )

        todo = [i for i in instances if stale(i)]
        if not todo:
            return False
        upgrade = any(pods[i]["spec"]["containers"][0]["image"] != image for i in todo)
        replicas = [i for i in todo if i != primary]
        if status.get("phase") not in (UPGRADING, RESTARTING_PRIMARY, WAITING_USER):
            self._event(
                c,
                "UpgradingCluster" if upgrade else "RestartingCluster",
                f"{'Upgrading' if upgrade else 'Restarting'} instances, replicas first",
            )
        if replicas:
            inst = replicas[0]
            self._phase(
                status, UPGRADING, f"{'Upgrading' if upgrade else 'Restarting'} instance {inst}"
            )
            if self._due(c, f"roll:{inst}", ROLL_SECONDS):
                self._recreate(status, pods[inst], image, restarted_at, resources=resources)
                self._event(
                    c,
                    "InstanceRestarted" if not upgrade else "InstanceUpgraded",
                    f"Instance {inst} rolled out",
                )
            return True
        if spec.get("primaryUpdateStrategy") == "supervised":
            self._phase(status, WAITING_USER, "User must issue a supervised switchover")
            return True
        others = [i for i in instances if i != primary]
        if spec.get("primaryUpdateMethod") == "switchover" and others:
            self._phase(status, SWITCHOVER, f"Switching over to {others[0]} to update the primary")
            if self._due(c, f"switchover:{others[0]}", SWITCHOVER_SECONDS):
                self._promote(c, status, pods, others[0])
                self._recreate(
                    status, pods[primary], image, restarted_at, role="replica", resources=resources
                )
            return True
        self._phase(
            status,
            RESTARTING_PRIMARY if not upgrade else UPGRADING,
            f"Restarting primary {primary}",
        )
        if self._due(c, f"roll:{primary}", ROLL_SECONDS):
            self._recreate(status, pods[primary], image, restarted_at, resources=resources)
            self._event(c, "PrimaryRestarted", f"Primary {primary} rolled out")
        return True

    def _recreate(
        self,
        status: dict[str, Any],
        pod: dict[str, Any],
        image: str,
        restarted_at: str | None,
        role: str | None = None,
        resources: dict[str, Any] | None = None,
    ) -> None:
        """Roll one pod in place: new image, the Cluster's resources and restart annotation,
        counted as a restart."""
        self._log(pod, InstanceLog(pod["metadata"]["name"]).shutdown())
        body = copy.deepcopy(pod)
        body["spec"]["containers"][0]["image"] = image
        if resources is not None:
            body["spec"]["containers"][0]["resources"] = copy.deepcopy(resources)
        annotations = body["metadata"].setdefault("annotations", {})
        if restarted_at is not None:
            annotations[RESTARTED_AT] = restarted_at
        if role:
            body["metadata"]["labels"]["cnpg.io/instanceRole"] = role
            body["metadata"]["labels"]["role"] = role
        updated = self.core.update(
            self._rt("", "pods"),
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            body,
            self.ctx,
        )
        restarts = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get(
            "restartCount", 0
        ) + 1
        self._mark_ready(updated, restarts)
        self._log(updated, InstanceLog(pod["metadata"]["name"]).manager_start())
        self._log_ready(status, updated)
        self.changed = True

    def _hibernate(
        self, c: dict[str, Any], status: dict[str, Any], pods: dict[str, Any], pvcs: dict[str, Any]
    ) -> None:
        cond = self._condition(status, HIBERNATION)
        if cond.get("status") == "True" and not pods:
            return
        if pods:
            if cond.get("reason") != "StartedHibernation":
                self._set_condition(
                    status, HIBERNATION, "False", "StartedHibernation", "Hibernation in progress"
                )
                self._event(c, "Hibernating", "Hibernation started: deleting instance pods")
                for pod in pods.values():
                    self._log(pod, InstanceLog(pod["metadata"]["name"]).shutdown())
            if self._due(c, "hibernate", HIBERNATE_SECONDS):
                for name in pods:
                    self._delete("pods", c["metadata"]["namespace"], name)
            return
        self._set_condition(
            status, HIBERNATION, "True", "Hibernated", "Cluster has been hibernated"
        )
        status["readyInstances"] = 0
        status["instancesStatus"] = {}
        self._phase(status, HEALTHY, "")
        self._event(c, "Hibernated", "Cluster has been hibernated")

    # ---- object store ----------------------------------------------------------------------

    def _store_entry(self, destination: str, server: str) -> dict[str, Any]:
        return self.sb.object_store.setdefault(destination, {}).setdefault(server, {"backups": []})

    def _archiving(self, c: dict[str, Any], status: dict[str, Any]) -> None:
        store = ((c.get("spec") or {}).get("backup") or {}).get("barmanObjectStore")
        if not store:
            return
        server = store.get("serverName") or c["metadata"]["name"]
        entry = self._store_entry(store["destinationPath"], server)
        entry.setdefault("archivingSince", now_iso())
        if status.get("currentPrimary"):
            self._set_condition(
                status,
                "ContinuousArchiving",
                "True",
                "ContinuousArchivingSuccess",
                "Continuous archiving is working",
            )
        self._prune(c, store, server)

    def _prune(self, c: dict[str, Any], store: dict[str, Any], server: str) -> None:
        policy = ((c.get("spec") or {}).get("backup") or {}).get("retentionPolicy")
        if not policy:
            return
        units = {"d": 86400, "w": 7 * 86400, "m": 30 * 86400}
        try:
            keep = dt.timedelta(seconds=int(policy[:-1]) * units[policy[-1]])
        except (ValueError, KeyError):
            return
        entry = self._store_entry(store["destinationPath"], server)
        cutoff = dt.datetime.now(dt.UTC) - keep
        completed = sorted(entry["backups"], key=lambda b: b["stoppedAt"])
        # Like Barman, never prune the newest backup, whatever its age.
        kept = [b for b in completed[:-1] if (_ts(b["stoppedAt"]) or cutoff) >= cutoff] + completed[
            -1:
        ]
        if len(kept) != len(entry["backups"]):
            entry["backups"] = kept
            self.changed = True
        # Look again when the next kept backup (never the newest) grows too old.
        expiring = [_ts(b["stoppedAt"]) for b in kept[:-1]]
        soonest = min((when for when in expiring if when is not None), default=None)
        if soonest is not None:
            wait = (soonest + keep - dt.datetime.now(dt.UTC)).total_seconds()
            meta = c["metadata"]
            self._wake(
                ("clusters", (meta["namespace"], meta["name"])), time.monotonic() + max(wait, 0.05)
            )

    def _recovery_failing(self, c: dict[str, Any], status: dict[str, Any], why: str) -> None:
        """A primary's restore Job that finds no backup to restore: it retries while the backup
        may still reach the object store, then fails for good, and CloudNativePG (since 1.30)
        calls the Cluster unrecoverable, naming the Job. What the Job's logs would say is a
        Warning event on the Cluster (the sandbox runs no Job)."""
        meta = c["metadata"]
        job = f"{meta['name']}-1-full-recovery"
        self.polled.add((meta["namespace"], meta["name"]))
        if self._due(c, "recovery-job", RECOVERY_JOB_SECONDS):
            self._phase(
                status,
                UNRECOVERABLE,
                f"Instance creation failed for the following jobs: {job}. "
                "Check the job logs to investigate the cause of the failure.",
            )
        elif status.get("phase") != SETTING_UP:
            self._event(c, "ErrorNoBackup", f"{job}: {why}", "Warning")
            self._phase(status, SETTING_UP, f"Creating primary instance {meta['name']}-1")
        self._set_status(c, status)

    def _recovery_source(
        self, c: dict[str, Any], recovery: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, str, bool]:
        """The backup a recovery bootstrap restores, or None, the reason it has none, and
        whether the operator would still start a restore Job (which then fails): it does once
        it knows where to look, not for a Backup object missing or unfinished."""
        ns = c["metadata"]["namespace"]
        spec = c.get("spec") or {}
        target = recovery.get("recoveryTarget") or {}
        if (recovery.get("backup") or {}).get("name"):
            bname = recovery["backup"]["name"]
            backup = self._get_cr("backups", ns, bname)
            if backup is None:
                return None, f"Backup object {ns}/{bname} not found", False
            st = backup.get("status") or {}
            if st.get("phase") != "completed":
                return (
                    None,
                    f"Backup {ns}/{bname} is not completed (phase: {st.get('phase') or 'new'})",
                    False,
                )
            entry = self.sb.object_store.get(st.get("destinationPath", ""), {}).get(
                st.get("serverName", ""), {}
            )
            found = [b for b in entry.get("backups", []) if b["backupId"] == st.get("backupId")]
            if not found:
                return (
                    None,
                    f"Backup {st.get('backupId')} of {ns}/{bname} is no longer in the object store",
                    True,
                )
            return found[0], "", True
        if recovery.get("volumeSnapshots"):
            return None, "recovery from volumeSnapshots is not simulated by the sandbox", False
        source_name = recovery.get("source")
        if not source_name:
            return None, "bootstrap.recovery needs backup.name, source or volumeSnapshots", False
        external = next(
            (e for e in spec.get("externalClusters") or [] if e.get("name") == source_name), None
        )
        if external is None or not external.get("barmanObjectStore"):
            return None, f"externalClusters has no barmanObjectStore named {source_name}", True
        store = external["barmanObjectStore"]
        server = store.get("serverName") or source_name
        entry = self.sb.object_store.get(store.get("destinationPath", ""), {}).get(server)
        if not entry or not entry.get("backups"):
            return (
                None,
                f"no target backup found in {store.get('destinationPath')} for server {server}",
                True,
            )
        candidates = sorted(entry["backups"], key=lambda b: b["stoppedAt"])
        if target.get("backupID"):
            candidates = [b for b in candidates if b["backupId"] == target["backupID"]]
            if not candidates:
                return None, f"no target backup found with ID {target['backupID']}", True
        if target.get("targetTime"):
            when = _ts(target["targetTime"])
            candidates = [b for b in candidates if when and (_ts(b["stoppedAt"]) or when) <= when]
            if not candidates:
                return None, f"no target backup found before {target['targetTime']}", True
        return candidates[-1], "", True

    def _get_cr(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        rt = self.core.resolve(GROUP, VERSION, plural)
        obj = self.core.store.get(rt.key, ns, name) if rt else None
        if obj is None:
            return None
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = f"{GROUP}/{VERSION}", rt.kind
        return out

    # ---- Backup ----------------------------------------------------------------------------

    def _backup(self, b: dict[str, Any]) -> None:
        meta = b["metadata"]
        status = copy.deepcopy(b.get("status") or {})
        phase = status.get("phase")
        if phase in ("completed", "failed") or meta.get("deletionTimestamp"):
            return
        ns = meta["namespace"]
        spec = b.get("spec") or {}
        cname = (spec.get("cluster") or {}).get("name", "")
        method = spec.get("method") or "barmanObjectStore"
        cluster = self._get_cr("clusters", ns, cname)
        if not phase:
            status.update({"phase": "pending", "method": method})
            self._set_status(b, status)
            return
        why = self._backup_blocker(cluster, cname, method)
        if why:
            self._fail(b, status, cluster, why)
            return
        cstore = cluster["spec"]["backup"].get("barmanObjectStore") or {}
        server = cstore.get("serverName") or cname
        primary = cluster["status"]["currentPrimary"]
        if phase == "pending":
            if self._due(b, "start", BACKUP_START_SECONDS):
                started = dt.datetime.now(dt.UTC)
                stored = self.sb.object_store.get(cstore.get("destinationPath", ""), {}).get(
                    server, {}
                )
                taken = {b["backupId"] for b in stored.get("backups", [])}
                while started.strftime("%Y%m%dT%H%M%S") in taken:
                    # Barman backup IDs are timestamps: two in one second take the next second.
                    started += dt.timedelta(seconds=1)
                status.update(
                    {
                        "phase": "running",
                        "startedAt": _fmt(started),
                        "backupId": started.strftime("%Y%m%dT%H%M%S"),
                        "backupName": f"backup-{started.strftime('%Y%m%d%H%M%S')}",
                        "instanceID": {"podName": primary, "ContainerID": "containerd://sandbox"},
                        "online": spec.get("online", True),
                    }
                )
                if method == "barmanObjectStore":
                    status.update(
                        {"destinationPath": cstore.get("destinationPath"), "serverName": server}
                    )
                    if cstore.get("endpointURL"):
                        status["endpointURL"] = cstore["endpointURL"]
                self._set_status(b, status)
                self._event(b, "Starting", f"Backup {meta['name']} started on {primary}")
                self._log(
                    self._get("pods", ns, primary),
                    InstanceLog(primary).backup_started(meta["name"], ns),
                )
            return
        if phase in ("running", "finalizing"):
            if not self._due(b, f"finish:{phase}", BACKUP_SECONDS):
                return
            if self.sb.faults.take_backup_failure():
                self._fail(b, status, cluster, "injected backup failure")
                return
            if method == "volumeSnapshot" and phase == "running":
                # Snapshots are taken, then wait for the storage to report them ready.
                status["phase"] = "finalizing"
                self._set_status(b, status)
                return
            stored = self.sb.object_store.get(cstore.get("destinationPath", ""), {}).get(server, {})
            serial = len(stored.get("backups", [])) + 1
            timeline = int(cluster["status"].get("timelineID", 1))
            status.update(
                {
                    "phase": "completed",
                    "stoppedAt": now_iso(),
                    "beginWal": f"{timeline:08X}{0:08X}{serial * 2:08X}",
                    "endWal": f"{timeline:08X}{0:08X}{serial * 2 + 1:08X}",
                    "beginLSN": f"0/{serial * 2:X}000028",
                    "endLSN": f"0/{serial * 2 + 1:X}000100",
                }
            )
            if method == "barmanObjectStore":
                record = {
                    k: status[k]
                    for k in (
                        "backupId",
                        "startedAt",
                        "stoppedAt",
                        "beginWal",
                        "endWal",
                        "beginLSN",
                        "endLSN",
                    )
                }
                record.update(
                    {
                        "timelineID": timeline,
                        "clusterName": cname,
                        "namespace": ns,
                        "backupObject": meta["name"],
                    }
                )
                self._store_entry(cstore["destinationPath"], server)["backups"].append(record)
            self._set_status(b, status)
            self._event(b, "Completed", f"Backup {meta['name']} completed")
            self._log(
                self._get("pods", ns, primary),
                InstanceLog(primary).backup_finished(meta["name"], ns),
            )
            self._cluster_backup_result(cluster, True, "", status)
            if method == "barmanObjectStore":
                self._prune(cluster, cstore, server)

    def _backup_blocker(self, cluster: dict[str, Any] | None, cname: str, method: str) -> str:
        if cluster is None:
            return f'while getting cluster {cname}: clusters.postgresql.cnpg.io "{cname}" not found'
        annotations = cluster["metadata"].get("annotations") or {}
        if annotations.get(HIBERNATION) == "on":
            return "cannot backup a hibernated cluster"
        cstatus = cluster.get("status") or {}
        if cstatus.get("phase") != HEALTHY or not cstatus.get("readyInstances"):
            return "cannot proceed with the backup as the cluster is not in a healthy state"
        backup_spec = (cluster.get("spec") or {}).get("backup") or {}
        if method == "barmanObjectStore" and not backup_spec.get("barmanObjectStore"):
            return "cannot proceed with the backup as the cluster has no backup section"
        if method == "volumeSnapshot" and not backup_spec.get("volumeSnapshot"):
            return "cannot execute backup: no volumeSnapshot configuration in the cluster"
        if method not in ("barmanObjectStore", "volumeSnapshot"):
            return f"unsupported backup method {method} in the sandbox"
        return ""

    def _fail(
        self, b: dict[str, Any], status: dict[str, Any], cluster: dict[str, Any] | None, why: str
    ) -> None:
        status.update({"phase": "failed", "error": why})
        pod_name = (status.get("instanceID") or {}).get("podName")
        if pod_name:
            ns = b["metadata"]["namespace"]
            self._log(
                self._get("pods", ns, pod_name),
                InstanceLog(pod_name).backup_finished(b["metadata"]["name"], ns, why),
            )
        status.setdefault("stoppedAt", now_iso())
        self._set_status(b, status)
        self._event(b, "Failed", f"Backup failed: {why}", "Warning")
        if cluster is not None:
            self._cluster_backup_result(cluster, False, why, status)

    def _cluster_backup_result(
        self, cluster: dict[str, Any], ok: bool, why: str, bstatus: dict[str, Any]
    ) -> None:
        status = copy.deepcopy(cluster.get("status") or {})
        if ok:
            self._set_condition(
                status,
                "LastBackupSucceeded",
                "True",
                "LastBackupSucceeded",
                "Backup was successful",
            )
            status["lastSuccessfulBackup"] = bstatus.get("stoppedAt")
            status.setdefault("firstRecoverabilityPoint", bstatus.get("stoppedAt"))
        else:
            self._set_condition(status, "LastBackupSucceeded", "False", "LastBackupFailed", why)
            status["lastFailedBackup"] = now_iso()
        self._set_status(cluster, status)

    # ---- ScheduledBackup -------------------------------------------------------------------

    def _scheduled(self, s: dict[str, Any]) -> None:
        meta = s["metadata"]
        spec = s.get("spec") or {}
        if meta.get("deletionTimestamp") or spec.get("suspend"):
            return
        status = copy.deepcopy(s.get("status") or {})
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        try:
            last = _ts(status.get("lastScheduleTime"))
            nxt = _ts(status.get("nextScheduleTime"))
            if nxt is None:
                nxt = next_time(spec.get("schedule", ""), _ts(meta["creationTimestamp"]) or now)
        except CronError as exc:
            if status.get("lastCheckTime") is None:
                self._event(s, "InvalidSchedule", f"invalid schedule: {exc}", "Warning")
                status["lastCheckTime"] = _fmt(now)
                self._set_status(s, status)
            return
        fire = (last is None and spec.get("immediate")) or now >= nxt
        if fire:
            self._create_scheduled_backup(s, now)
            status["lastScheduleTime"] = _fmt(now)
            nxt = next_time(spec["schedule"], now)
        status["lastCheckTime"] = status.get("lastCheckTime") or _fmt(now)
        if fire or status.get("nextScheduleTime") != _fmt(nxt):
            status["lastCheckTime"] = _fmt(now)
            status["nextScheduleTime"] = _fmt(nxt)
            self._set_status(s, status)
        self.wakeups[("scheduledbackups", (meta["namespace"], meta["name"]))] = (
            time.monotonic() + max((nxt - now).total_seconds(), 0.05)
        )

    def _create_scheduled_backup(self, s: dict[str, Any], now: dt.datetime) -> None:
        meta, spec = s["metadata"], s.get("spec") or {}
        ns = meta["namespace"]
        cname = (spec.get("cluster") or {}).get("name", "")
        owner_mode = spec.get("backupOwnerReference") or "none"
        owners: list[dict[str, Any]] = []
        if owner_mode == "self":
            owners = [_owner(s)]
        elif owner_mode == "cluster":
            cluster = self._get_cr("clusters", ns, cname)
            if cluster is not None:
                owners = [_owner(cluster)]
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Backup",
            "metadata": {
                "name": f"{meta['name']}-{now.strftime('%Y%m%d%H%M%S')}",
                "labels": {
                    "cnpg.io/cluster": cname,
                    "cnpg.io/scheduled-backup": meta["name"],
                    "cnpg.io/immediateBackup": str(bool(spec.get("immediate"))).lower(),
                },
                **({"ownerReferences": owners} if owners else {}),
            },
            "spec": {
                "cluster": {"name": cname},
                "method": spec.get("method") or "barmanObjectStore",
                **({"target": spec["target"]} if spec.get("target") else {}),
                **({"online": spec["online"]} if "online" in spec else {}),
            },
        }
        rt = self.core.resolve(GROUP, VERSION, "backups")
        try:
            self.core.create(rt, ns, body, self.ctx)
            self._event(s, "BackupSchedule", f"Scheduled backup {body['metadata']['name']} created")
            self.changed = True
        except ApiError as exc:
            if exc.code != 409:
                raise


def _plural(kind: str) -> str:
    return {"Cluster": "clusters", "Backup": "backups", "ScheduledBackup": "scheduledbackups"}[kind]


def _inherited(c: dict[str, Any], kind: str) -> dict[str, str]:
    """spec.inheritedMetadata labels or annotations, which CloudNativePG copies to instances."""
    inherited = ((c.get("spec") or {}).get("inheritedMetadata") or {}).get(kind)
    return dict(inherited) if isinstance(inherited, dict) else {}


def _annotations(values: dict[str, str]) -> dict[str, Any]:
    return {"annotations": values} if values else {}


def _image_id(image: str) -> str:
    """A stable fake digest for an image reference."""
    return f"{image.split(':')[0]}@sha256:{uuid.uuid5(uuid.NAMESPACE_URL, image).hex * 2}"


def _config_hash(c: dict[str, Any]) -> str:
    """A digest of spec.postgresql and the cnpg.io/reloadedAt annotation (a forced reload)."""
    reloaded = ((c.get("metadata") or {}).get("annotations") or {}).get("cnpg.io/reloadedAt")
    config = json.dumps([(c.get("spec") or {}).get("postgresql") or {}, reloaded], sort_keys=True)
    return hashlib.sha256(config.encode()).hexdigest()[:16]


BOOTSTRAP_METHODS = ("initdb", "recovery", "pg_basebackup")


def bootstrap_methods(cluster: dict[str, Any]) -> list[str]:
    """The bootstrap methods a Cluster's spec sets; one set to null is not set (a nil pointer)."""
    bootstrap = (cluster.get("spec") or {}).get("bootstrap")
    if not isinstance(bootstrap, dict):
        return []
    return [method for method in BOOTSTRAP_METHODS if bootstrap.get(method) is not None]


def validate_cluster(new: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """CloudNativePG's validating webhook, the parts Opsdeck's plans meet: one bootstrap method
    at a time (on create and on every update), and a volume never shrinks."""
    errs = []
    if len(bootstrap_methods(new)) > 1:
        errs.append(
            forbidden_field(
                "spec.bootstrap", "Only one bootstrap method can be specified at a time"
            )
        )
    if old is None:
        return errs
    for field in ("storage", "walStorage"):
        before = ((old.get("spec") or {}).get(field) or {}).get("size")
        after = ((new.get("spec") or {}).get(field) or {}).get("size")
        new_size, old_size = parse_quantity(after), parse_quantity(before)
        if new_size is not None and old_size is not None and new_size < old_size:
            errs.append(
                invalid(
                    f"spec.{field}.size",
                    after,
                    f"can't shrink existing storage from {before} to {after}",
                )
            )
    return errs


def default_cluster(cluster: dict[str, Any]) -> None:
    """CloudNativePG's defaulting webhook: initdb with database and owner "app" when no
    bootstrap method is set."""
    spec = cluster.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if not bootstrap_methods(cluster):
        spec["bootstrap"] = {"initdb": {}}
    initdb = spec["bootstrap"].get("initdb")
    if isinstance(initdb, dict):
        initdb.setdefault("database", "app")
        initdb.setdefault("owner", initdb["database"])
