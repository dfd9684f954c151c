"""ResourceQuota: its status as the quota controller fills it, and quota admission's refusals,
for clients and for the simulated controllers, through the official client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client, watch

from tests.sandbox.conftest import cache_statefulset
from tests.sandbox.conftest import wait_for as until

QUOTA = "opsdeck-quota"


def quota(core_v1: client.CoreV1Api, ns: str, **hard: str) -> None:
    """Create the namespace's quota (names with dots or slashes as `requests_storage`, ...)."""
    hard = {k.replace("__", "/").replace("_", "."): v for k, v in hard.items()}
    core_v1.create_namespaced_resource_quota(
        ns, {"metadata": {"name": QUOTA}, "spec": {"hard": hard}}
    )


def status(core_v1: client.CoreV1Api, ns: str) -> dict[str, Any]:
    """The quota's status as the server answers it (hard and used)."""
    found = core_v1.read_namespaced_resource_quota(QUOTA, ns).status
    return {"hard": found.hard, "used": found.used}


def claim(name: str, size: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def refusal(exc: pytest.ExceptionInfo[client.ApiException]) -> tuple[int, str]:
    body = json.loads(exc.value.body)
    return exc.value.status, body["message"]


def bound(core_v1: client.CoreV1Api, ns: str, name: str) -> Any:
    return until(
        lambda: (
            (c := core_v1.read_namespaced_persistent_volume_claim(name, ns)).status.phase == "Bound"
            and c
        )
    )


def test_status_shows_hard_and_what_the_namespace_uses(core_v1, namespace):
    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-1", "10Gi"))
    quota(core_v1, namespace, requests_storage="25Gi", persistentvolumeclaims="20", secrets="5")

    assert status(core_v1, namespace) == {
        "hard": {"persistentvolumeclaims": "20", "requests.storage": "25Gi", "secrets": "5"},
        "used": {"persistentvolumeclaims": "1", "requests.storage": "10Gi", "secrets": "0"},
    }
    written = core_v1.read_namespaced_resource_quota(QUOTA, namespace)
    managers = {(m.manager, m.subresource) for m in written.metadata.managed_fields}
    assert ("kube-controller-manager", "status") in managers


def test_watchers_see_used_follow_objects_as_they_come_and_go(core_v1, namespace):
    quota(core_v1, namespace, requests_storage="25Gi", persistentvolumeclaims="20")
    rv = core_v1.read_namespaced_resource_quota(QUOTA, namespace).metadata.resource_version

    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-1", "10Gi"))
    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-2", "1536Mi"))
    core_v1.delete_namespaced_persistent_volume_claim("data-1", namespace)

    seen = []
    w = watch.Watch()
    for event in w.stream(
        core_v1.list_namespaced_resource_quota, namespace, resource_version=rv, timeout_seconds=5
    ):
        used = event["object"].status.used
        seen.append((event["type"], used["persistentvolumeclaims"], used["requests.storage"]))
        if len(seen) == 3:
            w.stop()
    assert seen == [
        ("MODIFIED", "1", "10Gi"),
        ("MODIFIED", "2", "11776Mi"),
        ("MODIFIED", "1", "1536Mi"),
    ]


def test_a_claim_beyond_requests_storage_is_refused_403(core_v1, namespace):
    quota(core_v1, namespace, requests_storage="25Gi")
    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-1", "10Gi"))
    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-2", "10Gi"))

    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-3", "10Gi"))

    assert refusal(exc) == (
        403,
        'persistentvolumeclaims "data-3" is forbidden: exceeded quota: opsdeck-quota, '
        "requested: requests.storage=10Gi, used: requests.storage=20Gi, "
        "limited: requests.storage=25Gi",
    )
    assert json.loads(exc.value.body)["reason"] == "Forbidden"
    names = [
        c.metadata.name for c in core_v1.list_namespaced_persistent_volume_claim(namespace).items
    ]
    assert names == ["data-1", "data-2"]
    assert status(core_v1, namespace)["used"] == {"requests.storage": "20Gi"}
    # What still fits is admitted.
    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-3", "5Gi"))
    assert status(core_v1, namespace)["used"] == {"requests.storage": "25Gi"}


def test_growing_a_claim_beyond_the_quota_is_refused_403(core_v1, namespace):
    quota(core_v1, namespace, requests_storage="25Gi")
    core_v1.create_namespaced_persistent_volume_claim(namespace, claim("data-1", "10Gi"))
    bound(core_v1, namespace, "data-1")
    grow = {"spec": {"resources": {"requests": {"storage": "30Gi"}}}}

    with pytest.raises(client.ApiException) as exc:
        core_v1.patch_namespaced_persistent_volume_claim("data-1", namespace, grow)

    assert refusal(exc) == (
        403,
        'persistentvolumeclaims "data-1" is forbidden: exceeded quota: opsdeck-quota, '
        "requested: requests.storage=20Gi, used: requests.storage=10Gi, "
        "limited: requests.storage=25Gi",
    )
    kept = core_v1.read_namespaced_persistent_volume_claim("data-1", namespace)
    assert kept.spec.resources.requests["storage"] == "10Gi"
    grow["spec"]["resources"]["requests"]["storage"] = "25Gi"
    core_v1.patch_namespaced_persistent_volume_claim("data-1", namespace, grow)
    assert status(core_v1, namespace)["used"] == {"requests.storage": "25Gi"}


def test_object_counts_are_enforced_and_a_delete_frees_room(core_v1, namespace):
    quota(core_v1, namespace, services="1", count__configmaps="1")
    service = {"spec": {"ports": [{"port": 80}]}}
    core_v1.create_namespaced_service(namespace, {"metadata": {"name": "a"}, **service})
    core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "a"}})

    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_service(namespace, {"metadata": {"name": "b"}, **service})
    assert refusal(exc) == (
        403,
        'services "b" is forbidden: exceeded quota: opsdeck-quota, requested: services=1, '
        "used: services=1, limited: services=1",
    )
    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "b"}})
    assert refusal(exc)[1].endswith(
        "requested: count/configmaps=1, used: count/configmaps=1, limited: count/configmaps=1"
    )

    core_v1.delete_namespaced_service("a", namespace)
    assert status(core_v1, namespace)["used"] == {"count/configmaps": "1", "services": "0"}
    core_v1.create_namespaced_service(namespace, {"metadata": {"name": "b"}, **service})
    assert status(core_v1, namespace)["used"]["services"] == "1"


