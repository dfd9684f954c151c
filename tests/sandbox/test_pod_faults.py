"""Failing a named pod: its owner turns unhealthy as CloudNativePG (or a StatefulSet) reports it,
then recovers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, watch

from sandbox.errors import ApiError
from tests.sandbox.conftest import cache_statefulset

G, V = "postgresql.cnpg.io", "v1"
HEALTHY = "Cluster in healthy state"
ROOT = Path(__file__).resolve().parents[2]


def status_of(custom, ns: str, name: str = "pg") -> dict:
    return custom.get_namespaced_custom_object(G, V, ns, "clusters", name)["status"]


def container(core_v1, ns: str, pod: str):
    return core_v1.read_namespaced_pod(pod, ns).status.container_statuses[0]


def pod_ready(core_v1, ns: str, pod: str) -> bool:
    conditions = core_v1.read_namespaced_pod(pod, ns).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def log_of(core_v1, ns: str, pod: str) -> str:
    return core_v1.read_namespaced_pod_log(pod, ns, _preload_content=False).data.decode()


def test_a_failing_replica_makes_the_cluster_wait_then_recover(
    core_v1, custom, namespace, pg_cluster, sandbox
):
    pg_cluster(instances=3)
    sandbox.pod_fail(namespace, "pg-2", seconds=None)
    status = status_of(custom, namespace)
    assert status["phase"] == "Waiting for the instances to become active"
    assert status["readyInstances"] == 2
    assert status["currentPrimary"] == "pg-1"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ClusterIsNotReady")
    state = container(core_v1, namespace, "pg-2")
    assert state.ready is False and state.restart_count == 1
    assert state.state.waiting.reason == "CrashLoopBackOff"
    assert state.last_state.terminated.exit_code == 137
    assert not pod_ready(core_v1, namespace, "pg-2")
    assert "PostgreSQL process exited with errors" in log_of(core_v1, namespace, "pg-2")
    backoff = core_v1.list_namespaced_event(
        namespace, field_selector="involvedObject.name=pg-2,reason=BackOff"
    ).items
    assert [(e.type, e.source.component) for e in backoff] == [("Warning", "kubelet")]

    assert sandbox.pod_fail_clear(namespace, "pg-2") is True
    sandbox.run_until_idle()
    status = status_of(custom, namespace)
    assert (status["phase"], status["readyInstances"]) == (HEALTHY, 3)
    assert container(core_v1, namespace, "pg-2").restart_count == 1
    assert pod_ready(core_v1, namespace, "pg-2")
    assert (
        "started streaming WAL from primary"
        in log_of(core_v1, namespace, "pg-2").split("PostgreSQL process exited with errors")[-1]
    )


def test_a_failing_primary_fails_over_through_the_control_endpoint(
    core_v1, custom, raw, namespace, pg_cluster, sandbox
):
    cluster = pg_cluster(instances=3)
    phases: list[str] = []
    w = watch.Watch()
    stream = w.stream(
        custom.list_namespaced_custom_object,
        G,
        V,
        namespace,
        "clusters",
        resource_version=cluster["metadata"]["resourceVersion"],
        timeout_seconds=15,
    )
    # Down long enough that the operator sees it down after the failover even on a loaded
    # machine: back within one of its rounds, it skips the wait for the old primary.
    code, _, body = raw.request(
        "POST", f"/sandbox/v1/namespaces/{namespace}/pods/pg-1/fail", {"seconds": 2}
    )
    assert (code, body) == (200, {"namespace": namespace, "name": "pg-1", "seconds": 2})
    for event in stream:
        status = event["object"].get("status") or {}
        if not phases or phases[-1] != status.get("phase"):
            phases.append(status.get("phase"))
        # Healthy again once the old primary is back, as a replica.
        if status.get("phase") == HEALTHY and status.get("readyInstances") == 3 and len(phases) > 1:
            w.stop()
    assert phases == ["Failing over", "Waiting for the instances to become active", HEALTHY]
    sandbox.run_until_idle()
    status = status_of(custom, namespace)
    assert status["currentPrimary"] in ("pg-2", "pg-3")
    assert status["timelineID"] == 2
    old = core_v1.read_namespaced_pod("pg-1", namespace)
    assert old.metadata.labels["cnpg.io/instanceRole"] == "replica"
    assert old.status.container_statuses[0].restart_count == 1
    reasons = [
        e.reason
        for e in core_v1.list_namespaced_event(
            namespace, field_selector="involvedObject.name=pg"
        ).items
    ]
    assert "FailingOver" in reasons and "FailoverTarget" in reasons
    new_primary_log = log_of(core_v1, namespace, status["currentPrimary"])
    assert "received promote request" in new_primary_log
    assert "selected new timeline ID: 2" in new_primary_log


def test_a_single_instance_fails_until_its_time_is_up(
    custom, namespace, pg_cluster, sandbox, until
):
    pg_cluster(instances=1)
    sandbox.pod_fail(namespace, "pg-1", seconds=0.4)
    status = status_of(custom, namespace)
    assert status["phase"] == "Failing over"
    assert status["readyInstances"] == 0
    assert status["currentPrimary"] == "pg-1"
    until(lambda: status_of(custom, namespace)["phase"] == HEALTHY, timeout=5)
    assert status_of(custom, namespace)["readyInstances"] == 1


def test_a_failing_statefulset_pod_lowers_ready_replicas(
    core_v1, api_client, namespace, sandbox, until
):
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_stateful_set(
        namespace,
        cache_statefulset(2),
    )
    sandbox.run_until_idle()
    assert apps.read_namespaced_stateful_set("cache", namespace).status.ready_replicas == 2
    sandbox.pod_fail(namespace, "cache-1", seconds=0.4)
    until(lambda: apps.read_namespaced_stateful_set("cache", namespace).status.ready_replicas == 1)
    state = container(core_v1, namespace, "cache-1")
    assert (state.ready, state.restart_count) == (False, 1)
    assert "Exiting on fatal signal" in log_of(core_v1, namespace, "cache-1")
    until(
        lambda: apps.read_namespaced_stateful_set("cache", namespace).status.ready_replicas == 2,
        timeout=5,
    )
    assert pod_ready(core_v1, namespace, "cache-1")
    assert log_of(core_v1, namespace, "cache-1").count("Ready to accept connections") == 2


def test_failing_an_unknown_pod_is_404(raw, namespace, sandbox):
    code, _, body = raw.request("POST", f"/sandbox/v1/namespaces/{namespace}/pods/nope/fail", {})
    assert (code, body["reason"]) == (404, "NotFound")
    with pytest.raises(ApiError) as err:
        sandbox.pod_fail(namespace, "nope")
    assert err.value.code == 404


@pytest.mark.parametrize("seconds", [0, -1, "soon", True])
def test_a_bad_duration_is_refused(raw, namespace, pg_cluster, seconds):
    pg_cluster(instances=1)
    code, _, body = raw.request(
        "POST", f"/sandbox/v1/namespaces/{namespace}/pods/pg-1/fail", {"seconds": seconds}
    )
    assert (code, body["reason"]) == (400, "BadRequest")


def test_the_cli_fails_and_clears_a_pod(custom, namespace, pg_cluster, sandbox):
    pg_cluster(instances=2)
    command = [
        sys.executable,
        "-m",
        "sandbox",
        "fail-pod",
        f"{namespace}/pg-2",
        "--url",
        sandbox.url,
    ]
    done = subprocess.run(  # noqa: S603 - this interpreter running our own module
        [*command, "--until-cleared"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert json.loads(done.stdout) == {"namespace": namespace, "name": "pg-2", "seconds": None}
    assert status_of(custom, namespace)["readyInstances"] == 1
    done = subprocess.run(  # noqa: S603 - this interpreter running our own module
        [*command, "--clear"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert json.loads(done.stdout)["cleared"] is True
    sandbox.run_until_idle()
    assert status_of(custom, namespace)["phase"] == HEALTHY
