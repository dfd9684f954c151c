"""The Kubernetes driver of a cell: one per cell and configuration, per process; and where an
instance runs on a cell, as the executor renders it (`placement`).

The runner, the cell watcher, the status reader and the instance page's live tabs all reach a
cell through `driver_for`, so each process keeps one API client (its connection pool) and one
discovery cache per cluster and timeout.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings

from deployments import executor
from deployments.kube import (
    TIMEOUT,
    KubeDriver,
    api_client_from_kubeconfig,
    api_client_in_cluster,
)
from deployments.models import Cell

# The cell's settings its instances' namespace guard rails are rendered with (`placement`).
NAMESPACE_SETTINGS = ("customer_sources", "operator_namespace", "backup_credentials")

_drivers: dict[tuple[int, str, tuple[float, float]], KubeDriver] = {}


def configuration(cell: Cell) -> str:
    """What a cell is reached with: its kubeconfig and context (a change of either is another
    driver, and the watcher starts the cell's watches again on it)."""
    return cell.kubeconfig + "\0" + cell.context


def driver_for(cell: Cell, *, timeout: tuple[float, float] = TIMEOUT) -> KubeDriver:
    """One driver (one ApiClient and discovery cache) per cell, configuration and timeout of
    its requests (`kube.TIMEOUT`, or a page's shorter one), per process."""
    key = (cell.pk, configuration(cell), timeout)
    if key not in _drivers:
        api = (
            api_client_from_kubeconfig(cell.kubeconfig, context=cell.context or None)
            if cell.kubeconfig
            else api_client_in_cluster()
        )
        cache_dir = settings.VAR_DIR / "kube-cache"
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Named after the configuration too: databases sharing var/ may hold other clusters.
        digest = hashlib.sha256(key[1].encode()).hexdigest()[:12]
        cache_file = cache_dir / f"cell-{cell.pk}-{digest}.json"
        _drivers[key] = KubeDriver(api, cache_file=str(cache_file), timeout=timeout)
    return _drivers[key]


def placement(cell: Cell, *, instance_id: str, tenant_slug: str, **who: str) -> executor.Placement:
    """Where an instance runs on `cell`, as the executor renders it: the cell's settings, with
    the instance, its tenant and `who` (its tenant's name, the requester) beside them."""
    return executor.Placement(
        instance_id=instance_id,
        tenant_slug=tenant_slug,
        region=cell.region,
        cloud=cell.cloud,
        labels=cell.labels,
        backup_destination=cell.backup_destination,
        operator_namespace=cell.operator_namespace,
        customer_sources=tuple(cell.customer_sources),
        backup_credentials=json.loads(cell.backup_credentials) if cell.backup_credentials else None,
        **who,
    )


def namespace_settings(cell: Cell) -> tuple:
    """The cell's `NAMESPACE_SETTINGS`, to tell a change of them."""
    return tuple(getattr(cell, name) for name in NAMESPACE_SETTINGS)


def namespace_settings_read(cell: Cell) -> bool:
    """Read the cell's `NAMESPACE_SETTINGS` again into `cell`; whether they changed since it
    was read."""
    now = Cell.objects.filter(pk=cell.pk).values(*NAMESPACE_SETTINGS).get()
    changed = any(getattr(cell, name) != value for name, value in now.items())
    for name, value in now.items():
        setattr(cell, name, value)
    return changed
