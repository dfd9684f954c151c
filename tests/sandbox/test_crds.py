"""CustomResourceDefinitions: creating one serves its resources; deleting one stops serving them."""

from __future__ import annotations

import contextlib
import json

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

GROUP = "example.com"


def widget_crd(plural: str = "widgets", kind: str = "Widget") -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": ["wd"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "string", "jsonPath": ".spec.size"}
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "string", "enum": ["S", "M", "L"]},
                                        "replicas": {"type": "integer", "default": 1, "maximum": 5},
                                        "name": {"type": "string", "pattern": "^[a-z]+$"},
                                    },
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {"replicas": {"type": "integer"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def widgets(api_client):
    ext = client.ApiextensionsV1Api(api_client)
    crd = ext.create_custom_resource_definition(widget_crd())
    yield crd
    with contextlib.suppress(client.ApiException):
        ext.delete_custom_resource_definition(f"widgets.{GROUP}")


def test_created_crd_is_established_and_discoverable(widgets, raw):
    assert widgets.status.accepted_names.kind == "Widget"
    assert {c.type: c.status for c in widgets.status.conditions}["Established"] == "True"
    _, _, resources = raw.request("GET", f"/apis/{GROUP}/v1")
    names = {r["name"] for r in resources["resources"]}
    assert names == {"widgets", "widgets/status", "widgets/scale"}
    _, _, groups = raw.request("GET", "/apis")
    assert GROUP in [g["name"] for g in groups["groups"]]


def test_custom_resources_of_a_new_crd_are_served_and_validated(widgets, custom, namespace):
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": "M"},
    }
    created = custom.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", body)
    assert created["spec"] == {"size": "M", "replicas": 1}
    custom.patch_namespaced_custom_object_scale(
        GROUP, "v1", namespace, "widgets", "w", {"spec": {"replicas": 4}}
    )
    assert (
        custom.get_namespaced_custom_object(GROUP, "v1", namespace, "widgets", "w")["spec"][
            "replicas"
        ]
        == 4
    )
    bad = {**body, "metadata": {"name": "bad"}, "spec": {"size": "XL", "replicas": 9, "name": "A1"}}
    with pytest.raises(client.ApiException) as exc:
        custom.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", bad)
    status = json.loads(exc.value.body)
    assert exc.value.status == 422
    assert {c["field"] for c in status["details"]["causes"]} == {
        "spec.size",
        "spec.replicas",
        "spec.name",
    }


def test_dynamic_client_sees_a_new_crd(widgets, api_client, tmp_path, namespace):
    dyn = DynamicClient(api_client, cache_file=str(tmp_path / "cache.json"))
    res = dyn.resources.get(api_version=f"{GROUP}/v1", kind="Widget")
    res.create(
        body={
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": "d"},
            "spec": {"size": "S"},
        },
        namespace=namespace,
    )
    assert [w.metadata.name for w in res.get(namespace=namespace).items] == ["d"]


def test_kubectl_get_uses_the_new_printer_columns(widgets, custom, kubectl, namespace):
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": "k"},
        "spec": {"size": "L"},
    }
    custom.create_namespaced_custom_object(GROUP, "v1", namespace, "widgets", body)
    lines = kubectl("get", "-n", namespace, "wd").stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE"]
    assert lines[1].split() == ["k", "L"]


def test_deleting_a_crd_stops_serving_and_drops_its_objects(api_client, custom, namespace, raw):
    ext = client.ApiextensionsV1Api(api_client)
    ext.create_custom_resource_definition(widget_crd("gadgets", "Gadget"))
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "metadata": {"name": "g"},
        "spec": {"size": "S"},
    }
    custom.create_namespaced_custom_object(GROUP, "v1", namespace, "gadgets", body)
    ext.delete_custom_resource_definition(f"gadgets.{GROUP}")
    status, _, answer = raw.request("GET", f"/apis/{GROUP}/v1/namespaces/{namespace}/gadgets")
    assert (status, answer["reason"]) == (404, "NotFound")


def test_crd_name_must_match_its_names(api_client):
    ext = client.ApiextensionsV1Api(api_client)
    crd = widget_crd("things", "Thing")
    crd["metadata"]["name"] = f"wrong.{GROUP}"
    with pytest.raises(client.ApiException) as exc:
        ext.create_custom_resource_definition(crd)
    assert exc.value.status == 422
    assert json.loads(exc.value.body)["details"]["causes"][0]["field"] == "metadata.name"
