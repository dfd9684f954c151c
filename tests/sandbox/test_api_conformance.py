"""API server conformance through the official `kubernetes` client, rule by rule."""

from __future__ import annotations

import http.client
import json

import pytest
from kubernetes import client, watch
from kubernetes.dynamic import DynamicClient

from tests.sandbox.conftest import Raw

G, V = "postgresql.cnpg.io", "v1"
CLUSTER = {"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster"}


@pytest.fixture(autouse=True)
def _operator_frozen(sandbox):
    """These tests use Clusters as plain custom resources: keep the simulated operator away."""
    sandbox.set_faults(frozen=["cnpg"])
    sandbox.run_until_idle()
    yield
    sandbox.set_faults(frozen=[])


def cluster_body(name: str, instances: int = 1, **spec: object) -> dict:
    return {
        **CLUSTER,
        "metadata": {"name": name},
        "spec": {"instances": instances, "storage": {"size": "1Gi"}, **spec},
    }


def err(exc: client.ApiException) -> dict:
    return json.loads(exc.body)


# ---- discovery ------------------------------------------------------------------------------


def test_discovery_lists_core_groups_and_cnpg(raw):
    status, _, version = raw.request("GET", "/version")
    assert status == 200 and version["major"] == "1" and version["gitVersion"].startswith("v1.")
    status, _, apis = raw.request("GET", "/api")
    assert (status, apis["kind"], apis["versions"]) == (200, "APIVersions", ["v1"])
    _, _, groups = raw.request("GET", "/apis")
    names = [g["name"] for g in groups["groups"]]
    assert {"postgresql.cnpg.io", "rbac.authorization.k8s.io", "apiextensions.k8s.io"} <= set(names)
    _, _, resources = raw.request("GET", "/apis/postgresql.cnpg.io/v1")
    by_name = {r["name"]: r for r in resources["resources"]}
    assert by_name["clusters"]["kind"] == "Cluster"
    assert by_name["clusters"]["namespaced"] is True
    assert by_name["clusters"]["singularName"] == "cluster"
    assert "clusters/status" in by_name and "clusters/scale" in by_name
    assert set(by_name["backups"]["verbs"]) >= {"create", "get", "list", "watch", "patch", "delete"}
    _, _, core = raw.request("GET", "/api/v1")
    core_names = {r["name"] for r in core["resources"]}
    assert {"namespaces", "secrets", "configmaps", "services", "pods", "events"} <= core_names


def test_openapi_v2_is_absent_and_v3_lists_group_versions(raw):
    status, _, body = raw.request("GET", "/openapi/v2")
    assert (status, body["reason"]) == (404, "NotFound")
    status, _, root = raw.request("GET", "/openapi/v3")
    assert status == 200 and "apis/postgresql.cnpg.io/v1" in root["paths"]
    url = root["paths"]["apis/postgresql.cnpg.io/v1"]["serverRelativeURL"]
    status, _, doc = raw.request("GET", url)
    patch = doc["paths"]["/apis/postgresql.cnpg.io/v1/namespaces/{namespace}/clusters/{name}"][
        "patch"
    ]
    assert patch["x-kubernetes-group-version-kind"] == {"group": G, "version": V, "kind": "Cluster"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]


def test_unknown_paths_answer_404_status(raw):
    status, _, body = raw.request("GET", "/apis/nope.example.com/v1/widgets")
    assert status == 404
    assert body["reason"] == "NotFound"
    assert body["message"] == "the server could not find the requested resource"


def test_dynamic_client_discovers_custom_resources(api_client, tmp_path, namespace):
    dyn = DynamicClient(api_client, cache_file=str(tmp_path / "discovery.json"))
    clusters = dyn.resources.get(api_version="postgresql.cnpg.io/v1", kind="Cluster")
    created = clusters.create(body=cluster_body("dyn"), namespace=namespace)
    assert created.metadata.generation == 1
    patched = clusters.patch(
        name="dyn",
        namespace=namespace,
        body={"metadata": {"labels": {"tier": "gold"}}},
        content_type="application/merge-patch+json",
    )
    assert patched.metadata.labels["tier"] == "gold"
    assert [i.metadata.name for i in clusters.get(namespace=namespace).items] == ["dyn"]


# ---- create / get / errors ------------------------------------------------------------------


def test_secret_string_data_becomes_base64_data(core_v1, namespace):
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"pw": "hunter2"},
    }
    created = core_v1.create_namespaced_secret(namespace, body)
    assert created.data == {"pw": "aHVudGVyMg=="}
    assert created.string_data is None
    assert created.type == "Opaque"
    assert created.metadata.uid and created.metadata.creation_timestamp


