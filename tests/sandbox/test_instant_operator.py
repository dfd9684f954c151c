"""The instant operators benchmarks use, and the store times they measure notice delays from."""

from __future__ import annotations

import time

from kubernetes import client, config

G, V = "postgresql.cnpg.io", "v1"


def test_a_cluster_is_healthy_in_the_round_after_it_is_written_and_nothing_else_is_made(
    make_sandbox,
):
    sandbox = make_sandbox()
    sandbox.use_instant_operators()
    api = config.new_client_from_config_dict(sandbox.kubeconfig())
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    before = time.time()
    body = {"apiVersion": f"{G}/{V}", "kind": "Cluster", "metadata": {"name": "pg"},
            "spec": {"instances": 2, "storage": {"size": "1Gi"}}}  # fmt: skip
    custom.create_namespaced_custom_object(G, V, "default", "clusters", body)
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
    sandbox = make_sandbox()
    sandbox.use_instant_operators()
    api = config.new_client_from_config_dict(sandbox.kubeconfig())
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
