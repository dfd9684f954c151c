"""`validate_spec`, `load_specs` and `check_condition`, as a platform engineer runs them."""

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import CommandError, call_command

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "tests" / "engine" / "specs"
EXAMPLE_CNPG = SPECS / "examples-cnpg.yaml"  # public Omnistrate specs, copied unchanged
BYOA = SPECS / "postgres-paas-operator-byoa-spec.yaml"
WORKFLOWS = SPECS / "postgres-workflows.yaml"
DOC = ROOT / "docs" / "spec-format.md"
DOC_EXAMPLE = ROOT / "docs" / "examples" / "postgres-minimal.yaml"

BROKEN = """\
name: Broken
services:
  - name: db
    operatorCRDConfiguration: {helmChartDependencies: []}
    apiParameters:
      - {key: size, name: Size, type: Float64, modifiable: true}
    systemWorkflows:
      create:
        workflow:
          entrypoint: main
          activeDeadlineSeconds: 600
          templates:
            - name: main
              resource:
                action: apply
                successCondition: status.phase == Cluster in healthy state
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata:
                    name: {{ $sys.id }}
                  data:
                    size: "{{ $var.sise }}"
"""
BROKEN_ERRORS = [
    'services[0].apiParameters[0]: optional parameter "size" needs a defaultValue',
    'services[0].systemWorkflows: missing required verb "modify"',
    'services[0].systemWorkflows: missing required verb "delete"',
    "services[0].systemWorkflows.create.workflow.templates[0].resource.successCondition: "
    'value "Cluster in healthy state" is not a valid label value; use a cel: condition',
    "services[0].systemWorkflows.create.workflow.templates[0].resource.manifest: "
    'undefined parameter reference $var.sise; no apiParameter has key "sise"',
]

CLUSTER = {
    "apiVersion": "postgresql.cnpg.io/v1",
    "kind": "Cluster",
    "metadata": {"name": "inst-abcd1234"},
    "status": {
        "phase": "Cluster in healthy state",
        "readyInstances": 3,
        "instances": 3,
        "conditions": [
            {"type": "LastBackupSucceeded", "status": "False"},
            {"type": "Ready", "status": "True"},
        ],
    },
}


