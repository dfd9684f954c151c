"""metrics.k8s.io/v1beta1 PodMetrics, as metrics-server serves them, and `kubectl top pod`."""

from __future__ import annotations

import copy
import itertools
import json
import re
from decimal import Decimal

import pytest
from kubernetes import client

from sandbox.metrics import SAMPLE_SECONDS, pod_metrics
from sandbox.workloads import parse_quantity
from tests.sandbox.conftest import cache_statefulset

MG, MV = "metrics.k8s.io", "v1beta1"
LIMITS = {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "512Mi"}}


def usage(item: dict, what: str) -> Decimal:
    return parse_quantity(item["containers"][0]["usage"][what])


def test_discovery_lists_the_metrics_group(raw):
    _, _, groups = raw.request("GET", "/apis")
    group = next(g for g in groups["groups"] if g["name"] == MG)
    assert group["preferredVersion"] == {"groupVersion": f"{MG}/{MV}", "version": MV}
    _, _, resources = raw.request("GET", f"/apis/{MG}/{MV}")
    assert resources["kind"] == "APIResourceList" and resources["groupVersion"] == f"{MG}/{MV}"
    pods = next(r for r in resources["resources"] if r["name"] == "pods")
    assert pods["kind"] == "PodMetrics" and pods["namespaced"] is True
    assert pods["verbs"] == ["get", "list"]


def test_pod_metrics_have_metrics_servers_shape(custom, namespace, pg_cluster):
    pg_cluster(instances=1, resources=LIMITS)
    found = custom.get_namespaced_custom_object(MG, MV, namespace, "pods", "pg-1")
    assert found["kind"] == "PodMetrics" and found["apiVersion"] == f"{MG}/{MV}"
    assert found["metadata"]["name"] == "pg-1" and found["metadata"]["namespace"] == namespace
    assert found["metadata"]["labels"]["cnpg.io/cluster"] == "pg"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", found["metadata"]["creationTimestamp"])
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", found["timestamp"])
    assert found["window"] == "30s"
    [container] = found["containers"]
    assert container["name"] == "postgres"
    assert re.match(r"^\d+n$", container["usage"]["cpu"])
    assert re.match(r"^\d+Ki$", container["usage"]["memory"])


def test_usage_stays_inside_the_limits_and_the_primary_is_busiest(custom, namespace, pg_cluster):
    pg_cluster(instances=3, resources=LIMITS)
    listed = custom.list_namespaced_custom_object(MG, MV, namespace, "pods")
    assert listed["kind"] == "PodMetricsList" and listed["apiVersion"] == f"{MG}/{MV}"
    by_name = {item["metadata"]["name"]: item for item in listed["items"]}
    assert sorted(by_name) == ["pg-1", "pg-2", "pg-3"]
    for item in by_name.values():
        assert 0 < usage(item, "cpu") <= 1
        assert 0 < usage(item, "memory") <= 1024**3
    for replica in ("pg-2", "pg-3"):
        assert usage(by_name["pg-1"], "cpu") > usage(by_name[replica], "cpu")
        assert usage(by_name["pg-1"], "memory") > usage(by_name[replica], "memory")


def test_list_across_namespaces_filters_by_label_selector(custom, namespace, pg_cluster):
    pg_cluster(name=f"sel-{namespace}", instances=2)
    selector = f"cnpg.io/cluster=sel-{namespace},cnpg.io/instanceRole=primary"
    listed = custom.list_cluster_custom_object(MG, MV, "pods", label_selector=selector)
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in listed["items"]] == [
        (namespace, f"sel-{namespace}-1")
    ]
    everything = custom.list_cluster_custom_object(MG, MV, "pods")
    assert {i["metadata"]["name"] for i in everything["items"]} >= {
        f"sel-{namespace}-1",
        f"sel-{namespace}-2",
    }


def test_inherited_labels_select_instances_across_namespaces(
    core_v1, custom, namespace, pg_cluster
):
    labels = {"x-opsdeck/cell": f"cell-{namespace}"}
    pg_cluster(instances=2, inheritedMetadata={"labels": labels})
    assert core_v1.read_namespaced_pod("pg-1", namespace).metadata.labels["x-opsdeck/cell"]
    pvc = core_v1.read_namespaced_persistent_volume_claim("pg-2", namespace)
    assert pvc.metadata.labels["x-opsdeck/cell"] == f"cell-{namespace}"
    listed = custom.list_cluster_custom_object(
        MG, MV, "pods", label_selector=f"x-opsdeck/cell=cell-{namespace}"
    )
    assert [i["metadata"]["name"] for i in listed["items"]] == ["pg-1", "pg-2"]


