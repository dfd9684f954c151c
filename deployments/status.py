"""The operator's status of every instance, kept fresh without one GET per instance.

A plan's spec names the object that carries its instances' status (`x-opsdeck.status`: its
apiVersion and kind, named after the instance id in the instance's namespace, labelled
`opsdeck.io/instance`) and, optionally, which fields of its `status` to keep. Beat calls
`instances_observe()`: per cell and kind, one LIST (a page at a time) with that label selector,
matched to the cell's instances and written in bulk. A later watch replaces the polling behind
this one function.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from django.utils import timezone

from deployments import selectors
from deployments.kube import KubeDriver
from deployments.models import Cell, Instance
from deployments.workflow.driver import DriverError

log = logging.getLogger(__name__)

INSTANCE_LABEL = "opsdeck.io/instance"


def status_object(extensions: dict[str, Any]) -> tuple[str, str, list[str] | None] | None:
    """(apiVersion, kind, fields kept or None for all) from a spec's `x-opsdeck`, if it says."""
    status = extensions.get("status")
    if not isinstance(status, dict) or not status.get("apiVersion") or not status.get("kind"):
        return None
    fields = status.get("fields")
    return str(status["apiVersion"]), str(status["kind"]), list(fields) if fields else None


def observed_of(obj: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """What Opsdeck keeps of an object's status: the fields the spec names (all without)."""
    status = obj.get("status") or {}
    kept = status if fields is None else {k: status[k] for k in fields if k in status}
    return {"status": kept, "generation": (obj.get("metadata") or {}).get("generation")}


def cell_observe(cell: Cell, driver: KubeDriver) -> int:
    """Read the status of the cell's instances, one LIST per kind; how many were found."""
    instances = list(
        Instance.objects.filter(cell=cell)
        .exclude(state=Instance.State.DELETED)
        .only("id", "observed", "plan_version_id")
    )
    by_kind: dict[tuple[str, str], dict[str, tuple[Instance, list[str] | None]]] = defaultdict(dict)
    for instance in instances:
        found = status_object(
            selectors.plan_version_loaded(instance.plan_version_id).spec.extensions
        )
        if found is not None:
            api_version, kind, fields = found
            by_kind[(api_version, kind)][instance.pk] = (instance, fields)
    now = timezone.now()
    seen = []
    for (api_version, kind), wanted in by_kind.items():
        for obj in driver.list_objects(api_version, kind, label_selector=INSTANCE_LABEL):
            meta = obj.get("metadata") or {}
            entry = wanted.get(meta.get("name", ""))
            if entry is None or meta.get("namespace") != entry[0].namespace:
                continue
            instance, fields = entry
            instance.observed = observed_of(obj, fields)
            instance.observed_at = now
            seen.append(instance)
    Instance.objects.bulk_update(seen, ["observed", "observed_at"], batch_size=500)
    return len(seen)


def instances_observe() -> int:
    """Every cell's instances (a cell that cannot be read is logged and skipped)."""
    from deployments.runner import driver_for  # one driver (client, discovery) per cell

    total = 0
    for cell in Cell.objects.filter(instances__isnull=False).distinct():
        try:
            total += cell_observe(cell, driver_for(cell))
        except DriverError as exc:
            log.warning("cell %s: status not read: %s", cell.name, exc.message)
    return total