def test_get_missing_custom_resource_is_404_with_exact_status(custom, namespace):
    with pytest.raises(client.ApiException) as exc:
        custom.get_namespaced_custom_object(G, V, namespace, "clusters", "ghost")
    assert exc.value.status == 404
    assert err(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'clusters.postgresql.cnpg.io "ghost" not found',
        "reason": "NotFound",
        "details": {"name": "ghost", "group": "postgresql.cnpg.io", "kind": "clusters"},
        "code": 404,
    }


def test_create_twice_is_409_already_exists(core_v1, namespace):
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}}
    core_v1.create_namespaced_config_map(namespace, body)
    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_config_map(namespace, body)
    assert exc.value.status == 409
    status = err(exc.value)
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'configmaps "cm" already exists'
    assert status["details"] == {"name": "cm", "kind": "configmaps"}


def test_create_in_missing_namespace_is_404(core_v1):
    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_config_map(
            "no-such-ns", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
        )
    assert exc.value.status == 404
    assert err(exc.value)["message"] == 'namespaces "no-such-ns" not found'


def test_invalid_name_is_422_with_cause(core_v1, namespace):
    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_config_map(
            namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}}
        )
    assert exc.value.status == 422
    status = err(exc.value)
    assert status["reason"] == "Invalid"
    assert status["message"].startswith(
        'ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
        "a lowercase RFC 1123 subdomain"
    )
    assert status["details"]["causes"][0]["field"] == "metadata.name"
    assert status["details"]["causes"][0]["reason"] == "FieldValueInvalid"


def test_generate_name_appends_five_characters(core_v1, namespace):
    created = core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "job-"}}
    )
    assert created.metadata.name.startswith("job-") and len(created.metadata.name) == 9


# ---- versions and generations ---------------------------------------------------------------


def test_resource_versions_come_from_one_counter_and_lists_carry_snapshot(
    core_v1, custom, namespace
):
    a = core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}
    )
    b = custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("b"))
    assert int(b["metadata"]["resourceVersion"]) > int(a.metadata.resource_version)
    listed = core_v1.list_namespaced_config_map(namespace)
    assert int(listed.metadata.resource_version) >= int(b["metadata"]["resourceVersion"])


def test_list_items_of_a_built_in_kind_leave_out_their_kind_and_custom_resources_keep_it(
    raw, core_v1, custom, namespace
):
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}
    )
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("b"))

    _, _, configs = raw.request("GET", f"/api/v1/namespaces/{namespace}/configmaps")
    _, _, clusters = raw.request("GET", f"/apis/{G}/{V}/namespaces/{namespace}/clusters")

    # As the API server encodes them: the list's kind names a built-in kind's items.
    assert configs["kind"] == "ConfigMapList"
    assert [sorted(set(item) & {"apiVersion", "kind"}) for item in configs["items"]] == [[]]
    assert [(item["apiVersion"], item["kind"]) for item in clusters["items"]] == [
        (f"{G}/{V}", "Cluster")
    ]


def test_stale_put_is_409_conflict(custom, namespace):
    first = custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("c"))
    first["spec"]["instances"] = 2
    custom.replace_namespaced_custom_object(G, V, namespace, "clusters", "c", first)
    first["spec"]["instances"] = 3
    with pytest.raises(client.ApiException) as exc:
        custom.replace_namespaced_custom_object(G, V, namespace, "clusters", "c", first)
    assert exc.value.status == 409
    status = err(exc.value)
    assert status["reason"] == "Conflict"
    assert status["message"] == (
        'Operation cannot be fulfilled on clusters.postgresql.cnpg.io "c": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )


def test_put_custom_resource_without_resource_version_is_422(custom, namespace):
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("c"))
    with pytest.raises(client.ApiException) as exc:
        custom.replace_namespaced_custom_object(
            G, V, namespace, "clusters", "c", cluster_body("c", 2)
        )
    assert exc.value.status == 422
    status = err(exc.value)
    assert status["message"] == (
        'Cluster.postgresql.cnpg.io "c" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
        "must be specified for an update"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0x0: must be specified for an update",
            "field": "metadata.resourceVersion",
        }
    ]


def test_put_core_object_without_resource_version_is_allowed(core_v1, namespace):
    core_v1.create_namespaced_secret(
        namespace,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"a": "1"}},
    )
    replaced = core_v1.replace_namespaced_secret(
        "s",
        namespace,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"a": "2"}},
    )
    assert replaced.data == {"a": "Mg=="}


