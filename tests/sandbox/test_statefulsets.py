"""apps/v1 StatefulSets and their simulated controller, through the official client and kubectl."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.dynamic import DynamicClient

from tests.sandbox.conftest import wait_for as until

REVISION = "controller-revision-hash"


def valkey(name: str = "cache", replicas: int = 3, **spec: Any) -> dict[str, Any]:
    """A Valkey StatefulSet as a plan spec would render it."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "valkey",
                            "image": "valkey/valkey:8.1",
                            "ports": [{"containerPort": 6379, "name": "valkey"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ]
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
            **spec,
        },
    }


@pytest.fixture
def apps_v1(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


def ready(apps_v1, ns: str, name: str, replicas: int):
    """The StatefulSet once its rollout is complete with `replicas` ready pods."""

    def check():
        sts = apps_v1.read_namespaced_stateful_set(name, ns)
        st = sts.status
        done = (
            st.observed_generation == sts.metadata.generation
            and (st.ready_replicas or 0) == replicas
            and st.replicas == replicas
            and st.current_revision == st.update_revision
        )
        return sts if done else None

    return until(check)


def pods(core_v1, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in core_v1.list_namespaced_pod(ns).items}


def claims(core_v1, ns: str) -> dict[str, Any]:
    return {c.metadata.name: c for c in core_v1.list_namespaced_persistent_volume_claim(ns).items}


def controller_events(core_v1, ns: str, name: str) -> list[str]:
    listed = core_v1.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e.message for e in listed if e.source.component == "statefulset-controller"]


def pod_events(core_v1, ns: str, rv: str, until_done: Callable[[list], bool]) -> list:
    """(type, pod name, ready) for every pod event after rv, until until_done(seen) holds."""
    seen: list[tuple[str, str, bool]] = []
    w = watch.Watch()
    for event in w.stream(core_v1.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=15):
        pod = event["object"]
        conditions = (pod.status.conditions or []) if pod.status else []
        is_ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        seen.append((event["type"], pod.metadata.name, is_ready))
        if until_done(seen):
            w.stop()
    return seen


def test_pods_start_in_order_each_after_the_previous_is_ready(apps_v1, core_v1, namespace):
    rv = core_v1.list_namespaced_pod(namespace).metadata.resource_version
    created = apps_v1.create_namespaced_stateful_set(namespace, valkey())
    assert created.status.replicas == 0 and created.metadata.generation == 1
    seen = pod_events(core_v1, namespace, rv, lambda s: ("MODIFIED", "cache-2", True) in s)
    added = [name for etype, name, _ in seen if etype == "ADDED"]
    assert added == ["cache-0", "cache-1", "cache-2"]
    for previous, following in (("cache-0", "cache-1"), ("cache-1", "cache-2")):
        ready_at = seen.index(("MODIFIED", previous, True))
        assert ready_at < seen.index(("ADDED", following, False))

    sts = ready(apps_v1, namespace, "cache", 3)
    st = sts.status
    assert (st.replicas, st.ready_replicas, st.available_replicas) == (3, 3, 3)
    assert (st.current_replicas, st.updated_replicas, st.observed_generation) == (3, 3, 1)
    assert st.current_revision == st.update_revision and st.update_revision.startswith("cache-")

    running = pods(core_v1, namespace)
    assert sorted(running) == ["cache-0", "cache-1", "cache-2"]
    pod = running["cache-1"]
    assert pod.status.phase == "Running"
    assert pod.metadata.labels == {
        "app": "cache",
        "statefulset.kubernetes.io/pod-name": "cache-1",
        "apps.kubernetes.io/pod-index": "1",
        REVISION: st.update_revision,
    }
    owner = pod.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "StatefulSet",
        "cache",
        sts.metadata.uid,
        True,
    )
    assert (pod.spec.hostname, pod.spec.subdomain) == ("cache-1", "cache")
    volume = next(v for v in pod.spec.volumes if v.name == "data")
    assert volume.persistent_volume_claim.claim_name == "data-cache-1"

    bound = claims(core_v1, namespace)
    assert sorted(bound) == ["data-cache-0", "data-cache-1", "data-cache-2"]
    for claim in bound.values():
        assert claim.status.phase == "Bound"
        assert claim.status.capacity == {"storage": "1Gi"}
        assert claim.spec.volume_name == f"pvc-{claim.metadata.uid}"
        assert claim.metadata.labels == {"app": "cache"}
    assert controller_events(core_v1, namespace, "cache")[:2] == [
        "create Claim data-cache-0 Pod cache-0 in StatefulSet cache success",
        "create Pod cache-0 in StatefulSet cache successful",
    ]


