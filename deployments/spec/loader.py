"""Loading a service plan spec (YAML, Omnistrate-compatible) into the typed model.

`load_spec` returns a `PlanSpec` or raises `SpecError` with every problem found; the checks
themselves live in `validation`. Keys Opsdeck does not know are kept in the `raw` mappings and
never make a spec fail.

Opsdeck's own settings live under one top-level key, `x-opsdeck`:

    x-opsdeck:
      plan: postgres-production      # stable plan key (default: the slug of `name`)
      service: postgresql            # catalog service grouping plans (default: the plan key)
      currency: usd                  # the currency of `pricing` (default: usd)
      kinds: [Cluster, Backup, Secret]   # kinds (or apiVersion/Kind) workflows may touch
      operator: {namespace: db-system, ports: [8000], install: install the DB operator first}
      network: {port: 5432}          # the port customers reach (default: the endpoint's ports)
      usage:                         # per pricing dimension, a CEL expression over `var`
        cpu: "double(var.cpu) * double(var.instances)"
      display:
        groups: [{name: Compute, parameters: [cpu, instances]}]
      connection:                    # what the Connection tab shows (parameters by key)
        {user: owner, database: database, password: password, scheme: postgresql}
      entitlements:                  # limits over the usage dimensions (docs/spec-format.md)
        {maxInstances: 10, maxTotal: {storage: 2000}, maxPerInstance: {replica: 5},
         cells: [eu-1], deniedVerbs: [restore.pointInTime], maxBackupRetentionDays: 35}
      subscription: {autoApprove: true, graceDays: 7, stopAfterDays: 7}

Without `kinds`, the kinds found in the spec's own manifests are the allowed ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

from deployments.spec import legacy, params
from deployments.spec.model import (
    FIELD_MANAGER_FLAG,
    PARAMETER_TYPES,
    REQUIRED_VERBS,
    SYSTEM_VERBS,
    OutputParameter,
    Parameter,
    PlanSpec,
    Requirement,
    ResourceAction,
    RetryStrategy,
    Service,
    Task,
    Template,
    Verb,
    Workflow,
    default_deadline,
)
from deployments.workflow import safe_yaml

PRICING_DIMENSIONS = (
    "cpu",
    "memory",
    "storage",
    "replica",
    "deploymentCell",
    "backupStorage",
    "base",
)
PRICE_TIME_UNITS = ("hour", "month")
DEFAULT_CURRENCY = "usd"
_PRICE_PLACES = Decimal("0.00000001")  # what billing stores
RESOURCE_ACTIONS = ("get", "create", "apply", "delete", "replace", "patch")
FIELD_MANAGER_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
MERGE_STRATEGIES = ("strategic", "merge", "json")
RETRY_POLICIES = ("Always", "OnFailure", "OnError", "OnTransientError")
CUSTOM_SCOPES = ("fleet", "END_CUSTOMER")
_OTHER_TEMPLATE_TYPES = ("steps", "container", "script", "containerSet", "suspend", "http", "data")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
_SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_CURRENCY = re.compile(r"^[a-z]{3}$")  # an ISO 4217 code in lowercase, as Stripe writes it


class SpecError(ValueError):
    """A spec that cannot be used; `errors` are path-qualified sentences."""

    def __init__(self, errors: list[str], warnings: list[str] | None = None):
        self.errors = list(errors)
        self.warnings = list(warnings or [])
        super().__init__("\n".join(self.errors))


@dataclass
class Report:
    """Errors and warnings collected while reading a spec."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Errors of rules added after plan versions were stored under the rules before: a spec
    # loaded now is refused for them, a stored version is read with them as warnings (its
    # instances must stay operable; `manage.py check` names it).
    later_errors: list[str] = field(default_factory=list)

    def error(self, path: str, message: str) -> None:
        """Record an error about the value at `path`."""
        self.errors.append(f"{path}: {message}" if path else message)

    def later_error(self, path: str, message: str) -> None:
        """Record an error of a rule a stored version may predate (`later_errors`)."""
        self.later_errors.append(f"{path}: {message}" if path else message)

    def warn(self, path: str, message: str) -> None:
        """Record a warning about the value at `path`."""
        self.warnings.append(f"{path}: {message}" if path else message)


@dataclass
class Built:
    """The outcome of reading a spec: the model (None when unusable) and the parsed YAML."""

    spec: PlanSpec | None
    document: Any
    report: Report