def test_put_missing_custom_resource_is_404(custom, namespace):
    body = cluster_body("ghost")
    body["metadata"]["resourceVersion"] = "1"
    with pytest.raises(client.ApiException) as exc:
        custom.replace_namespaced_custom_object(G, V, namespace, "clusters", "ghost", body)
    assert exc.value.status == 404


def test_generation_bumps_on_spec_changes_only(custom, namespace):
    created = custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("g"))
    assert created["metadata"]["generation"] == 1
    labelled = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "g", {"metadata": {"labels": {"a": "b"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    scaled = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "g", {"spec": {"instances": 2}}
    )
    assert scaled["metadata"]["generation"] == 2
    status = custom.patch_namespaced_custom_object_status(
        G, V, namespace, "clusters", "g", {"status": {"phase": "x"}}
    )
    assert status["metadata"]["generation"] == 2


def test_status_subresource_isolation(custom, namespace):
    body = cluster_body("s")
    body["status"] = {"phase": "ignored on create"}
    created = custom.create_namespaced_custom_object(G, V, namespace, "clusters", body)
    assert "status" not in created
    # Writes to the main resource ignore .status.
    main = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "s", {"status": {"phase": "nope"}, "spec": {"instances": 2}}
    )
    assert main.get("status") is None and main["spec"]["instances"] == 2
    # Writes to /status change only .status.
    status = custom.patch_namespaced_custom_object_status(
        G,
        V,
        namespace,
        "clusters",
        "s",
        {"status": {"phase": "Cluster in healthy state"}, "spec": {"instances": 5}},
    )
    assert status["status"]["phase"] == "Cluster in healthy state"
    assert status["spec"]["instances"] == 2


def test_status_patch_with_stale_resource_version_is_409(custom, namespace):
    created = custom.create_namespaced_custom_object(
        G, V, namespace, "clusters", cluster_body("lock")
    )
    rv = created["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object_status(
        G,
        V,
        namespace,
        "clusters",
        "lock",
        {"status": {"phase": "a"}, "metadata": {"resourceVersion": rv}},
    )
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object_status(
            G,
            V,
            namespace,
            "clusters",
            "lock",
            {"status": {"targetPrimary": "lock-2"}, "metadata": {"resourceVersion": rv}},
        )
    assert exc.value.status == 409
    assert err(exc.value)["reason"] == "Conflict"


def test_scale_subresource_reads_and_writes_instances(custom, namespace):
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("sc", 1))
    scale = custom.get_namespaced_custom_object_scale(G, V, namespace, "clusters", "sc")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1
    custom.patch_namespaced_custom_object_scale(
        G, V, namespace, "clusters", "sc", {"spec": {"replicas": 3}}
    )
    assert (
        custom.get_namespaced_custom_object(G, V, namespace, "clusters", "sc")["spec"]["instances"]
        == 3
    )


# ---- selectors and paging -------------------------------------------------------------------


def _labelled(core_v1, namespace):
    for name, labels in [
        ("a", {"app": "db", "tier": "gold"}),
        ("b", {"app": "db", "tier": "silver"}),
        ("c", {"app": "web"}),
        ("d", {}),
    ]:
        core_v1.create_namespaced_config_map(
            namespace,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}},
        )


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=db", ["a", "b"]),
        ("app==web", ["c"]),
        ("app!=db", ["c", "d"]),
        ("tier in (gold,bronze)", ["a"]),
        ("tier notin (gold)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app=db,tier!=gold", ["b"]),
    ],
)
def test_label_selectors(core_v1, namespace, selector, expected):
    _labelled(core_v1, namespace)
    found = core_v1.list_namespaced_config_map(namespace, label_selector=selector)
    assert [i.metadata.name for i in found.items] == expected


def test_field_selectors_on_custom_resources(custom, namespace):
    for name in ("x", "y"):
        custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body(name))
    found = custom.list_namespaced_custom_object(
        G, V, namespace, "clusters", field_selector="metadata.name=y"
    )
    assert [i["metadata"]["name"] for i in found["items"]] == ["y"]
    everywhere = custom.list_cluster_custom_object(
        G, V, "clusters", field_selector=f"metadata.namespace={namespace}"
    )
    assert {i["metadata"]["name"] for i in everywhere["items"]} == {"x", "y"}
    with pytest.raises(client.ApiException) as exc:
        custom.list_namespaced_custom_object(
            G, V, namespace, "clusters", field_selector="spec.instances=1"
        )
    assert exc.value.status == 400


