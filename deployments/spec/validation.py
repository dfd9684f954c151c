"""Validation of a service plan spec, with path-qualified errors and warnings.

`validate(text)` never raises for a bad spec: it returns every error it finds, each starting
with the path of the offending value (`services[0].systemWorkflows.create.workflow.
templates[1].resource.manifest: ...`; a template's index is its position in the YAML list).
Conditions, `when`/`depends` expressions, JSONPaths and template references are checked by
the workflow engine's own parsers, so a spec that validates is one the engine can run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from deployments.spec.loader import PRICING_DIMENSIONS, Report, build
from deployments.spec.model import (
    BACKUP_VERBS,
    REQUIRED_VERBS,
    OutputParameter,
    Parameter,
    PlanSpec,
    Service,
    Task,
    Template,
    Verb,
    Workflow,
)
from deployments.spec.params import cel_values
from deployments.workflow import safe_yaml
from deployments.workflow.conditions import ConditionError, parse_condition
from deployments.workflow.engine import MAX_NODES, PATCH_TARGET_MISSING, patch_target
from deployments.workflow.evaluator import (
    ProgramError,
    ProgramLimitError,
    cel_parse,
    evaluate_cel,
)
from deployments.workflow.expressions import (
    ExpressionError,
    check_when_syntax,
    is_task_name,
    parse_depends,
    placeholders_replaced,
)
from deployments.workflow.outputs import OutputError, check_jq_filter, check_json_path
from deployments.workflow.quantity import Quantity, QuantityError
from deployments.workflow.render import RenderError, is_patch_list, patch_problems, references

SYS_ROOTS = frozenset(
    {
        "id",
        "instanceId",
        "namespace",
        "tenant",
        "deploymentCell",
        "backup",
        "compute",
        "deployment",
        "network",
        "snapshot",
        "restore",
        "sourceInstanceId",
        "targetInstanceId",
        "deterministicSeedValue",
        "operation",  # Opsdeck: {id, startedAt} of the running operation
    }
)
_TOKEN = "opsdeckph{}x"  # noqa: S105 (a placeholder marker, not a secret)
_TOKEN_RE = re.compile(r"opsdeckph(\d+)x")
_TASK_OUTPUT = re.compile(r"^\$tasks\.([^.]+)\.resource\.(.+)$")
# Template calls a value is traced back through to find the parameters that feed an object's
# name (one stack frame each); a name passed through more is refused, not left unchecked.
_MAX_TRACE = 200
# Tasks in one verb's workflow, over all its templates: the specs we know hold 22, and a move
# walks them all.
MAX_TASKS = 500


@dataclass
class ValidationResult:
    """The outcome of `validate`: the spec (None when there are errors), errors, warnings."""

    spec: PlanSpec | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the spec has no errors (warnings allowed)."""
        return not self.errors


def validate(
    text: str, *, deadlines: dict[str, int] | None = None, stored: bool = False
) -> ValidationResult:
    """Load and check spec text; returns every error and warning, never raises for bad input.

    `deadlines` overrides the per-verb platform deadline applied when a workflow sets no
    activeDeadlineSeconds. `stored`: the text of a plan version stored already, whose errors
    of rules added since (`Report.later_errors`) are warnings.
    """
    built = build(text, deadlines=deadlines)
    report, spec = built.report, built.spec
    (report.warnings if stored else report.errors).extend(report.later_errors)
    if spec is not None:
        _check_plan(spec, report)
    # a legacy manifest is checked once per synthesized verb: report each finding once
    errors, warnings = list(dict.fromkeys(report.errors)), list(dict.fromkeys(report.warnings))
    if spec is not None:
        spec.warnings = warnings
    return ValidationResult(spec=None if errors else spec, errors=errors, warnings=warnings)


# --- placeholders -----------------------------------------------------------------------


def _tokenize(text: str) -> tuple[str, list[str]]:
    """Replace each `{{ ... }}` with a plain token, so the text parses as YAML or a condition."""
    found: list[str] = []

    def swap(placeholder: str) -> str:
        found.append(placeholder)
        return _TOKEN.format(len(found) - 1)

    return placeholders_replaced(text, swap)[0], found


def _untokenize(text: str, found: list[str]) -> str:
    return _TOKEN_RE.sub(lambda m: found[int(m.group(1))], text)


# --- plan -------------------------------------------------------------------------------


def _check_plan(spec: PlanSpec, report: Report) -> None:
    kinds: list[tuple[str, str, str]] = []  # (path, apiVersion, kind)
    waited: set[tuple[str, str]] = set()  # (apiVersion, kind) of objects a move waits on
    system_read: set[str] = set()  # the `$sys` variables the workflows read
    for i, service in enumerate(spec.services):
        path = f"services[{i}]"
        if service is spec.main or any(not v.custom for v in service.verbs.values()):
            _require_verbs(service, path, REQUIRED_VERBS, "", report)
        if service.backup is not None:
            _require_verbs(
                service, path, BACKUP_VERBS, " (capabilities.backupConfiguration is set)", report
            )
        for verb in service.verbs.values():
            _VerbChecker(service, verb, report, kinds, waited, system_read).run()
    _check_kinds(spec, kinds, report)
    spec.system_read = frozenset(system_read)
    spec.required_kinds = list(
        dict.fromkeys(
            (api_version, kind)
            for _, api_version, kind in kinds
            if api_version and not _TOKEN_RE.search(api_version)
        )
    )
    spec.waited_kinds = [key for key in spec.required_kinds if key in waited]
    _check_operator(spec, report)
    _check_network(spec, report)
    _check_quota(spec, report)
    _check_endpoints(spec, report)
    _check_usage(spec, report)
    _check_requirements(spec, report)
    _check_groups(spec, report)
    _check_connection(spec, report)
    _check_status(spec, report)
    _check_health(spec, report)
    _check_servers(spec, report)
    _check_service_name(spec, report)


