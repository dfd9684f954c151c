"""Built-in kinds' fields and types checked as kube-apiserver checks them, through the client."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client

APPLY = "application/apply-patch+yaml"


def valkey_statefulset(name: str = "cache") -> dict[str, Any]:
    """A StatefulSet written as the Valkey spec writes it (every kind of field it uses)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {"opsdeck.io/instance": name}},
        "spec": {
            "serviceName": f"{name}-headless",
            "replicas": 2,
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate"},
            "persistentVolumeClaimRetentionPolicy": {
                "whenScaled": "Retain",
                "whenDeleted": "Delete",
            },
            "selector": {"matchLabels": {"opsdeck.io/instance": name}},
            "template": {
                "metadata": {
                    "labels": {"opsdeck.io/instance": name},
                    "annotations": {"opsdeck.io/maxmemory": "1gb"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "valkey",
                            "image": "valkey/valkey:8.1",
                            "command": ["sh", "-c"],
                            "args": ["exec valkey-server /etc/valkey/valkey.conf"],
                            "env": [
                                {
                                    "name": "VALKEY_PASSWORD",
                                    "valueFrom": {
                                        "secretKeyRef": {"name": name, "key": "password"}
                                    },
                                }
                            ],
                            "ports": [{"name": "valkey", "containerPort": 6379}],
                            "readinessProbe": {
                                "exec": {"command": ["sh", "-c", "valkey-cli ping"]},
                                "periodSeconds": 5,
                            },
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "1Gi"},
                                "limits": {"cpu": 1},
                            },
                            "volumeMounts": [
                                {"name": "data", "mountPath": "/data"},
                                {"name": "config", "mountPath": "/etc/valkey"},
                            ],
                        }
                    ],
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
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
        },
    }