def test_limit_and_continue_page_through_one_snapshot(core_v1, namespace):
    for i in range(5):
        core_v1.create_namespaced_config_map(
            namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}"}}
        )
    first = core_v1.list_namespaced_config_map(namespace, limit=2)
    assert [i.metadata.name for i in first.items] == ["cm0", "cm1"]
    assert first.metadata.remaining_item_count == 3
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm9"}}
    )
    core_v1.delete_namespaced_config_map("cm3", namespace)
    names = []
    token = first.metadata._continue
    while token:
        page = core_v1.list_namespaced_config_map(namespace, limit=2, _continue=token)
        names += [i.metadata.name for i in page.items]
        assert page.metadata.resource_version == first.metadata.resource_version
        token = page.metadata._continue
    assert names == ["cm2", "cm3", "cm4"]


def test_expired_continue_token_is_410(core_v1, namespace, sandbox):
    for i in range(3):
        core_v1.create_namespaced_config_map(
            namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}"}}
        )
    first = core_v1.list_namespaced_config_map(namespace, limit=1)
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}
    )
    sandbox.compact()
    with pytest.raises(client.ApiException) as exc:
        core_v1.list_namespaced_config_map(namespace, limit=1, _continue=first.metadata._continue)
    assert exc.value.status == 410
    assert err(exc.value)["reason"] == "Expired"
    # With a token that goes on from the same place, in the state as it is now (kube-apiserver's
    # "inconsistent list"): the later ConfigMap is in it.
    rest = core_v1.list_namespaced_config_map(
        namespace, _continue=err(exc.value)["metadata"]["continue"]
    )
    assert [c.metadata.name for c in rest.items] == ["cm1", "cm2", "late"]


# ---- patches --------------------------------------------------------------------------------


def test_merge_patch_on_custom_resource_removes_null_fields(custom, namespace):
    custom.create_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        {**cluster_body("m"), "metadata": {"name": "m", "labels": {"a": "1", "b": "2"}}},
    )
    patched = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "m", {"metadata": {"labels": {"a": None, "c": "3"}}}
    )
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}


def test_json_patch_on_core_and_custom_resources(core_v1, custom, namespace):
    core_v1.create_namespaced_config_map(
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "j"}, "data": {"a": "1"}},
    )
    patched = core_v1.patch_namespaced_config_map(
        "j",
        namespace,
        [{"op": "add", "path": "/data/b", "value": "2"}, {"op": "remove", "path": "/data/a"}],
    )
    assert patched.data == {"b": "2"}
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("j"))
    out = custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "j",
        [{"op": "replace", "path": "/spec/instances", "value": 3}],
        _content_type="application/json-patch+json",
    )
    assert out["spec"]["instances"] == 3
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(
            G,
            V,
            namespace,
            "clusters",
            "j",
            [{"op": "test", "path": "/spec/instances", "value": 9}],
            _content_type="application/json-patch+json",
        )
    assert exc.value.status == 422


def test_strategic_merge_merges_containers_by_name(core_v1, namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]},
    }
    core_v1.create_namespaced_pod(namespace, pod)
    patched = core_v1.patch_namespaced_pod(
        "p", namespace, {"spec": {"containers": [{"name": "b", "image": "b:2"}]}}
    )
    assert [(c.name, c.image) for c in patched.spec.containers] == [("a", "a:1"), ("b", "b:2")]


def test_strategic_merge_on_custom_resource_is_415(custom, namespace):
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("smp"))
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(
            G,
            V,
            namespace,
            "clusters",
            "smp",
            {"spec": {"instances": 2}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert exc.value.status == 415
    status = err(exc.value)
    assert status["reason"] == "UnsupportedMediaType"
    assert status["message"] == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )


APPLY = "application/apply-patch+yaml"


def test_server_side_apply_creates_then_detects_conflicts(custom, namespace):
    body = cluster_body("ssa", 1)
    # Like kube-apiserver, an apply that creates answers 201, which the client maps to None.
    answer = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "ssa", body, field_manager="opsdeck", _content_type=APPLY
    )
    assert answer is None
    created = custom.get_namespaced_custom_object(G, V, namespace, "clusters", "ssa")
    assert created["spec"]["instances"] == 1
    managers = {(m["manager"], m["operation"]) for m in created["metadata"]["managedFields"]}
    assert managers == {("opsdeck", "Apply")}
    # Same manager, same config: no change, no new resourceVersion.
    again = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "ssa", body, field_manager="opsdeck", _content_type=APPLY
    )
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # Another manager changing an owned field conflicts.
    other = cluster_body("ssa", 3)
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(
            G, V, namespace, "clusters", "ssa", other, field_manager="intruder", _content_type=APPLY
        )
    assert exc.value.status == 409
    status = err(exc.value)
    assert status["reason"] == "Conflict"
    assert (
        status["message"]
        == 'Apply failed with 1 conflict: conflict with "opsdeck": .spec.instances'
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "opsdeck"',
            "field": ".spec.instances",
        }
    ]
    forced = custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "ssa",
        other,
        field_manager="intruder",
        force=True,
        _content_type=APPLY,
    )
    assert forced["spec"]["instances"] == 3


