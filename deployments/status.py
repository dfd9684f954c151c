"""The operator's status of every instance, kept fresh without one GET per instance.

A plan's spec names the object that carries its instances' status (`x-opsdeck.status`: its
apiVersion and kind, named after the instance id in the instance's namespace, labelled
`opsdeck.io/instance`) and where in it the portal finds what it shows (phase, ready and total
servers, primary, conditions). Beat calls
`instances_observe()`: per cell and kind, one LIST (a page at a time) with that label selector,
matched to the cell's instances, and what changed written in bulk. Beside the cell watcher,
which stores each change as it happens, this is a safety net: a kind the watcher streams in a
cell is read only every OPSDECK_STATUS_CONFIRM_AFTER seconds (`cell_observe`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q

from deployments import health, selectors
from deployments.cells import driver_for
from deployments.kube import KubeDriver
from deployments.models import Cell, CellWatchLease, Instance
from deployments.spec.validation import SHOWN_STATUS
from deployments.workflow.driver import DriverError
from deployments.workflow.outputs import MISSING, dotted_get

log = logging.getLogger(__name__)

INSTANCE_LABEL = "opsdeck.io/instance"


@dataclass(frozen=True)
class StatusRule:
    """A plan's status object (`x-opsdeck.status`): its apiVersion and kind, where in it the
    portal finds what it shows, and its health rule (`x-opsdeck.health`: a condition as a
    successCondition is written, and the path of the operator's reason when it fails)."""

    api_version: str
    kind: str
    paths: dict[str, str]
    health: str = ""
    health_reason: str = ""


def status_rule(extensions: dict[str, Any]) -> StatusRule | None:
    """The status rule of a spec's `x-opsdeck` extensions (None without a status object)."""
    status = extensions.get("status")
    if not isinstance(status, dict) or not status.get("apiVersion") or not status.get("kind"):
        return None
    fields = status.get("fields") or {}
    paths = (
        {str(k): str(v) for k, v in fields.items() if k in SHOWN_STATUS}
        if isinstance(fields, dict)
        else {}
    )
    health = extensions.get("health")
    health = health if isinstance(health, dict) else {}
    return StatusRule(
        str(status["apiVersion"]),
        str(status["kind"]),
        paths,
        health=str(health.get("condition") or ""),
        health_reason=str(health.get("reason") or ""),
    )


def observed_of(obj: dict[str, Any], rule: StatusRule) -> dict[str, Any]:
    """What Opsdeck keeps of an object: the shown values its spec points at, conditions as
    `{type, status, message}`, and with a health rule whether the object passes it (`healthy`)
    and, when not, the operator's reason (`healthReason`) — nothing else of the object: memory
    stays small."""
    observed: dict[str, Any] = {}
    for name, path in rule.paths.items():
        value = dotted_get(obj, path)
        if value is MISSING:
            continue
        if name == "conditions":
            value = (
                [
                    {key: str(c.get(key, "")) for key in ("type", "status", "message")}
                    for c in value
                    if isinstance(c, dict)
                ]
                if isinstance(value, list)
                else []
            )
        elif name in {"ready", "total"}:
            value = value if isinstance(value, int) and not isinstance(value, bool) else None
        else:
            value = str(value)
        observed[name] = value
    if rule.health:
        observed.update(health.verdict(obj, rule.health, rule.health_reason))
    return observed


def cell_observe(cell: Cell, driver: KubeDriver, now: datetime | None = None) -> int:
    """Read the status of the cell's instances, one LIST per kind, and store what changed; how
    many were found.

    The cell watcher stores each change of a kind it streams as it happens (its lease live and
    the kind among those it watches): such a kind is read again only once the cell's last read
    of them is OPSDECK_STATUS_CONFIRM_AFTER old, a safety net for an event the watcher missed.
    A kind it does not stream is read at each call. An instance whose status is unchanged is
    written only when its status was last stored that long ago, to confirm it (the page's
    "Observed" time): a fleet whose status holds still is not written again every 30 s.

    What a read finds is stored as of the moment it began (`now`, the database's clock, as the
    watcher's writes are), and never over a status stored after that: the watcher may store a
    change the LIST came too early to see while the read is under way."""
    now = now or _database_now()
    confirmed_after = now - timedelta(seconds=settings.OPSDECK_STATUS_CONFIRM_AFTER)
    in_cell = Instance.objects.filter(cell=cell).exclude(state=Instance.State.DELETED).order_by()
    rules: dict[int, StatusRule] = {}
    for version_id in in_cell.values_list("plan_version_id", flat=True).distinct():
        rule = status_rule(selectors.plan_version_loaded(version_id).spec.extensions)
        if rule is not None:
            rules[version_id] = rule
    streamed = _streamed_kinds(cell, now)
    if cell.status_read_at is not None and cell.status_read_at > confirmed_after:
        # Read lately: a kind the watcher streams is not read again (nor its instances).
        rules = {v: r for v, r in rules.items() if (r.api_version, r.kind) not in streamed}
    by_kind: dict[tuple[str, str], dict[str, tuple[Instance, StatusRule]]] = defaultdict(dict)
    if rules:
        read = in_cell.filter(plan_version_id__in=list(rules))
        for instance in read.only("id", "observed", "observed_at", "plan_version_id"):
            rule = rules[instance.plan_version_id]
            by_kind[(rule.api_version, rule.kind)][instance.pk] = (instance, rule)
    found, changed = 0, []
    for (api_version, kind), wanted in by_kind.items():
        for obj in driver.list_objects(api_version, kind, label_selector=INSTANCE_LABEL):
            meta = obj.get("metadata") or {}
            entry = wanted.get(meta.get("name", ""))
            if entry is None or meta.get("namespace") != entry[0].namespace:
                continue
            instance, rule = entry
            found += 1
            observed = observed_of(obj, rule)
            stale = instance.observed_at is None or instance.observed_at <= confirmed_after
            if observed != instance.observed or stale:
                instance.observed, instance.observed_at = observed, now
                changed.append(instance)
    stored_before = Q(observed_at=None) | Q(observed_at__lt=now)
    Instance.objects.filter(stored_before).bulk_update(
        changed, ["observed", "observed_at"], batch_size=500
    )
    if any(kind in streamed for kind in by_kind):
        Cell.objects.filter(pk=cell.pk).update(status_read_at=now)
    return found


def _database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _streamed_kinds(cell: Cell, now: datetime) -> set[tuple[str, str]]:
    """The (apiVersion, kind) pairs the cell's watcher streams: its lease live, the kinds it
    watches (`CellWatchLease.watching`, "apiVersion/Kind")."""
    lease = CellWatchLease.objects.filter(cell=cell, expires_at__gt=now).first()
    return lease.streamed() if lease else set()


def instances_observe() -> int:
    """Every cell's instances (a cell that cannot be read is logged and skipped)."""
    total = 0
    for cell in Cell.objects.filter(instances__isnull=False).distinct():
        try:
            total += cell_observe(cell, driver_for(cell))
        except DriverError as exc:
            log.warning("cell %s: status not read: %s", cell.name, exc.message)
    return total
