"""Bad input answers the right 4xx Status: never a 500, never a crash."""

from __future__ import annotations

import base64
import json

import pytest

G, V = "postgresql.cnpg.io", "v1"


def assert_status(result, code, reason):
    status, headers, body = result
    assert status == code, body
    assert headers["Content-Type"] == "application/json"
    assert (body["kind"], body["status"], body["code"], body["reason"]) == (
        "Status",
        "Failure",
        code,
        reason,
    )
    return body


def test_malformed_json_is_400(raw, namespace):
    body = assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            '{"kind": "ConfigMap", ',
            {"Content-Type": "application/json"},
        ),
        400,
        "BadRequest",
    )
    assert body["message"].startswith("couldn't get version/kind; json parse error: ")


def test_malformed_yaml_is_400(raw, namespace):
    body = assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            "kind: [unclosed\n  - x: :",
            {"Content-Type": "application/yaml"},
        ),
        400,
        "BadRequest",
    )
    assert body["message"].startswith("error converting YAML to JSON: yaml: ")


def test_yaml_body_is_accepted(raw, namespace):
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  a: b\n"
    status, _, obj = raw.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        manifest,
        {"Content-Type": "application/yaml"},
    )
    assert status == 201 and obj["data"] == {"a": "b"}


def test_wrong_content_type_is_415(raw, namespace):
    body = assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            "<xml/>",
            {"Content-Type": "text/xml"},
        ),
        415,
        "UnsupportedMediaType",
    )
    assert body["message"].startswith(
        "the body of the request was in an unknown format - accepted media types include: "
    )


def test_unknown_patch_type_is_415(raw, namespace):
    raw.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
    )
    assert_status(
        raw.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/configmaps/c",
            "{}",
            {"Content-Type": "text/plain"},
        ),
        415,
        "UnsupportedMediaType",
    )


def test_unknown_kind_is_404(raw, namespace):
    body = assert_status(
        raw.request("GET", f"/apis/{G}/{V}/namespaces/{namespace}/poolers"), 404, "NotFound"
    )
    assert body["message"] == "the server could not find the requested resource"


def test_kind_mismatch_is_400(raw, namespace):
    assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}},
        ),
        400,
        "BadRequest",
    )


def test_missing_kind_of_custom_resource_is_400(raw, namespace):
    body = assert_status(
        raw.request(
            "POST", f"/apis/{G}/{V}/namespaces/{namespace}/clusters", {"metadata": {"name": "x"}}
        ),
        400,
        "BadRequest",
    )
    assert body["message"].startswith("Object 'Kind' is missing in")


def test_built_in_kinds_take_kind_from_the_url(raw, namespace):
    status, _, obj = raw.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "bare"}}
    )
    assert (status, obj["kind"], obj["apiVersion"]) == (201, "ConfigMap", "v1")


def test_body_that_is_not_an_object_is_400(raw, namespace):
    assert_status(
        raw.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", "[1, 2]"),
        400,
        "BadRequest",
    )


@pytest.mark.parametrize(
    ("plural", "kind", "name", "rule"),
    [
        ("configmaps", "ConfigMap", "UPPER", "a lowercase RFC 1123 subdomain"),
        ("configmaps", "ConfigMap", "x" * 254, "must be no more than 253 characters"),
        ("services", "Service", "1abc", "a DNS-1035 label"),
    ],
)
def test_invalid_names_are_422(raw, namespace, plural, kind, name, rule):
    body = assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/{plural}",
            {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}},
        ),
        422,
        "Invalid",
    )
    assert rule in body["message"]
    assert body["details"]["causes"][0]["field"] == "metadata.name"


def test_invalid_namespace_name_is_422(raw):
    body = assert_status(
        raw.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "has.dot"}},
        ),
        422,
        "Invalid",
    )
    assert "a lowercase RFC 1123 label" in body["message"]


def test_missing_name_is_422(raw, namespace):
    body = assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}},
        ),
        422,
        "Invalid",
    )
    assert (
        body["message"] == 'ConfigMap "" is invalid: metadata.name: Required value: '
        "name or generateName is required"
    )


def test_oversized_body_is_413(raw, namespace):
    huge = (
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big"},"data":{"a":"'
        + "x" * (3 * 1024 * 1024)
        + '"}}'
    )
    body = assert_status(
        raw.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", huge),
        413,
        "RequestEntityTooLarge",
    )
    assert body["message"] == "Request entity too large: limit is 3145728"


def test_bad_base64_in_secret_is_400(raw, namespace):
    assert_status(
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s"},
                "data": {"k": "not base64!"},
            },
        ),
        400,
        "BadRequest",
    )


