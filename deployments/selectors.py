"""Reads for deployments. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache

from django.db.models import Prefetch, Q, QuerySet
from django.utils.dateparse import parse_datetime

from accounts.models import AuditEvent, Tenant
from billing.models import Plan
from deployments import lifecycle
from deployments.models import Instance, Operation, PlanVersion, Snapshot, TaskRun
from deployments.spec.loader import load_spec
from deployments.spec.model import Parameter, PlanSpec
from deployments.spec.params import format_value


@lru_cache(maxsize=64)
def _spec(digest: str, text: str) -> PlanSpec:
    return load_spec(text)


def plan_spec(version: PlanVersion) -> PlanSpec:
    """The loaded spec of a plan version (parsed once per process; versions never change)."""
    return _spec(version.digest, version.spec_text)


@dataclass(frozen=True)
class LoadedVersion:
    spec: PlanSpec
    uses_secrets: bool  # whether the text reads platform secrets ($secret.*)


@lru_cache(maxsize=64)
def plan_version_loaded(version_id: int) -> LoadedVersion:
    """A plan version's spec by id, read and parsed once per process (versions never change):
    the runner needs it on every move without reading the spec text each time."""
    version = PlanVersion.objects.only("digest", "spec_text").get(pk=version_id)
    return LoadedVersion(plan_spec(version), "$secret." in version.spec_text)


def plan_version_latest(plan: Plan) -> PlanVersion | None:
    return plan.versions.order_by("-number").first()


def instances_for_tenant(tenant: Tenant) -> QuerySet[Instance]:
    return (
        Instance.objects.for_tenant(tenant)
        .active()
        .select_related("plan_version__plan", "cell")
        .order_by("-created_at")
    )


def operations_pending(instance: Instance) -> QuerySet[Operation]:
    """The instance's queued and running operations, oldest first."""
    return instance.operations.filter(
        state__in=[Operation.State.QUEUED, Operation.State.RUNNING]
    ).order_by("created_at")


# --- instance page ---------------------------------------------------------------------------


def instance_for_tenant(tenant: Tenant, instance_id: str) -> Instance | None:
    """One of the tenant's instances (deleted ones too: their snapshots and history remain)."""
    return (
        Instance.objects.for_tenant(tenant)
        .select_related("plan_version__plan", "cell", "created_by")
        .filter(pk=instance_id)
        .first()
    )


def operations_with_runs(instance: Instance) -> QuerySet[Operation]:
    """The instance's operations, newest first, each with its task runs (two queries in all;
    the encrypted engine state and rendered objects stay in the database)."""
    runs = TaskRun.objects.defer("object").order_by("started_at", "id")
    return (
        instance.operations.select_related("requested_by")
        .defer("engine_state", "secret_parameters", "requested_secret")
        .prefetch_related(Prefetch("task_runs", queryset=runs))
        .order_by("-created_at")
    )


def snapshots_of_instance(instance: Instance) -> QuerySet[Snapshot]:
    """The instance's snapshots, newest first, deleted ones left out."""
    return (
        Snapshot.objects.filter(tenant=instance.tenant, instance=instance)
        .exclude(status=Snapshot.Status.DELETED)
        .order_by("-created_at")
    )


def snapshot_of_instance(instance: Instance, snapshot_id: int) -> Snapshot | None:
    return snapshots_of_instance(instance).filter(pk=snapshot_id).first()


def instance_audit_events(instance: Instance) -> QuerySet[AuditEvent]:
    """The audit events about an instance: those aimed at it, at its snapshots, and those whose
    payload names it (a restore from one of its snapshots)."""
    snapshot_ids = Snapshot.objects.filter(instance=instance).values_list("pk", flat=True)
    about = (
        Q(target_type="instance", target_id=instance.pk)
        | Q(target_type="snapshot", target_id__in=[str(pk) for pk in snapshot_ids])
        | Q(payload__source=instance.pk)
    )
    return AuditEvent.objects.for_tenant(instance.tenant).filter(about).select_related("actor")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    message: str


@dataclass(frozen=True)
class ObservedStatus:
    """What the operator last reported about an instance, in Opsdeck's terms."""

    phase: str
    ready: int | None
    total: int | None
    primary: str
    conditions: list[Condition]
    at: datetime | None


