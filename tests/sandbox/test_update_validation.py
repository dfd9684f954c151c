"""What kube-apiserver checks on every update, not on create alone, and the writes it refuses
outright: a spec that passes `spec_test` on the sandbox must not be refused by a real cluster
for any of these."""

from __future__ import annotations

import json

import pytest
from kubernetes import client


def _refused(write) -> dict:
    with pytest.raises(client.ApiException) as refused:
        write()
    assert refused.value.status == 422, refused.value.body
    return json.loads(refused.value.body)


def _config_map(**fields) -> dict:
    return {"metadata": {"name": "conf", **fields.pop("metadata", {})}, **fields}


def test_a_label_value_is_checked_on_update_as_on_create(core_v1, namespace):
    """A label rendered from a parameter passed create with its default, and a modify's new
    value no label can hold was stored: a real cluster refuses it (ValidateObjectMetaUpdate)."""
    core_v1.create_namespaced_config_map(namespace, _config_map(metadata={"labels": {"v": "16"}}))

    status = _refused(
        lambda: core_v1.patch_namespaced_config_map(
            "conf", namespace, {"metadata": {"labels": {"v": "16 (beta)"}}}
        )
    )

    assert status["details"]["causes"][0]["field"] == "metadata.labels"
    assert 'Invalid value: "16 (beta)"' in status["message"]
    labels = core_v1.read_namespaced_config_map("conf", namespace).metadata.labels
    assert labels == {"v": "16"}


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("-bad", "name part must consist of alphanumeric characters"),
        ("opsdeck.io/", "name part must be non-empty"),
        ("a/b/c", "a qualified name must consist of alphanumeric characters"),
        ("Opsdeck.IO/tier", "prefix part a lowercase RFC 1123 subdomain"),
        ("x" * 64, "name part must be no more than 63 characters"),
    ],
)
def test_a_label_key_must_be_a_qualified_name(core_v1, namespace, key, why):
    status = _refused(
        lambda: core_v1.create_namespaced_config_map(
            namespace, _config_map(metadata={"labels": {key: "v"}})
        )
    )

    assert why in status["message"]


def test_an_annotation_key_must_be_a_qualified_name(core_v1, namespace):
    status = _refused(
        lambda: core_v1.create_namespaced_config_map(
            namespace, _config_map(metadata={"annotations": {"bad key": "v"}})
        )
    )

    assert status["details"]["causes"][0]["field"] == "metadata.annotations"


def test_an_immutable_secret_keeps_its_data_and_stays_immutable(core_v1, namespace):
    core_v1.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "creds"}, "immutable": True, "stringData": {"password": "first"}},
    )

    changed = _refused(
        lambda: core_v1.patch_namespaced_secret(
            "creds", namespace, {"stringData": {"password": "2"}}
        )
    )
    unfrozen = _refused(
        lambda: core_v1.patch_namespaced_secret("creds", namespace, {"immutable": False})
    )

    assert changed["message"] == (
        'Secret "creds" is invalid: data: Forbidden: field is immutable when `immutable` is set'
    )
    assert "immutable: Forbidden: field is immutable when `immutable` is set" in unfrozen["message"]
    assert core_v1.read_namespaced_secret("creds", namespace).data == {"password": "Zmlyc3Q="}


def test_a_secrets_type_never_changes(core_v1, namespace):
    core_v1.create_namespaced_secret(namespace, {"metadata": {"name": "creds"}, "type": "Opaque"})

    status = _refused(
        lambda: core_v1.patch_namespaced_secret(
            "creds",
            namespace,
            {"type": "kubernetes.io/basic-auth", "stringData": {"username": "u"}},
        )
    )

    assert (
        'type: Invalid value: "kubernetes.io/basic-auth": field is immutable' in status["message"]
    )


def test_an_immutable_config_map_keeps_its_data(core_v1, namespace):
    core_v1.create_namespaced_config_map(
        namespace, _config_map(immutable=True, data={"valkey.conf": "maxmemory 1gb"})
    )

    status = _refused(
        lambda: core_v1.patch_namespaced_config_map(
            "conf", namespace, {"data": {"valkey.conf": "maxmemory 2gb"}}
        )
    )

    assert "data: Forbidden: field is immutable when `immutable` is set" in status["message"]
    # A mutable one changes as before.
    core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "free"}, "data": {}})
    core_v1.patch_namespaced_config_map("free", namespace, {"data": {"a": "b"}})