def validate_spec(*files) -> tuple[str, CommandError | None]:
    out = StringIO()
    try:
        call_command("validate_spec", *map(str, files), stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def check_condition(obj, *args: str, tmp_path: Path, suffix: str = ".json") -> str:
    path = tmp_path / f"object{suffix}"
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    out = StringIO()
    call_command("check_condition", "--object", str(path), *args, stdout=out)
    return out.getvalue()


def manage(*args: str) -> subprocess.CompletedProcess:
    """`python manage.py …` in a fresh process that has only the test run's environment."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if k in {"PATH", "HOME", "LANG", "DATABASE_URL", "SECRET_KEY", "OPSDECK_ENCRYPTION_KEYS"}
    }
    return subprocess.run(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**keep, "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
             "CACHE_URL": "locmemcache://"},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


@pytest.fixture
def broken(tmp_path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    return path


# --- validate_spec ----------------------------------------------------------------------------


def test_a_valid_spec_is_ok_and_lists_its_warnings():
    out, error = validate_spec(EXAMPLE_CNPG)

    assert error is None
    assert out.splitlines() == [
        f"{EXAMPLE_CNPG}: ok",
        "  warning: services[0].operatorCRDConfiguration.template: "
        "metadata.namespace is replaced by the instance's namespace",
    ]


def test_a_workflow_without_a_deadline_is_warned_about_the_platform_default(tmp_path):
    document = yaml.safe_load(WORKFLOWS.read_text())
    del document["services"][0]["systemWorkflows"]["backup"]["workflow"]["activeDeadlineSeconds"]
    path = tmp_path / "no-deadline.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))

    out, error = validate_spec(path)

    assert error is None
    assert out.splitlines() == [
        f"{path}: ok",
        "  warning: services[0].systemWorkflows.backup.workflow.activeDeadlineSeconds: "
        "not set; the platform default for backup (7200 s) applies",
    ]


def test_an_invalid_spec_prints_one_path_qualified_line_per_error(broken):
    out, error = validate_spec(broken)

    assert out.splitlines() == [f"{broken}: {message}" for message in BROKEN_ERRORS]
    assert str(error) == "1 of 1 spec file(s) have errors."
    assert error.returncode == 1


def test_several_files_are_each_reported_and_one_bad_file_fails_the_run(broken):
    out, error = validate_spec(WORKFLOWS, broken, EXAMPLE_CNPG)

    lines = out.splitlines()
    assert lines[0] == f"{WORKFLOWS}: ok"
    assert lines[1 : 1 + len(BROKEN_ERRORS)] == [f"{broken}: {m}" for m in BROKEN_ERRORS]
    assert lines[1 + len(BROKEN_ERRORS)] == f"{EXAMPLE_CNPG}: ok"
    assert str(error) == "1 of 3 spec file(s) have errors."


def test_a_missing_file_is_an_error_line_for_that_file(tmp_path):
    missing = tmp_path / "nope.yaml"

    out, error = validate_spec(missing, WORKFLOWS)

    assert out.splitlines() == [
        f"{missing}: cannot read the file: No such file or directory",
        f"{WORKFLOWS}: ok",
    ]
    assert str(error) == "1 of 2 spec file(s) have errors."


def test_a_file_that_is_not_yaml_is_one_error_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")

    out, error = validate_spec(path)

    assert out.startswith(f"{path}: The spec is not valid YAML at line 2, column 1: ")
    assert len(out.splitlines()) == 1
    assert error is not None


@pytest.mark.parametrize("spec", [EXAMPLE_CNPG, BYOA], ids=["examples-cnpg", "byoa"])
def test_the_public_omnistrate_specs_validate(spec):
    out, error = validate_spec(spec)

    assert error is None, out
    assert out.splitlines()[0] == f"{spec}: ok"


def test_the_example_in_the_spec_format_guide_validates_without_warnings():
    out, error = validate_spec(DOC_EXAMPLE)

    assert error is None, out
    assert out.splitlines() == [f"{DOC_EXAMPLE}: ok"]


def test_the_spec_format_guide_shows_the_example_file_verbatim():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)

    assert DOC_EXAMPLE.read_text() in blocks


def test_the_command_exits_0_for_valid_specs_and_1_otherwise(broken):
    valid = manage("validate_spec", str(EXAMPLE_CNPG), str(BYOA))
    invalid = manage("validate_spec", str(WORKFLOWS), str(broken))

    assert valid.returncode == 0, valid.stderr
    assert valid.stdout.splitlines()[0] == f"{EXAMPLE_CNPG}: ok"
    assert invalid.returncode == 1
    assert f"{broken}: {BROKEN_ERRORS[0]}" in invalid.stdout.splitlines()
    assert invalid.stderr.strip() == "CommandError: 1 of 2 spec file(s) have errors."


# --- check_condition --------------------------------------------------------------------------


def test_a_met_success_condition_prints_succeeded(tmp_path):
    out = check_condition(
        CLUSTER, "--success", "status.readyInstances == 3, status.instances", tmp_path=tmp_path
    )

    assert out == "succeeded\n"


def test_a_success_condition_not_yet_met_prints_pending(tmp_path):
    out = check_condition(
        CLUSTER,
        "--success",
        "status.readyInstances == 3, status.readyInstances > 3",
        "--failure",
        "status.phase == failed",
        tmp_path=tmp_path,
    )

    assert out == "pending\n"


def test_any_matching_failure_requirement_prints_failed_before_success_is_checked(tmp_path):
    out = check_condition(
        CLUSTER,
        "--success",
        "status.readyInstances == 3",
        "--failure",
        "status.phase == failed, status.missing != anything",
        tmp_path=tmp_path,
    )

    assert out == "failed\n"


def test_an_unmet_failure_condition_alone_prints_succeeded(tmp_path):
    out = check_condition(CLUSTER, "--failure", "status.phase in (failed,error)", tmp_path=tmp_path)

    assert out == "succeeded\n"


def test_cel_conditions_query_lists_and_compare_values_with_spaces(tmp_path):
    ready = 'cel: self.status.conditions.exists(c, c.type == "Ready" && c.status == "True")'
    healthy = 'cel: self.status.phase == "Cluster in healthy state"'

    assert check_condition(CLUSTER, "--success", ready, tmp_path=tmp_path) == "succeeded\n"
    assert check_condition(CLUSTER, "--failure", healthy, tmp_path=tmp_path) == "failed\n"


def test_a_cel_condition_over_a_missing_field_is_false(tmp_path):
    out = check_condition(
        CLUSTER, "--success", "cel: self.status.currentPrimary == 'x'", tmp_path=tmp_path
    )

    assert out == "pending\n"


def test_a_yaml_object_as_kubectl_prints_it_is_accepted(tmp_path):
    text = """\
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  name: inst-abcd1234
  creationTimestamp: 2026-01-02T03:04:05Z
status:
  phase: Cluster in healthy state
"""

    out = check_condition(
        text,
        "--success",
        'cel: self.metadata.creationTimestamp == "2026-01-02T03:04:05Z"',
        tmp_path=tmp_path,
        suffix=".yaml",
    )

    assert out == "succeeded\n"


def test_a_selector_value_with_spaces_is_refused_with_a_hint(tmp_path):
    with pytest.raises(CommandError) as error:
        check_condition(
            CLUSTER, "--success", "status.phase == Cluster in healthy state", tmp_path=tmp_path
        )

    assert str(error.value) == (
        '--success: value "Cluster in healthy state" is not a valid label value; '
        "use a cel: condition"
    )


def test_a_cel_syntax_error_is_one_line(tmp_path):
    with pytest.raises(CommandError) as error:
        check_condition(CLUSTER, "--failure", "cel: self.status.phase ==", tmp_path=tmp_path)

    assert str(error.value).startswith("--failure: invalid CEL expression at line 1")
    assert "\n" not in str(error.value)


def test_bad_json_is_refused_with_its_position(tmp_path):
    with pytest.raises(CommandError) as error:
        check_condition('{"status": ', "--success", "status", tmp_path=tmp_path)

    assert str(error.value) == (
        f"{tmp_path / 'object.json'} is not valid JSON (Expecting value at line 1, column 12)"
    )


def test_a_missing_object_file_is_refused(tmp_path):
    with pytest.raises(CommandError, match="No such file or directory"):
        call_command("check_condition", "--object", str(tmp_path / "none.json"), stdout=StringIO())


def test_a_list_is_not_an_object(tmp_path):
    with pytest.raises(CommandError, match=r"must hold one object \(a mapping\), not list"):
        check_condition("[1, 2]", tmp_path=tmp_path)


def test_bad_input_exits_1_with_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "object.json"
    path.write_text("{not json")

    result = manage("check_condition", "--object", str(path), "--success", "status")

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"CommandError: {path} is not valid JSON "
        "(Expecting property name enclosed in double quotes at line 1, column 2)"
    ]


# --- hostile YAML: every command refuses it in one line -------------------------------------------

LAUGHS = "".join(  # a million values from six lines (a billion with nine)
    f"  lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}" if i else "lol"] * 10) + "]\n"
    for i in range(6)
)
HOSTILE = {  # what is added under x-opsdeck (from line 11), and the one error it gives
    "billion-laughs": (
        LAUGHS,
        "The spec is not valid YAML at line 16, column 16: "
        "alias *lol4 expands the document to more than 200000 values",
    ),
    "recursive-alias": (
        "  loop: &r [*r]\n",
        "The spec is not valid YAML at line 11, column 13: "
        "alias *r is inside its own anchor &r (recursive aliases are not allowed)",
    ),
    "deep-nesting": (
        "  deep: " + "[" * 10_000 + "]" * 10_000 + "\n",
        "The spec is not valid YAML at line 11, column 71: "
        "the document nests deeper than 64 levels",
    ),
}


def hostile_spec(tmp_path: Path, case: str) -> tuple[Path, str]:
    """The guide's valid example with a hostile block under x-opsdeck, and its one error."""
    block, message = HOSTILE[case]
    text = DOC_EXAMPLE.read_text()
    assert text.splitlines()[9] == "x-opsdeck:"
    path = tmp_path / f"{case}.yaml"
    path.write_text(text.replace("x-opsdeck:\n", "x-opsdeck:\n" + block, 1))
    return path, message


@pytest.mark.parametrize("case", HOSTILE)
def test_validate_spec_refuses_hostile_yaml_in_one_line(tmp_path, case):
    path, message = hostile_spec(tmp_path, case)

    out, error = validate_spec(path)

    assert out.splitlines() == [f"{path}: {message}"]
    assert str(error) == "1 of 1 spec file(s) have errors."


@pytest.mark.parametrize("case", HOSTILE)
def test_validate_spec_exits_1_on_hostile_yaml_without_a_traceback(tmp_path, case):
    path, message = hostile_spec(tmp_path, case)

    result = manage("validate_spec", str(path))

    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"{path}: {message}"]
    assert result.stderr.splitlines() == ["CommandError: 1 of 1 spec file(s) have errors."]