def test_server_side_apply_removes_fields_dropped_from_config(custom, namespace):
    with_labels = {
        **cluster_body("drop"),
        "metadata": {"name": "drop", "labels": {"keep": "1", "gone": "1"}},
    }
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "drop",
        with_labels,
        field_manager="opsdeck",
        _content_type=APPLY,
    )
    fewer = {**cluster_body("drop"), "metadata": {"name": "drop", "labels": {"keep": "1"}}}
    out = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "drop", fewer, field_manager="opsdeck", _content_type=APPLY
    )
    assert out["metadata"]["labels"] == {"keep": "1"}


def test_apply_without_field_manager_is_422(custom, namespace):
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(
            G, V, namespace, "clusters", "nofm", cluster_body("nofm"), _content_type=APPLY
        )
    assert exc.value.status == 422
    assert (
        err(exc.value)["message"]
        == 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch"
    )


def test_apply_conflict_with_an_update_manager_names_its_version(custom, namespace):
    custom.create_namespaced_custom_object(
        G, V, namespace, "clusters", cluster_body("upd"), field_manager="kubectl-edit"
    )
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(
            G,
            V,
            namespace,
            "clusters",
            "upd",
            cluster_body("upd", 4),
            field_manager="opsdeck",
            _content_type=APPLY,
        )
    assert exc.value.status == 409
    assert err(exc.value)["message"].startswith(
        'Apply failed with 1 conflict: conflict with "kubectl-edit" using postgresql.cnpg.io/v1 at '
    )


# ---- watch ----------------------------------------------------------------------------------


def test_watch_without_version_replays_current_objects_then_streams(core_v1, namespace):
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w1"}}
    )
    w = watch.Watch()
    seen = []
    for event in w.stream(core_v1.list_namespaced_config_map, namespace, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 1:
            core_v1.create_namespaced_config_map(
                namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w2"}}
            )
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "w1"), ("ADDED", "w2")]


def test_watch_from_version_sees_only_later_changes(core_v1, namespace):
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old"}}
    )
    rv = core_v1.list_namespaced_config_map(namespace).metadata.resource_version
    core_v1.patch_namespaced_config_map("old", namespace, {"data": {"x": "1"}})
    core_v1.delete_namespaced_config_map("old", namespace)
    w = watch.Watch()
    seen = []
    for event in w.stream(
        core_v1.list_namespaced_config_map, namespace, resource_version=rv, timeout_seconds=2
    ):
        seen.append(event["type"])
        if len(seen) == 2:
            w.stop()
    assert seen == ["MODIFIED", "DELETED"]


def test_watch_with_too_old_version_gets_410_error_event(raw, core_v1, namespace, sandbox):
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    )
    sandbox.compact()
    status, _, body = raw.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/configmaps?watch=true&resourceVersion=1&timeoutSeconds=1",
    )
    assert status == 200
    event = json.loads(body.splitlines()[0]) if isinstance(body, str) else body
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"
    assert event["object"]["message"].startswith("too old resource version: 1 (")


