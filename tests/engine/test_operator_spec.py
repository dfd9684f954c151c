"""What a plan needs of its operator and its cell, as the spec says it: `x-opsdeck.operator`,
`x-opsdeck.network.port`, `x-opsdeck.quota`, the endpoint and the kinds its manifests write."""

from pathlib import Path

import pytest
import yaml

from deployments.spec import SpecError, load_spec
from tests.engine.test_spec_validation import WORKFLOWS, check

SHIPPED = (Path(__file__).resolve().parents[2] / "specs" / "postgres-cnpg.yaml").read_text()


def operator(**values):
    return lambda d: d.setdefault("x-opsdeck", {}).update(operator=values)


def test_the_shipped_plan_names_its_operator_and_the_kinds_a_cell_must_serve():
    spec = load_spec(SHIPPED)

    assert spec.extensions["operator"] == {
        "namespace": "cnpg-system",
        "ports": [8000, 5432],
        "install": "install CloudNativePG first",
    }
    assert spec.required_kinds == [
        ("v1", "Secret"),
        ("postgresql.cnpg.io/v1", "Cluster"),
        ("v1", "Pod"),
        ("v1", "PersistentVolumeClaim"),
        ("postgresql.cnpg.io/v1", "Backup"),
    ]
    assert spec.main.primary_endpoint()["host"] == "{{ $sys.id }}-rw"


def test_the_watcher_watches_only_the_kinds_a_template_waits_on():
    # Secrets are written and deleted, never read back until a condition holds: no change of
    # one can move a waiting run on, so the watcher streams none of them. A volume's claim is
    # waited on by a modify, until it has grown.
    spec = load_spec(SHIPPED)

    assert spec.waited_kinds == [
        ("postgresql.cnpg.io/v1", "Cluster"),
        ("v1", "Pod"),
        ("v1", "PersistentVolumeClaim"),
        ("postgresql.cnpg.io/v1", "Backup"),
    ]


def test_the_kinds_a_cell_must_serve_are_those_the_manifests_write():
    def widgets(document):
        text = yaml.safe_dump(document).replace("postgresql.cnpg.io/v1", "widgets.example.io/v2")
        document.update(yaml.safe_load(text))

    kinds = check(widgets).spec.required_kinds

    assert ("widgets.example.io/v2", "Cluster") in kinds
    assert not [api for api, _ in kinds if "cnpg" in api]


def test_an_operator_with_a_namespace_alone_is_enough():
    spec = check(operator(namespace="db-operators")).spec

    assert spec.extensions["operator"] == {"namespace": "db-operators"}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            operator(ports=[8000]),
            "x-opsdeck.operator.namespace: is required (lowercase letters, digits and -, at "
            "most 63)",
        ),
        (
            operator(namespace="CNPG_System"),
            'x-opsdeck.operator.namespace: "CNPG_System" is not a namespace name (lowercase '
            "letters, digits and -, at most 63)",
        ),
        (
            operator(namespace="ops", ports=[8000, "http"]),
            'x-opsdeck.operator.ports[1]: "http" is not a port number (a whole number from 1 to '
            "65535)",
        ),
        (
            operator(namespace="ops", ports=[70000]),
            'x-opsdeck.operator.ports[0]: "70000" is not a port number (a whole number from 1 to '
            "65535)",
        ),
        (
            operator(namespace="ops", ports=[]),
            "x-opsdeck.operator.ports: must list at least one port; leave it out to admit every "
            "port",
        ),
        (
            operator(namespace="ops", install=""),
            "x-opsdeck.operator.install: must be text of 1 to 200 characters",
        ),
        (
            lambda d: d.setdefault("x-opsdeck", {}).update(operator="cnpg-system"),
            "x-opsdeck.operator: must be a mapping with namespace, ports and install",
        ),
        (
            lambda d: d.setdefault("x-opsdeck", {}).update(quota={"storage": "lots"}),
            'x-opsdeck.quota.storage: "lots" is not a storage size: give a Kubernetes quantity, '
            "such as 500Gi",
        ),
        (
            lambda d: d.setdefault("x-opsdeck", {}).update(quota={"storage": "-5Gi"}),
            'x-opsdeck.quota.storage: "-5Gi" is not a storage size: give a Kubernetes quantity, '
            "such as 500Gi",
        ),
        (
            lambda d: d.setdefault("x-opsdeck", {}).update(quota="500Gi"),
            "x-opsdeck.quota: must be a mapping with storage",
        ),
        (
            lambda d: d.setdefault("x-opsdeck", {}).update(network={"port": 0}),
            'x-opsdeck.network.port: "0" is not a port number (a whole number from 1 to 65535)',
        ),
        (
            lambda d: d["services"][0].update(
                endpointConfiguration={"writer": {"host": "{{ $sys.id }}", "ports": [True]}}
            ),
            'services[0].endpointConfiguration.writer.ports[0]: "True" is not a port number (a '
            "whole number from 1 to 65535)",
        ),
    ],
)
def test_a_bad_operator_network_quota_or_endpoint_value_is_one_line_and_loads_nothing(
    change, error
):
    document = yaml.safe_load(WORKFLOWS)
    change(document)

    with pytest.raises(SpecError) as refused:
        load_spec(yaml.safe_dump(document, sort_keys=False))
    assert refused.value.errors == [error]


def test_an_unknown_operator_key_is_a_warning():
    result = check(operator(namespace="ops", helm="cnpg"))

    assert result.ok
    assert "x-opsdeck.operator.helm: unknown key; expected one of namespace, ports, install" in (
        result.warnings
    )


@pytest.mark.parametrize("name", ["Bad_Name", "", "a" * 64])
def test_an_applys_field_manager_is_a_valid_name(name):
    text = SHIPPED.replace('"--field-manager=opsdeck-modify"', f'"--field-manager={name}"')
    assert text != SHIPPED

    with pytest.raises(SpecError) as refused:
        load_spec(text)
    assert len(refused.value.errors) == 1
    assert "--field-manager=NAME goes with action apply" in refused.value.errors[0]


def test_a_field_manager_goes_with_an_apply_only():
    # The stop's hibernation is a merge patch: a field manager there is a mistake.
    flagged = 'mergeStrategy: merge\n                flags: ["--field-manager=x"]\n'
    text = SHIPPED.replace("mergeStrategy: merge\n", flagged, 1)

    with pytest.raises(SpecError, match="goes with action apply"):
        load_spec(text)
