"""The shipped plans wait for a grown volume by its size, however its provisioner writes it."""

from pathlib import Path

import pytest

from deployments.spec import load_spec
from deployments.workflow import conditions

SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.mark.parametrize(("spec", "template"), [("postgres-cnpg.yaml", "volume"),
                                                ("valkey.yaml", "grow")])  # fmt: skip
def test_a_modify_waits_until_each_volume_holds_at_least_the_new_size(spec, template):
    workflow = load_spec((SPECS / spec).read_text()).main.verbs["modify"].workflow
    text = workflow.templates[template].resource.success_condition
    condition = conditions.parse_condition(text.replace("{{ $var.storageGi }}", "15"))

    def holds(storage: str | None) -> bool:
        claim = {"status": {"capacity": {"storage": storage}} if storage else {}}
        return condition.is_true(claim)

    assert holds("15Gi") and holds("16106127360") and holds("16Gi")  # a provisioner rounded up
    assert not holds("10Gi") and not holds("14.5Gi") and not holds(None)