def test_compaction_through_the_control_api_expires_only_older_versions(raw, namespace):
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    _, _, before = raw.request("GET", configmaps)
    raw.request(
        "POST", configmaps, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    )

    status, _, compacted = raw.request("POST", "/sandbox/v1/compact")

    assert status == 200
    assert int(compacted["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    old = before["metadata"]["resourceVersion"]
    _, _, body = raw.request("GET", f"{configmaps}?watch=1&resourceVersion={old}&timeoutSeconds=1")
    assert body["type"] == "ERROR" and body["object"]["code"] == 410  # the stream's one event
    since = compacted["resourceVersion"]
    _, _, body = raw.request(
        "GET", f"{configmaps}?watch=1&resourceVersion={since}&timeoutSeconds=1"
    )
    assert body == ""  # nothing lost after the compacted version: no error, no event


def test_an_open_watch_that_has_read_everything_outlives_a_compaction(make_sandbox):
    sb = make_sandbox(operators=False)
    configmaps = "/api/v1/namespaces/default/configmaps"
    conn = http.client.HTTPConnection(sb.host, sb.port, timeout=5)
    try:
        conn.request(
            "GET", f"{configmaps}?watch=1&resourceVersion={sb.core.store.rv}&timeoutSeconds=5"
        )
        stream = conn.getresponse()
        sb.compact()
        Raw(sb.url).request(
            "POST",
            configmaps,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}},
        )

        event = json.loads(stream.readline())
    finally:
        conn.close()
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "after")


def test_a_watch_answers_at_once_before_any_event(sandbox, namespace):
    """A client may wait for the response before it makes the change it watches for (the
    watch fan-out benchmark does): the headers must not wait for the first event."""
    conn = http.client.HTTPConnection(sandbox.host, sandbox.port, timeout=2)
    try:
        conn.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/configmaps?watch=1"
            f"&resourceVersion={sandbox.core.store.rv}&timeoutSeconds=10",
        )
        stream = conn.getresponse()  # times out if the server holds the headers back
        Raw(sandbox.url).request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "awaited"}},
        )
        event = json.loads(stream.readline())
    finally:
        conn.close()
    assert stream.status == 200
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "awaited")


def test_watch_client_raises_after_repeated_410(core_v1, namespace, sandbox):
    sandbox.compact()
    w = watch.Watch()
    with pytest.raises(client.ApiException) as exc:
        for _ in w.stream(
            core_v1.list_namespaced_config_map, namespace, resource_version="1", timeout_seconds=2
        ):
            pass
    assert exc.value.status == 410


def test_watch_bookmarks_only_when_allowed(raw, namespace, sandbox):
    sandbox.core.bookmark_seconds = 0.2
    try:
        _, _, with_bm = raw.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/configmaps?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion={sandbox.core.store.rv}",
        )
        _, _, without = raw.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/configmaps?watch=1&timeoutSeconds=1&resourceVersion={sandbox.core.store.rv}",
        )
    finally:
        sandbox.core.bookmark_seconds = 5.0
    events = [json.loads(line) for line in with_bm.splitlines()]
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert (
        events[0]["object"]["kind"] == "ConfigMap"
        and events[0]["object"]["metadata"]["resourceVersion"]
    )
    assert without == ""


def test_watch_selector_transitions_produce_added_and_deleted(core_v1, namespace):
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t"}}
    )
    rv = core_v1.list_namespaced_config_map(namespace).metadata.resource_version
    core_v1.patch_namespaced_config_map("t", namespace, {"metadata": {"labels": {"pick": "me"}}})
    core_v1.patch_namespaced_config_map("t", namespace, {"data": {"a": "b"}})
    core_v1.patch_namespaced_config_map("t", namespace, {"metadata": {"labels": {"pick": None}}})
    w = watch.Watch()
    seen = [
        e["type"]
        for e in w.stream(
            core_v1.list_namespaced_config_map,
            namespace,
            label_selector="pick=me",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert seen == ["ADDED", "MODIFIED", "DELETED"]


# ---- deletion -------------------------------------------------------------------------------


def test_finalizers_hold_deletion_until_removed(custom, namespace):
    body = cluster_body("fin")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", body)
    held = custom.delete_namespaced_custom_object(G, V, namespace, "clusters", "fin")
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["generation"] == 2
    current = custom.get_namespaced_custom_object(G, V, namespace, "clusters", "fin")
    assert current["metadata"]["deletionTimestamp"]
    custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "fin", {"metadata": {"finalizers": None}}
    )
    with pytest.raises(client.ApiException) as exc:
        custom.get_namespaced_custom_object(G, V, namespace, "clusters", "fin")
    assert exc.value.status == 404


def test_delete_answers_status_success_for_custom_resources(custom, namespace):
    created = custom.create_namespaced_custom_object(
        G, V, namespace, "clusters", cluster_body("del")
    )
    out = custom.delete_namespaced_custom_object(G, V, namespace, "clusters", "del")
    assert out["status"] == "Success"
    assert out["details"] == {
        "name": "del",
        "group": G,
        "kind": "clusters",
        "uid": created["metadata"]["uid"],
    }


def _owned_configmap(core_v1, namespace, owner, name, block=False, finalizers=None):
    ref = {
        "apiVersion": "v1",
        "kind": "Secret",
        "name": owner.metadata.name,
        "uid": owner.metadata.uid,
    }
    if block:
        ref["blockOwnerDeletion"] = True
    meta = {"name": name, "ownerReferences": [ref]}
    if finalizers:
        meta["finalizers"] = finalizers
    core_v1.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    )


