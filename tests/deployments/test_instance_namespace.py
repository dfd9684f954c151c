"""What the spec decides of an instance's namespace and `$sys`: the network policy's operator
namespace and ports, the customers' port, and `$sys.network.externalClusterEndpoint`."""

import pytest
import yaml

from deployments import context
from deployments.spec import load_spec
from deployments.workflow.render import Context, render_manifest
from tests.deployments.conftest import SPEC

SHIPPED = SPEC.read_text()


def variant(**changes) -> str:
    """The shipped spec with `x-opsdeck` keys and the main service's endpoints replaced."""
    document = yaml.safe_load(SHIPPED)
    endpoints = changes.pop("endpointConfiguration", None)
    if endpoints is not None:
        document["services"][0]["endpointConfiguration"] = endpoints
    for key, value in changes.items():
        if value is None:
            document["x-opsdeck"].pop(key, None)
        else:
            document["x-opsdeck"][key] = value
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def policy(text: str, *, operator_namespace: str = "", sources=("203.0.113.0/24",)) -> dict:
    spec = load_spec(text)
    objects = context.namespace_objects(
        namespace="inst-a1b2c3d4",
        instance_id="inst-a1b2c3d4",
        tenant_slug="acme",
        extensions=spec.extensions,
        endpoint=spec.main.primary_endpoint(),
        operator_namespace=operator_namespace,
        customer_sources=list(sources),
        backup_credentials=None,
    )
    return next(o for o in objects if o["kind"] == "NetworkPolicy")


def endpoint(text: str, instance_id: str = "inst-a1b2c3d4", namespace: str = "ns-1") -> str:
    sys = context.sys_variables(
        instance_id=instance_id,
        namespace=namespace,
        tenant_slug="acme",
        tenant_name="Acme",
        endpoint=load_spec(text).main.primary_endpoint(),
    )
    return sys["network"]["externalClusterEndpoint"]


def operator_rule(namespace: str, ports: list[int] | None) -> dict:
    rule = {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]
    }
    if ports is not None:
        rule["ports"] = [{"port": port} for port in ports]
    return rule


CUSTOMERS = {"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 5432}]}


def test_the_shipped_plan_admits_its_pods_its_operator_and_customers_as_before():
    assert policy(SHIPPED) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "opsdeck-isolation", "namespace": "inst-a1b2c3d4"},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {}}]},
                operator_rule("cnpg-system", [8000, 5432]),
                CUSTOMERS,
            ],
        },
    }


def test_the_operator_namespace_and_ports_come_from_the_spec():
    text = variant(operator={"namespace": "db-operators", "ports": [9443]})

    assert policy(text)["spec"]["ingress"][1] == operator_rule("db-operators", [9443])


def test_an_operator_without_ports_is_admitted_on_every_port():
    text = variant(operator={"namespace": "db-operators"})

    assert policy(text)["spec"]["ingress"][1] == operator_rule("db-operators", None)


def test_a_cell_override_moves_the_operator_namespace_and_keeps_the_spec_ports():
    ingress = policy(SHIPPED, operator_namespace="postgres-operator")["spec"]["ingress"]

    assert ingress[1] == operator_rule("postgres-operator", [8000, 5432])


def test_a_plan_without_an_operator_admits_only_its_pods_and_customers():
    ingress = policy(variant(operator=None))["spec"]["ingress"]

    assert ingress == [{"from": [{"podSelector": {}}]}, CUSTOMERS]


def test_customers_reach_the_endpoint_ports_unless_the_plan_names_one():
    moved = variant(
        endpointConfiguration={"api": {"host": "{{ $sys.id }}-api", "ports": [8443, 9000]}}
    )
    named = variant(network={"port": 6432})

    assert policy(moved)["spec"]["ingress"][2]["ports"] == [{"port": 8443}, {"port": 9000}]
    assert policy(named)["spec"]["ingress"][2]["ports"] == [{"port": 6432}]
    assert len(policy(SHIPPED, sources=())["spec"]["ingress"]) == 2


def test_the_shipped_plan_endpoint_is_its_primary_service_in_its_namespace():
    assert endpoint(SHIPPED) == "inst-a1b2c3d4-rw.ns-1"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("{{ $sys.id }}-primary", "inst-a1b2c3d4-primary.ns-1"),
        ("db-{{ $sys.id }}.{{ $sys.namespace }}.svc", "db-inst-a1b2c3d4.ns-1.svc"),
        ("$sys.id", "inst-a1b2c3d4.ns-1"),
        # Omnistrate's form leaves the name to the platform.
        ("$sys.network.externalClusterEndpoint", "inst-a1b2c3d4.ns-1"),
    ],
)
def test_the_endpoint_comes_from_the_spec_primary_endpoint(host, expected):
    text = variant(
        endpointConfiguration={
            "reader": {"host": "reader-{{ $sys.id }}", "ports": [5432]},
            "writer": {"host": host, "ports": [5432], "primary": True},
        }
    )

    assert endpoint(text) == expected


def test_a_template_renders_the_endpoint_the_spec_names():
    text = variant(endpointConfiguration={"w": {"host": "{{ $sys.id }}-w", "primary": True}})
    sys = context.sys_variables(
        instance_id="inst-a1b2c3d4",
        namespace="inst-a1b2c3d4",
        tenant_slug="acme",
        tenant_name="Acme",
        endpoint=load_spec(text).main.primary_endpoint(),
    )
    manifest = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
        "data: {host: '{{ $sys.network.externalClusterEndpoint }}'}\n"
    )

    rendered = render_manifest(manifest, Context(var={}, sys=sys))

    assert rendered["data"]["host"] == "inst-a1b2c3d4-w.inst-a1b2c3d4"