def slugify(text: str) -> str:
    """`PostgreSQL — Production` → `postgresql-production`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def parse_yaml(text: str) -> Any:
    """Parse spec text within the bounds of `safe_yaml` (alias expansion, nesting, recursive
    aliases); raises SpecError with one message giving the line and column."""
    try:
        return safe_yaml.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError([f"The spec is not valid YAML{where}: {problem}"]) from None


def parse_duration(value: Any) -> float:
    """Argo durations: a number of seconds, or Go-style text such as "10s", "1m30s", "2h"."""
    if isinstance(value, bool):
        raise ValueError(f'"{value}" is not a duration')
    if isinstance(value, int | float):
        seconds = _finite(value)
    else:
        text = str(value).strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = _finite(text)
        else:
            parts = _DURATION_PART.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f'"{value}" is not a duration such as 30s, 5m or 1h')
            seconds = _finite(sum(_finite(n) * _DURATION_UNITS[u] for n, u in parts))
    if seconds > _LONGEST_DURATION:
        raise ValueError(f'"{value}" is longer than a year')
    return seconds


_LONGEST_DURATION = 366 * 86_400.0


def _finite(value: Any) -> float:
    """`value` as a float; ValueError for one too large for a float, infinite or not a
    number."""
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        raise ValueError(f'"{value}" is not a finite number') from None
    if not math.isfinite(number):
        raise ValueError(f'"{value}" is not a finite number')
    return number


def _number(value: Any) -> int | float:
    """A YAML number or numeric string; integral values come back as int. ValueError for one
    that is not a finite number."""
    if isinstance(value, bool) or value is None:
        raise ValueError
    number = _finite(value)
    return int(number) if number.is_integer() else number


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _mapping(value: Any, path: str, report: Report) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        report.error(path, "must be a mapping")
        return {}
    return value


def _list(value: Any, path: str, report: Report) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        report.error(path, "must be a list")
        return []
    return value


def _bool(data: dict, key: str, path: str, report: Report, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    report.error(_at(path, key), f'"{value}" is not true or false')
    return default


def _text(data: dict, key: str, path: str, report: Report, *, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            report.error(_at(path, key), "is required")
        return ""
    if isinstance(value, dict | list):
        report.error(_at(path, key), "must be text")
        return ""
    return str(value)


def _int(data: dict, key: str, path: str, report: Report) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        number = _number(value)
    except (TypeError, ValueError):
        number = None
    if not isinstance(number, int) or number < 0:
        report.error(_at(path, key), f'"{value}" is not a whole number of at least 0')
        return None
    return number


def _deadline(raw: dict, path: str, report: Report) -> int | None:
    """An `activeDeadlineSeconds`: whole seconds, at most a year, as every duration."""
    seconds = _int(raw, "activeDeadlineSeconds", path, report)
    if seconds is not None and seconds > _LONGEST_DURATION:
        report.error(_at(path, "activeDeadlineSeconds"), f'"{seconds}" is longer than a year')
        return None
    return seconds


def _named_values(value: Any, path: str, report: Report) -> dict[str, Any]:
    """Argo `parameters: [{name, value}]` as a name → value mapping."""
    result: dict[str, Any] = {}
    for i, item in enumerate(_list(value, path, report)):
        if not isinstance(item, dict) or not item.get("name"):
            report.error(f"{path}[{i}]", "must be a mapping with a name")
            continue
        result[str(item["name"])] = item.get("value")
    return result


# --- parameters -------------------------------------------------------------------------


def build_parameter(raw: Any, path: str, report: Report) -> Parameter | None:
    """One `apiParameters` entry; a defaultValue that breaks its own rules is an error."""
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping")
        return None
    key = _text(raw, "key", path, report, required=True)
    kind = _text(raw, "type", path, report, required=True)
    if kind and kind not in PARAMETER_TYPES:
        report.error(
            f"{path}.type", f'unknown type "{kind}"; expected one of {", ".join(PARAMETER_TYPES)}'
        )
    parameter = Parameter(
        key=key,
        name=_text(raw, "name", path, report) or key,
        description=_text(raw, "description", path, report),
        type=kind,
        modifiable=_bool(raw, "modifiable", path, report, False),
        required=_bool(raw, "required", path, report, False),
        export=_bool(raw, "export", path, report, True),
        raw=raw,
    )
    options = raw.get("options")
    if options is not None:
        if isinstance(options, list) and all(not isinstance(o, dict | list) for o in options):
            parameter.options = [str(o) for o in options]
        else:
            report.error(f"{path}.options", "must be a list of values")
    limits = raw.get("limits")
    if limits is not None:
        parameter.limits = _limits(limits, f"{path}.limits", report)
    regex = raw.get("regex")
    if regex is not None:
        try:
            params.pattern_compiled(str(regex))
            parameter.regex = str(regex)
        except ValueError as exc:
            report.error(f"{path}.regex", f"is not a valid regular expression ({exc})")
    extension = raw.get("x-opsdeck")
    if extension is not None:
        _parameter_extension(parameter, extension, f"{path}.x-opsdeck", report)
    if not key or kind not in PARAMETER_TYPES:
        return parameter
    if parameter.options:
        parameter.options = _options(parameter, f"{path}.options", report)
    default = raw.get("defaultValue")
    if default is not None and not (isinstance(default, str) and default == ""):
        try:
            parameter.default = params.coerce(parameter, default)
            params.check(parameter, parameter.default)
        except ValueError as exc:
            parameter.default = None
            report.error(f"{path}.defaultValue", f'default "{default}" is invalid: {exc}')
    elif not parameter.required and kind != "Password":
        report.error(path, f'optional parameter "{key}" needs a defaultValue')
    elif kind == "Password" and params.password_length(parameter) > params.PASSWORD_LENGTH_MAX:
        report.error(
            path,
            f'passwords generated for "{key}" would be longer than Opsdeck makes them (at most '
            f"{params.PASSWORD_LENGTH_MAX} characters): give it a defaultValue or a lower "
            "limits.min",
        )
    elif kind == "Password" and not params.password_generable(parameter):
        report.later_error(
            path,
            f'no password generated for "{key}" meets its own limits and regex: give it a '
            "defaultValue or loosen them",
        )
    return parameter


def _options(parameter: Parameter, path: str, report: Report) -> list[str]:
    """A parameter's options as its form field offers them and `params.check` reads them: each
    written as a value of its type is (YAML's `2.0` for a Float64 is "2", `true` for a Boolean
    "true"), else a customer choosing it would be told it is not one of them. An option the
    parameter's own type, limits, step or regex refuse is an error: no one could choose it."""
    unbounded = dataclasses.replace(parameter, options=None)
    written: list[str] = []
    for i, option in enumerate(parameter.options or []):
        try:
            value = params.coerce(parameter, option)
            params.check(unbounded, value)
        except ValueError as exc:
            report.later_error(f"{path}[{i}]", f'option "{option}" is invalid: {exc}')
            continue
        text = params.format_value(parameter, value)
        if text in written:
            report.later_error(f"{path}[{i}]", f'option "{option}" is offered twice')
            continue
        written.append(text)
    return written