def _wait_gone(fn, *args, sandbox=None):
    sandbox.run_until_idle()
    try:
        fn(*args)
    except client.ApiException as exc:
        return exc.status == 404
    return False


def test_background_garbage_collection(core_v1, namespace, sandbox):
    owner = core_v1.create_namespaced_secret(
        namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "owner"}}
    )
    _owned_configmap(core_v1, namespace, owner, "dep")
    core_v1.delete_namespaced_secret("owner", namespace)
    assert _wait_gone(core_v1.read_namespaced_config_map, "dep", namespace, sandbox=sandbox)


def test_foreground_deletion_waits_for_blocking_dependents(core_v1, namespace, sandbox):
    owner = core_v1.create_namespaced_secret(
        namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "owner"}}
    )
    _owned_configmap(core_v1, namespace, owner, "dep", block=True, finalizers=["example.com/hold"])
    core_v1.delete_namespaced_secret("owner", namespace, propagation_policy="Foreground")
    sandbox.run_until_idle()
    current = core_v1.read_namespaced_secret("owner", namespace)
    assert current.metadata.finalizers == ["foregroundDeletion"]
    assert current.metadata.deletion_timestamp is not None
    dep = core_v1.read_namespaced_config_map("dep", namespace)
    assert dep.metadata.deletion_timestamp is not None
    core_v1.patch_namespaced_config_map(
        "dep",
        namespace,
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/hold"]}},
    )
    assert _wait_gone(core_v1.read_namespaced_config_map, "dep", namespace, sandbox=sandbox)
    assert _wait_gone(core_v1.read_namespaced_secret, "owner", namespace, sandbox=sandbox)


def test_orphan_deletion_strips_owner_references(core_v1, namespace, sandbox):
    owner = core_v1.create_namespaced_secret(
        namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "owner"}}
    )
    _owned_configmap(core_v1, namespace, owner, "dep")
    core_v1.delete_namespaced_secret("owner", namespace, propagation_policy="Orphan")
    sandbox.run_until_idle()
    kept = core_v1.read_namespaced_config_map("dep", namespace)
    assert kept.metadata.owner_references is None


def test_namespace_termination(core_v1, custom, sandbox):
    core_v1.create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}}
    )
    body = cluster_body("held")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    custom.create_namespaced_custom_object(G, V, "doomed", "clusters", body)
    core_v1.create_namespaced_config_map(
        "doomed", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
    )
    core_v1.delete_namespace("doomed")
    sandbox.run_until_idle()
    assert core_v1.read_namespace("doomed").status.phase == "Terminating"
    with pytest.raises(client.ApiException) as exc:
        core_v1.create_namespaced_config_map(
            "doomed", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}
        )
    assert exc.value.status == 403
    status = err(exc.value)
    assert status["reason"] == "Forbidden"
    assert (
        status["message"]
        == 'configmaps "late" is forbidden: unable to create new content in namespace doomed '
        "because it is being terminated"
    )
    # Deleted again while its content goes: 409, as the namespace registry answers.
    with pytest.raises(client.ApiException) as again:
        core_v1.delete_namespace("doomed")
    assert again.value.status == 409 and err(again.value)["reason"] == "Conflict"
    assert "ensuring all content is removed from this namespace" in err(again.value)["message"]
    assert core_v1.list_namespaced_config_map("doomed").items == []
    custom.patch_namespaced_custom_object(
        G, V, "doomed", "clusters", "held", {"metadata": {"finalizers": None}}
    )
    assert _wait_gone(core_v1.read_namespace, "doomed", sandbox=sandbox)


# ---- table output ---------------------------------------------------------------------------