def test_bad_selectors_and_parameters_are_400(raw, namespace):
    assert_status(
        raw.request("GET", f"/api/v1/namespaces/{namespace}/configmaps?labelSelector=a%20in%20b"),
        400,
        "BadRequest",
    )
    assert_status(
        raw.request("GET", f"/api/v1/namespaces/{namespace}/configmaps?limit=many"),
        400,
        "BadRequest",
    )
    assert_status(
        raw.request("GET", f"/api/v1/namespaces/{namespace}/configmaps?continue=garbage"),
        400,
        "BadRequest",
    )
    assert_status(
        raw.request(
            "GET", f"/api/v1/namespaces/{namespace}/configmaps?watch=true&resourceVersion=abc"
        ),
        400,
        "BadRequest",
    )


def test_json_patch_with_wrong_shape_is_400(raw, namespace):
    raw.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "jp"}},
    )
    assert_status(
        raw.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/configmaps/jp",
            {"op": "add"},
            {"Content-Type": "application/json-patch+json"},
        ),
        400,
        "BadRequest",
    )


def test_post_to_a_named_path_is_405(raw, namespace):
    assert_status(
        raw.request("POST", f"/api/v1/namespaces/{namespace}/configmaps/x", {}),
        405,
        "MethodNotAllowed",
    )


def test_server_survives_garbage(raw, sandbox):
    import socket

    with socket.create_connection((sandbox.host, sandbox.port), timeout=5) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        sock.recv(1024)
    status, _, _ = raw.request("GET", "/version")
    assert status == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "ctype"),
    [
        ("POST", "configmaps", {"metadata": {"name": "l", "labels": {"a": 1}}}, "application/json"),
        ("POST", "configmaps", {"metadata": {"name": "f", "finalizers": "x"}}, "application/json"),
        (
            "POST",
            "configmaps",
            {"metadata": {"name": "o", "ownerReferences": "x"}},
            "application/json",
        ),
        ("POST", "configmaps", {"metadata": {"name": 5}}, "application/json"),
        ("POST", "services", {"metadata": {"name": "s"}, "spec": []}, "application/json"),
        (
            "POST",
            "services",
            {"metadata": {"name": "s"}, "spec": {"ports": [1]}},
            "application/json",
        ),
        ("PATCH", "configmaps/target", {"metadata": []}, "application/merge-patch+json"),
        (
            "PATCH",
            "configmaps/target",
            {"metadata": {"labels": []}},
            "application/strategic-merge-patch+json",
        ),
        ("PUT", "configmaps/target", [], "application/json"),
    ],
)
def test_wrongly_typed_fields_are_400_not_500(raw, namespace, method, path, body, ctype):
    raw.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "target"}}
    )
    status, _, answer = raw.request(
        method, f"/api/v1/namespaces/{namespace}/{path}", body, {"Content-Type": ctype}
    )
    assert (status, answer["reason"]) == (400, "BadRequest"), answer
    assert "cannot be handled as a" in answer["message"] or "must be" in answer["message"]


def test_scale_bodies_of_the_wrong_shape_are_400(raw, namespace):
    base = f"/apis/{G}/{V}/namespaces/{namespace}/clusters"
    raw.request(
        "POST",
        base,
        {
            "apiVersion": f"{G}/{V}",
            "kind": "Cluster",
            "metadata": {"name": "sc"},
            "spec": {"instances": 1},
        },
    )
    status, _, answer = raw.request("PUT", f"{base}/sc/scale", [1])
    assert (status, answer["reason"]) == (400, "BadRequest")
    status, _, answer = raw.request(
        "PATCH", f"{base}/sc/scale", "null", {"Content-Type": "application/merge-patch+json"}
    )
    assert (status, answer["reason"]) == (400, "BadRequest")


def test_negative_limit_lists_everything(raw, namespace):
    raw.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "one"}})
    status, _, listed = raw.request("GET", f"/api/v1/namespaces/{namespace}/configmaps?limit=-1")
    assert status == 200 and [i["metadata"]["name"] for i in listed["items"]] == ["one"]


def test_an_applied_json_body_holding_an_emoji_keeps_it(raw, namespace):
    # json.dumps escapes it as a surrogate pair, as the official client sends it.
    body = json.dumps({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "emoji"}, "stringData": {"password": "hello \U0001f600"},
    })  # fmt: skip
    assert "\\ud83d\\ude00" in body

    status, _, obj = raw.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/secrets/emoji?fieldManager=test",
        body,
        {"Content-Type": "application/apply-patch+yaml"},
    )

    assert status == 201, obj
    assert base64.b64decode(obj["data"]["password"]).decode() == "hello \U0001f600"


def test_a_yaml_flow_mapping_body_is_still_yaml(raw, namespace):
    status, _, obj = raw.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        "{apiVersion: v1, kind: ConfigMap, metadata: {name: flow}, data: {a: b}}",
        {"Content-Type": "application/yaml"},
    )

    assert status == 201, obj
    assert obj["data"] == {"a": "b"}


def test_a_lone_surrogate_escape_is_read_as_the_replacement_character(raw, namespace):
    body = '{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lone"},'
    body += ' "stringData": {"password": "a\\ud800b"}}'

    status, _, obj = raw.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body,
        {"Content-Type": "application/json"},
    )

    assert status == 201, obj
    assert base64.b64decode(obj["data"]["password"]).decode() == "a\ufffdb"