REGEX_MESSAGE_MAX = 200  # characters: a sentence beside a form field
RESERVED_MAX = 100  # words a parameter may reserve


def _parameter_extension(parameter: Parameter, raw: Any, path: str, report: Report) -> None:
    """A parameter's `x-opsdeck`: `step` (Float64 values are whole multiples of it; 1 makes
    the parameter a whole number), `growOnly` (a modify may raise a Float64, never lower it: a
    volume's size), `regexMessage` (what a value its `regex` refuses is told, in words) and
    `reserved` (String values it may not take: words, or prefixes ending in "*")."""
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping")
        return
    reserved = raw.get("reserved")
    if reserved is not None:
        if parameter.type != "String":
            report.error(f"{path}.reserved", "only a String parameter reserves values")
        elif (
            not isinstance(reserved, list)
            or not reserved
            or len(reserved) > RESERVED_MAX
            or not all(isinstance(w, str) and w.strip("*") and "*" not in w[:-1] for w in reserved)
        ):
            report.error(
                f"{path}.reserved",
                f"must be a list of 1 to {RESERVED_MAX} words, each may end in * (a prefix)",
            )
        else:
            parameter.reserved = tuple(reserved)
    message = raw.get("regexMessage")
    if message is not None:
        if not isinstance(message, str) or not message.strip() or "\n" in message.strip():
            report.error(f"{path}.regexMessage", "must be one line of text")
        elif len(message) > REGEX_MESSAGE_MAX:
            report.error(
                f"{path}.regexMessage", f"must be at most {REGEX_MESSAGE_MAX} characters long"
            )
        elif parameter.raw.get("regex") is None:
            report.error(f"{path}.regexMessage", "is for a parameter with a regex")
        else:
            parameter.regex_message = message.strip()
    grow_only = raw.get("growOnly")
    if grow_only is not None:
        if not isinstance(grow_only, bool):
            report.error(f"{path}.growOnly", "must be true or false")
        elif grow_only and parameter.type != "Float64":
            report.error(f"{path}.growOnly", "only a Float64 parameter can grow")
        else:
            parameter.grow_only = grow_only
    if raw.get("step") is None:
        return
    try:
        step = _number(raw["step"])
    except (TypeError, ValueError):
        report.error(f"{path}.step", f'"{raw["step"]}" is not a number')
        return
    if parameter.type != "Float64":
        report.error(f"{path}.step", "only a Float64 parameter has a step")
    elif step <= 0:
        report.error(f"{path}.step", "must be greater than 0")
    else:
        parameter.step = step


def _limits(raw: Any, path: str, report: Report) -> dict | None:
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping with min and/or max")
        return None
    limits = dict(raw)
    for bound in ("min", "max"):
        if raw.get(bound) is None:
            limits.pop(bound, None)
            continue
        try:
            limits[bound] = _number(raw[bound])
        except (TypeError, ValueError):
            report.error(f"{path}.{bound}", f'"{raw[bound]}" is not a number')
            limits.pop(bound)
    if "min" in limits and "max" in limits and limits["min"] > limits["max"]:
        report.error(path, f"min ({limits['min']}) is greater than max ({limits['max']})")
    return limits


def build_parameters(raw: Any, path: str, report: Report) -> list[Parameter]:
    """A list of `apiParameters`; duplicate keys are errors."""
    result: list[Parameter] = []
    seen: set[str] = set()
    for i, item in enumerate(_list(raw, path, report)):
        parameter = build_parameter(item, f"{path}[{i}]", report)
        if parameter is None:
            continue
        if parameter.key in seen:
            report.error(f"{path}[{i}].key", f'duplicate parameter key "{parameter.key}"')
        seen.add(parameter.key)
        result.append(parameter)
    return result


# --- workflows --------------------------------------------------------------------------


def _retry(raw: Any, path: str, report: Report) -> RetryStrategy | None:
    if raw is None:
        return None
    raw = _mapping(raw, path, report)
    retry = RetryStrategy()
    if raw.get("limit") is not None:
        try:
            retry.limit = int(_number(raw["limit"]))
        except (TypeError, ValueError):
            report.error(f"{path}.limit", f'"{raw["limit"]}" is not a whole number')
    policy = raw.get("retryPolicy")
    if policy is not None:
        if policy in RETRY_POLICIES:
            retry.policy = policy
        else:
            report.error(
                f"{path}.retryPolicy",
                f'unknown policy "{policy}"; expected one of {", ".join(RETRY_POLICIES)}',
            )
    backoff = _mapping(raw.get("backoff"), f"{path}.backoff", report)
    for key, attribute in (
        ("duration", "duration"),
        ("cap", "cap"),
        ("maxDuration", "max_duration"),
    ):
        if backoff.get(key) is not None:
            try:
                setattr(retry, attribute, parse_duration(backoff[key]))
            except ValueError as exc:
                report.error(f"{path}.backoff.{key}", str(exc))
    if backoff.get("factor") is not None:
        try:
            retry.factor = float(_number(backoff["factor"]))
        except (TypeError, ValueError):
            report.error(f"{path}.backoff.factor", f'"{backoff["factor"]}" is not a number')
    return retry


