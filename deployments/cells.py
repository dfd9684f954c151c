"""The Kubernetes driver of a cell: one per cell and configuration, per process.

The runner, the cell watcher, the status reader and the instance page's live tabs all reach a
cell through `driver_for`, so each process keeps one API client (its connection pool) and one
discovery cache per cluster and timeout.
"""

from __future__ import annotations

import hashlib

from django.conf import settings

from deployments.kube import (
    TIMEOUT,
    KubeDriver,
    api_client_from_kubeconfig,
    api_client_in_cluster,
)
from deployments.models import Cell

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