def test_a_quota_counting_resourcequotas_refuses_one_too_many(core_v1, namespace):
    """Quotas are objects its admission counts too: a second one where one is allowed was
    taken, and the first then said it used 2 of 1."""
    core_v1.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "first"}, "spec": {"hard": {"resourcequotas": "1"}}}
    )
    assert core_v1.read_namespaced_resource_quota("first", namespace).status.used == {
        "resourcequotas": "1"
    }

    with pytest.raises(client.ApiException) as refused:
        core_v1.create_namespaced_resource_quota(
            namespace, {"metadata": {"name": "second"}, "spec": {"hard": {"pods": "5"}}}
        )

    assert refused.value.status == 403
    assert "exceeded quota: first, requested: resourcequotas=1" in refused.value.body
    # Its own changes are not counted again.
    core_v1.patch_namespaced_resource_quota(
        "first", namespace, {"spec": {"hard": {"resourcequotas": "1", "pods": "3"}}}
    )


def test_a_quota_on_requests_cpu_wants_every_pod_to_state_it(core_v1, namespace):
    quota(core_v1, namespace, requests_cpu="1", limits_memory="1Gi", pods="5")
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}

    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_pod(namespace, pod)
    assert refusal(exc) == (
        403,
        'pods "p" is forbidden: failed quota: opsdeck-quota: must specify '
        "limits.memory,requests.cpu",
    )

    # A limit alone is also the request, as the server defaults it.
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "600m", "memory": "512Mi"}}
    core_v1.create_namespaced_pod(namespace, pod)
    assert status(core_v1, namespace)["used"] == {
        "limits.memory": "512Mi",
        "pods": "1",
        "requests.cpu": "600m",
    }
    pod["metadata"]["name"] = "q"
    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_pod(namespace, pod)
    assert refusal(exc)[1].endswith(
        "requested: requests.cpu=600m, used: requests.cpu=600m, limited: requests.cpu=1"
    )