def test_defaults_match_the_api_server(apps_v1, namespace):
    body = valkey("plain")
    del body["spec"]["replicas"]
    sts = apps_v1.create_namespaced_stateful_set(namespace, body)
    assert sts.spec.replicas == 1
    assert sts.spec.pod_management_policy == "OrderedReady"
    assert sts.spec.update_strategy.type == "RollingUpdate"
    assert sts.spec.update_strategy.rolling_update.partition == 0
    assert sts.spec.revision_history_limit == 10
    retention = sts.spec.persistent_volume_claim_retention_policy
    assert (retention.when_deleted, retention.when_scaled) == ("Retain", "Retain")
    assert sts.spec.template.spec.restart_policy == "Always"
    assert sts.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"
    assert sts.spec.volume_claim_templates[0].spec.volume_mode == "Filesystem"


def test_scale_down_removes_the_highest_ordinal_first_and_keeps_claims(apps_v1, core_v1, namespace):
    apps_v1.create_namespaced_stateful_set(namespace, valkey())
    ready(apps_v1, namespace, "cache", 3)
    scale = apps_v1.read_namespaced_stateful_set_scale("cache", namespace)
    assert (scale.spec.replicas, scale.status.replicas, scale.status.selector) == (
        3,
        3,
        "app=cache",
    )
    rv = core_v1.list_namespaced_pod(namespace).metadata.resource_version
    apps_v1.patch_namespaced_stateful_set_scale("cache", namespace, {"spec": {"replicas": 1}})
    seen = pod_events(core_v1, namespace, rv, lambda s: ("DELETED", "cache-1", True) in s)
    assert [name for etype, name, _ in seen if etype == "DELETED"] == ["cache-2", "cache-1"]
    sts = ready(apps_v1, namespace, "cache", 1)
    assert sts.metadata.generation == 2 and sts.status.observed_generation == 2
    assert sorted(pods(core_v1, namespace)) == ["cache-0"]
    assert sorted(claims(core_v1, namespace)) == ["data-cache-0", "data-cache-1", "data-cache-2"]
    assert controller_events(core_v1, namespace, "cache")[-2:] == [
        "delete Pod cache-2 in StatefulSet cache successful",
        "delete Pod cache-1 in StatefulSet cache successful",
    ]


def test_stop_and_start_reuse_the_same_claims(apps_v1, core_v1, namespace):
    apps_v1.create_namespaced_stateful_set(namespace, valkey())
    ready(apps_v1, namespace, "cache", 3)
    uids = {n: c.metadata.uid for n, c in claims(core_v1, namespace).items()}
    apps_v1.patch_namespaced_stateful_set("cache", namespace, {"spec": {"replicas": 0}})
    sts = ready(apps_v1, namespace, "cache", 0)
    assert sts.status.replicas == 0 and sts.status.ready_replicas is None
    assert pods(core_v1, namespace) == {}
    apps_v1.patch_namespaced_stateful_set("cache", namespace, {"spec": {"replicas": 3}})
    ready(apps_v1, namespace, "cache", 3)
    assert {n: c.metadata.uid for n, c in claims(core_v1, namespace).items()} == uids
    assert sorted(pods(core_v1, namespace)) == ["cache-0", "cache-1", "cache-2"]