@pytest.mark.parametrize("case", HOSTILE)
def test_load_specs_refuses_hostile_yaml_in_one_line_and_stores_nothing(db, tmp_path, case):
    from billing.models import Plan
    from deployments.models import PlanVersion

    path, message = hostile_spec(tmp_path, case)
    err = StringIO()

    with pytest.raises(CommandError) as error:
        call_command("load_specs", str(path), stdout=StringIO(), stderr=err)

    assert str(error.value) == "some specs were not loaded"
    assert err.getvalue().splitlines() == [f"{path}: {message}"]
    assert not Plan.objects.exists()
    assert not PlanVersion.objects.exists()


@pytest.mark.parametrize("levels", [100, 10_000])
def test_check_condition_refuses_deeply_nested_json_in_one_line(tmp_path, levels):
    deep = '{"status": ' + "[" * levels + "]" * levels + "}"

    with pytest.raises(CommandError) as error:
        check_condition(deep, "--success", "status", tmp_path=tmp_path)

    assert str(error.value) == (
        f"{tmp_path / 'object.json'} is refused: the document nests deeper than 64 levels"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: Cluster\nstatus: &s {phase: [*s]}\n",
            "at line 2, column 21: alias *s is inside its own anchor &s "
            "(recursive aliases are not allowed)",
        ),
        (
            "kind: Cluster\nstatus:\n" + LAUGHS,
            "at line 8, column 16: alias *lol4 expands the document to more than 200000 values",
        ),
        (
            "kind: Cluster\nstatus: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n",
            "at line 2, column 261: the document nests deeper than 64 levels",
        ),
    ],
    ids=["recursive-alias", "billion-laughs", "deep-nesting"],
)
def test_check_condition_refuses_hostile_yaml_in_one_line(tmp_path, text, message):
    with pytest.raises(CommandError) as error:
        check_condition(text, "--success", "status", tmp_path=tmp_path, suffix=".yaml")

    assert str(error.value) == f"{tmp_path / 'object.yaml'} is refused {message}"