def test_a_services_cluster_ip_never_changes(core_v1, namespace):
    """A Service made with an address cannot be made headless by a later write, nor the other
    way round."""
    service = {"metadata": {"name": "cache"}, "spec": {"ports": [{"port": 6379}]}}
    core_v1.create_namespaced_service(namespace, service)
    headless = {"metadata": {"name": "bare"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}}
    core_v1.create_namespaced_service(namespace, headless)

    made_headless = _refused(
        lambda: core_v1.patch_namespaced_service(
            "cache", namespace, {"spec": {"clusterIP": "None"}}
        )
    )
    addressed = _refused(
        lambda: core_v1.patch_namespaced_service(
            "bare", namespace, {"spec": {"clusterIP": "10.96.0.99"}}
        )
    )

    assert made_headless["details"]["causes"][0]["field"] == "spec.clusterIPs[0]"
    assert "may not change once set" in made_headless["message"]
    assert "may not change once set" in addressed["message"]
    # Written again as it is, or without the address it was given: nothing to refuse.
    core_v1.patch_namespaced_service("cache", namespace, {"metadata": {"labels": {"a": "b"}}})


def test_a_dry_run_delete_of_a_collection_deletes_nothing(raw, core_v1, namespace):
    core_v1.create_namespaced_config_map(namespace, _config_map(metadata={"labels": {"app": "x"}}))

    status, _, _ = raw.request(
        "DELETE", f"/api/v1/namespaces/{namespace}/configmaps?labelSelector=app%3Dx&dryRun=All"
    )

    assert status == 200
    assert core_v1.read_namespaced_config_map("conf", namespace).metadata.name == "conf"


def test_a_delete_of_a_status_subresource_is_not_allowed(raw, core_v1, namespace):
    core_v1.create_namespaced_service(
        namespace, {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}
    )

    status, _, body = raw.request("DELETE", f"/api/v1/namespaces/{namespace}/services/svc/status")

    assert status == 405, body
    assert core_v1.read_namespaced_service("svc", namespace).metadata.name == "svc"


def _service(name: str, **spec) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "p", "port": 80}], **spec},
    }


def test_a_service_written_again_with_an_empty_cluster_ip_keeps_the_allocated_one(
    core_v1, namespace
):
    """A manifest saying `clusterIP: ""` (many charts render it) applied again: a real server
    keeps the address it allocated, where the sandbox refused the write as a change of it."""
    core_v1.create_namespaced_service(namespace, _service("web", clusterIP=""))
    allocated = core_v1.read_namespaced_service("web", namespace).spec
    assert allocated.cluster_ip not in ("", "None")  # "" asks for one
    assert allocated.cluster_ips == [allocated.cluster_ip]

    core_v1.patch_namespaced_service("web", namespace, {"spec": {"clusterIP": ""}})
    stored = core_v1.read_namespaced_service("web", namespace)
    body = _service("web", clusterIP="")
    body["metadata"]["resourceVersion"] = stored.metadata.resource_version
    core_v1.replace_namespaced_service("web", namespace, body)

    spec = core_v1.read_namespaced_service("web", namespace).spec
    assert (spec.cluster_ip, spec.cluster_ips) == (allocated.cluster_ip, allocated.cluster_ips)


def test_a_service_made_an_external_name_gives_up_its_address(core_v1, namespace):
    """An ExternalName Service has no address: the one it had goes, and it may later become
    headless (the sandbox kept the old address and refused that)."""
    core_v1.create_namespaced_service(namespace, _service("db"))

    core_v1.patch_namespaced_service(
        "db", namespace, {"spec": {"type": "ExternalName", "externalName": "db.example.com"}}
    )
    external = core_v1.read_namespaced_service("db", namespace).spec
    core_v1.patch_namespaced_service(
        "db", namespace, {"spec": {"type": "ClusterIP", "clusterIP": "None", "externalName": None}}
    )

    assert (external.cluster_ip, external.cluster_ips) == (None, None)
    assert core_v1.read_namespaced_service("db", namespace).spec.cluster_ip == "None"


def test_annotations_are_limited_in_bytes_not_characters(core_v1, namespace):
    annotations = {"a": "é" * 100_000, "b": "x" * 70_000}  # 170,000 characters, 270,000 bytes

    status = _refused(
        lambda: core_v1.create_namespaced_config_map(
            namespace, _config_map(metadata={"annotations": annotations})
        )
    )

    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in status["message"]