def _resource(raw: Any, path: str, report: Report) -> ResourceAction:
    raw = _mapping(raw, path, report)
    action = _text(raw, "action", path, report, required=True)
    if action and action not in RESOURCE_ACTIONS:
        report.error(
            f"{path}.action",
            f'unknown action "{action}"; expected one of {", ".join(RESOURCE_ACTIONS)}',
        )
    manifest = raw.get("manifest")
    if isinstance(manifest, dict | list):  # an object, or a JSON patch's operations
        manifest = yaml.safe_dump(manifest, sort_keys=False)
    elif manifest is None or not isinstance(manifest, str):
        report.error(f"{path}.manifest", "is required (one Kubernetes object as YAML text)")
        manifest = ""
    merge = _text(raw, "mergeStrategy", path, report) or "strategic"
    if merge not in MERGE_STRATEGIES:
        report.error(
            f"{path}.mergeStrategy",
            f'unknown strategy "{merge}"; expected one of {", ".join(MERGE_STRATEGIES)}',
        )
    flags = raw.get("flags") or []
    if not isinstance(flags, list):
        report.error(f"{path}.flags", "must be a list")
        flags = []
    for flag in flags:
        if str(flag).startswith(FIELD_MANAGER_FLAG):
            name = str(flag).removeprefix(FIELD_MANAGER_FLAG)
            if action != "apply" or not FIELD_MANAGER_NAME.fullmatch(name):
                report.error(
                    f"{path}.flags",
                    f"{FIELD_MANAGER_FLAG}NAME goes with action apply, NAME being lowercase "
                    "letters, digits and dashes (at most 63)",
                )
    return ResourceAction(
        action=action,
        manifest=manifest,
        success_condition=_text(raw, "successCondition", path, report) or None,
        failure_condition=_text(raw, "failureCondition", path, report) or None,
        merge_strategy=merge,
        flags=[str(f) for f in flags],
        set_owner_reference=_bool(raw, "setOwnerReference", path, report, False),
    )


def _task(raw: Any, path: str, report: Report) -> Task | None:
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping")
        return None
    dependencies = raw.get("dependencies")
    if dependencies is not None:
        if isinstance(dependencies, list) and all(isinstance(d, str) for d in dependencies):
            dependencies = list(dependencies)
        else:
            report.error(f"{path}.dependencies", "must be a list of task names")
            dependencies = None
    with_items = raw.get("withItems")
    if with_items is not None and not isinstance(with_items, list):
        report.error(f"{path}.withItems", "must be a list")
        with_items = None
    with_param = raw.get("withParam")
    if with_param is not None and not isinstance(with_param, str):
        report.error(f"{path}.withParam", "must be text that renders to a JSON list")
        with_param = None
    if with_items is not None and with_param is not None:
        report.error(path, "a task takes withItems or withParam, not both")
    continue_on = _mapping(raw.get("continueOn"), f"{path}.continueOn", report)
    return Task(
        name=_text(raw, "name", path, report, required=True),
        template=_text(raw, "template", path, report, required=True),
        dependencies=dependencies,
        depends=_text(raw, "depends", path, report) or None,
        when=_text(raw, "when", path, report) or None,
        arguments=_named_values(
            _mapping(raw.get("arguments"), f"{path}.arguments", report).get("parameters"),
            f"{path}.arguments.parameters",
            report,
        ),
        with_items=with_items,
        with_param=with_param,
        continue_on={k: bool(v) for k, v in continue_on.items() if k in ("failed", "error")},
    )


def _template(raw: Any, path: str, report: Report) -> Template | None:
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping")
        return None
    template = Template(name=_text(raw, "name", path, report, required=True), path=path)
    inputs = _mapping(raw.get("inputs"), f"{path}.inputs", report)
    for i, item in enumerate(_list(inputs.get("parameters"), f"{path}.inputs.parameters", report)):
        if not isinstance(item, dict) or not item.get("name"):
            report.error(f"{path}.inputs.parameters[{i}]", "must be a mapping with a name")
            continue
        template.inputs.append(str(item["name"]))
        for key in ("value", "default"):
            if item.get(key) is not None:
                template.input_defaults[str(item["name"])] = item[key]
    dag, resource = raw.get("dag"), raw.get("resource")
    if dag is not None and resource is not None:
        report.error(path, "a template is either a dag or a resource, not both")
    if dag is not None:
        dag = _mapping(dag, f"{path}.dag", report)
        template.tasks = []
        for i, item in enumerate(_list(dag.get("tasks"), f"{path}.dag.tasks", report)):
            task = _task(item, f"{path}.dag.tasks[{i}]", report)
            if task is not None:
                template.tasks.append(task)
        target = dag.get("target")
        if isinstance(target, str):
            template.target = target.strip() or None
        elif isinstance(target, list):
            template.target = " ".join(str(t) for t in target) or None
        elif target is not None:
            report.error(f"{path}.dag.target", "must be task names separated by spaces")
        template.fail_fast = _bool(dag, "failFast", f"{path}.dag", report, True)
    elif resource is not None:
        template.resource = _resource(resource, f"{path}.resource", report)
    elif template.name:
        kind = next((k for k in _OTHER_TEMPLATE_TYPES if k in raw), None)
        detail = f"; {kind} templates are not supported" if kind else ""
        report.error(path, f'template "{template.name}" has neither a dag nor a resource{detail}')
    template.retry = _retry(raw.get("retryStrategy"), f"{path}.retryStrategy", report)
    template.active_deadline_seconds = _deadline(raw, path, report)
    outputs = _mapping(raw.get("outputs"), f"{path}.outputs", report)
    for i, item in enumerate(
        _list(outputs.get("parameters"), f"{path}.outputs.parameters", report)
    ):
        where = f"{path}.outputs.parameters[{i}]"
        if not isinstance(item, dict) or not item.get("name"):
            report.error(where, "must be a mapping with a name")
            continue
        value_from = _mapping(item.get("valueFrom"), f"{where}.valueFrom", report)
        default = value_from.get("default", item.get("default"))
        template.outputs.append(
            OutputParameter(
                name=str(item["name"]),
                json_path=_text(value_from, "jsonPath", f"{where}.valueFrom", report) or None,
                jq_filter=_text(value_from, "jqFilter", f"{where}.valueFrom", report) or None,
                default=None if default is None else str(default),
            )
        )
    return template


