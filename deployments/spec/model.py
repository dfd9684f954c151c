"""The typed model of a service plan spec, as the workflow engine and the runner read it.

Every object keeps the mapping it was built from (`raw`) where unknown keys may matter, so a
key Opsdeck does not understand yet is carried along instead of dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PARAMETER_TYPES = ("String", "Float64", "Boolean", "Password", "JSON")

REQUIRED_VERBS = ("create", "modify", "delete")
BACKUP_VERBS = ("backup", "restore", "deleteBackup")
SYSTEM_VERBS = (
    "create",
    "modify",
    "delete",
    "start",
    "stop",
    "restart",
    "backup",
    "restore",
    "deleteBackup",
    # Opsdeck's own: renders a changed backup retention into the cluster.
    "applyBackupRetention",
    "failover",
    "addCapacity",
    "removeCapacity",
)

# Seconds a verb may run when its workflow sets no activeDeadlineSeconds.
DEFAULT_DEADLINES: dict[str, int] = {"create": 3600, "restore": 3600, "backup": 7200}
FALLBACK_DEADLINE = 1800


def default_deadline(verb: str, overrides: dict[str, int] | None = None) -> int:
    """The platform deadline of a verb: `overrides` first, then create/restore 1 h, backup 2 h,
    anything else 30 min. An override keyed "*" replaces the 30 min fallback."""
    overrides = overrides or {}
    if verb in overrides:
        return int(overrides[verb])
    if verb in DEFAULT_DEADLINES:
        return DEFAULT_DEADLINES[verb]
    return int(overrides.get("*", FALLBACK_DEADLINE))


# A resource apply's own field manager (kubectl's flag, `flags: ["--field-manager=NAME"]`):
# what that manager applied before and leaves out now is removed, whatever other managers (the
# create's apply, an operator) own beside it.
FIELD_MANAGER_FLAG = "--field-manager="


@dataclass
class Parameter:
    """One `apiParameters` entry; `default` is already typed (None when there is none)."""

    key: str
    name: str
    description: str
    type: str
    modifiable: bool = False
    required: bool = False
    export: bool = True
    default: Any = None
    options: list[str] | None = None
    limits: dict | None = None
    regex: str | None = None
    # What a value the regex refuses is told, in words (x-opsdeck.regexMessage); else the
    # pattern itself.
    regex_message: str | None = None
    # String: values it may not take (x-opsdeck.reserved), each a word, or a prefix ending in
    # "*": names the service keeps for itself.
    reserved: tuple[str, ...] = ()
    step: int | float | None = None  # Float64: values are multiples of it (x-opsdeck.step)
    # Float64: a modify may raise it, never lower it (x-opsdeck.growOnly; e.g. a volume).
    grow_only: bool = False
    raw: dict = field(default_factory=dict)


@dataclass
class RetryStrategy:
    """Argo's retryStrategy; `limit` None means unlimited attempts."""

    limit: int | None = None
    policy: str = "OnFailure"
    duration: float = 0.0
    factor: float = 1.0
    cap: float | None = None
    max_duration: float | None = None


@dataclass
class ResourceAction:
    """A resource template's action on exactly one Kubernetes object (`manifest` is unrendered)."""

    action: str
    manifest: str
    success_condition: str | None = None
    failure_condition: str | None = None
    merge_strategy: str = "merge"
    flags: list[str] = field(default_factory=list)
    set_owner_reference: bool = False


@dataclass
class OutputParameter:
    """A template output read from the resource's object: a kubectl-style JSONPath, or a jq
    program (`jq -rc`); the JSONPath wins when both are given, as in Argo."""

    name: str
    json_path: str | None = None
    jq_filter: str | None = None
    default: str | None = None


@dataclass
class Task:
    """One task of a DAG template; `arguments` maps input parameter names to unrendered values."""

    name: str
    template: str
    dependencies: list[str] | None = None
    depends: str | None = None
    when: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    with_items: list[Any] | None = None
    with_param: str | None = None  # a JSON list, usually another task's output
    continue_on: dict[str, bool] = field(default_factory=dict)