def test_a_bad_label_selector_is_refused(raw):
    status, _, body = raw.request("GET", f"/apis/{MG}/{MV}/pods?labelSelector=a%3D%3D%3Db")
    assert status == 400 and body["reason"] == "BadRequest"


def test_pods_that_are_not_running_and_ready_have_no_metrics(core_v1, custom, namespace):
    core_v1.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pending"},
            "spec": {"containers": [{"name": "a", "image": "busybox"}]},
        },
    )
    assert custom.list_namespaced_custom_object(MG, MV, namespace, "pods")["items"] == []
    with pytest.raises(client.ApiException) as err:
        custom.get_namespaced_custom_object(MG, MV, namespace, "pods", "pending")
    assert err.value.status == 404
    body = json.loads(err.value.body)
    assert body["message"] == f'podmetrics.metrics.k8s.io "{namespace}/pending" not found'


def test_a_failing_pod_loses_its_metrics_until_it_recovers(custom, namespace, pg_cluster, sandbox):
    pg_cluster(instances=2)
    sandbox.pod_fail(namespace, "pg-2", seconds=None)
    names = [
        i["metadata"]["name"]
        for i in custom.list_namespaced_custom_object(MG, MV, namespace, "pods")["items"]
    ]
    assert names == ["pg-1"]
    sandbox.pod_fail_clear(namespace, "pg-2")
    sandbox.run_until_idle()
    listed = custom.list_namespaced_custom_object(MG, MV, namespace, "pods")["items"]
    assert [i["metadata"]["name"] for i in listed] == ["pg-1", "pg-2"]


def test_statefulset_pods_have_metrics(custom, api_client, namespace, sandbox):
    client.AppsV1Api(api_client).create_namespaced_stateful_set(
        namespace,
        cache_statefulset(2, resources={"limits": {"cpu": "250m", "memory": "256Mi"}}),
    )
    sandbox.run_until_idle()
    listed = custom.list_namespaced_custom_object(
        MG, MV, namespace, "pods", label_selector="app=cache"
    )
    assert [i["metadata"]["name"] for i in listed["items"]] == ["cache-0", "cache-1"]
    for item in listed["items"]:
        assert item["containers"][0]["name"] == "valkey"
        assert 0 < usage(item, "cpu") <= Decimal("0.25")
        assert 0 < usage(item, "memory") <= 256 * 1024**2


def test_usage_varies_slowly_and_is_stable_within_a_sample(core_v1, namespace, pg_cluster):
    pg_cluster(instances=1, resources=LIMITS)
    pod = copy.deepcopy(
        core_v1.api_client.sanitize_for_serialization(
            core_v1.read_namespaced_pod("pg-1", namespace)
        )
    )
    start = 1_800_000_000.0
    same = [pod_metrics(pod, start + s) for s in (0, 5, 14)]
    assert same[0]["containers"] == same[1]["containers"] == same[2]["containers"]
    series = [usage(pod_metrics(pod, start + i * SAMPLE_SECONDS), "cpu") for i in range(240)]
    steps = [abs(b - a) / a for a, b in itertools.pairwise(series)]
    assert max(steps) < Decimal("0.1")  # no jumps from one sample to the next
    assert max(series) / min(series) > Decimal("1.2")  # but it does move over an hour


def test_kubectl_top_pod(kubectl, namespace, pg_cluster):
    pg_cluster(instances=2, resources=LIMITS)
    out = kubectl("top", "pod", "-n", namespace).stdout.splitlines()
    assert out[0].split() == ["NAME", "CPU(cores)", "MEMORY(bytes)"]
    rows = {line.split()[0]: line.split()[1:] for line in out[1:]}
    assert sorted(rows) == ["pg-1", "pg-2"]
    assert all(re.match(r"^\d+m$", cpu) and re.match(r"^\d+Mi$", mem) for cpu, mem in rows.values())
    primary = kubectl("top", "pod", "-n", namespace, "-l", "role=primary").stdout.splitlines()
    assert [line.split()[0] for line in primary[1:]] == ["pg-1"]