def observed_status(instance: Instance) -> ObservedStatus | None:
    """The instance's observed status, None until the status sync has seen it. The sync
    stores `{"phase", "ready", "total", "primary", "conditions": [{"type", "status",
    "message"}], "at": ISO time}`; a key it leaves out shows as unknown."""
    observed = instance.observed or {}
    if not observed:
        return None
    conditions = [
        Condition(str(c.get("type", "")), str(c.get("status", "")), str(c.get("message", "")))
        for c in observed.get("conditions") or []
        if isinstance(c, dict)
    ]
    at = parse_datetime(observed["at"]) if isinstance(observed.get("at"), str) else None
    return ObservedStatus(
        phase=str(observed.get("phase") or ""),
        ready=observed.get("ready") if isinstance(observed.get("ready"), int) else None,
        total=observed.get("total") if isinstance(observed.get("total"), int) else None,
        primary=str(observed.get("primary") or ""),
        conditions=conditions,
        at=at,
    )


@dataclass(frozen=True)
class ParameterShown:
    key: str
    name: str
    value: str  # "set, hidden" for a Password


HIDDEN_VALUE = "set, hidden"


def instance_parameters_shown(instance: Instance) -> list[ParameterShown]:
    """The instance's parameters as the page lists them, in the spec's order: Password values
    are never read (they are always set: a missing one is generated), and the others the spec
    keeps out of view (`export: false`) are left out."""
    spec = plan_spec(instance.plan_version)
    shown = []
    for parameter in spec.main.parameters:
        if parameter.type == "Password":
            value = HIDDEN_VALUE
        elif parameter.export and parameter.key in instance.parameters:
            value = format_value(parameter, instance.parameters[parameter.key])
        else:
            continue
        shown.append(ParameterShown(parameter.key, parameter.name or parameter.key, value))
    return shown


# The verbs offered as buttons on the instance page, in this order, with their labels.
BUTTONS = {
    "stop": "Stop",
    "start": "Start",
    "restart": "Restart",
    "failover": "Switchover",
    "backup": "Back up now",
}


@dataclass(frozen=True)
class InstanceAction:
    """A button on the instance page: `refusal` says why the instance's state forbids it now."""

    verb: str
    label: str
    description: str = ""
    refusal: str | None = None
    parameters: list[Parameter] = field(default_factory=list)

    @property
    def in_dialog(self) -> bool:
        """Whether it asks for input or confirmation first."""
        return bool(self.parameters) or self.verb == "delete"


def instance_retry_verb(instance: Instance) -> str | None:
    """The verb to offer as "Retry": create or restore, when the instance failed because that
    verb failed (None otherwise)."""
    if instance.state != Instance.State.FAILED:
        return None
    last = (
        instance.operations.exclude(state=Operation.State.CANCELLED)
        .order_by("-created_at")
        .only("verb", "state")
        .first()
    )
    if last and last.verb in {"create", "restore"} and last.state == Operation.State.FAILED:
        return last.verb
    return None


def instance_actions(instance: Instance, allowed: frozenset[str]) -> list[InstanceAction]:
    """The actions the instance page offers to a member whose role allows `allowed`: the
    plan's lifecycle verbs, a retry of a failed create or restore, its custom workflows, and
    delete last."""
    spec = plan_spec(instance.plan_version)
    verbs = spec.main.verbs
    actions = []

    def offer(verb: str, label: str, *, custom: bool = False, **extra) -> None:
        if lifecycle.rule(verb, custom=custom).action not in allowed:
            return
        refusal = lifecycle.refusal(verb, instance.state, custom=custom)
        actions.append(InstanceAction(verb, label, refusal=refusal, **extra))

    for verb, label in BUTTONS.items():
        if verb in verbs:
            offer(verb, label)
    retry = instance_retry_verb(instance)
    if retry and retry in verbs:
        offer(retry, "Retry", description=f"Run the failed {retry} again.")
    for verb in verbs.values():
        if verb.custom:
            offer(
                verb.name,
                verb.display_name or verb.name,
                custom=True,
                description=verb.description,
                parameters=verb.parameters,
            )
    offer("delete", "Delete")
    return actions


# How the page names the verbs that are not buttons (custom ones use their display name).
VERB_LABELS = {
    **BUTTONS,
    "backup": "Backup",
    "create": "Create",
    "modify": "Modify",
    "restore": "Restore",
    "deleteBackup": "Delete backup",
    "delete": "Delete",
}


def verb_labels(version: PlanVersion) -> dict[str, str]:
    """Each verb of the plan version as the operations timeline names it."""
    verbs = plan_spec(version).main.verbs.values()
    return {v.name: VERB_LABELS.get(v.name) or v.display_name or v.name for v in verbs}