@dataclass
class Template:
    """A DAG template (`tasks` set) or a resource template (`resource` set)."""

    name: str
    inputs: list[str] = field(default_factory=list)
    tasks: list[Task] | None = None
    target: str | None = None  # task names separated by spaces; may hold placeholders
    fail_fast: bool = True
    resource: ResourceAction | None = None
    retry: RetryStrategy | None = None
    active_deadline_seconds: int | None = None
    outputs: list[OutputParameter] = field(default_factory=list)
    input_defaults: dict[str, Any] = field(default_factory=dict)
    # Where the template came from, for messages: its path, and per field a path that
    # overrides "<path>.<field>" (legacy templates point back at operatorCRDConfiguration).
    path: str = ""
    source: dict[str, str] = field(default_factory=dict)

    def where(self, field_path: str) -> str:
        """The spec path to blame for `field_path` of this template."""
        return self.source.get(field_path, f"{self.path}.{field_path}")


@dataclass
class Workflow:
    """An Argo-style workflow; `active_deadline_seconds` is the effective deadline."""

    entrypoint: str
    templates: dict[str, Template]
    arguments: dict[str, Any] = field(default_factory=dict)
    active_deadline_seconds: int = FALLBACK_DEADLINE
    on_exit: str | None = None


@dataclass(frozen=True)
class Requirement:
    """What a verb needs of the instance (`x-opsdeck.requires`): a CEL expression over its
    parameters (`var`) that must hold for the verb to start, and the sentence the page and the
    refusal give when it does not."""

    when: str
    message: str


@dataclass
class Verb:
    """A system or custom workflow of a service."""

    name: str
    workflow: Workflow
    outputs: dict[str, str] = field(default_factory=dict)
    custom: bool = False
    display_name: str = ""
    description: str = ""
    parameters: list[Parameter] = field(default_factory=list)
    scope: list[str] = field(default_factory=list)
    synthesized: bool = False
    path: str = ""
    # Instance parameters a successful run sets from this verb's own parameters:
    # {instance parameter key: verb parameter key} (a custom verb's x-opsdeck.updates).
    updates: dict[str, str] = field(default_factory=dict)
    requires: Requirement | None = None
    # What the page asks before sending it (`x-opsdeck.confirm`): None asks Opsdeck's own
    # question for the verb, if any; "" asks nothing.
    confirm: str | None = None


@dataclass
class Service:
    """One entry of `services`."""

    name: str
    description: str = ""
    parameters: list[Parameter] = field(default_factory=list)
    verbs: dict[str, Verb] = field(default_factory=dict)
    backup: dict | None = None
    endpoints: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)

    def primary_endpoint(self) -> dict:
        """The `endpointConfiguration` entry marked `primary: true`, else the first; {} when
        the service declares none."""
        endpoints = [e for e in self.endpoints.values() if isinstance(e, dict)]
        return next((e for e in endpoints if e.get("primary")), endpoints[0] if endpoints else {})


@dataclass
class PlanSpec:
    """A loaded plan: its identity, its services and Opsdeck's `x-opsdeck` extensions."""

    key: str
    name: str
    service: str
    description: str
    services: list[Service]
    main: Service
    pricing: list[dict] = field(default_factory=list)  # {dimension, unit, timeUnit, price}
    currency: str = "usd"  # x-opsdeck.currency: the currency of every price
    max_instances: int | None = None
    # x-opsdeck.entitlements, in billing's keys (max_total, max_per_instance, cells,
    # denied_verbs, max_backup_retention_days); max_instances is the field above.
    entitlements: dict = field(default_factory=dict)
    # x-opsdeck.subscription with its defaults: auto_approve, grace_days, stop_after_days.
    subscription: dict = field(default_factory=dict)
    extensions: dict = field(default_factory=dict)
    allowed_kinds: list[str] = field(default_factory=list)
    # (apiVersion, kind) of every object the workflows' manifests name, in order of first
    # appearance: what a cell must serve to run the plan.
    required_kinds: list[tuple[str, str]] = field(default_factory=list)
    # Those a template waits on (a success or failure condition): what the cell's watcher
    # watches, since only a change of one of them can move a waiting run on.
    waited_kinds: list[tuple[str, str]] = field(default_factory=list)
    # The `$sys` variables the workflows read, as their root and first field
    # ("backup.destinationPath", "backup" for the whole mapping): what a cell must be given
    # (a backup destination) for the plan to run on it.
    system_read: frozenset[str] = frozenset()
    usage_rules: dict[str, str] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    parameter_groups: list[dict] = field(default_factory=list)
    # x-opsdeck.connection: which parameters are the user, database and password of the
    # endpoint, and the scheme of its URI (e.g. {user: owner, scheme: postgresql}).
    connection: dict = field(default_factory=dict)

    def parameter(self, key: str) -> Parameter | None:
        """The main service's parameter called `key`, or None."""
        return next((p for p in self.main.parameters if p.key == key), None)
