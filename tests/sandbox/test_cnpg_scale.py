"""The CNPG simulation and the garbage collector look only at what changed."""

from __future__ import annotations

import time

from sandbox import Sandbox
from sandbox.core import Ctx
from sandbox.operators.cnpg import CnpgOperator

SPEED = 2000.0  # as the conftest fixtures run

G, V = "postgresql.cnpg.io", "v1"
IDLE = 50


def cluster(name: str, instances: int) -> dict:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"instances": instances, "storage": {"size": "1Gi"}},
    }


def settle(sb: Sandbox, timeout: float = 60.0) -> None:
    """Run controller rounds on this thread until nothing is written and no step is in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rv = sb.core.store.rv
        if not sb.reconcile_once() and sb.core.store.rv == rv:
            if not any(c.busy() for c in sb.controllers):
                return
            time.sleep(0.001)
    raise TimeoutError("controllers still busy")


def phase(sb: Sandbox, name: str) -> str | None:
    rt = sb.core.resolve(G, V, "clusters")
    return ((sb.core.store.get(rt.key, "default", name) or {}).get("status") or {}).get("phase")


def pods(sb: Sandbox, name: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in sb.core.store.items(sb.core.builtin("pods").key, "default")
        if p["metadata"]["labels"].get("cnpg.io/cluster") == name
    ]


def test_a_new_cluster_converges_beside_idle_ones_without_visiting_them():
    # Not started: rounds run on this thread, so every visit is counted and none races.
    sb = Sandbox(speed=SPEED)
    operator = next(c for c in sb.controllers if isinstance(c, CnpgOperator))
    rt, ctx = sb.core.resolve(G, V, "clusters"), Ctx(field_manager="test")
    for i in range(IDLE):
        sb.core.create(rt, "default", cluster(f"idle-{i}", 1), ctx)
    settle(sb)
    assert {phase(sb, f"idle-{i}") for i in range(IDLE)} == {"Cluster in healthy state"}

    operator.visits.clear()
    for _ in range(5):
        sb.reconcile_once()
    assert not operator.visits

    sb.core.create(rt, "default", cluster("new", 3), ctx)
    settle(sb)
    assert phase(sb, "new") == "Cluster in healthy state"
    assert pods(sb, "new") == ["new-1", "new-2", "new-3"]
    assert set(operator.visits) == {("clusters", ("default", "new"))}


def test_deleting_one_cluster_among_many_removes_only_its_objects():
    sb = Sandbox(speed=SPEED)
    rt, ctx = sb.core.resolve(G, V, "clusters"), Ctx(field_manager="test")
    for i in range(IDLE):
        sb.core.create(rt, "default", cluster(f"pg-{i}", 1), ctx)
    settle(sb)
    sb.core.delete(rt, "default", "pg-7")
    settle(sb)
    assert pods(sb, "pg-7") == []
    assert sb.core.store.get(sb.core.builtin("services").key, "default", "pg-7-rw") is None
    assert pods(sb, "pg-8") == ["pg-8-1"]
    assert phase(sb, "pg-8") == "Cluster in healthy state"


def test_a_terminating_namespace_is_emptied_without_scanning_the_others(monkeypatch):
    sb = Sandbox(speed=SPEED, operators=False)
    core, ctx = sb.core, Ctx(field_manager="test")
    namespaces, configmaps = core.builtin("namespaces"), core.builtin("configmaps")

    def configmap(name: str, **meta: object) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}}

    for name in ("crowded", "leaving"):
        core.create(
            namespaces,
            "",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            ctx,
        )
    for i in range(IDLE * 20):
        core.create(configmaps, "crowded", configmap(f"cm-{i}"), ctx)
    core.create(configmaps, "leaving", configmap("held", finalizers=["example.com/hold"]), ctx)
    core.create(configmaps, "leaving", configmap("plain"), ctx)
    settle(sb)
    listed: list[tuple[str, str]] = []
    items = core.store.items
    monkeypatch.setattr(
        core.store, "items", lambda key, ns=None: listed.append(key) or items(key, ns)
    )

    core.delete(namespaces, "", "leaving")
    settle(sb)

    assert core.store.get(namespaces.key, "", "leaving")["status"]["phase"] == "Terminating"
    assert core.store.get(configmaps.key, "leaving", "plain") is None
    held = core.store.get(configmaps.key, "leaving", "held")
    assert held["metadata"]["deletionTimestamp"]
    released = {**held, "metadata": {**held["metadata"], "finalizers": []}}
    core.update(configmaps, "leaving", "held", released, ctx)
    settle(sb)
    assert core.store.get(namespaces.key, "", "leaving") is None
    assert len(items(configmaps.key, "crowded")) == IDLE * 20
    assert listed == []  # no resource was listed whole to find the namespace's objects
