"""Workflows synthesized from the legacy `operatorCRDConfiguration` model.

Older Omnistrate specs describe a service by one custom resource (`template`), extra manifests
(`supplementalFiles`), `readinessConditions` and `outputParameters`, with no workflows. Opsdeck
turns that into ordinary create / modify / delete verbs, so the engine knows one model:

- create and modify: a DAG `main` that applies each supplemental file (`supplemental-<i>`,
  in parallel), then applies the custom resource (task `cr`, depending on all of them) and
  waits for it to be ready. Server-side apply makes create and modify the same steps.
- delete: deletes the custom resource (`cr`), then each supplemental file.
- outputs: `"$var._crd.<path>"` becomes `"$tasks.cr.resource.<path>"`.

Readiness gating: the readinessConditions map is compiled into ONE `cel:` successCondition on
the `cr` task (Argo's selector syntax can neither query `conditions[]` nor compare with values
containing spaces such as "Cluster in healthy state"). Each entry `<JSONPath>: <expected>`
becomes `string(<path>) == "<expected as text>"`, and all entries are joined with `&&`:

- `$var._crd` is the object (`self`); `.a`, `['a']` and `[N]` become CEL member/index access;
- a filter `[?(@.type=="Ready")]` or a wildcard `[*]` becomes `.exists(e, <filter> && <rest>)`,
  so, as in JSONPath's list result, one matching element is enough;
- the comparison is textual (`string(x) == "3"`), because Omnistrate compares the rendered
  value: `readyInstances: 3` matches the integer 3 and `status: "True"` the string "True"; an
  unquoted YAML boolean matches either spelling (`true` or `True`).

A missing field makes a CEL condition false, so the task keeps waiting until the operator
reports readiness or the verb's deadline ends it. With outputParameters but no
readinessConditions the condition is `cel: true`, so the task still captures the object the
outputs read. A JSONPath outside this subset is a spec
error, reported against the readinessConditions entry.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from deployments.spec.model import (
    ResourceAction,
    Task,
    Template,
    Verb,
    Workflow,
)

CRD_ROOT = "$var._crd"
CR_TASK = "cr"
ENTRYPOINT = "main"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILTER = re.compile(
    r"""\?\(\s*@((?:\.[A-Za-z_][A-Za-z0-9_-]*)+)\s*(==|!=)\s*
        ("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|-?\d+(?:\.\d+)?|true|false)\s*\)""",
    re.VERBOSE,
)


class LegacyError(ValueError):
    """A legacy construct Opsdeck cannot translate."""


@dataclass
class _Step:
    kind: str  # "field", "index", "each" (wildcard or filter)
    value: Any = None
    test: tuple[list[str], str, Any] | None = None  # filter: (relative fields, op, literal)


def _literal(text: str) -> Any:
    if text[0] in "\"'":
        return text[1:-1].replace("\\" + text[0], text[0])
    if text in ("true", "false"):
        return text == "true"
    return float(text) if "." in text else int(text)


def parse_path(path: str) -> list[_Step]:
    """Split a `$var._crd...` JSONPath into steps; raises LegacyError outside the subset."""
    if not path.startswith(CRD_ROOT):
        raise LegacyError(f'JSONPath "{path}" must start with {CRD_ROOT}')
    rest, steps = path[len(CRD_ROOT) :], []
    while rest:
        if rest.startswith("."):
            match = re.match(r"\.([A-Za-z_][A-Za-z0-9_-]*)", rest)
            if not match:
                raise LegacyError(f'JSONPath "{path}": cannot read the field at "{rest}"')
            steps.append(_Step("field", match.group(1)))
            rest = rest[match.end() :]
            continue
        if not rest.startswith("["):
            raise LegacyError(f'JSONPath "{path}": unexpected "{rest}"')
        end = _closing_bracket(rest, path)
        inner = rest[1:end].strip()
        rest = rest[end + 1 :]
        if inner == "*":
            steps.append(_Step("each"))
        elif inner.isdigit():
            steps.append(_Step("index", int(inner)))
        elif len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "\"'":
            steps.append(_Step("field", inner[1:-1]))
        elif (match := _FILTER.fullmatch(inner)) is not None:
            fields = match.group(1).split(".")[1:]
            steps.append(_Step("each", test=(fields, match.group(2), _literal(match.group(3)))))
        else:
            raise LegacyError(
                f'JSONPath "{path}": unsupported selector [{inner}]; use a field, an index, '
                '[*] or a filter like [?(@.type=="Ready")]'
            )
    if not steps:
        raise LegacyError(f'JSONPath "{path}" names no field of the object')
    return steps


def _closing_bracket(text: str, path: str) -> int:
    quote = None
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "]":
            return i
    raise LegacyError(f'JSONPath "{path}": unclosed "["')


def _cel_literal(value: Any) -> str:
    """`value` as a CEL literal: JSON's escapes are CEL's, and a character beyond U+FFFF is
    written as itself (JSON's surrogate pair would be two characters to CEL)."""
    return json.dumps(value, ensure_ascii=False)


def _member(base: str, name: str) -> str:
    return f"{base}.{name}" if _IDENT.fullmatch(name) else f"{base}[{_cel_literal(name)}]"


def _compare(expr: str, op: str, expected: Any) -> str:
    if isinstance(expected, bool):
        spellings = ["true", "True"] if expected else ["false", "False"]
        test = f"string({expr}) in {_cel_literal(spellings)}"
        return test if op == "==" else f"!({test})"
    if isinstance(expected, float) and expected.is_integer():
        expected = int(expected)
    text = expected if isinstance(expected, str) else json.dumps(expected)
    return f"string({expr}) {op} {_cel_literal(text)}"


def _translate(base: str, steps: list[_Step], expected: Any, depth: int = 0) -> str:
    for i, step in enumerate(steps):
        if step.kind == "field":
            base = _member(base, step.value)
        elif step.kind == "index":
            base = f"{base}[{step.value}]"
        else:
            var = f"e{depth}"
            inner = _translate(var, steps[i + 1 :], expected, depth + 1)
            if step.test is not None:
                fields, op, literal = step.test
                target = var
                for name in fields:
                    target = _member(target, name)
                inner = f"{_compare(target, op, literal)} && {inner}"
            return f"{base}.exists({var}, {inner})"
    return _compare(base, "==", expected)


def readiness_expression(path: str, expected: Any) -> str:
    """The CEL test (over `self`) for one readinessConditions entry."""
    return _translate("self", parse_path(path), expected)


def output_expression(path: str) -> str:
    """`$var._crd.status.image` as a verb output read from the `cr` task's object."""
    steps = parse_path(path)
    if any(step.kind == "each" for step in steps):
        raise LegacyError(f'output "{path}" cannot select from a list; use a dotted path')
    if any(step.kind == "field" and "." in step.value for step in steps):
        raise LegacyError(f'output "{path}" names a field with a dot, which a dotted path cannot')
    dotted = ".".join(str(step.value) for step in steps)
    return f"$tasks.{CR_TASK}.resource.{dotted}"


def _resource_template(
    name: str, action: str, manifest: str, source: dict[str, str], condition: str | None = None
) -> Template:
    return Template(
        name=name,
        resource=ResourceAction(action=action, manifest=manifest, success_condition=condition),
        path=source["resource.manifest"],
        source=source,
    )


def synthesize(
    config: dict, path: str, verbs: list[str], deadlines: dict[str, int]
) -> tuple[dict[str, Verb], list[str]]:
    """Build the `verbs` (a subset of create/modify/delete) from an operatorCRDConfiguration.

    `path` is the configuration's spec path, used in messages and kept on each template.
    Returns the verbs and the errors found while translating.
    """
    errors: list[str] = []
    template = config.get("template")
    supplemental = config.get("supplementalFiles") or []
    if not isinstance(supplemental, list):
        errors.append(f"{path}.supplementalFiles: must be a list of manifests")
        supplemental = []
    readiness = config.get("readinessConditions") or {}
    if not isinstance(readiness, dict):
        errors.append(f"{path}.readinessConditions: must map a JSONPath to its expected value")
        readiness = {}
    condition_path = f"{path}.readinessConditions"
    tests = []
    for key, value in readiness.items():
        try:
            tests.append(readiness_expression(str(key), value))
        except LegacyError as exc:
            errors.append(f'{condition_path}["{key}"]: {exc}')
    outputs: dict[str, str] = {}
    raw_outputs = config.get("outputParameters") or {}
    if isinstance(raw_outputs, dict):
        for name, expr in raw_outputs.items():
            try:
                outputs[str(name)] = output_expression(str(expr))
            except LegacyError as exc:
                errors.append(f'{path}.outputParameters["{name}"]: {exc}')
    else:
        errors.append(f"{path}.outputParameters: must map a display name to a $var._crd path")
    # outputs read the object a gated task captured: with no readiness, gate on "true"
    condition = "cel: " + " && ".join(tests) if tests else ("cel: true" if outputs else None)

    files = []
    for i, text in enumerate(supplemental):
        if isinstance(text, str):
            files.append((i, text))
        else:
            errors.append(f"{path}.supplementalFiles[{i}]: must be a manifest string")

    result: dict[str, Verb] = {}
    for verb in verbs:
        deleting = verb == "delete"
        action = "delete" if deleting else "apply"
        templates: dict[str, Template] = {}
        tasks: list[Task] = []
        cr_source = {"resource.manifest": f"{path}.template"}
        if condition and not deleting:
            cr_source["resource.successCondition"] = condition_path
        templates["apply-cr" if not deleting else "delete-cr"] = _resource_template(
            "apply-cr" if not deleting else "delete-cr",
            action,
            str(template),
            cr_source,
            None if deleting else condition,
        )
        names = []
        for i, text in files:
            name = f"{action}-supplemental-{i}"
            templates[name] = _resource_template(
                name, action, text, {"resource.manifest": f"{path}.supplementalFiles[{i}]"}
            )
            names.append(f"supplemental-{i}")
            tasks.append(
                Task(
                    name=f"supplemental-{i}",
                    template=name,
                    dependencies=[CR_TASK] if deleting else None,
                )
            )
        cr_task = Task(
            name=CR_TASK,
            template="delete-cr" if deleting else "apply-cr",
            dependencies=None if deleting or not names else names,
        )
        if deleting:
            tasks.insert(0, cr_task)
        else:
            tasks.append(cr_task)
        templates[ENTRYPOINT] = Template(name=ENTRYPOINT, tasks=tasks, path=f"{path}")
        workflow = Workflow(
            entrypoint=ENTRYPOINT,
            templates={ENTRYPOINT: templates.pop(ENTRYPOINT), **templates},
            active_deadline_seconds=deadlines[verb],
        )
        result[verb] = Verb(
            name=verb,
            workflow=workflow,
            outputs={} if deleting else dict(outputs),
            display_name=verb.capitalize(),
            synthesized=True,
            path=path,
        )
    return result, errors
