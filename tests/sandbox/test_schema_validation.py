"""Custom resources validated against their CRD's openAPIV3Schema, through the official client."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

G, V = "postgresql.cnpg.io", "v1"


@pytest.fixture(autouse=True)
def _operator_frozen(sandbox):
    """Validation is the API server's job; keep the simulated operator out of these objects."""
    sandbox.set_faults(frozen=["cnpg"])
    sandbox.run_until_idle()
    yield
    sandbox.set_faults(frozen=[])


def body(name: str, **spec: object) -> dict:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"instances": 1, **spec},
    }


def refuse(custom, namespace, obj, plural="clusters", **kwargs) -> tuple[int, dict]:
    with pytest.raises(client.ApiException) as exc:
        custom.create_namespaced_custom_object(G, V, namespace, plural, obj, **kwargs)
    return exc.value.status, json.loads(exc.value.body)


def test_defaults_are_filled_on_create_and_update(custom, namespace):
    created = custom.create_namespaced_custom_object(G, V, namespace, "clusters", body("d"))
    spec = created["spec"]
    assert spec["enableSuperuserAccess"] is False
    assert spec["primaryUpdateStrategy"] == "unsupervised"
    assert spec["primaryUpdateMethod"] == "restart"
    assert spec["logLevel"] == "info"
    del created["spec"]["logLevel"]
    replaced = custom.replace_namespaced_custom_object(G, V, namespace, "clusters", "d", created)
    assert replaced["spec"]["logLevel"] == "info"
    assert replaced["metadata"]["generation"] == 1


def test_unknown_fields_are_pruned_by_default(custom, namespace):
    created = custom.create_namespaced_custom_object(
        G, V, namespace, "clusters", body("p", bogus=1)
    )
    assert "bogus" not in created["spec"]


def test_strict_field_validation_refuses_unknown_fields(custom, namespace):
    code, status = refuse(
        custom,
        namespace,
        body("s", bogus=1, storage={"size": "1Gi", "sizz": 2}),
        field_validation="Strict",
    )
    assert code == 400
    assert status["reason"] == "BadRequest"
    assert status["message"] == (
        'Cluster in version "v1" cannot be handled as a Cluster: strict decoding error: '
        'unknown field "spec.bogus", unknown field "spec.storage.sizz"'
    )


def test_warn_field_validation_answers_a_warning_header(raw, namespace):
    path = f"/apis/{G}/{V}/namespaces/{namespace}/clusters?fieldValidation=Warn"
    status, headers, obj = raw.request(
        "POST", path, body("w", bogus=1), {"Content-Type": "application/json"}
    )
    assert status == 201
    assert headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    assert "bogus" not in obj["spec"]


def test_dry_run_validates_and_defaults_without_storing(custom, namespace):
    out = custom.create_namespaced_custom_object(
        G, V, namespace, "clusters", body("dry"), dry_run="All"
    )
    assert out["spec"]["logLevel"] == "info"
    with pytest.raises(client.ApiException) as exc:
        custom.get_namespaced_custom_object(G, V, namespace, "clusters", "dry")
    assert exc.value.status == 404
    code, _ = refuse(custom, namespace, body("dry", instances=0), dry_run="All")
    assert code == 422


def test_minimum_violation_is_422_with_cause(custom, namespace):
    code, status = refuse(custom, namespace, body("m", instances=0))
    assert code == 422
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        'Cluster.postgresql.cnpg.io "m" is invalid: spec.instances: Invalid value: 0: '
        "spec.instances in body should be greater than or equal to 1"
    )
    assert status["details"] == {
        "name": "m",
        "group": G,
        "kind": "Cluster",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 0: "
                "spec.instances in body should be greater than or equal to 1",
                "field": "spec.instances",
            }
        ],
    }


def test_wrong_type_is_422(custom, namespace):
    code, status = refuse(custom, namespace, body("t", instances="three"))
    assert code == 422
    assert status["details"]["causes"][0] == {
        "reason": "FieldValueInvalid",
        "message": 'Invalid value: "three": '
        'spec.instances in body must be of type integer: "string"',
        "field": "spec.instances",
    }


def test_enum_violation_lists_supported_values(custom, namespace):
    code, status = refuse(custom, namespace, body("e", primaryUpdateStrategy="sometimes"))
    assert code == 422
    cause = status["details"]["causes"][0]
    assert cause["reason"] == "FieldValueNotSupported"
    assert cause["field"] == "spec.primaryUpdateStrategy"
    assert (
        cause["message"]
        == 'Unsupported value: "sometimes": supported values: "unsupervised", "supervised"'
    )


def test_required_field_missing(custom, namespace):
    backup = {"apiVersion": f"{G}/{V}", "kind": "Backup", "metadata": {"name": "b"}, "spec": {}}
    code, status = refuse(custom, namespace, backup, plural="backups")
    assert code == 422
    assert (
        status["message"]
        == 'Backup.postgresql.cnpg.io "b" is invalid: spec.cluster: Required value'
    )


def test_several_violations_are_listed_together(custom, namespace):
    code, status = refuse(custom, namespace, body("x", instances=0, logLevel="loud"))
    assert code == 422
    assert status["message"].startswith('Cluster.postgresql.cnpg.io "x" is invalid: [')
    assert {c["field"] for c in status["details"]["causes"]} == {"spec.instances", "spec.logLevel"}


def test_int_or_string_accepts_both(custom, namespace):
    for value in (5, "5"):
        name = f"ios{value}".lower() if isinstance(value, int) else "ios-str"
        spec = {"resources": {"requests": {"cpu": value}}}
        created = custom.create_namespaced_custom_object(
            G, V, namespace, "clusters", body(name, **spec)
        )
        assert created["spec"]["resources"]["requests"]["cpu"] == value


def test_cel_rule_makes_backup_spec_immutable(custom, namespace):
    backup = {
        "apiVersion": f"{G}/{V}",
        "kind": "Backup",
        "metadata": {"name": "imm"},
        "spec": {"cluster": {"name": "a"}},
    }
    custom.create_namespaced_custom_object(G, V, namespace, "backups", backup)
    with pytest.raises(client.ApiException) as exc:
        custom.patch_namespaced_custom_object(
            G, V, namespace, "backups", "imm", {"spec": {"cluster": {"name": "b"}}}
        )
    assert exc.value.status == 422
    status = json.loads(exc.value.body)
    assert (
        status["message"]
        == 'Backup.postgresql.cnpg.io "imm" is invalid: spec: Invalid value: "object": '
        "BackupSpec is immutable once set"
    )


def test_cel_rule_on_cluster_spec(custom, namespace):
    code, status = refuse(
        custom,
        namespace,
        body(
            "cel",
            imageName="postgres:17",
            imageCatalogRef={"apiGroup": G, "kind": "ImageCatalog", "name": "c", "major": 17},
        ),
    )
    assert code == 422
    assert status["details"]["causes"][0]["field"] == "spec"
    assert "imageName and imageCatalogRef" in status["details"]["causes"][0]["message"]


def test_strict_field_validation_refuses_duplicate_fields(raw, namespace):
    text = (
        '{"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "metadata": {"name": "dup"},'
        ' "spec": {"instances": 1, "instances": 2, "bogus": true}}'
    )
    path = f"/apis/{G}/{V}/namespaces/{namespace}/clusters?fieldValidation=Strict"
    status, _, answer = raw.request("POST", path, text)
    assert (status, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == (
        'Cluster in version "v1" cannot be handled as a Cluster: strict decoding error: '
        'duplicate field "instances", unknown field "spec.bogus"'
    )
