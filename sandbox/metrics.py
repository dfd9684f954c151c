"""`metrics.k8s.io/v1beta1` PodMetrics, shaped like metrics-server's, computed when read.

Usage is plausible and slowly varying: a deterministic function of the pod, its container and
the sample time (samples every 15 s), inside the container's limits (or requests), a primary
(label `cnpg.io/instanceRole` or `role` = `primary`) busier than a replica. Pods that are not
Running and Ready have no metrics, as metrics-server has none for a container that is not up.
Nothing is stored: a controller round costs nothing more.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from . import errors as E
from .selectors import parse_field_selector, parse_label_selector
from .workloads import parse_quantity

if TYPE_CHECKING:
    from .core import Core

GROUP, VERSION = "metrics.k8s.io", "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
SAMPLE_SECONDS = 15
WINDOW = "30s"
# What a container without limits or requests is taken to have room for.
DEFAULT_CPU_CORES = 1.0
DEFAULT_MEMORY_BYTES = 512 * 1024 * 1024
# Share of the CPU room a busy (1.0) container uses at its peak, and the memory floor/peak.
CPU_PEAK, CPU_FLOOR = 0.45, 0.02
MEMORY_FLOOR, MEMORY_PEAK = 0.25, 0.35
# How busy each role is, relative to a primary.
ROLE_LOAD = {"primary": 1.0, "replica": 0.3}
OTHER_LOAD = 0.5


def api_group() -> dict[str, Any]:
    """The APIGroup entry of metrics.k8s.io, as `/apis` lists it."""
    gv = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"name": GROUP, "versions": [gv], "preferredVersion": gv}


def api_resources() -> dict[str, Any]:
    """`/apis/metrics.k8s.io/v1beta1`: the resources metrics-server serves (pods only here)."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": "pods",
                "singularName": "",
                "namespaced": True,
                "kind": "PodMetrics",
                "verbs": ["get", "list"],
            }
        ],
    }


def get_pod_metrics(core: Core, ns: str, name: str) -> dict[str, Any]:
    """One pod's PodMetrics, or 404 as metrics-server answers for a pod it has no metrics of."""
    now = time.time()
    with core.lock:
        pod = core.store.get(core.builtin("pods").key, ns, name)
        found = pod_metrics(pod, now) if pod is not None else None
    if found is None:
        # metrics-server names the object namespace/name in its NotFound.
        raise E.not_found("podmetrics", GROUP, f"{ns}/{name}")
    return found


def list_pod_metrics(
    core: Core, ns: str | None, label_selector: str | None, field_selector: str | None
) -> dict[str, Any]:
    """PodMetricsList of the running pods in ns (all namespaces if None) the selectors match."""
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector, "pods", "Pod")
    now = time.time()
    items = []
    with core.lock:
        for pod in core.store.items(core.builtin("pods").key, ns):
            if not labels(pod["metadata"].get("labels") or {}) or not fields(pod):
                continue
            found = pod_metrics(pod, now)
            if found is not None:
                items.append(found)
    return {"kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}


def pod_metrics(pod: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The PodMetrics of a pod at wall time `now`, None unless it is Running and Ready."""
    if not _running_and_ready(pod):
        return None
    meta = pod["metadata"]
    sampled = math.floor(now / SAMPLE_SECONDS) * SAMPLE_SECONDS
    labels = meta.get("labels") or {}
    role = labels.get("cnpg.io/instanceRole") or labels.get("role") or ""
    load = ROLE_LOAD.get(role, OTHER_LOAD)
    containers = []
    for container in pod["spec"].get("containers") or []:
        seed = f"{meta.get('namespace', '')}/{meta['name']}/{container.get('name', '')}"
        cpu, memory = _usage(container.get("resources") or {}, seed, load, sampled)
        containers.append(
            {"name": container.get("name", ""), "usage": {"cpu": f"{cpu}n", "memory": memory}}
        )
    return {
        "kind": "PodMetrics",
        "apiVersion": GROUP_VERSION,
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace", ""),
            "creationTimestamp": _iso(now),
            "labels": dict(labels),
        },
        "timestamp": _iso(sampled),
        "window": WINDOW,
        "containers": containers,
    }


def _usage(resources: dict[str, Any], seed: str, load: float, when: float) -> tuple[int, str]:
    """(CPU in nanocores, memory as `<n>Ki`) of one container at a sample time."""
    cpu_room = _room(resources, "cpu", Decimal(str(DEFAULT_CPU_CORES)))
    memory_room = _room(resources, "memory", Decimal(DEFAULT_MEMORY_BYTES))
    activity = _wave(seed, when)
    # Activity moves usage within its role's band: a primary is always above its replicas.
    cpu_share = CPU_FLOOR + (CPU_PEAK - CPU_FLOOR) * load * (0.5 + 0.5 * activity)
    # Memory follows the working set: it moves less than CPU and never drops to nothing.
    memory_share = MEMORY_FLOOR + MEMORY_PEAK * (0.4 + 0.6 * load) * (0.7 + 0.3 * activity)
    nanocores = int(cpu_room * Decimal(1_000_000_000) * Decimal(str(cpu_share)))
    kib = int(memory_room * Decimal(str(memory_share)) / 1024)
    return max(nanocores, 1), f"{max(kib, 1)}Ki"


def _room(resources: dict[str, Any], name: str, default: Decimal) -> Decimal:
    """The container's limit for a resource, else its request, else the default."""
    for section in ("limits", "requests"):
        value = parse_quantity((resources.get(section) or {}).get(name))
        if value is not None and value > 0:
            return value
    return default


def _wave(seed: str, when: float) -> float:
    """A smooth value in [0, 1] that drifts over minutes, different for each seed."""
    digest = hashlib.sha256(seed.encode()).digest()
    phase1, phase2 = digest[0] / 255 * math.tau, digest[1] / 255 * math.tau
    slow = 900 + digest[2] * 4  # 15 to 32 minutes
    fast = 240 + digest[3]  # 4 to 8 minutes
    value = 0.5 + 0.35 * math.sin(math.tau * when / slow + phase1)
    value += 0.1 * math.sin(math.tau * when / fast + phase2)
    return min(max(value, 0.0), 1.0)


def _running_and_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _iso(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