def build_workflow(
    raw: Any, path: str, verb: str, deadlines: dict[str, int] | None, report: Report
) -> Workflow:
    """An Argo-style workflow; a missing activeDeadlineSeconds gets the verb's platform default
    (with a warning)."""
    raw = _mapping(raw, path, report)
    templates: dict[str, Template] = {}
    for i, item in enumerate(_list(raw.get("templates"), f"{path}.templates", report)):
        template = _template(item, f"{path}.templates[{i}]", report)
        if template is None or not template.name:
            continue
        if template.name in templates:
            report.error(f"{path}.templates[{i}].name", f'duplicate template "{template.name}"')
            continue
        templates[template.name] = template
    if not raw.get("templates"):
        report.error(f"{path}.templates", "at least one template is required")
    deadline = _deadline(raw, path, report)
    if deadline is None:
        deadline = default_deadline(verb, deadlines)
        report.warn(
            f"{path}.activeDeadlineSeconds",
            f"not set; the platform default for {verb} ({deadline} s) applies",
        )
    arguments = _mapping(raw.get("arguments"), f"{path}.arguments", report)
    return Workflow(
        entrypoint=_text(raw, "entrypoint", path, report, required=True),
        templates=templates,
        arguments=_named_values(
            arguments.get("parameters"), f"{path}.arguments.parameters", report
        ),
        active_deadline_seconds=deadline,
        on_exit=_text(raw, "onExit", path, report) or None,
    )


def _outputs(raw: Any, path: str, report: Report) -> dict[str, str]:
    raw = _mapping(raw, path, report)
    return {str(k): str(v) for k, v in raw.items() if v is not None}


def _system_verbs(
    raw: Any, path: str, deadlines: dict[str, int] | None, report: Report
) -> dict[str, Verb]:
    verbs: dict[str, Verb] = {}
    for name, body in _mapping(raw, path, report).items():
        where = f"{path}.{name}"
        if name not in SYSTEM_VERBS:
            report.warn(
                where, f'unknown verb "{name}" is ignored; known verbs: {", ".join(SYSTEM_VERBS)}'
            )
            continue
        body = _mapping(body, where, report)
        verbs[name] = Verb(
            name=name,
            workflow=build_workflow(
                body.get("workflow"), f"{where}.workflow", name, deadlines, report
            ),
            outputs=_outputs(body.get("outputParameters"), f"{where}.outputParameters", report),
            display_name=name[0].upper() + name[1:],
            path=where,
            requires=_requires(
                body.get("x-opsdeck"), name, where, report, keys=("requires", "confirm")
            ),
            confirm=_confirm(body.get("x-opsdeck"), name, where, report),
        )
    return verbs


def _custom_verbs(
    raw: Any,
    path: str,
    taken: dict[str, Verb],
    parameters: list[Parameter],
    deadlines: dict[str, int] | None,
    report: Report,
) -> dict[str, Verb]:
    verbs: dict[str, Verb] = {}
    for i, body in enumerate(_list(raw, path, report)):
        where = f"{path}[{i}]"
        if not isinstance(body, dict):
            report.error(where, "must be a mapping")
            continue
        name = _text(body, "verb", where, report, required=True)
        if not name:
            continue
        if name in taken or name in verbs or name in SYSTEM_VERBS:
            report.error(f"{where}.verb", f'verb "{name}" is already defined')
            continue
        scope = body.get("scope") or ["END_CUSTOMER"]
        if isinstance(scope, str):
            scope = [scope]
        for value in scope if isinstance(scope, list) else [scope]:
            if value not in CUSTOM_SCOPES:
                report.error(
                    f"{where}.scope", f'unknown scope "{value}"; expected fleet or END_CUSTOMER'
                )
        verbs[name] = Verb(
            name=name,
            workflow=build_workflow(
                body.get("workflow"), f"{where}.workflow", name, deadlines, report
            ),
            outputs=_outputs(body.get("outputParameters"), f"{where}.outputParameters", report),
            custom=True,
            display_name=_text(body, "displayName", where, report) or name,
            description=_text(body, "description", where, report),
            parameters=build_parameters(
                body.get("apiParameters"), f"{where}.apiParameters", report
            ),
            scope=[str(s) for s in scope] if isinstance(scope, list) else [],
            path=where,
        )
        verbs[name].updates = _updates(
            verbs[name], parameters, body.get("x-opsdeck"), where, report
        )
        verbs[name].requires = _requires(
            body.get("x-opsdeck"), name, where, report, keys=("updates", "requires", "confirm")
        )
        verbs[name].confirm = _confirm(body.get("x-opsdeck"), name, where, report, custom=True)
    return verbs


# Verbs an instance must always be able to run (to exist, change, stop, go): no requirement.
UNCONDITIONAL_VERBS = ("create", "restore", "modify", "stop", "start", "delete", "deleteBackup")


