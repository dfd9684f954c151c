"""The instant operators benchmarks use, and the store times they measure notice delays from."""

from __future__ import annotations

import time

from kubernetes import client, config

G, V = "postgresql.cnpg.io", "v1"


def _instant(make_sandbox):
    """A sandbox with instant operators, and an API client of it."""
    sandbox = make_sandbox()
    sandbox.use_instant_operators()
    return sandbox, config.new_client_from_config_dict(sandbox.kubeconfig())


def _cluster(name: str, instances: int = 1) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "Cluster", "metadata": {"name": name},
            "spec": {"instances": instances, "storage": {"size": "1Gi"}}}  # fmt: skip


def test_a_cluster_is_healthy_in_the_round_after_it_is_written_and_nothing_else_is_made(
    make_sandbox,
):
    sandbox, api = _instant(make_sandbox)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    before = time.time()
    custom.create_namespaced_custom_object(G, V, "default", "clusters", _cluster("pg", 2))
    sandbox.run_until_idle()

    cluster = custom.get_namespaced_custom_object(G, V, "default", "clusters", "pg")
    assert cluster["status"]["phase"] == "Cluster in healthy state"
    assert cluster["status"]["readyInstances"] == 2
    assert core.list_namespaced_pod("default").items == []
    # The sandbox knows when it stored that status.
    stored = sandbox.stored_at(cluster["metadata"]["resourceVersion"])
    assert stored is not None and before <= stored <= time.time()
    api.close()


def test_a_statefulset_is_rolled_out_at_once(make_sandbox):
    sandbox, api = _instant(make_sandbox)
    apps = client.AppsV1Api(api)
    labels = {"app": "cache"}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "v"}]}}
    body = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "cache"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": pod},
    }
    apps.create_namespaced_stateful_set("default", body)
    sandbox.run_until_idle()

    status = apps.read_namespaced_stateful_set("cache", "default").status
    assert status.ready_replicas == 3
    assert status.current_revision == status.update_revision
    api.close()


def test_a_forgotten_version_has_no_stored_time(make_sandbox):
    sandbox = make_sandbox(operators=False)
    assert sandbox.stored_at(10**9) is None


def test_a_round_reads_only_the_clusters_written_since_the_one_before(make_sandbox):
    sandbox, api = _instant(make_sandbox)
    custom = client.CustomObjectsApi(api)
    for n in range(20):
        custom.create_namespaced_custom_object(G, V, "default", "clusters", _cluster(f"pg{n}"))
    sandbox.run_until_idle()
    operator = sandbox.controllers[0]
    clusters = sandbox.core.resolve(G, V, "clusters")

    sandbox.set_faults(frozen=["instant"])  # its rounds are this test's from here
    with sandbox.core.lock:  # settled: a round now reads none of the twenty
        assert operator._written(clusters) == []
    custom.patch_namespaced_custom_object(
        G, V, "default", "clusters", "pg7", {"spec": {"instances": 3}}
    )
    with sandbox.core.lock:  # one written: a round reads that one
        assert [c["metadata"]["name"] for c in operator._written(clusters)] == ["pg7"]
    api.close()


def test_a_cluster_written_again_gets_the_status_of_its_new_spec(make_sandbox):
    sandbox, api = _instant(make_sandbox)
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(G, V, "default", "clusters", _cluster("pg", 1))
    custom.create_namespaced_custom_object(G, V, "default", "clusters", _cluster("other", 1))
    sandbox.run_until_idle()

    custom.patch_namespaced_custom_object(
        G, V, "default", "clusters", "pg", {"spec": {"instances": 3}}
    )
    # A client overwriting the status is set right in the next round too.
    custom.patch_namespaced_custom_object_status(
        G, V, "default", "clusters", "other", {"status": {"phase": "Setting up primary"}}
    )
    sandbox.run_until_idle()

    scaled = custom.get_namespaced_custom_object(G, V, "default", "clusters", "pg")["status"]
    assert (scaled["instances"], scaled["readyInstances"]) == (3, 3)
    other = custom.get_namespaced_custom_object(G, V, "default", "clusters", "other")["status"]
    assert other["phase"] == "Cluster in healthy state"
    api.close()


def test_a_cluster_whose_status_was_refused_gets_it_once_the_crd_allows_it(make_sandbox):
    # Nothing writes the cluster again after its status was refused: the operator tries again
    # of itself, in the rounds that follow.
    sandbox, api = _instant(make_sandbox)
    custom, ext = client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)
    crd_name = f"clusters.{G}"
    path = ["spec", "versions", 0, "schema", "openAPIV3Schema", "properties", "status",
            "properties", "readyInstances"]  # fmt: skip

    def set_maximum(maximum):
        crd = api.sanitize_for_serialization(ext.read_custom_resource_definition(crd_name))
        node = crd
        for step in path:
            node = node[step]
        if maximum is None:
            node.pop("maximum", None)
        else:
            node["maximum"] = maximum
        ext.replace_custom_resource_definition(crd_name, crd)

    set_maximum(1)  # the operator's status (readyInstances 3) is refused
    custom.create_namespaced_custom_object(G, V, "default", "clusters", _cluster("pg", 3))
    sandbox.run_until_idle()
    status = custom.get_namespaced_custom_object(G, V, "default", "clusters", "pg").get("status")
    assert not status or status.get("readyInstances") != 3

    set_maximum(None)  # allowed again: the next round gives the cluster its status
    sandbox.run_until_idle()
    status = custom.get_namespaced_custom_object(G, V, "default", "clusters", "pg").get("status")
    assert status and status.get("readyInstances") == 3, status
    api.close()
