"""`x-opsdeck.entitlements` and `x-opsdeck.subscription` are checked when a spec loads, with one
line per mistake at its path."""

import pytest

from deployments.spec.loader import SpecError, load_spec
from tests.deployments.conftest import SPEC


def _with(block: str, *, drop_legacy: bool = False) -> str:
    text = SPEC.read_text()
    start = text.index("  entitlements:")
    end = text.index("\nservices:")
    text = text[:start] + block.strip("\n") + "\n" + text[end:]
    return text.replace("maxNumberOfInstancesAllowed: 10\n", "") if drop_legacy else text


def _errors(block: str, **kwargs) -> list[str]:
    with pytest.raises(SpecError) as failed:
        load_spec(_with(block, **kwargs))
    return failed.value.errors


def test_the_shipped_spec_loads_its_entitlements_and_terms():
    spec = load_spec(SPEC.read_text())

    assert spec.max_instances == 10
    assert spec.entitlements == {
        "max_total": {"storage": 10000},
        "max_per_instance": {"replica": 5},
        "max_backup_retention_days": 365,
    }
    assert spec.subscription == {"auto_approve": True, "grace_days": 7, "stop_after_days": 7}


def test_without_the_keys_nothing_is_limited_and_the_terms_take_their_defaults():
    spec = load_spec(_with("", drop_legacy=True))

    assert (spec.max_instances, spec.entitlements) == (None, {})
    assert spec.subscription == {"auto_approve": True, "grace_days": 7, "stop_after_days": 7}


def test_max_instances_is_omnistrates_limit_by_another_name():
    spec = load_spec(_with("  entitlements: {maxInstances: 4}", drop_legacy=True))

    assert spec.max_instances == 4
    assert _errors("  entitlements: {maxInstances: 4}") == [
        "x-opsdeck.entitlements.maxInstances: is 4 but maxNumberOfInstancesAllowed is 10; give one"
    ]


def test_dimensions_must_be_usage_dimensions_and_numbers_at_least_0():
    errors = _errors("  entitlements: {maxTotal: {disk: 5}, maxPerInstance: {cpu: -1}}")

    assert errors == [
        'x-opsdeck.entitlements.maxTotal.disk: unknown dimension "disk"; expected one of the '
        "x-opsdeck.usage dimensions (cpu, memory, replica, storage)",
        'x-opsdeck.entitlements.maxPerInstance.cpu: "-1" is not a number of at least 0',
    ]


def test_denied_verbs_must_be_verbs_of_the_plan_and_never_create_or_delete():
    errors = _errors("  entitlements: {deniedVerbs: [failover, delete, teleport]}")

    assert errors == [
        'x-opsdeck.entitlements.deniedVerbs[1]: "delete" cannot be denied',
        'x-opsdeck.entitlements.deniedVerbs[2]: unknown verb "teleport"; expected one of the '
        "plan's verbs or restore.pointInTime",
    ]


def test_a_verb_always_allowed_denied_is_left_out_with_a_warning_and_the_spec_still_loads():
    # Versions stored before this was refused are read again on every use: they must load.
    spec = load_spec(_with("  entitlements: {deniedVerbs: [failover, stop, deleteBackup]}"))

    assert spec.entitlements == {"denied_verbs": ["failover"]}
    assert 'x-opsdeck.entitlements.deniedVerbs[1]: "stop" is always allowed' in spec.warnings[-2]
    spec = load_spec(_with("  entitlements: {deniedVerbs: [restore.pointInTime]}"))
    assert spec.entitlements == {"denied_verbs": ["restore.pointInTime"]}


def test_a_retention_limit_below_the_plans_own_retention_is_an_error():
    assert _errors("  entitlements: {maxBackupRetentionDays: 7}") == [
        "x-opsdeck.entitlements.maxBackupRetentionDays: is 7 but the plan's own "
        "backupRetentionInDays is 30; raise it or shorten that"
    ]


def test_cells_are_names_and_subscription_terms_are_checked():
    errors = _errors(
        "  entitlements: {cells: [eu-1, 3]}\n  subscription: {autoApprove: maybe, graceDays: -2}"
    )

    assert sorted(errors) == [
        "x-opsdeck.entitlements.cells: must be a list of cell names",
        'x-opsdeck.subscription.autoApprove: "maybe" is not true or false',
        'x-opsdeck.subscription.graceDays: "-2" is not a whole number of at least 0',
    ]


def test_unknown_keys_are_warnings():
    spec = load_spec(_with("  entitlements: {maxInstance: 3}"))

    assert spec.warnings == [
        "x-opsdeck.entitlements.maxInstance: unknown key; expected one of maxInstances, "
        "maxTotal, maxPerInstance, cells, deniedVerbs, maxBackupRetentionDays"
    ]