def test_table_output_uses_printer_columns(raw, custom, namespace):
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("tbl"))
    custom.patch_namespaced_custom_object_status(
        G,
        V,
        namespace,
        "clusters",
        "tbl",
        {
            "status": {
                "instances": 1,
                "readyInstances": 1,
                "phase": "Cluster in healthy state",
                "currentPrimary": "tbl-1",
            }
        },
    )
    status, _, table = raw.request(
        "GET",
        f"/apis/{G}/{V}/namespaces/{namespace}/clusters",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    )
    assert status == 200
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Age", "Instances", "Ready", "Status", "Primary", "SyncTopology"]
    cells = table["rows"][0]["cells"]
    assert cells[0] == "tbl" and cells[2:6] == [1, 1, "Cluster in healthy state", "tbl-1"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_watch_as_table_sends_one_row_tables(raw, custom, namespace):
    custom.create_namespaced_custom_object(G, V, namespace, "clusters", cluster_body("wt"))
    status, _, body = raw.request(
        "GET",
        f"/apis/{G}/{V}/namespaces/{namespace}/clusters?watch=1&timeoutSeconds=1",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    )
    assert status == 200
    event = json.loads(body.splitlines()[0]) if isinstance(body, str) else body
    assert (event["type"], event["object"]["kind"]) == ("ADDED", "Table")
    assert event["object"]["rows"][0]["cells"][0] == "wt"


def test_replace_status_subresource_changes_only_status(custom, namespace):
    created = custom.create_namespaced_custom_object(
        G, V, namespace, "clusters", cluster_body("ps")
    )
    created["status"] = {"phase": "Setting up primary"}
    created["spec"]["instances"] = 9
    out = custom.replace_namespaced_custom_object_status(G, V, namespace, "clusters", "ps", created)
    assert out["status"] == {"phase": "Setting up primary"}
    assert out["spec"]["instances"] == 1


def test_delete_collection_by_label(core_v1, namespace):
    _labelled(core_v1, namespace)
    core_v1.delete_collection_namespaced_config_map(namespace, label_selector="app=db")
    left = [i.metadata.name for i in core_v1.list_namespaced_config_map(namespace).items]
    assert left == ["c", "d"]


def test_server_side_apply_merges_list_map_items_by_key(custom, namespace):
    def config(ref_name):
        body = cluster_body("lm")
        body["spec"]["podSelectorRefs"] = [
            {"name": ref_name, "selector": {"matchLabels": {"app": ref_name}}}
        ]
        return body

    for manager, ref in (("one", "a"), ("two", "b")):
        custom.patch_namespaced_custom_object(
            G,
            V,
            namespace,
            "clusters",
            "lm",
            config(ref),
            field_manager=manager,
            _content_type=APPLY,
        )
    got = custom.get_namespaced_custom_object(G, V, namespace, "clusters", "lm")
    assert [r["name"] for r in got["spec"]["podSelectorRefs"]] == ["a", "b"]
    owned = {m["manager"]: json.dumps(m["fieldsV1"]) for m in got["metadata"]["managedFields"]}
    assert 'k:{\\"name\\":\\"a\\"}' in owned["one"] and 'k:{\\"name\\":\\"b\\"}' in owned["two"]


def test_server_side_apply_on_core_kinds_and_cluster_scoped_objects(core_v1, namespace):
    ns_name = f"{namespace}-ssa"
    ns_body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns_name, "labels": {"team": "a"}},
    }
    # CoreV1Api maps the 201 of an apply that creates (CustomObjectsApi answers None for it).
    created = core_v1.patch_namespace(
        ns_name, ns_body, field_manager="opsdeck", _content_type=APPLY
    )
    assert created.metadata.labels["team"] == "a"
    assert created.status.phase == "Active"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "stringData": {"k": "v"},
    }
    core_v1.patch_namespaced_secret(
        "s", ns_name, secret, field_manager="opsdeck", _content_type=APPLY
    )
    secret["stringData"] = {"k": "w"}
    out = core_v1.patch_namespaced_secret(
        "s", ns_name, secret, field_manager="opsdeck", force=True, _content_type=APPLY
    )
    assert out.data == {"k": "dw=="}
    core_v1.delete_namespace(ns_name)


def test_events_expire_after_an_hour(core_v1, namespace, sandbox):
    def event(name, stamp):
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name},
            "involvedObject": {"kind": "ConfigMap", "name": "x", "namespace": namespace},
            "reason": "Test",
            "message": "m",
            "lastTimestamp": stamp,
        }

    core_v1.create_namespaced_event(namespace, event("old", "2020-01-01T00:00:00Z"))
    core_v1.create_namespaced_event(namespace, event("new", "2999-01-01T00:00:00Z"))
    sandbox.run_until_idle()
    assert [e.metadata.name for e in core_v1.list_namespaced_event(namespace).items] == ["new"]
