"""Quantities from the spec's `x-opsdeck.usage` rules, through the bounded evaluator."""

from dataclasses import replace
from decimal import Decimal

import pytest

from deployments.metering import UsageError, quantities
from deployments.spec.loader import load_spec
from deployments.spec.params import validate_parameters
from tests.deployments.conftest import SPEC

CNPG = load_spec(SPEC.read_text())


def measured(**given):
    return quantities(CNPG, validate_parameters(CNPG.main.parameters, given))


def test_the_default_cnpg_instance_uses_one_server_of_1_core_2_gib_and_10_gib():
    assert measured() == {
        "cpu": Decimal(1),
        "memory": Decimal(2),
        "storage": Decimal(10),
        "replica": Decimal(1),
        "base": Decimal(1),
    }


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"instances": "3"}, {"cpu": "3", "memory": "6", "storage": "30", "replica": "3"}),
        (
            {"instances": "3", "cpu": "0.5", "memoryGi": "16", "storageGi": "250"},
            {"cpu": "1.5", "memory": "48", "storage": "750", "replica": "3"},
        ),
        ({"instances": "5", "cpu": "4"}, {"cpu": "20", "memory": "10", "storage": "50"}),
    ],
)
def test_quantities_multiply_per_server_sizes_by_the_server_count(given, expected):
    result = measured(**given)

    for dimension, value in expected.items():
        assert result[dimension] == Decimal(value)
        assert isinstance(result[dimension], Decimal)


def test_a_password_never_reaches_a_usage_rule():
    """A spec whose rule reads one is refused at load; a rule set past the loader still reads
    nothing of it."""
    spec = replace(load_spec(SPEC.read_text()), usage_rules={"cpu": "double(size(var.password))"})

    with pytest.raises(UsageError, match="The usage rule for cpu failed"):
        quantities(spec, validate_parameters(spec.main.parameters, {}))


def test_a_rule_that_fails_or_gives_no_number_is_a_clear_error():
    spec = load_spec(SPEC.read_text())
    rules = {"cpu": "var.cpu / 0", "memory": "'lots'", "storage": "-1.0"}

    with pytest.raises(UsageError, match="The usage rule for cpu failed"):
        quantities(replace(spec, usage_rules=rules), {"cpu": 1})
    with pytest.raises(UsageError, match="memory does not give a number"):
        quantities(replace(spec, usage_rules={"memory": "'lots'"}), {"cpu": 1})
    with pytest.raises(UsageError, match=r"storage gives -1\.0, not a quantity"):
        quantities(replace(spec, usage_rules={"storage": "-1.0"}), {"cpu": 1})


def test_a_rule_past_the_evaluators_bounds_is_stopped_with_a_clear_error():
    spec = replace(load_spec(SPEC.read_text()), usage_rules={"cpu": "+".join(["1.0"] * 3000)})

    with pytest.raises(UsageError) as caught:
        quantities(spec, {})

    assert str(caught.value) == (
        "The usage rule for cpu was stopped: CEL: the expression or its input is nested too deeply"
    )


def test_quantities_of_a_stored_plan_version(db):
    from deployments import services

    version = services.plan_load(text=SPEC.read_text()).version

    assert (
        quantities(version, {"instances": 2, "cpu": 4, "memoryGi": 8, "storageGi": 5})["cpu"] == 8
    )


def test_remembered_quantities_leave_the_password_out(db):
    from deployments import metering, services

    version = services.plan_load(text=SPEC.read_text()).version
    values = {"instances": 2, "cpu": 4, "memoryGi": 8, "storageGi": 5}
    first = metering.stored_quantities(version.pk, {**values, "password": "first"})
    measured = metering._stored_quantities.cache_info().misses

    # Another password is the same values: remembered, not measured again (nor kept).
    assert metering.stored_quantities(version.pk, {**values, "password": "second"}) == first
    assert metering._stored_quantities.cache_info().misses == measured
    assert first["cpu"] == 8
