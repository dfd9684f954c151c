"""What a spec author writes is bounded where it is loaded: a spec that would hang the loader,
break its storage, or crash every move of its runs is refused with a message saying where."""

import time

import pytest

from deployments.spec import validate
from deployments.spec.loader import SpecError, load_spec
from tests.engine.test_spec_validation import (
    CREATE,
    WORKFLOWS,
    check,
    errors,
    parameter,
    templates,
)

NAMED = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: '{{ inputs.parameters.n }}'\n"


def _chain(document, levels: int) -> None:
    """Templates L0…L<levels-1>, each a dag of three tasks calling the next with input n; the
    last names an object after n, which the main dag passes the modifiable `instances`."""
    templates_ = templates(document)
    for level in range(levels):
        callee = f"l{level + 1}" if level + 1 < levels else "named"
        passed = {"parameters": [{"name": "n", "value": "{{ inputs.parameters.n }}"}]}
        templates_.append({
            "name": f"l{level}", "inputs": {"parameters": [{"name": "n"}]},
            "dag": {"tasks": [
                {"name": f"t{i}", "template": callee, "arguments": passed} for i in range(3)
            ]},
        })  # fmt: skip
    templates_.append({
        "name": "named", "inputs": {"parameters": [{"name": "n"}]},
        "resource": {"action": "apply", "manifest": NAMED},
    })  # fmt: skip
    templates_[0]["dag"]["tasks"].append({
        "name": "chain", "template": "l0",
        "arguments": {"parameters": [{"name": "n", "value": "{{ $var.instances }}"}]},
    })  # fmt: skip


def test_a_parameter_traced_through_a_deep_chain_of_calls_is_found_in_seconds():
    started = time.monotonic()

    found = errors(lambda d: _chain(d, 16))  # 3 ** 16 paths: hours when walked path by path

    assert time.monotonic() - started < 30
    assert found == [
        f"{CREATE}.templates: a run would hold 64570084 steps (templates calling templates "
        "multiply them, before any fan-out); at most 1000",
        f"{CREATE}.templates[19].resource.manifest: metadata.name uses parameter "
        '"instances", which is modifiable; a parameter that feeds metadata.name must be '
        "modifiable: false",
    ]


def test_a_template_that_calls_itself_through_others_is_refused():
    def recurse(document):
        templates(document).extend([
            {"name": "ping", "dag": {"tasks": [{"name": "a", "template": "pong"}]}},
            {"name": "pong", "dag": {"tasks": [{"name": "b", "template": "ping"}]}},
        ])  # fmt: skip
        templates(document)[0]["dag"]["tasks"].append({"name": "loop", "template": "ping"})

    assert errors(recurse) == [
        f"{CREATE}.templates: template call cycle: ping -> pong -> ping (a template may not "
        "call itself, directly or through others)"
    ]


def test_a_chain_of_thousands_of_dependencies_is_read_without_running_out_of_stack():
    def chain(document):
        dag = templates(document)[0]["dag"]["tasks"]
        dag[:] = [
            {"name": f"t{i}", "template": "apply-secret", "dependencies": [f"t{(i - 1) % 1500}"]}
            for i in reversed(range(1500))
        ]
        for task in dag:
            task["arguments"] = {"parameters": [{"name": "ns", "value": "x"}]}

    found = errors(chain)

    cycle = next(e for e in found if "dependency cycle: " in e)
    assert cycle.count(" -> ") == 1500 and cycle.endswith(" -> t0 -> t1499")
    assert any("the workflow holds 1500 tasks; at most 500" in e for e in found)


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("x-note: 2024-01-01", None),  # a date is text, as JSON has it
        ("x-note: !!set {a, b}", "a !!set value is not JSON"),
        ("x-note: !!binary aGVsbG8=", "a !!binary value is not JSON"),
        ("x-note: .nan", ".nan is not a finite number"),
        ("x-note: -.inf", "-.inf is not a finite number"),
        ('x-note: "a\\0b"', "text may not hold a NUL character"),
        ('x-note: "\\ud800"', "text may not hold a lone surrogate"),
        ("x-note: 9223372036854775808", "does not fit in 64 bits"),
        ("x-note: " + "9" * 5000, "is too long"),
        ("x-note: {2024-01-01: a}", None),
    ],
)
def test_a_value_json_cannot_hold_is_refused_where_it_is_written(written, said):
    text = WORKFLOWS + written + "\n"
    line = text.count("\n")

    if said is None:
        assert validate(text).errors == []
        return
    with pytest.raises(SpecError) as refused:
        load_spec(text)
    (message,) = refused.value.errors
    assert message.startswith(f"The spec is not valid YAML at line {line}, column 9: ")
    assert said in message


@pytest.mark.parametrize(
    ("backoff", "said"),
    [
        ({"duration": "9" * 400}, "is not a finite number"),
        ({"duration": "400d"}, "is not a duration"),
        ({"duration": 40_000_000}, "is longer than a year"),
        ({"factor": "1e400"}, '"1e400" is not a number'),
    ],
)
def test_a_backoff_beyond_any_clock_is_refused(backoff, said):
    def retry(document):
        templates(document)[2]["retryStrategy"]["backoff"].update(backoff)

    found = errors(retry)

    assert len(found) == 1 and said in found[0], found
    assert found[0].startswith(f"{CREATE}.templates[2].retryStrategy.backoff.")


def test_func_calls_nested_without_end_are_refused():
    nested = "$var.password"
    for _ in range(2000):
        nested = f"$func.base64encode({nested})"

    def deep(document):
        templates(document)[1]["resource"]["manifest"] += f"data:\n  deep: '{{{{ {nested} }}}}'\n"

    found = errors(deep)

    assert len(found) == 1 and "$func calls nest more than 16 deep" in found[0], found


def test_an_expression_reading_free_text_a_customer_types_is_warned_of():
    def read(document, free: bool = True):
        if free:
            parameter(document, "database").pop("regex")
        tasks = templates(document)[0]["dag"]["tasks"]
        tasks[0]["when"] = "{{ $var.database }} == app"  # any text: `x == x || x` decides
        tasks[1]["when"] = "{{ $var.instances }} > 1"  # a number: nothing to inject

    found = check(read)
    patterned = check(lambda d: read(d, free=False))  # ^[a-z][a-z0-9_]*$: no operator fits

    assert found.errors == [] and patterned.warnings == []
    assert found.warnings == [
        f"{CREATE}.templates[0].dag.tasks[0].when: $var.database is free text written into "
        "the expression as it is: a value holding quotes or operators changes what it decides; "
        "give the parameter options or a regex, or compare it in the manifest"
    ]


def test_a_key_written_twice_in_one_mapping_is_refused_but_one_merged_in_may_be_again():
    twice = WORKFLOWS + "x-note: {a: 1, a: 2}\n"
    merged = WORKFLOWS + "x-base: &base {a: 1, b: 2}\nx-note: {<<: *base, a: 3}\n"

    with pytest.raises(SpecError) as refused:
        load_spec(twice)

    line = twice.count("\n")
    assert refused.value.errors == [
        f'The spec is not valid YAML at line {line}, column 16: the key "a" is written twice '
        "in one mapping"
    ]
    assert validate(merged).errors == []


def test_templates_calling_templates_past_the_steps_a_run_holds_are_refused_at_load():
    found = errors(lambda d: _chain(d, 8))  # 3 ** 8 = 6,561 objects named

    assert (
        f"{CREATE}.templates: a run would hold 9844 steps (templates calling templates "
        "multiply them, before any fan-out); at most 1000"
    ) in found