def holds(actual: Any, expected: Any) -> bool:
    """Whether `actual` carries everything `expected` sets (the server may add defaults)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and holds(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(holds(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return actual == expected


def refused(call, *args, **kwargs) -> tuple[int, dict[str, Any]]:
    with pytest.raises(client.ApiException) as exc:
        call(*args, **kwargs)
    return exc.value.status, json.loads(exc.value.body)


@pytest.fixture
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


def test_strict_refuses_a_statefulset_naming_each_unknown_field(apps, namespace):
    sts = valkey_statefulset()
    sts["spec"]["replica"] = sts["spec"].pop("replicas")
    sts["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    code, status = refused(
        apps.create_namespaced_stateful_set, namespace, sts, field_validation="Strict"
    )
    assert (code, status["reason"]) == (400, "BadRequest")
    # Named in the order of the body.
    assert status["message"] == (
        'StatefulSet in version "v1" cannot be handled as a StatefulSet: strict decoding error: '
        'unknown field "spec.template.spec.containers[0].resource", '
        'unknown field "spec.replica"'
    )
    code, _ = refused(apps.read_namespaced_stateful_set, "cache", namespace)
    assert code == 404


def test_warn_drops_only_the_unknown_field_of_a_valkey_statefulset(apps, namespace):
    sts = valkey_statefulset()
    sts["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    answer = apps.create_namespaced_stateful_set(
        namespace, sts, field_validation="Warn", _preload_content=False
    )
    assert answer.status == 201
    assert answer.headers["Warning"] == (
        '299 - "unknown field \\"spec.template.spec.containers[0].resource\\""'
    )
    stored = json.loads(answer.data)
    del sts["spec"]["template"]["spec"]["containers"][0]["resource"]
    # Everything else the spec writes is a field of the kind: stored as sent.
    assert holds(stored, sts)
    assert "resource" not in stored["spec"]["template"]["spec"]["containers"][0]


def test_ignore_drops_a_misspelt_field_silently(apps, namespace):
    sts = valkey_statefulset()
    sts["spec"]["replica"] = 3
    answer = apps.create_namespaced_stateful_set(
        namespace, sts, field_validation="Ignore", _preload_content=False
    )
    assert answer.status == 201
    assert "Warning" not in answer.headers
    stored = json.loads(answer.data)
    assert "replica" not in stored["spec"]
    assert stored["spec"]["replicas"] == 2


def test_an_unknown_field_in_a_pod_template_metadata_is_refused(apps, namespace):
    sts = valkey_statefulset()
    sts["spec"]["template"]["metadata"]["label"] = {"tier": "cache"}
    code, status = refused(
        apps.create_namespaced_stateful_set, namespace, sts, field_validation="Strict"
    )
    assert code == 400
    assert status["message"].endswith('unknown field "spec.template.metadata.label"')


def test_a_secret_stringdata_typo_is_refused_or_dropped(core_v1, namespace):
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}}
    secret["stringdata"] = {"password": "s3cret"}
    code, status = refused(
        core_v1.create_namespaced_secret, namespace, secret, field_validation="Strict"
    )
    assert code == 400
    assert status["message"] == (
        'Secret in version "v1" cannot be handled as a Secret: strict decoding error: '
        'unknown field "stringdata"'
    )
    # Without Strict the Secret is made, but holds no password.
    core_v1.create_namespaced_secret(namespace, secret, field_validation="Ignore")
    assert core_v1.read_namespaced_secret("creds", namespace).data is None


def test_string_data_is_merged_into_data_and_an_unknown_field_beside_it_dropped(core_v1, namespace):
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds"},
        "data": {"user": "YXBw"},
        "stringData": {"password": "s3cret"},
        "passwrd": "s3cret",
    }
    core_v1.create_namespaced_secret(namespace, secret, field_validation="Warn")
    stored = json.loads(
        core_v1.read_namespaced_secret("creds", namespace, _preload_content=False).data
    )
    assert stored["data"] == {"user": "YXBw", "password": "czNjcmV0"}
    assert "stringData" not in stored
    assert "passwrd" not in stored


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        (
            "StatefulSet",
            {"spec": {"replicas": "2"}},
            "json: cannot unmarshal string into Go struct field StatefulSetSpec.spec.replicas "
            "of type int32",
        ),
        (
            "StatefulSet",
            {"spec": {"replicas": 2.5}},
            "json: cannot unmarshal number 2.5 into Go struct field StatefulSetSpec.spec.replicas "
            "of type int32",
        ),
        (
            "StatefulSet",
            {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": "30"}}}},
            "json: cannot unmarshal string into Go struct field "
            "PodSpec.spec.template.spec.terminationGracePeriodSeconds of type int64",
        ),
        (
            "StatefulSet",
            {"spec": {"template": {"spec": {"containers": {"name": "valkey"}}}}},
            "json: cannot unmarshal object into Go struct field "
            "PodSpec.spec.template.spec.containers of type []v1.Container",
        ),
        (
            "StatefulSet",
            {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "valkey", "resources": {"requests": {"memory": "1gb"}}}
                            ]
                        }
                    }
                }
            },
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
        (
            "StatefulSet",
            {"spec": {"template": {"spec": {"containers": [{"resources": {"limits": "1"}}]}}}},
            "json: cannot unmarshal string into Go struct field "
            "ResourceRequirements.spec.template.spec.containers.resources.limits of type "
            "v1.ResourceList",
        ),
        (
            "Service",
            {"spec": {"ports": [{"name": "valkey", "port": "6379"}]}},
            "json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port "
            "of type int32",
        ),
        (
            "Service",
            {"spec": {"publishNotReadyAddresses": "true"}},
            "json: cannot unmarshal string into Go struct field "
            "ServiceSpec.spec.publishNotReadyAddresses of type bool",
        ),
        (
            "ConfigMap",
            {"data": {"maxmemory": 1}},
            "json: cannot unmarshal number into Go struct field ConfigMap.data of type string",
        ),
        (
            "Secret",
            {"data": {"password": 1}},
            "json: cannot unmarshal number into Go struct field Secret.data of type []uint8",
        ),
    ],
    ids=[
        "replicas-string",
        "replicas-fraction",
        "grace-period-string",
        "containers-object",
        "memory-1gb",
        "limits-string",
        "port-string",
        "bool-string",
        "configmap-number",
        "secret-number",
    ],
)
def test_a_value_of_the_wrong_type_is_a_bad_request(raw, namespace, kind, body, message):
    paths = {
        "StatefulSet": f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
        "Service": f"/api/v1/namespaces/{namespace}/services",
        "ConfigMap": f"/api/v1/namespaces/{namespace}/configmaps",
        "Secret": f"/api/v1/namespaces/{namespace}/secrets",
    }
    obj = {"kind": kind, "metadata": {"name": "x"}, **body}
    code, _, status = raw.request("POST", paths[kind] + "?fieldValidation=Ignore", obj)
    assert (code, status["reason"]) == (400, "BadRequest")
    assert status["message"] == f'{kind} in version "v1" cannot be handled as a {kind}: {message}'


def test_a_target_port_may_be_a_name_but_a_port_may_not(core_v1, namespace):
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "valkey"},
        "spec": {"ports": [{"name": "valkey", "port": "valkey", "targetPort": "valkey"}]},
    }
    code, status = refused(core_v1.create_namespaced_service, namespace, service)
    assert code == 400
    assert status["message"].endswith("ServicePort.spec.ports.port of type int32")
    service["spec"]["ports"][0]["port"] = 6379
    created = core_v1.create_namespaced_service(namespace, service, field_validation="Strict")
    assert created.spec.ports[0].target_port == "valkey"


def test_a_patch_is_checked_as_the_object_it_makes(apps, namespace, sandbox):
    sandbox.set_faults(frozen=["statefulsets"])
    try:
        apps.create_namespaced_stateful_set(namespace, valkey_statefulset())
        code, status = refused(
            apps.patch_namespaced_stateful_set,
            "cache",
            namespace,
            {"spec": {"replica": 3}},
            field_validation="Strict",
        )
        assert code == 400
        assert status["message"].endswith('strict decoding error: unknown field "spec.replica"')
        code, status = refused(
            apps.patch_namespaced_stateful_set, "cache", namespace, {"spec": {"replicas": "3"}}
        )
        assert code == 400
        assert status["message"].endswith("StatefulSetSpec.spec.replicas of type int32")
    finally:
        sandbox.set_faults(frozen=[])


def test_server_side_apply_takes_a_valkey_statefulset_and_refuses_a_typo(raw, namespace):
    path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/cache"
    query = "?fieldManager=opsdeck&force=true&fieldValidation=Strict"
    sts = valkey_statefulset()
    code, _, applied = raw.request("PATCH", path + query, sts, {"Content-Type": APPLY})
    assert code == 201
    assert holds(applied, sts)

    typo = copy.deepcopy(sts)
    typo["metadata"]["namespace"] = namespace
    typo["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    # structured-merge-diff refuses it whatever fieldValidation says, with a 500.
    ignore = "?fieldManager=opsdeck&force=true&fieldValidation=Ignore"
    code, _, status = raw.request("PATCH", path + ignore, typo, {"Content-Type": APPLY})
    assert code == 500
    assert "reason" not in status
    assert status["message"] == (
        f"failed to create typed patch object ({namespace}/cache; apps/v1, Kind=StatefulSet): "
        '.spec.template.spec.containers[name="valkey"].resource: field not declared in schema'
    )

    wrong = copy.deepcopy(sts)
    wrong["spec"]["replicas"] = "3"
    wrong["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = 6379
    code, _, status = raw.request("PATCH", path + query, wrong, {"Content-Type": APPLY})
    assert code == 500
    assert status["message"] == (
        "failed to create typed patch object (/cache; apps/v1, Kind=StatefulSet): errors:\n"
        "  .spec.replicas: expected numeric (int or float), got string\n"
        '  .spec.template.spec.containers[name="valkey"].ports[containerPort=6379,'
        'protocol="TCP"].name: expected string, got &value.valueUnstructured{Value:6379}'
    )
    _, _, live = raw.request("GET", path)
    assert live["spec"]["replicas"] == 2


def test_status_subresource_writes_are_checked_and_still_land(apps, namespace, sandbox):
    sandbox.set_faults(frozen=["statefulsets"])
    try:
        apps.create_namespaced_stateful_set(namespace, valkey_statefulset())
        current = apps.read_namespaced_stateful_set_status("cache", namespace).to_dict()
        body = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "cache"},
            "status": {"replicas": 2, "readyReplicas": 1, "readyReplica": 1},
        }
        code, status = refused(
            apps.replace_namespaced_stateful_set_status,
            "cache",
            namespace,
            body,
            field_validation="Strict",
        )
        assert code == 400
        assert status["message"].endswith('unknown field "status.readyReplica"')
        written = apps.replace_namespaced_stateful_set_status(
            "cache", namespace, body, field_validation="Warn"
        )
        assert written.status.ready_replicas == 1
        assert written.metadata.generation == current["metadata"]["generation"]
    finally:
        sandbox.set_faults(frozen=[])