def _requires(
    raw: Any, verb: str, where: str, report: Report, *, keys: tuple[str, ...]
) -> Requirement | None:
    """A verb's `x-opsdeck` (which may hold `keys`) and its `requires`: `when`, a CEL
    expression over the instance's parameters (`var`) that must hold for the verb to start
    (checked in `validation`), and `message`, what the customer reads when it does not."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        if "updates" not in keys:  # a custom verb's is reported by `_updates`
            report.error(f"{where}.x-opsdeck", "must be a mapping")
        return None
    unknown = sorted(set(map(str, raw)) - set(keys))
    if unknown:
        report.error(
            f"{where}.x-opsdeck", f"unknown key {', '.join(unknown)}; expected {' or '.join(keys)}"
        )
    if raw.get("requires") is None:
        return None
    path = f"{where}.x-opsdeck.requires"
    if verb in UNCONDITIONAL_VERBS:
        report.error(path, f"an instance must always be able to {verb}: it takes no requirement")
        return None
    requires = raw["requires"]
    if not isinstance(requires, dict):
        report.error(path, "must be a mapping with when and message")
        return None
    when = _text(requires, "when", path, report, required=True)
    message = _text(requires, "message", path, report, required=True)
    unknown = sorted(set(map(str, requires)) - {"when", "message"})
    if unknown:
        report.error(path, f"unknown key {', '.join(unknown)}; expected when and message")
    return Requirement(when, message) if when and message else None


CONFIRM_MAX = 300  # characters: a question in a dialog
# The system verbs the page sends from a button of their own; the others are sent from a form
# of their own (create, restore, modify, delete) or not from the page.
CONFIRMABLE_VERBS = ("start", "stop", "restart", "failover", "backup")


def _confirm(
    raw: Any, verb: str, where: str, report: Report, *, custom: bool = False
) -> str | None:
    """A verb's `x-opsdeck.confirm`: what the page asks before it sends the verb, one line (a
    verb with parameters shows it in its dialog); "" asks nothing where Opsdeck asks its own
    question (stop, restart, failover). None when the spec says nothing."""
    if not isinstance(raw, dict) or "confirm" not in raw:
        return None
    path = f"{where}.x-opsdeck.confirm"
    text = raw["confirm"]
    if not custom and verb not in CONFIRMABLE_VERBS:
        report.error(path, f"{verb} is not sent from a button of its own: nothing to ask")
        return None
    if not isinstance(text, str) or "\n" in text.strip():
        report.error(path, "must be one line of text (empty: ask nothing)")
        return None
    if len(text.strip()) > CONFIRM_MAX:
        report.error(path, f"must be at most {CONFIRM_MAX} characters long")
        return None
    return text.strip()


def _updates(
    verb: Verb, parameters: list[Parameter], raw: Any, where: str, report: Report
) -> dict[str, str]:
    """A custom verb's `x-opsdeck.updates`: which instance parameters its success changes, each
    to the value of one of the verb's own parameters (of the same type)."""
    if raw is None:
        return {}
    path = f"{where}.x-opsdeck"
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping")
        return {}
    updates = raw.get("updates")
    if updates is None:
        return {}
    if not isinstance(updates, dict):
        report.error(f"{path}.updates", "must map instance parameters to this verb's parameters")
        return {}
    instance = {p.key: p for p in parameters}
    own = {p.key: p for p in verb.parameters}
    result: dict[str, str] = {}
    for target, source in updates.items():
        target, source = str(target), str(source)
        if target not in instance:
            report.error(f"{path}.updates.{target}", "is not a parameter of the service")
        elif not instance[target].modifiable:
            report.error(f"{path}.updates.{target}", "is not modifiable")
        elif source not in own:
            report.error(f"{path}.updates.{target}", f'"{source}" is not a parameter of this verb')
        elif own[source].type != instance[target].type:
            report.error(
                f"{path}.updates.{target}",
                f'"{source}" is {own[source].type}, the parameter is {instance[target].type}',
            )
        else:
            result[target] = source
    return result


# --- services and plan ------------------------------------------------------------------


def build_service(
    raw: Any, path: str, deadlines: dict[str, int] | None, report: Report
) -> Service | None:
    """One `services` entry, with legacy verbs synthesized from operatorCRDConfiguration."""
    if not isinstance(raw, dict):
        report.error(path, "must be a mapping")
        return None
    service = Service(
        name=_text(raw, "name", path, report, required=True),
        description=_text(raw, "description", path, report),
        parameters=build_parameters(raw.get("apiParameters"), f"{path}.apiParameters", report),
        endpoints=_mapping(
            raw.get("endpointConfiguration"), f"{path}.endpointConfiguration", report
        ),
        raw=raw,
    )
    capabilities = _mapping(raw.get("capabilities"), f"{path}.capabilities", report)
    if capabilities.get("backupConfiguration") is not None:
        service.backup = _backup(
            capabilities["backupConfiguration"], f"{path}.capabilities.backupConfiguration", report
        )
    service.verbs = _system_verbs(
        raw.get("systemWorkflows"), f"{path}.systemWorkflows", deadlines, report
    )
    crd = _mapping(raw.get("operatorCRDConfiguration"), f"{path}.operatorCRDConfiguration", report)
    if crd.get("template") is not None:
        where = f"{path}.operatorCRDConfiguration"
        missing = [verb for verb in REQUIRED_VERBS if verb not in service.verbs]
        if not missing:
            report.warn(
                f"{where}.template", "unused: systemWorkflows define create, modify and delete"
            )
        elif not isinstance(crd["template"], str):
            report.error(f"{where}.template", "must be one manifest as YAML text")
        else:
            verbs, errors = legacy.synthesize(
                crd, where, missing, {v: default_deadline(v, deadlines) for v in missing}
            )
            report.errors.extend(errors)
            service.verbs.update(verbs)
    service.verbs.update(
        _custom_verbs(
            raw.get("customWorkflows"),
            f"{path}.customWorkflows",
            service.verbs,
            service.parameters,
            deadlines,
            report,
        )
    )
    return service


def _backup(raw: Any, path: str, report: Report) -> dict:
    raw = _mapping(raw, path, report)
    for key in ("backupRetentionInDays", "backupPeriodInHours"):
        _int(raw, key, path, report)
    _bool(raw, "snapshotBeforeDeletion", path, report, False)
    return raw