def test_a_finished_pod_no_longer_counts(core_v1, namespace):
    quota(core_v1, namespace, pods="1", count__pods="5")
    pod = {"metadata": {"name": "job"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    core_v1.create_namespaced_pod(namespace, pod)
    assert status(core_v1, namespace)["used"] == {"count/pods": "1", "pods": "1"}

    core_v1.patch_namespaced_pod_status("job", namespace, {"status": {"phase": "Succeeded"}})

    assert status(core_v1, namespace)["used"] == {"count/pods": "1", "pods": "0"}
    core_v1.create_namespaced_pod(namespace, {**pod, "metadata": {"name": "next"}})


def test_a_quota_not_a_quantity_is_refused(core_v1, namespace):
    with pytest.raises(client.ApiException) as exc:
        quota(core_v1, namespace, pods="lots")
    assert refusal(exc) == (
        400,
        'ResourceQuota in version "v1" cannot be handled as a ResourceQuota: quantities must '
        "match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
    )
    with pytest.raises(client.ApiException) as exc:
        quota(core_v1, namespace, pods="-1")
    assert refusal(exc) == (
        422,
        'ResourceQuota "opsdeck-quota" is invalid: spec.hard[pods]: Invalid value: "-1": '
        "must be greater than or equal to 0",
    )


def test_the_statefulset_controller_is_held_by_the_quota_and_goes_on_once_it_fits(
    api_client, core_v1, namespace, sandbox
):
    apps_v1 = client.AppsV1Api(api_client)
    quota(core_v1, namespace, pods="2")
    apps_v1.create_namespaced_stateful_set(namespace, cache_statefulset(3))
    sandbox.run_until_idle()

    pods = [p.metadata.name for p in core_v1.list_namespaced_pod(namespace).items]
    assert pods == ["cache-0", "cache-1"]
    events = core_v1.list_namespaced_event(namespace).items
    assert {(e.reason, e.message) for e in events if e.type == "Warning"} == {
        (
            "FailedCreate",
            'create Pod cache-2 in StatefulSet cache failed error: pods "cache-2" is forbidden: '
            "exceeded quota: opsdeck-quota, requested: pods=1, used: pods=2, limited: pods=2",
        )
    }
    assert apps_v1.read_namespaced_stateful_set("cache", namespace).status.replicas == 2

    core_v1.patch_namespaced_resource_quota(QUOTA, namespace, {"spec": {"hard": {"pods": "3"}}})

    until(
        lambda: apps_v1.read_namespaced_stateful_set("cache", namespace).status.ready_replicas == 3
    )
    assert status(core_v1, namespace)["used"] == {"pods": "3"}


def test_cnpg_says_it_cannot_create_its_objects_and_goes_on_once_they_fit(
    custom, core_v1, namespace, sandbox
):
    quota(core_v1, namespace, services="2")
    custom.create_namespaced_custom_object(
        "postgresql.cnpg.io",
        "v1",
        namespace,
        "clusters",
        {
            "apiVersion": "postgresql.cnpg.io/v1",
            "kind": "Cluster",
            "metadata": {"name": "pg"},
            "spec": {"instances": 1, "storage": {"size": "1Gi"}},
        },
    )
    sandbox.run_until_idle()

    found = custom.get_namespaced_custom_object(
        "postgresql.cnpg.io", "v1", namespace, "clusters", "pg"
    )
    assert found["status"]["phase"] == "Unable to create required cluster objects"
    assert found["status"]["phaseReason"] == (
        'services "pg-r" is forbidden: exceeded quota: opsdeck-quota, requested: services=1, '
        "used: services=2, limited: services=2"
    )

    core_v1.patch_namespaced_resource_quota(QUOTA, namespace, {"spec": {"hard": {"services": "3"}}})

    until(
        lambda: (
            custom.get_namespaced_custom_object(
                "postgresql.cnpg.io", "v1", namespace, "clusters", "pg"
            )["status"]["phase"]
            == "Cluster in healthy state"
        )
    )