def _check_service_name(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.serviceName`: how the catalog names the service (`PostgreSQL`)."""
    name = spec.extensions.get("serviceName")
    if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > 100):
        report.error("x-opsdeck.serviceName", "must be text of 1 to 100 characters")


# What the portal shows of an instance's status (deployments.status reads the same names).
SHOWN_STATUS = (
    "phase",
    "ready",
    "total",
    "primary",
    "conditions",
    # The oldest and newest instants a point-in-time restore can reach (RFC 3339).
    "recoverableFrom",
    "recoverableUntil",
)


def _check_status(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.status`: the object whose status the portal shows, of a kind the plan uses."""
    status = spec.extensions.get("status")
    if status is None:
        return
    path = "x-opsdeck.status"
    if not isinstance(status, dict):
        report.error(path, "must be a mapping with apiVersion and kind")
        return
    for key in ("apiVersion", "kind"):
        if not isinstance(status.get(key), str) or not status[key]:
            report.error(f"{path}.{key}", "is required (text)")
    kind = status.get("kind")
    if isinstance(kind, str) and spec.allowed_kinds and kind not in spec.allowed_kinds:
        report.error(f"{path}.kind", f'"{kind}" is not a kind this plan uses')
    fields = status.get("fields")
    if fields is None:
        return
    if not isinstance(fields, dict):
        report.error(f"{path}.fields", "must map what the portal shows to paths in the object")
        return
    for name, where in fields.items():
        if name not in SHOWN_STATUS:
            report.error(f"{path}.fields.{name}", f"is not one of {', '.join(SHOWN_STATUS)}")
        elif not isinstance(where, str) or not where:
            report.error(f"{path}.fields.{name}", "must be a dotted path such as status.phase")


def _check_health(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.health`: a condition over the status object (as a successCondition is
    written) and the dotted path of the operator's reason."""
    health = spec.extensions.get("health")
    if health is None:
        return
    path = "x-opsdeck.health"
    if not isinstance(health, dict):
        report.error(path, "must be a mapping with a condition")
        return
    if spec.extensions.get("status") is None:
        report.error(path, "needs x-opsdeck.status: the object the condition looks at")
    condition = health.get("condition")
    if not isinstance(condition, str) or not condition.strip():
        report.error(f"{path}.condition", "is required (e.g. cel: self.status.ready == true)")
    else:
        try:
            parse_condition(condition)
        except ConditionError as exc:
            report.error(f"{path}.condition", str(exc))
    reason = health.get("reason")
    if reason is not None and (not isinstance(reason, str) or not reason):
        report.error(f"{path}.reason", "must be a dotted path such as status.phase")


# What a plan's servers' limits are measured in (what the Metrics charts draw).
SERVER_LIMITS = ("cpu", "memory")


def _check_servers(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.servers`: the label selector finding an instance's pods, the labels and
    container the tabs show, and each server's limits (CEL over the parameters)."""
    servers = spec.extensions.get("servers")
    if servers is None:
        return
    path = "x-opsdeck.servers"
    if not isinstance(servers, dict):
        report.error(path, "must be a mapping with a selector")
        return
    selector = servers.get("selector")
    if not isinstance(selector, str) or not selector.strip() or len(selector) > 300:
        report.error(f"{path}.selector", "is required: a label selector such as app=db")
    else:
        try:
            parse_condition(selector)  # Argo's conditions are label selectors
        except ConditionError as exc:
            report.error(f"{path}.selector", f"is not a label selector: {exc}")
    for key in ("role", "container"):
        value = servers.get(key)
        if value is not None and (not isinstance(value, str) or not value or len(value) > 253):
            report.error(f"{path}.{key}", "must be a name (text)")
    _check_log_fields(servers.get("logs"), f"{path}.logs", report)
    limits = servers.get("limits")
    if limits is None:
        return
    if not isinstance(limits, dict):
        report.error(f"{path}.limits", f"must map {' and '.join(SERVER_LIMITS)} to expressions")
        return
    keys = {p.key for p in spec.main.parameters}
    defaults = {p.key: p.default for p in spec.main.parameters if p.default is not None}
    for name, expression in limits.items():
        where = f"{path}.limits.{name}"
        if name not in SERVER_LIMITS:
            report.error(where, f"is not one of {', '.join(SERVER_LIMITS)}")
            continue
        problem = _parameter_expression_problem(str(expression), keys, defaults)
        if problem:
            report.error(where, problem)


LOG_FIELDS = ("level", "message")
_DOTTED = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")


def _check_log_fields(logs: Any, path: str, report: Report) -> None:
    """`x-opsdeck.servers.logs`: where a log line written as a JSON object says its level and
    its message, each a dotted path or a list of at most five (the first found is shown)."""
    if logs is None:
        return
    if not isinstance(logs, dict):
        report.error(path, "must map level and message to dotted paths")
        return
    for name, value in logs.items():
        where = f"{path}.{name}"
        if name not in LOG_FIELDS:
            report.error(where, f"is not one of {', '.join(LOG_FIELDS)}")
            continue
        paths = value if isinstance(value, list) else [value]
        if not 1 <= len(paths) <= 5 or not all(
            isinstance(p, str) and len(p) <= 200 and _DOTTED.fullmatch(p) for p in paths
        ):
            report.error(where, "must be a dotted path such as record.message, or a list of them")
    if "message" not in logs:
        report.error(f"{path}.message", "is required: where a line says its message")


def _parameter_expression_problem(expression: str, keys: set[str], defaults: dict) -> str | None:
    """Why a CEL expression over the parameters (`var`) cannot give a number."""
    names = _parameters_read(expression)
    if isinstance(names, str):
        return names
    unknown = sorted(names - keys)
    if unknown:
        return f'undefined parameter reference var.{unknown[0]}; no apiParameter "{unknown[0]}"'
    return _usage_problem(expression, defaults, "a limit") if names <= set(defaults) else None


def _parameters_read(expression: str) -> set[str] | str:
    """The parameters a CEL expression over `var` names, or why it does not parse (parsed by
    the bounded evaluator: CEL's lexer can backtrack for ages on some expressions)."""
    try:
        parsed = cel_parse(expression, "var")
    except ProgramLimitError as exc:
        return f'cannot parse CEL expression "{expression}": {exc}'
    if parsed.problem is not None:
        return f'cannot parse CEL expression "{expression}"{parsed.where}'
    return set(parsed.fields)


def _require_verbs(
    service: Service, path: str, verbs: tuple[str, ...], reason: str, report: Report
) -> None:
    for verb in verbs:
        if verb not in service.verbs:
            report.error(f"{path}.systemWorkflows", f'missing required verb "{verb}"{reason}')


def _kind_allowed(allowed: list[str], api_version: str, kind: str) -> bool:
    return kind in allowed or f"{api_version}/{kind}" in allowed


def _check_kinds(spec: PlanSpec, kinds: list[tuple[str, str, str]], report: Report) -> None:
    if "kinds" not in spec.extensions:
        spec.allowed_kinds = sorted({kind for _, _, kind in kinds})
        return
    for path, api_version, kind in kinds:
        if not _kind_allowed(spec.allowed_kinds, api_version, kind):
            report.error(
                path,
                f'kind "{kind}" is not in x-opsdeck.kinds ({", ".join(spec.allowed_kinds)})',
            )


OPERATOR_KEYS = ("namespace", "ports", "install")
# A namespace name: a DNS label (RFC 1123), as Kubernetes requires.
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_INSTALL_MAX = 200


def _port_problem(value: Any) -> str | None:
    """Why `value` is not a port number (None when it is one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return f'"{value}" is not a port number (a whole number from 1 to 65535)'
    return None


def _check_operator(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.operator`: where the plan's operator runs, the ports of the instance's pods it
    must reach, and what a cell lacking the plan's kinds is told to do."""
    operator = spec.extensions.get("operator")
    if operator is None:
        return
    path = "x-opsdeck.operator"
    if not isinstance(operator, dict):
        report.error(path, "must be a mapping with namespace, ports and install")
        return
    for key in operator:
        if key not in OPERATOR_KEYS:
            report.warn(f"{path}.{key}", f"unknown key; expected one of {', '.join(OPERATOR_KEYS)}")
    namespace = operator.get("namespace")
    if not isinstance(namespace, str) or not NAMESPACE_NAME.fullmatch(namespace):
        shown = "is required" if namespace is None else f'"{namespace}" is not a namespace name'
        report.error(f"{path}.namespace", f"{shown} (lowercase letters, digits and -, at most 63)")
    if "ports" in operator:
        ports = operator["ports"]
        if not isinstance(ports, list) or not ports:
            report.error(
                f"{path}.ports", "must list at least one port; leave it out to admit every port"
            )
        else:
            for i, port in enumerate(ports):
                problem = _port_problem(port)
                if problem:
                    report.error(f"{path}.ports[{i}]", problem)
    install = operator.get("install")
    if install is not None and (
        not isinstance(install, str) or not install.strip() or len(install) > _INSTALL_MAX
    ):
        report.error(f"{path}.install", f"must be text of 1 to {_INSTALL_MAX} characters")


def _check_network(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.network.port`: the port customers reach (default: the primary endpoint's)."""
    network = spec.extensions.get("network")
    if network is None:
        return
    if not isinstance(network, dict):
        report.error("x-opsdeck.network", "must be a mapping with port")
        return
    if "port" in network:
        problem = _port_problem(network["port"])
        if problem:
            report.error("x-opsdeck.network.port", problem)


def _check_quota(spec: PlanSpec, report: Report) -> None:
    """`x-opsdeck.quota.storage`: the most storage the claims in an instance's namespace may
    request in all, which its ResourceQuota holds: a size the API server takes, or every
    create would fail at its namespace."""
    quota = spec.extensions.get("quota")
    if quota is None:
        return
    if not isinstance(quota, dict):
        report.error("x-opsdeck.quota", "must be a mapping with storage")
        return
    for key in quota:
        if key != "storage":
            report.warn(f"x-opsdeck.quota.{key}", "unknown key; expected storage")
    storage = quota.get("storage")
    if storage is None:
        return
    try:
        size = None if isinstance(storage, bool) else Quantity.parse(str(storage))
    except QuantityError:
        size = None
    if size is None or size.value <= 0:
        report.error(
            "x-opsdeck.quota.storage",
            f'"{storage}" is not a storage size: give a Kubernetes quantity, such as 500Gi',
        )


def _check_endpoints(spec: PlanSpec, report: Report) -> None:
    """The main service's `endpointConfiguration`: its host names the instance's endpoint and
    its ports admit customers, so each must be what it says."""
    path = f"services[{spec.services.index(spec.main)}].endpointConfiguration"
    for name, endpoint in spec.main.endpoints.items():
        where = f"{path}.{name}"
        if not isinstance(endpoint, dict):
            report.error(where, "must be a mapping with host and ports")
            continue
        if "host" in endpoint and not isinstance(endpoint["host"], str):
            report.error(f"{where}.host", "must be text")
        ports = endpoint.get("ports")
        if ports is None:
            continue
        if not isinstance(ports, list):
            report.error(f"{where}.ports", "must be a list of port numbers")
            continue
        for i, port in enumerate(ports):
            problem = _port_problem(port)
            if problem:
                report.error(f"{where}.ports[{i}]", problem)


def _parameters_used(
    expression: str, parameters: list[Parameter], path: str, report: Report
) -> set[str] | None:
    """The parameters a CEL expression over `var` reads (each undefined one reported, and each
    Password, which never reaches an expression: it would read as missing at every run); None
    when it does not parse."""
    names = _parameters_read(expression)
    if isinstance(names, str):
        report.error(path, names)
        return None
    keys = {p.key for p in parameters}
    for name in sorted(names - keys):
        report.error(path, f'undefined parameter reference var.{name}; no apiParameter "{name}"')
    for name in sorted(names & {p.key for p in parameters if p.type == "Password"}):
        report.error(path, f"var.{name} is a Password: passwords never reach an expression")
    return names


def _check_usage(spec: PlanSpec, report: Report) -> None:
    defaults = {p.key: p.default for p in spec.main.parameters if p.default is not None}
    for dimension, expression in spec.usage_rules.items():
        path = f"x-opsdeck.usage.{dimension}"
        if dimension not in PRICING_DIMENSIONS:
            report.error(
                path,
                f'unknown dimension "{dimension}"; expected one of {", ".join(PRICING_DIMENSIONS)}',
            )
        names = _parameters_used(expression, spec.main.parameters, path, report)
        if names is not None and names <= set(defaults):
            problem = _usage_problem(expression, defaults)
            if problem:
                report.error(path, problem)


def _check_requirements(spec: PlanSpec, report: Report) -> None:
    """Each verb's `x-opsdeck.requires.when` parses, names only the service's parameters, and
    gives true or false with the default parameters."""
    defaults = {p.key: p.default for p in spec.main.parameters if p.default is not None}
    for verb in spec.main.verbs.values():
        if verb.requires is None:
            continue
        path, expression = f"{verb.path}.x-opsdeck.requires.when", verb.requires.when
        names = _parameters_used(expression, spec.main.parameters, path, report)
        if names is None or not names <= set(defaults):
            continue
        try:
            result = evaluate_cel(expression, "var", cel_values(spec.main.parameters, defaults))
        except (ProgramError, ProgramLimitError) as exc:
            report.error(path, f"fails with the default parameters ({exc})")
            continue
        if not isinstance(result.value, bool):
            report.error(path, f"gives {result.shown} with the default parameters; it must give "
                               "true or false")  # fmt: skip


def _usage_problem(expression: str, values: dict, what: str = "a usage rule") -> str | None:
    """Why a usage rule (or another number over the parameters, `what`) cannot be worked out
    from the default parameters (None when it gives a number)."""
    try:
        result = evaluate_cel(expression, "var", values)
    except ProgramError as exc:
        return f"fails with the default parameters ({exc}); convert numbers with double()"
    except ProgramLimitError as exc:
        return f"{exc} with the default parameters"
    if isinstance(result.value, bool) or not isinstance(result.value, int | float):
        return f"gives {result.shown} with the default parameters; {what} must give a number"
    return None


def _check_groups(spec: PlanSpec, report: Report) -> None:
    keys = {p.key for p in spec.main.parameters}
    for i, group in enumerate(spec.parameter_groups):
        path = f"x-opsdeck.display.groups[{i}]"
        if not isinstance(group, dict) or not isinstance(group.get("parameters", []), list):
            report.error(path, "must be a mapping with a name and a list of parameters")
            continue
        for key in group.get("parameters", []):
            if not isinstance(key, str):
                report.error(f"{path}.parameters", f"{key!r} is not a parameter's key")
            elif key not in keys:
                report.error(f"{path}.parameters", f'unknown parameter "{key}"')


CONNECTION_PARAMETERS = ("user", "database", "password")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def _check_connection(spec: PlanSpec, report: Report) -> None:
    path = "x-opsdeck.connection"
    for key, value in spec.connection.items():
        if key == "scheme":
            if not isinstance(value, str) or not _SCHEME.fullmatch(value):
                report.error(f"{path}.scheme", "must be a URI scheme (lowercase, e.g. https)")
        elif key not in CONNECTION_PARAMETERS:
            expected = ", ".join((*CONNECTION_PARAMETERS, "scheme"))
            report.error(f"{path}.{key}", f'unknown key "{key}"; expected one of {expected}')
        elif spec.parameter(str(value)) is None:
            report.error(f"{path}.{key}", f'unknown parameter "{value}"')
        elif (spec.parameter(str(value)).type == "Password") != (key == "password"):
            wanted = "a Password" if key == "password" else "not a Password"
            report.error(f"{path}.{key}", f'parameter "{value}" must be {wanted} parameter')


# --- verbs ------------------------------------------------------------------------------


@dataclass
class _Scope:
    """What a reference may name where it appears."""

    inputs: list[str] | None = None  # the template's inputs; None outside any template
    template: str = ""
    tasks: dict[str, Template | None] | None = None  # sibling tasks → their template
    # The sibling tasks that have ended whenever this task runs (its dependencies, theirs, …):
    # the only ones whose results it may read. None: any sibling (a dag's target).
    ancestors: frozenset[str] | None = None
    item: bool = False  # inside a task with withItems, where {{item}} is defined


class _VerbChecker:
    """Checks one verb's workflow: templates, tasks, conditions, references, outputs."""

    def __init__(
        self,
        service: Service,
        verb: Verb,
        report: Report,
        kinds: list[tuple[str, str, str]],
        waited: set[tuple[str, str]],
        system_read: set[str],
    ):
        self.verb = verb
        self.workflow: Workflow = verb.workflow
        self.report = report
        self.kinds = kinds
        self.waited = waited
        self.system_read = system_read
        self.parameters: dict[str, Parameter] = {
            p.key: p for p in [*service.parameters, *verb.parameters]
        }
        self.path = f"{verb.path}.workflow"
        self._name_memo: dict[tuple[str, str | None], set[str]] = {}
        self._trace_cut = False  # a name traced through more than _MAX_TRACE calls
        # template name → the (template, task) pairs that call it
        self.callers: dict[str, list[tuple[Template, Task]]] = {}
        for caller in self.workflow.templates.values():
            for task in caller.tasks or []:
                self.callers.setdefault(task.template, []).append((caller, task))

    def run(self) -> None:
        workflow, templates = self.workflow, self.workflow.templates
        names = ", ".join(templates) or "none"
        if workflow.entrypoint and workflow.entrypoint not in templates:
            self.report.error(
                f"{self.path}.entrypoint",
                f'unknown template "{workflow.entrypoint}"; templates: {names}',
            )
        if workflow.on_exit and workflow.on_exit not in templates:
            self.report.error(
                f"{self.path}.onExit", f'unknown template "{workflow.on_exit}"; templates: {names}'
            )
        for name, value in workflow.arguments.items():
            self.check_references(value, f"{self.path}.arguments.parameters.{name}", _Scope())
        for start in {workflow.entrypoint, workflow.on_exit} - {None, ""}:
            if start in templates:
                self.check_threaded(
                    templates[start], workflow.arguments, f"{self.path}.arguments.parameters"
                )
        self.check_calls()
        for template in templates.values():
            if template.tasks is not None:
                self.check_dag(template)
            if template.resource is not None:
                self.check_resource(template)
            for i, output in enumerate(template.outputs):
                self.check_output(output, f"{template.path}.outputs.parameters[{i}].valueFrom")
        self.check_outputs()

    def check_calls(self) -> None:
        """A template never calls itself, through any number of hops (the run would nest it
        without end), and a workflow holds at most `MAX_TASKS` tasks (each move walks them)."""
        calls = {
            name: {task.template for task in template.tasks or []}
            for name, template in self.workflow.templates.items()
        }
        cycle = _find_cycle(calls)
        if cycle:
            self.report.error(
                f"{self.path}.templates",
                f"template call cycle: {' -> '.join(cycle)} (a template may not call itself, "
                "directly or through others)",
            )
        elif (steps := self._steps(calls)) > MAX_NODES:
            self.report.error(
                f"{self.path}.templates",
                f"a run would hold {steps} steps (templates calling templates multiply them, "
                f"before any fan-out); at most {MAX_NODES}",
            )
        count = sum(len(template.tasks or []) for template in self.workflow.templates.values())
        if count > MAX_TASKS:
            self.report.error(
                f"{self.path}.templates",
                f"the workflow holds {count} tasks; at most {MAX_TASKS}",
            )

    def _steps(self, calls: dict[str, set[str]]) -> int:
        """The steps a run of the workflow holds from its entrypoint, each task counted with
        what its template holds (the call graph has no cycle), without fan-outs."""
        templates = self.workflow.templates
        held: dict[str, int] = {}
        for name in _callees_first(calls):
            template = templates.get(name)
            held[name] = 1 + sum(held.get(task.template, 1) for task in template.tasks or [])
        starts = {self.workflow.entrypoint, self.workflow.on_exit} - {None, ""}
        return sum(held.get(name, 0) for name in starts)

    def check_output(self, output: OutputParameter, path: str) -> None:
        if output.json_path is not None:
            try:
                check_json_path(output.json_path)
            except OutputError as exc:
                self.report.error(f"{path}.jsonPath", str(exc))
            if output.jq_filter is not None:
                self.report.warn(f"{path}.jqFilter", "ignored: jsonPath is used when both are set")
        elif output.jq_filter is not None:
            try:
                check_jq_filter(str(output.jq_filter))
            except OutputError as exc:
                self.report.error(f"{path}.jqFilter", str(exc))

    # references

    def check_references(self, value: Any, path: str, scope: _Scope) -> None:
        """Report undefined references in a text (or any scalar) of the spec."""
        if not isinstance(value, str):
            return
        try:
            found = references(value)
        except RenderError as exc:
            self.report.error(path, str(exc))
            return
        for reference in found:
            problem = self.reference_problem(reference, scope)
            if problem:
                self.report.error(path, problem)

    def reference_problem(self, reference: str, scope: _Scope) -> str | None:
        """Why `reference` is undefined where `scope` says it appears (None if it is fine)."""
        parts = re.split(r"[.\[]", reference)
        head = parts[0]
        if head == "$var":
            key = parts[1] if len(parts) > 1 else ""
            if key not in self.parameters:
                return f'undefined parameter reference $var.{key}; no apiParameter has key "{key}"'
        elif head == "$sys":
            root = parts[1] if len(parts) > 1 else ""
            if root not in SYS_ROOTS:
                return f"unknown system variable $sys.{root}"
            self.system_read.add(".".join(parts[1:3]))
        elif head == "inputs" and len(parts) >= 3 and parts[1] == "parameters":
            if scope.inputs is None or parts[2] not in scope.inputs:
                where = f'template "{scope.template}"' if scope.template else "this place"
                return (
                    f"undefined reference {reference}: {where} declares no input "
                    f'"{parts[2]}" (parameters are threaded explicitly at every hop)'
                )
        elif head == "workflow" and len(parts) >= 3 and parts[1] == "parameters":
            if parts[2] not in self.workflow.arguments:
                return (
                    f"undefined reference {reference}: the workflow's arguments have no "
                    f'parameter "{parts[2]}"'
                )
        elif head == "tasks" and len(parts) >= 2:
            return self.task_reference_problem(reference, parts, scope)
        elif head == "item" and not scope.item:
            return (
                f"undefined reference {reference}: "
                "only a task with withItems or withParam defines item"
            )
        return None

    def task_reference_problem(self, reference: str, parts: list[str], scope: _Scope) -> str | None:
        if scope.tasks is None:
            return f"undefined reference {reference}: tasks can only be read in a dag's tasks"
        if parts[1] not in scope.tasks:
            return f'undefined reference {reference}: no task "{parts[1]}" in this dag'
        if scope.ancestors is not None and parts[1] not in scope.ancestors:
            return (
                f'undefined reference {reference}: this task does not depend on "{parts[1]}" '
                "(through its dependencies or theirs), so it may run first; add it to the "
                "dependencies"
            )
        target = scope.tasks[parts[1]]
        if (
            len(parts) >= 5
            and parts[2:4] == ["outputs", "parameters"]
            and target is not None
            and parts[4] not in {o.name for o in target.outputs}
        ):
            return (
                f'undefined reference {reference}: template "{target.name}" has no output '
                f'"{parts[4]}"'
            )
        return None

    def check_threaded(self, template: Template, passed: dict[str, Any], path: str) -> None:
        """Every input of `template` without a default must be passed where it is called."""
        for name in template.inputs:
            if name not in passed and name not in template.input_defaults:
                self.report.error(
                    path,
                    f'input "{name}" of template "{template.name}" is not passed '
                    "(parameters are threaded explicitly at every hop)",
                )

    # dag templates

    def check_dag(self, template: Template) -> None:
        templates = self.workflow.templates
        tasks = template.tasks or []
        if not tasks:
            self.report.error(f"{template.path}.dag.tasks", "a dag needs at least one task")
            return
        siblings: dict[str, Template | None] = {}
        for i, task in enumerate(tasks):
            if task.name in siblings:
                self.report.error(
                    f"{template.path}.dag.tasks[{i}].name", f'duplicate task "{task.name}"'
                )
            siblings[task.name] = templates.get(task.template)
            if task.name and not is_task_name(task.name):
                self.report.error(
                    f"{template.path}.dag.tasks[{i}].name",
                    f'"{task.name}": a task name is letters, digits, "-" and "_", not starting '
                    'with "-" (a dependency on it is read as an expression)',
                )
        if any(t.dependencies is not None for t in tasks) and any(t.depends for t in tasks):
            self.report.error(
                f"{template.path}.dag", "dependencies and depends cannot be mixed in one dag"
            )
        scope = _Scope(inputs=template.inputs, template=template.name, tasks=siblings)
        needs = {task.name: _needed(task) for task in tasks}
        graph = {name: (needed or set()) & siblings.keys() for name, needed in needs.items()}
        for i, task in enumerate(tasks):
            # What it reads is judged by what it depends on once that is known (its own
            # errors say what is wrong with it).
            needed = needs[task.name]
            known = needed is not None and needed <= siblings.keys()
            ancestors = frozenset(_reachable(graph, task.name)) if known else None
            where = f"{template.path}.dag.tasks[{i}]"
            self.check_task(task, where, replace(scope, ancestors=ancestors), needed or set())
        target = template.target or ""
        if "{{" in target:  # named through a parameter: its names are checked at run time
            self.check_references(target, f"{template.path}.dag.target", scope)
        else:
            for name in target.split():
                if name not in siblings:
                    self.report.error(f"{template.path}.dag.target", f'unknown task "{name}"')
        cycle = _find_cycle(graph)
        if cycle:
            self.report.error(
                f"{template.path}.dag.tasks", f"dependency cycle: {' -> '.join(cycle)}"
            )

    def check_task(self, task: Task, path: str, scope: _Scope, needed: set[str]) -> None:
        """Check one task: what it depends on (`needed`, the tasks it names), names, and
        reads."""
        if task.with_param is not None:
            self.check_references(task.with_param, f"{path}.withParam", scope)
        scope = replace(scope, item=task.with_items is not None or task.with_param is not None)
        templates = self.workflow.templates
        target = templates.get(task.template)
        if task.template and target is None:
            self.report.error(
                f"{path}.template",
                f'unknown template "{task.template}"; templates: {", ".join(templates)}',
            )
        if task.depends:
            try:
                parse_depends(task.depends)
            except ExpressionError as exc:
                self.report.error(f"{path}.depends", str(exc))
        siblings = scope.tasks or {}
        field_name = "depends" if task.depends else "dependencies"
        for name in sorted(n for n in needed if n not in siblings):
            self.report.error(f"{path}.{field_name}", f'unknown task "{name}"')
        if task.when:
            try:
                check_when_syntax(task.when)
            except ExpressionError as exc:
                self.report.error(f"{path}.when", str(exc))
            self.check_references(task.when, f"{path}.when", scope)
            self.warn_free_text(task.when, f"{path}.when")
        for name, value in task.arguments.items():
            self.check_references(value, f"{path}.arguments.parameters.{name}", scope)
            if target is not None and name not in target.inputs:
                self.report.warn(
                    f"{path}.arguments.parameters.{name}",
                    f'template "{target.name}" declares no input "{name}"; the value is unused',
                )
        if target is not None:
            self.check_threaded(target, task.arguments, f"{path}.arguments")

    # resource templates

    def check_resource(self, template: Template) -> None:
        resource = template.resource
        if resource is None:
            return
        scope = _Scope(inputs=template.inputs, template=template.name)
        manifest_path = template.where("resource.manifest")
        if resource.set_owner_reference:
            self.report.warn(
                template.where("resource.setOwnerReference"),
                "ignored: there is no Workflow object here to own the resource",
            )
        for field_name, condition in (
            ("successCondition", resource.success_condition),
            ("failureCondition", resource.failure_condition),
        ):
            if condition is None:
                continue
            path = template.where(f"resource.{field_name}")
            if resource.action == "delete":
                self.report.error(path, "a delete takes no conditions")
                continue
            self.check_condition(condition, path)
            self.check_references(condition, path, scope)
        self.check_references(resource.manifest, manifest_path, scope)
        for i, flag in enumerate(resource.flags):
            self.check_references(flag, template.where(f"resource.flags[{i}]"), scope)
        if resource.action == "patch" and is_patch_list(resource.manifest):
            self.check_patch_list(template)
            return
        obj = self.parse_manifest(resource.manifest, manifest_path)
        if obj is None:
            return
        obj, placeholders = obj
        api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
        for key, value in (("apiVersion", api_version), ("kind", kind)):
            if not value:
                self.report.error(manifest_path, f"the object has no {key}")
        if kind and not _TOKEN_RE.search(kind):
            self.kinds.append((manifest_path, api_version, kind))
            if resource.action != "delete" and (
                resource.success_condition or resource.failure_condition
            ):
                self.waited.add((api_version, kind))  # a move reads it back until they decide
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        if metadata.get("namespace") is not None:
            self.report.warn(
                manifest_path,
                "metadata.namespace is replaced by the instance's namespace",
            )
        name = metadata.get("name")
        if name is None and metadata.get("generateName") is None:
            self.report.error(manifest_path, "the object has no metadata.name")
        elif name is not None:
            self.check_name(_untokenize(str(name), placeholders), template, manifest_path)
        if resource.action == "patch" and resource.merge_strategy == "strategic":
            group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
            if "." in group and not group.endswith(".k8s.io"):
                self.report.error(
                    template.where("resource.mergeStrategy"),
                    f"a strategic merge patch is not supported for custom resources ({kind} "
                    f"of {api_version}); set mergeStrategy to merge or json",
                )

    def check_patch_list(self, template: Template) -> None:
        """Argo's form of a JSON patch: operations as the manifest, the object in flags."""
        resource = template.resource
        if resource.merge_strategy != "json":
            self.report.error(
                template.where("resource.mergeStrategy"),
                "a manifest that is a list is a JSON patch; set mergeStrategy to json",
            )
        for at, message in patch_problems(resource.manifest):
            self.report.error(f"{template.where('resource.manifest')}{at}", message)
        if patch_target(resource.flags) is None:
            self.report.error(template.where("resource.flags"), PATCH_TARGET_MISSING)

    def warn_free_text(self, expression: str, path: str) -> None:
        """Warn of a text parameter any value may fill (no options, no regex) that an
        expression reads as a placeholder: the customer's text is written into the expression
        as it is, so quotes or operators in it change what the expression decides."""
        try:
            found = references(expression)
        except RenderError:
            return  # reported where the references are checked
        for reference in found:
            parts = re.split(r"[.\[]", reference)
            parameter = self.parameters.get(parts[1]) if parts[0] == "$var" else None
            if parameter is None or parameter.type not in ("String", "Password"):
                continue
            if parameter.options or parameter.regex:
                continue
            self.report.warn(
                path,
                f"$var.{parameter.key} is free text written into the expression as it is: a "
                "value holding quotes or operators changes what it decides; give the parameter "
                "options or a regex, or compare it in the manifest",
            )

    def check_condition(self, condition: str, path: str) -> None:
        self.warn_free_text(condition, path)
        tokenized, _ = _tokenize(condition)
        try:
            parse_condition(tokenized)
        except ConditionError as exc:
            # one line per error: a CEL message's caret drawing would split it
            message = str(exc).splitlines()[0]
            if not condition.strip().startswith("cel:") and "cel:" not in message:
                message += "; use a cel: condition"
            self.report.error(path, message)

    def parse_manifest(self, manifest: str, path: str) -> tuple[dict, list[str]] | None:
        """The one object of a manifest (placeholders tokenized), or None after an error."""
        tokenized, placeholders = _tokenize(manifest)
        try:
            documents = [d for d in safe_yaml.load_all(tokenized) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            self.report.error(path, f"the manifest is not valid YAML{where}: {problem}")
            return None
        if len(documents) > 1:
            self.report.error(
                path,
                f"the manifest holds {len(documents)} documents; a resource template applies "
                "exactly one Kubernetes object (use one template per object)",
            )
            return None
        if not documents or not isinstance(documents[0], dict):
            self.report.error(path, "the manifest must be one Kubernetes object (a mapping)")
            return None
        return documents[0], placeholders

    def check_name(self, name: str, template: Template, path: str) -> None:
        """A modifiable parameter must not feed metadata.name, even through a hop."""
        self._trace_cut = False
        sources = self.name_sources(name, template, 0)
        if self._trace_cut:
            self.report.error(
                path,
                f"metadata.name is passed through more than {_MAX_TRACE} template calls; "
                "pass it through fewer, so that what feeds it can be checked",
            )
        for key in sorted(sources):
            parameter = self.parameters.get(key)
            if parameter is not None and parameter.modifiable:
                self.report.error(
                    path,
                    f'metadata.name uses parameter "{key}", which is modifiable; a parameter '
                    "that feeds metadata.name must be modifiable: false",
                )

    def name_sources(self, text: Any, template: Template | None, depth: int = 0) -> set[str]:
        """The parameter keys that flow into `text`, following inputs back to their callers.

        Remembered per text and template: a chain of templates each called by several tasks
        is walked once per hop, not once per path (which grows as the tasks to the power of
        the hops). A hop back into a trace under way adds nothing (a call cycle, refused on
        its own)."""
        if not isinstance(text, str):
            return set()
        if depth > _MAX_TRACE:
            self._trace_cut = True
            return set()
        key = (text, template.name if template is not None else None)
        known = self._name_memo.get(key)
        if known is not None:
            return known
        self._name_memo[key] = set()  # under way
        try:
            found = references(text)
        except RenderError:
            return set()
        keys: set[str] = set()
        workflow = self.workflow
        for reference in found:
            parts = re.split(r"[.\[]", reference)
            if parts[0] == "$var" and len(parts) > 1:
                keys.add(parts[1])
            elif parts[0] == "workflow" and len(parts) > 2 and parts[1] == "parameters":
                keys |= self.name_sources(workflow.arguments.get(parts[2]), None, depth + 1)
            elif parts[0] == "inputs" and len(parts) > 2 and template is not None:
                name = parts[2]
                keys |= self.name_sources(template.input_defaults.get(name), None, depth + 1)
                if template.name in (workflow.entrypoint, workflow.on_exit):
                    keys |= self.name_sources(workflow.arguments.get(name), None, depth + 1)
                for caller, task in self.callers.get(template.name, []):
                    if name in task.arguments:
                        keys |= self.name_sources(task.arguments[name], caller, depth + 1)
        self._name_memo[key] = keys
        return keys

    # verb outputs

    def check_outputs(self) -> None:
        """Verb outputs `$tasks.<t>.resource.<path>` read a task that captured its object."""
        tasks = {
            task.name: self.workflow.templates.get(task.template)
            for template in self.workflow.templates.values()
            for task in template.tasks or []
        }
        for name, expression in self.verb.outputs.items():
            match = _TASK_OUTPUT.match(expression.strip())
            if not match:
                continue
            path, task = _key_path(f"{self.verb.path}.outputParameters", name), match.group(1)
            if task not in tasks:
                self.report.error(path, f'no task "{task}" in this workflow')
                continue
            target = tasks[task]
            if target is None:  # an unknown template, reported on the task
                continue
            if target.resource is None or not target.resource.success_condition:
                self.report.error(
                    path, f'task "{task}" has no successCondition, so it captures no object to read'
                )


def _key_path(base: str, key: str) -> str:
    return f"{base}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f'{base}["{key}"]'


def _callees_first(calls: dict[str, set[str]]) -> list[str]:
    """The templates of an acyclic call graph, each after every template it calls."""
    order: list[str] = []
    done: set[str] = set()
    for root in calls:
        if root in done:
            continue
        done.add(root)
        pending = [(root, iter(sorted(calls.get(root, ()))))]
        while pending:
            name, callees = pending[-1]
            callee = next(callees, None)
            if callee is None:
                order.append(name)
                pending.pop()
            elif callee in calls and callee not in done:
                done.add(callee)
                pending.append((callee, iter(sorted(calls[callee]))))
    return order


def _needed(task: Task) -> set[str] | None:
    """The tasks `task` names in its dependencies or depends; None when its depends does not
    parse (`check_task` says so)."""
    needed = set(task.dependencies or [])
    if task.depends:
        try:
            needed |= set(parse_depends(task.depends).task_names())
        except ExpressionError:
            return None
    return needed


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The nodes `start` reaches through `graph`'s edges, itself only through a cycle."""
    seen: set[str] = set()
    pending = list(graph.get(start, ()))
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending.extend(graph.get(node, ()))
    return seen


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of node names (first repeated at the end), or None. Depth first,
    without recursion: a chain of thousands of nodes is as deep as it is long."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in graph:
        if root in state:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(sorted(graph.get(root, ())))]
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                pending.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                pending.append(iter(sorted(graph.get(nxt, ()))))
    return None