def _pricing(raw: Any, path: str, report: Report) -> list[dict]:
    result = []
    seen: set[str] = set()
    for i, item in enumerate(_list(raw, path, report)):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            report.error(where, "must be a mapping")
            continue
        entry = dict(item)
        dimension = item.get("dimension")
        if not isinstance(dimension, str) or dimension not in PRICING_DIMENSIONS:
            report.error(
                f"{where}.dimension",
                f'unknown dimension "{dimension}"; expected one of {", ".join(PRICING_DIMENSIONS)}',
            )
        elif dimension in seen:
            report.error(f"{where}.dimension", f'"{dimension}" is priced twice')
        else:
            seen.add(dimension)
        try:
            entry["price"] = Decimal(str(item.get("price")))
            if not entry["price"].is_finite() or entry["price"] < 0:
                raise InvalidOperation
        except InvalidOperation:
            report.error(f"{where}.price", f'"{item.get("price")}" is not a price')
        else:
            price = entry["price"]  # checked against 10**10 first: quantize needs the room
            if price >= 10**10 or price != price.quantize(_PRICE_PLACES):
                report.error(
                    f"{where}.price", "use at most 10 digits before and 8 after the decimal point"
                )
        entry["timeUnit"] = item.get("timeUnit") or "hour"
        if entry["timeUnit"] not in PRICE_TIME_UNITS:
            report.error(
                f"{where}.timeUnit",
                f'unknown time unit "{entry["timeUnit"]}"; expected one of '
                f"{', '.join(PRICE_TIME_UNITS)}",
            )
        entry["unit"] = str(item.get("unit") or "")
        result.append(entry)
    return result


def _currency(extensions: dict, report: Report) -> str:
    value = extensions.get("currency")
    if value is None:
        return DEFAULT_CURRENCY
    if not isinstance(value, str) or not _CURRENCY.match(value):
        report.error(
            "x-opsdeck.currency", f'"{value}" is not a currency code (3 lowercase letters)'
        )
        return DEFAULT_CURRENCY
    return value


ENTITLEMENT_KEYS = (
    "maxInstances",
    "maxTotal",
    "maxPerInstance",
    "cells",
    "deniedVerbs",
    "maxBackupRetentionDays",
)
# A pseudo-verb: denying it refuses restores to a point in time, not plain restores.
POINT_IN_TIME = "restore.pointInTime"
# Verbs a plan cannot deny: an instance must always be creatable and deletable.
UNDENIABLE_VERBS = ("create", "delete")
# What an organization can always do, suspended or not (billing's ALWAYS_ALLOWED): denying one
# does nothing. A warning, left out of the plan's limits, not an error: versions stored before
# say so and must still load.
ALWAYS_ALLOWED_VERBS = ("deleteBackup", "stop")
SUBSCRIPTION_DEFAULTS = {"autoApprove": True, "graceDays": 7, "stopAfterDays": 7}


def _dimension_limits(
    raw: Any, path: str, dimensions: list[str], report: Report
) -> dict[str, int | float]:
    """`{dimension: number}` over the plan's usage dimensions."""
    result = {}
    for dimension, value in _mapping(raw, path, report).items():
        where = f"{path}.{dimension}"
        if dimension not in dimensions:
            report.error(
                where,
                f'unknown dimension "{dimension}"; expected one of the x-opsdeck.usage '
                f"dimensions ({', '.join(dimensions) or 'none'})",
            )
            continue
        try:
            number = _number(value)
        except (TypeError, ValueError):
            number = -1
        if number < 0:
            report.error(where, f'"{value}" is not a number of at least 0')
            continue
        result[str(dimension)] = number
    return result


def _entitlements(
    extensions: dict, document: dict, main: Service, report: Report
) -> tuple[int | None, dict]:
    """`x-opsdeck.entitlements` as billing stores it, and the instance limit it shares with
    Omnistrate's `maxNumberOfInstancesAllowed`."""
    path = "x-opsdeck.entitlements"
    raw = _mapping(extensions.get("entitlements"), path, report)
    for key in raw:
        if key not in ENTITLEMENT_KEYS:
            report.warn(
                _at(path, key), f"unknown key; expected one of {', '.join(ENTITLEMENT_KEYS)}"
            )
    legacy_max = _int(document, "maxNumberOfInstancesAllowed", "", report)
    max_instances = _int(raw, "maxInstances", path, report)
    if max_instances is not None and legacy_max is not None and max_instances != legacy_max:
        report.error(
            f"{path}.maxInstances",
            f"is {max_instances} but maxNumberOfInstancesAllowed is {legacy_max}; give one",
        )
    if max_instances is None:
        max_instances = legacy_max
    dimensions = sorted(_mapping(extensions.get("usage"), "x-opsdeck.usage", Report()))
    result: dict[str, Any] = {}
    for key, name in (("maxTotal", "max_total"), ("maxPerInstance", "max_per_instance")):
        limits = _dimension_limits(raw.get(key), f"{path}.{key}", dimensions, report)
        if limits:
            result[name] = limits
    if raw.get("cells") is not None:
        cells = _list(raw.get("cells"), f"{path}.cells", report)
        if not all(isinstance(cell, str) and cell for cell in cells):
            report.error(f"{path}.cells", "must be a list of cell names")
        else:
            result["cells"] = cells
    denied = _list(raw.get("deniedVerbs"), f"{path}.deniedVerbs", report)
    for i, verb in enumerate(denied):
        where = f"{path}.deniedVerbs[{i}]"
        if verb in UNDENIABLE_VERBS:
            report.error(where, f'"{verb}" cannot be denied')
        elif verb in ALWAYS_ALLOWED_VERBS:
            report.warn(
                where, f'"{verb}" is always allowed (a suspended organization too); left out'
            )
        elif verb == POINT_IN_TIME:
            if "restore" not in main.verbs:
                report.error(where, f'"{verb}" needs the restore verb, which the plan lacks')
        elif verb not in main.verbs:
            report.error(
                where,
                f'unknown verb "{verb}"; expected one of the plan\'s verbs or {POINT_IN_TIME}',
            )
    denied = [verb for verb in denied if verb not in ALWAYS_ALLOWED_VERBS]
    if denied:
        result["denied_verbs"] = [str(verb) for verb in denied]
    most = _int(raw, "maxBackupRetentionDays", path, report)
    if most is not None:
        own = (main.backup or {}).get("backupRetentionInDays")
        if isinstance(own, int) and own > most:
            report.error(
                f"{path}.maxBackupRetentionDays",
                f"is {most} but the plan's own backupRetentionInDays is {own}; raise it or "
                "shorten that",
            )
        result["max_backup_retention_days"] = most
    return max_instances, result