def test_check_condition_exits_1_on_deep_json_without_a_traceback(tmp_path):
    path = tmp_path / "object.json"
    path.write_text("[" * 10_000 + "]" * 10_000)

    result = manage("check_condition", "--object", str(path), "--success", "status")

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"CommandError: {path} is refused: the document nests deeper than 64 levels"
    ]


def test_a_condition_that_exceeds_its_time_limit_exits_1_with_one_line(tmp_path):
    path = tmp_path / "object.json"
    path.write_text(json.dumps(CLUSTER))
    sixty = "[" + ",".join(str(i) for i in range(60)) + "]"
    runaway = f"cel: {sixty}.map(a, {sixty}.map(b, {sixty}.map(c, {sixty}.map(d, a + b)))) != []"

    result = manage("check_condition", "--object", str(path), "--success", runaway)

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "CommandError: successCondition: CEL: the expression exceeded its time limit of 2 s"
    ]


def test_check_names_a_stored_plan_version_this_opsdeck_no_longer_loads(db):
    from django.core.checks import Tags, run_checks

    from deployments import services
    from deployments.models import PlanVersion

    text = (ROOT / "specs" / "postgres-cnpg.yaml").read_text()
    version = services.plan_load(text=text).version
    assert run_checks(databases=["default"], tags=[Tags.database]) == []
    # Stored by an Opsdeck that matched `regex` with Python's `re`: RE2 has no lookahead.
    old = text.replace('regex: "^[a-z][a-z0-9_]*$"', 'regex: "^(?!postgres$)[a-z][a-z0-9_]*$"', 1)
    PlanVersion.objects.create(plan=version.plan, number=version.number + 1, spec_text=old)

    found = run_checks(databases=["default"], tags=[Tags.database])

    assert [warning.id for warning in found] == ["deployments.W001"]
    assert found[0].msg.startswith(
        f"Plan {version.plan.key} version {version.number + 1} no longer loads:"
    )
    assert "regex" in found[0].msg
    out = StringIO()
    call_command(
        "check", "--database", "default", stderr=out, stdout=out
    )  # a warning, not a failure
    assert "deployments.W001" in out.getvalue()


def test_loading_a_plan_stores_its_service_name_and_the_migration_fills_it_for_older_plans(db):
    import importlib

    from django.apps import apps

    from billing.models import Plan
    from deployments import services

    plan = services.plan_load(text=(ROOT / "specs" / "valkey.yaml").read_text()).plan
    assert (plan.service, plan.service_name) == ("valkey", "Valkey")

    Plan.objects.filter(pk=plan.pk).update(service_name="")  # loaded before the field was
    fill = importlib.import_module("deployments.migrations.0022_plan_service_name_fill").fill
    fill(apps, None)

    plan.refresh_from_db()
    assert plan.service_name == "Valkey"