def test_template_change_rolls_pods_from_the_highest_ordinal(apps_v1, core_v1, namespace):
    apps_v1.create_namespaced_stateful_set(namespace, valkey())
    before = ready(apps_v1, namespace, "cache", 3).status.current_revision
    rv = core_v1.list_namespaced_pod(namespace).metadata.resource_version
    restarted = {"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}
    patched = apps_v1.patch_namespaced_stateful_set(
        "cache", namespace, {"spec": {"template": {"metadata": {"annotations": restarted}}}}
    )
    assert patched.metadata.generation == 2
    seen = pod_events(core_v1, namespace, rv, lambda s: ("MODIFIED", "cache-0", True) in s)
    assert [name for etype, name, _ in seen if etype == "DELETED"] == [
        "cache-2",
        "cache-1",
        "cache-0",
    ]
    # One pod at a time: each is back and ready before the next goes.
    assert seen.index(("MODIFIED", "cache-2", True)) < seen.index(("DELETED", "cache-1", True))
    sts = ready(apps_v1, namespace, "cache", 3)
    assert sts.status.update_revision != before
    assert sts.status.current_revision == sts.status.update_revision
    assert sts.status.updated_replicas == 3 and sts.status.current_replicas == 3
    for pod in pods(core_v1, namespace).values():
        assert pod.metadata.labels[REVISION] == sts.status.update_revision
        assert pod.metadata.annotations == restarted
    revisions = client.AppsV1Api(apps_v1.api_client).list_namespaced_controller_revision(namespace)
    assert sorted(r.revision for r in revisions.items) == [1, 2]


def test_volume_claim_templates_cannot_change(apps_v1, namespace):
    apps_v1.create_namespaced_stateful_set(namespace, valkey())
    changed = {"spec": {"volumeClaimTemplates": valkey()["spec"]["volumeClaimTemplates"]}}
    changed["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] = "2Gi"
    with pytest.raises(client.ApiException) as caught:
        apps_v1.patch_namespaced_stateful_set("cache", namespace, changed)
    assert caught.value.status == 422
    body = json.loads(caught.value.body)
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'StatefulSet.apps "cache" is invalid: spec: Forbidden: updates to statefulset spec for '
        "fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', "
        "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
    )


def test_selector_is_required_and_must_match_the_template(apps_v1, namespace):
    body = valkey("other")
    body["spec"]["selector"] = {"matchLabels": {"app": "elsewhere"}}
    with pytest.raises(client.ApiException) as caught:
        apps_v1.create_namespaced_stateful_set(namespace, body)
    assert caught.value.status == 422
    assert json.loads(caught.value.body)["message"] == (
        'StatefulSet.apps "other" is invalid: spec.template.metadata.labels: Invalid value: '
        'map[string]string{"app":"other"}: `selector` does not match template `labels`'
    )
    del body["spec"]["selector"]
    with pytest.raises(client.ApiException) as caught:
        apps_v1.create_namespaced_stateful_set(namespace, body)
    assert json.loads(caught.value.body)["message"] == (
        'StatefulSet.apps "other" is invalid: spec.selector: Required value'
    )
    body = valkey("other", replicas=-1)
    with pytest.raises(client.ApiException) as caught:
        apps_v1.create_namespaced_stateful_set(namespace, body)
    assert json.loads(caught.value.body)["message"] == (
        'StatefulSet.apps "other" is invalid: spec.replicas: Invalid value: -1: '
        "must be greater than or equal to 0"
    )


def test_claim_expansion_updates_capacity_and_shrinking_is_refused(apps_v1, core_v1, namespace):
    apps_v1.create_namespaced_stateful_set(namespace, valkey(replicas=1))
    ready(apps_v1, namespace, "cache", 1)
    grow = {"spec": {"resources": {"requests": {"storage": "5Gi"}}}}
    core_v1.patch_namespaced_persistent_volume_claim("data-cache-0", namespace, grow)
    claim = until(
        lambda: (
            (
                c := core_v1.read_namespaced_persistent_volume_claim("data-cache-0", namespace)
            ).status.capacity["storage"]
            == "5Gi"
            and c
        )
    )
    assert claim.status.allocated_resources == {"storage": "5Gi"}
    assert not claim.status.conditions
    reasons = [
        e.reason
        for e in core_v1.list_namespaced_event(
            namespace, field_selector="involvedObject.name=data-cache-0"
        ).items
    ]
    assert reasons[-2:] == ["Resizing", "FileSystemResizeSuccessful"]
    shrink = {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    with pytest.raises(client.ApiException) as caught:
        core_v1.patch_namespaced_persistent_volume_claim("data-cache-0", namespace, shrink)
    assert caught.value.status == 422
    assert json.loads(caught.value.body)["message"] == (
        'PersistentVolumeClaim "data-cache-0" is invalid: spec.resources.requests.storage: '
        "Forbidden: field can not be less than status.capacity"
    )


def test_delete_removes_pods_but_keeps_claims(apps_v1, core_v1, namespace):
    apps_v1.create_namespaced_stateful_set(namespace, valkey())
    ready(apps_v1, namespace, "cache", 3)
    apps_v1.delete_namespaced_stateful_set("cache", namespace)
    until(lambda: not pods(core_v1, namespace))
    assert sorted(claims(core_v1, namespace)) == ["data-cache-0", "data-cache-1", "data-cache-2"]


def test_claims_follow_the_retention_policy(apps_v1, core_v1, namespace):
    policy = {"whenDeleted": "Delete", "whenScaled": "Delete"}
    body = valkey(persistentVolumeClaimRetentionPolicy=policy)
    apps_v1.create_namespaced_stateful_set(namespace, body)
    ready(apps_v1, namespace, "cache", 3)
    apps_v1.patch_namespaced_stateful_set("cache", namespace, {"spec": {"replicas": 2}})
    until(lambda: sorted(claims(core_v1, namespace)) == ["data-cache-0", "data-cache-1"])
    apps_v1.delete_namespaced_stateful_set("cache", namespace)
    until(lambda: not claims(core_v1, namespace) and not pods(core_v1, namespace))


def test_parallel_pod_management_starts_every_pod_at_once(apps_v1, core_v1, namespace):
    rv = core_v1.list_namespaced_pod(namespace).metadata.resource_version
    apps_v1.create_namespaced_stateful_set(namespace, valkey(podManagementPolicy="Parallel"))
    seen = pod_events(core_v1, namespace, rv, lambda s: sum(1 for e in s if e[2]) == 3)
    first_ready = next(i for i, e in enumerate(seen) if e[2])
    assert sorted(name for etype, name, _ in seen[:first_ready] if etype == "ADDED") == [
        "cache-0",
        "cache-1",
        "cache-2",
    ]


def test_watch_sees_the_status_progress(apps_v1, namespace):
    rv = apps_v1.create_namespaced_stateful_set(namespace, valkey()).metadata.resource_version
    progress = []
    w = watch.Watch()
    for event in w.stream(
        apps_v1.list_namespaced_stateful_set, namespace, resource_version=rv, timeout_seconds=15
    ):
        status = event["object"].status
        step = (status.replicas, status.ready_replicas or 0)
        if not progress or progress[-1] != step:
            progress.append(step)
        if step == (3, 3):
            w.stop()
    # A pod turning ready lets the controller create the next in the same sync.
    assert progress == [(1, 0), (2, 1), (3, 2), (3, 3)]


def test_discovery_serves_apps_v1(raw):
    _, _, groups = raw.request("GET", "/apis")
    apps = next(g for g in groups["groups"] if g["name"] == "apps")
    assert apps["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
    _, _, listed = raw.request("GET", "/apis/apps/v1")
    by_name = {r["name"]: r for r in listed["resources"]}
    sts = by_name["statefulsets"]
    assert (sts["kind"], sts["namespaced"], sts["shortNames"]) == ("StatefulSet", True, ["sts"])
    assert set(sts["verbs"]) == {
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    }
    assert by_name["statefulsets/status"]["kind"] == "StatefulSet"
    assert (by_name["statefulsets/scale"]["group"], by_name["statefulsets/scale"]["kind"]) == (
        "autoscaling",
        "Scale",
    )


def test_kubectl_get_scale_restart_and_rollout_status(kubectl, namespace, tmp_path, apps_v1):
    manifest = tmp_path / "cache.json"
    manifest.write_text(json.dumps(valkey()))
    assert (
        "statefulset.apps/cache created"
        in kubectl("apply", "-n", namespace, "-f", str(manifest)).stdout
    )
    status = kubectl("rollout", "status", "-n", namespace, "sts/cache", "--timeout=30s").stdout
    assert status.strip().endswith("partitioned roll out complete: 3 new pods have been updated...")
    lines = kubectl("get", "-n", namespace, "sts").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "AGE"]
    assert lines[1].split()[:2] == ["cache", "3/3"]
    wide = kubectl("get", "-n", namespace, "sts", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]
    assert wide[1].split()[3:] == ["valkey", "valkey/valkey:8.1"]
    resources = kubectl("api-resources", "--api-group=apps").stdout
    assert any(line.split()[:2] == ["statefulsets", "sts"] for line in resources.splitlines())

    before = ready(apps_v1, namespace, "cache", 3).status.update_revision
    assert (
        "statefulset.apps/cache restarted"
        in kubectl("rollout", "restart", "-n", namespace, "sts/cache").stdout
    )
    kubectl("rollout", "status", "-n", namespace, "sts/cache", "--timeout=30s")
    assert ready(apps_v1, namespace, "cache", 3).status.update_revision != before

    assert (
        "statefulset.apps/cache scaled"
        in kubectl("scale", "-n", namespace, "sts/cache", "--replicas=1").stdout
    )
    kubectl("rollout", "status", "-n", namespace, "sts/cache", "--timeout=30s")
    assert ready(apps_v1, namespace, "cache", 1).status.replicas == 1
    history = kubectl("rollout", "history", "-n", namespace, "sts/cache").stdout
    assert history.split()[-2:] == ["2", "<none>"]


def test_server_side_apply_as_opsdeck_drives_it(api_client, apps_v1, core_v1, namespace, tmp_path):
    dynamic = DynamicClient(api_client, cache_file=str(tmp_path / "discovery.json"))
    resource = dynamic.resources.get(api_version="apps/v1", kind="StatefulSet")

    def apply(body):
        return resource.server_side_apply(
            body=body,
            name="cache",
            namespace=namespace,
            field_manager="opsdeck",
            force_conflicts=True,
            query_params=[("fieldValidation", "Strict")],
        )

    body = valkey()
    assert apply(body).metadata.generation == 1
    ready(apps_v1, namespace, "cache", 3)
    # Re-applying the same manifest (ports without a protocol, defaulted ones) changes nothing.
    assert apply(body).metadata.generation == 1
    body["spec"]["replicas"] = 0
    assert apply(body).metadata.generation == 2
    ready(apps_v1, namespace, "cache", 0)
    body["spec"]["replicas"] = 2
    body["spec"]["template"]["spec"]["containers"][0]["image"] = "valkey/valkey:8.2"
    apply(body)
    ready(apps_v1, namespace, "cache", 2)
    images = {
        p.metadata.name: p.spec.containers[0].image for p in pods(core_v1, namespace).values()
    }
    assert images == {"cache-0": "valkey/valkey:8.2", "cache-1": "valkey/valkey:8.2"}