def _subscription(extensions: dict, report: Report) -> dict:
    """`x-opsdeck.subscription` with its defaults, in billing's keys."""
    path = "x-opsdeck.subscription"
    raw = _mapping(extensions.get("subscription"), path, report)
    for key in raw:
        if key not in SUBSCRIPTION_DEFAULTS:
            report.warn(
                _at(path, key), f"unknown key; expected one of {', '.join(SUBSCRIPTION_DEFAULTS)}"
            )
    grace, stop = _int(raw, "graceDays", path, report), _int(raw, "stopAfterDays", path, report)
    return {
        "auto_approve": _bool(raw, "autoApprove", path, report, True),
        "grace_days": SUBSCRIPTION_DEFAULTS["graceDays"] if grace is None else grace,
        "stop_after_days": SUBSCRIPTION_DEFAULTS["stopAfterDays"] if stop is None else stop,
    }


def _main_service(services: list[Service]) -> Service | None:
    for service in services:
        if "operatorCRDConfiguration" in service.raw:
            return service
    for service in services:
        if "create" in service.verbs:
            return service
    return services[0] if len(services) == 1 else None


def build(text: str, *, deadlines: dict[str, int] | None = None) -> Built:
    """Read spec text into the model, collecting structural errors; never raises for a bad
    spec (malformed YAML included)."""
    report = Report()
    try:
        document = parse_yaml(text)
    except SpecError as exc:
        report.errors.extend(exc.errors)
        return Built(None, None, report)
    if not isinstance(document, dict):
        report.error("", "The spec must be a YAML mapping with name and services")
        return Built(None, document, report)
    name = _text(document, "name", "name", report)
    if not name:
        report.error("name", "is required")
    elif not name.isprintable():
        # The plan's name: in page titles and email subjects, which hold one line.
        report.error("name", "must be one line of text, without tabs or control characters")
    services: list[Service] = []
    for i, item in enumerate(_list(document.get("services"), "services", report)):
        service = build_service(item, f"services[{i}]", deadlines, report)
        if service is not None:
            services.append(service)
    if not document.get("services"):
        report.error("services", "at least one service is required")
    extensions = _mapping(document.get("x-opsdeck"), "x-opsdeck", report)
    key = str(extensions.get("plan") or slugify(name))
    if key and not _SLUG.match(key):
        report.error("x-opsdeck.plan", f'"{key}" is not a slug (lowercase letters, digits, -)')
    main = _main_service(services)
    if main is None:
        if services:
            report.error("services", "no service carries operatorCRDConfiguration")
        return Built(None, document, report)
    kinds = _list(extensions.get("kinds"), "x-opsdeck.kinds", report)
    usage = _mapping(extensions.get("usage"), "x-opsdeck.usage", report)
    display = _mapping(extensions.get("display"), "x-opsdeck.display", report)
    max_instances, entitlements = _entitlements(extensions, document, main, report)
    spec = PlanSpec(
        key=key,
        name=name,
        service=str(extensions.get("service") or key),
        description=_text(document, "description", "", report),
        services=services,
        main=main,
        pricing=_pricing(document.get("pricing"), "pricing", report),
        currency=_currency(extensions, report),
        max_instances=max_instances,
        entitlements=entitlements,
        subscription=_subscription(extensions, report),
        extensions=extensions,
        allowed_kinds=[str(k) for k in kinds],
        usage_rules={str(k): str(v) for k, v in usage.items()},
        raw=document,
        parameter_groups=_list(display.get("groups"), "x-opsdeck.display.groups", report),
        connection=_mapping(extensions.get("connection"), "x-opsdeck.connection", report),
    )
    return Built(spec, document, report)


def load_spec(
    text: str, *, deadlines: dict[str, int] | None = None, stored: bool = False
) -> PlanSpec:
    """Load and validate a spec; raises SpecError listing every error (and the warnings).

    `deadlines` overrides the platform deadline per verb (seconds; "*" for the 30 min
    fallback); `stored`: the text of a plan version stored already (`Report.later_errors`).
    The returned spec carries the warnings in `spec.warnings`. It is shared, as a stored
    version's is (`selectors.plan_spec`): read it, never change it.
    """
    if deadlines is None:
        return _validated(text, stored)
    return _validate(text, deadlines, stored)


@functools.lru_cache(maxsize=32)
def _validated(text: str, stored: bool) -> PlanSpec:
    """A valid text's spec, validated once per process: what it says depends on its text
    alone, and a spec is loaded again unchanged (a plan's load at every start, an upload
    sent twice, a `spec_test` of the plan loaded)."""
    return _validate(text, None, stored)


def _validate(text: str, deadlines: dict[str, int] | None, stored: bool) -> PlanSpec:
    # validation builds on this module, so it is imported when first needed
    from deployments.spec.validation import validate

    result = validate(text, deadlines=deadlines, stored=stored)
    if result.errors or result.spec is None:
        raise SpecError(result.errors, result.warnings)
    return result.spec
