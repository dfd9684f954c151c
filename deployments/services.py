"""Writes for deployments: plans from specs, cells, instances and their operations.

Every instance action checks the role, the instance's state and the plan's
entitlements, records an audit event, and queues an Operation that a worker
runs (dispatched after commit). A repeated request id returns the operation
it created the first time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime

import yaml
from celery import current_app
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.audit import Actor, audit_record, audited_action
from accounts.errors import ActionDenied
from accounts.models import Tenant
from accounts.services import permission_require
from billing import entitlements
from billing import services as billing_services
from billing.models import Plan
from deployments import lifecycle, selectors
from deployments.kube import KubeDriver, api_client_from_kubeconfig
from deployments.models import (
    Cell,
    Instance,
    InstanceStateChange,
    Operation,
    PlanVersion,
    Snapshot,
)
from deployments.spec.loader import load_spec
from deployments.spec.model import Parameter
from deployments.spec.params import ParameterErrors, validate_parameters
from deployments.workflow.driver import DriverError

STEP_TASK = "deployments.tasks.operation_step"


# --- plans ------------------------------------------------------------------------------


@dataclass
class PlanLoad:
    """What loading one spec changed."""

    plan: Plan
    version: PlanVersion
    plan_changed: bool
    version_created: bool
    warnings: list[str] = field(default_factory=list)


@transaction.atomic
def plan_load(*, text: str) -> PlanLoad:
    """Create or update the plan a spec describes; a changed spec adds a plan version.

    Raises SpecError (with every error) when the spec is invalid.
    """
    spec = load_spec(text)
    limits = {"max_instances": spec.max_instances} if spec.max_instances is not None else {}
    plan, plan_changed = billing_services.plan_upsert(
        key=spec.key,
        name=spec.name,
        service=spec.service,
        description=spec.description,
        limits=limits,
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    version = plan.versions.filter(digest=digest).first()
    created = version is None
    if created:
        latest = selectors.plan_version_latest(plan)
        version = PlanVersion.objects.create(
            plan=plan,
            number=(latest.number + 1) if latest else 1,
            spec_text=text,
            parsed=yaml.safe_load(text),
            digest=digest,
        )
    return PlanLoad(plan, version, plan_changed, created, spec.warnings)


# --- cells --------------------------------------------------------------------------------

CNPG_KINDS = [("postgresql.cnpg.io/v1", "Cluster"), ("postgresql.cnpg.io/v1", "Backup")]


def cell_check(*, kubeconfig: str, context: str = "") -> None:
    """Raise ValidationError unless the cluster answers and serves the operator's kinds."""
    try:
        driver = KubeDriver(api_client_from_kubeconfig(kubeconfig, context=context or None))
        try:
            missing = [kind for api, kind in CNPG_KINDS if not driver.serves(api, kind)]
        finally:
            driver.close()
    except DriverError as exc:
        raise ValidationError(f"The cluster cannot be reached: {exc.message}") from exc
    if missing:
        raise ValidationError(
            f"The cluster does not serve {', '.join(missing)}: install CloudNativePG first."
        )


@transaction.atomic
def cell_register(
    *,
    name: str,
    kubeconfig: str,
    context: str = "",
    region: str = "",
    cloud: str = "",
    deployment_model: str = Cell.DeploymentModel.HOSTED,
    backup_destination: str = "",
    backup_credentials: dict | None = None,
    make_default: bool = False,
) -> Cell:
    """Register (or update) the cell `name` after checking that its cluster answers."""
    cell_check(kubeconfig=kubeconfig, context=context)
    cell = Cell.objects.select_for_update().filter(name=name).first() or Cell(name=name)
    cell.kubeconfig = kubeconfig
    cell.context = context
    cell.region = region
    cell.cloud = cloud
    cell.deployment_model = deployment_model
    cell.backup_destination = backup_destination
    cell.backup_credentials = json.dumps(backup_credentials) if backup_credentials else ""
    if make_default or not Cell.objects.exclude(pk=cell.pk).filter(is_default=True).exists():
        Cell.objects.exclude(pk=cell.pk).filter(is_default=True).update(is_default=False)
        cell.is_default = True
    cell.full_clean()
    cell.save()
    return cell


# --- instances ------------------------------------------------------------------------------


def _split(parameters: list[Parameter], values: dict) -> tuple[dict, str]:
    """Plain values and the JSON of the Password ones (stored encrypted)."""
    secret = {p.key for p in parameters if p.type == "Password"}
    plain = {k: v for k, v in values.items() if k not in secret}
    hidden = {k: v for k, v in values.items() if k in secret}
    return plain, json.dumps(hidden) if hidden else ""


def instance_parameters(instance: Instance) -> dict:
    """All of an instance's parameter values, Password ones included."""
    hidden = json.loads(instance.secret_parameters) if instance.secret_parameters else {}
    return {**instance.parameters, **hidden}


def _dispatch(operation: Operation) -> None:
    transaction.on_commit(lambda: current_app.send_task(STEP_TASK, args=[str(operation.pk)]))


def instance_state_set(
    instance: Instance, state: str, *, operation: Operation | None = None, reason: str = ""
) -> None:
    """Move an instance to `state`, recording the change with its time."""
    if instance.state == state:
        return
    InstanceStateChange.objects.create(
        instance=instance,
        from_state=instance.state,
        to_state=state,
        operation=operation,
        reason=reason[:500],
    )
    instance.state = state
    instance.updated_at = timezone.now()
    instance.save(update_fields=["state", "updated_at"])


def _projected_state(instance: Instance) -> str:
    """The state the instance will be in once its queued operations have run."""
    state = instance.state
    for op in selectors.operations_pending(instance):
        spec = selectors.plan_spec(op.plan_version)
        verb = spec.main.verbs.get(op.verb)
        after = lifecycle.rule(op.verb, custom=bool(verb and verb.custom)).after
        state = after or state
    return state


def _parameter_errors(exc: ParameterErrors) -> ValidationError:
    return ValidationError({key: message for key, message in exc.errors.items()})


def _instance_new(
    *,
    actor: Actor,
    tenant: Tenant,
    version: PlanVersion,
    cell: Cell | None,
    name: str,
    values: dict,
) -> tuple[Instance, dict, str]:
    """A new instance row (state creating) after the checks every new instance passes:
    a cell, a name, the plan's limit for the tenant, valid parameters.

    Returns the instance, its plain parameters and the encrypted JSON of its passwords.
    """
    cell = cell or Cell.objects.filter(is_default=True).first()
    if cell is None:
        raise ValidationError("No cell is registered to run instances on.")
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Give the instance a name."})
    # Lock the tenant so two concurrent creates cannot both pass the limit.
    Tenant.objects.select_for_update().get(pk=tenant.pk)
    plan = version.plan
    try:
        entitlements.check(
            tenant=tenant,
            plan=plan,
            action="instance.create",
            active_instances=Instance.objects.for_tenant(tenant)
            .active()
            .filter(plan_version__plan=plan)
            .count(),
        )
    except entitlements.EntitlementDenied as exc:
        raise ActionDenied(str(exc)) from exc
    spec = selectors.plan_spec(version)
    try:
        typed = validate_parameters(spec.main.parameters, values)
    except ParameterErrors as exc:
        raise _parameter_errors(exc) from exc
    plain, hidden = _split(spec.main.parameters, typed)
    instance = Instance.objects.create(
        tenant=tenant,
        name=name,
        plan_version=version,
        cell=cell,
        parameters=plain,
        secret_parameters=hidden,
        created_by=actor.user,
    )
    InstanceStateChange.objects.create(instance=instance, to_state=instance.state)
    return instance, plain, hidden


def instance_create(
    *,
    actor: Actor,
    tenant: Tenant,
    plan: Plan,
    name: str,
    parameters: dict,
    request_id: str,
    cell: Cell | None = None,
) -> Operation:
    """A new instance of `plan` for `tenant`, and the operation that creates it."""
    existing = Operation.objects.filter(
        instance__tenant=tenant, verb="create", request_id=request_id
    ).first()
    if existing is not None:
        return existing
    with audited_action(actor=actor, action="instance.create", tenant=tenant):
        permission_require(actor=actor, tenant=tenant, action="instance.create")
        version = selectors.plan_version_latest(plan)
        if version is None:
            raise ValidationError("This plan has no released version yet.")
        instance, plain, hidden = _instance_new(
            actor=actor, tenant=tenant, version=version, cell=cell, name=name, values=parameters
        )
        operation = Operation.objects.create(
            instance=instance,
            verb="create",
            requested_by=actor.user,
            request_id=request_id,
            plan_version=version,
            parameters=plain,
            secret_parameters=hidden,
        )
        audit_record(
            actor=actor,
            action="instance.create",
            tenant=tenant,
            target=instance,
            payload={"name": name, "plan": plan.key, "parameters": plain},
        )
        _dispatch(operation)
    return operation


def instance_action(
    *,
    actor: Actor,
    instance: Instance,
    verb: str,
    request_id: str,
    parameters: dict | None = None,
) -> Operation:
    """Queue `verb` (modify, stop, start, restart, backup, failover, a custom verb) on an
    instance; it runs after the operations queued before it."""
    existing = instance.operations.filter(request_id=request_id).first()
    if existing is not None:
        return existing
    tenant = instance.tenant
    spec = selectors.plan_spec(instance.plan_version)
    spec_verb = spec.main.verbs.get(verb)
    if spec_verb is None or verb in {"delete", "create", "restore"}:
        raise ValidationError(f"This plan has no {verb} action.")
    rule = lifecycle.rule(verb, custom=spec_verb.custom)
    with audited_action(actor=actor, action=f"instance.{verb}", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action=rule.action)
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        reason = lifecycle.refusal(verb, _projected_state(instance), custom=spec_verb.custom)
        if reason:
            raise ActionDenied(reason)
        current = instance_parameters(instance)
        values, arguments = current, {}
        try:
            if verb == "modify":
                values = validate_parameters(
                    spec.main.parameters, parameters or {}, current=current
                )
            elif spec_verb.parameters:
                arguments = validate_parameters(spec_verb.parameters, parameters or {})
        except ParameterErrors as exc:
            raise _parameter_errors(exc) from exc
        plain, hidden = _split(spec.main.parameters, values)
        # A custom verb's Password parameters are kept encrypted with the instance's own.
        verb_plain, verb_hidden = _split(spec_verb.parameters, arguments)
        if verb_hidden:
            hidden = json.dumps({**json.loads(hidden or "{}"), **json.loads(verb_hidden)})
        extra = {"verb_parameters": verb_plain} if verb_plain else {}
        if verb == "backup":
            extra.update(_snapshot_start(instance))
        operation = Operation.objects.create(
            instance=instance,
            verb=verb,
            requested_by=actor.user,
            request_id=request_id,
            plan_version=instance.plan_version,
            parameters=plain,
            secret_parameters=hidden,
            arguments=extra,
        )
        if verb == "backup":
            Snapshot.objects.filter(pk=extra["snapshot"]).update(operation=operation)
        changed = {k: v for k, v in plain.items() if instance.parameters.get(k) != v}
        audit_record(
            actor=actor,
            action=f"instance.{verb}",
            tenant=tenant,
            target=instance,
            payload={"changed": changed} if verb == "modify" else {},
        )
        _dispatch(operation)
    return operation


def _snapshot_start(instance: Instance) -> dict:
    """A pending snapshot for a backup, and the $sys.snapshot values its workflow sees."""
    now = timezone.now()
    name = f"{instance.pk}-{now:%Y%m%d%H%M%S}"
    snapshot = Snapshot.objects.create(
        tenant=instance.tenant,
        instance=instance,
        source_instance_id=instance.pk,
        plan_version=instance.plan_version,
        name=name,
    )
    return {"snapshot": snapshot.pk, "sys": {"snapshot": {"id": name, "time": now.isoformat()}}}


def instance_delete(*, actor: Actor, instance: Instance, request_id: str) -> Operation:
    """Delete an instance: always accepted; queued operations are cancelled and a running
    one stops at its next step before the delete workflow runs."""
    existing = instance.operations.filter(request_id=request_id).first()
    if existing is not None:
        return existing
    tenant = instance.tenant
    with audited_action(actor=actor, action="instance.delete", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action="instance.delete")
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        if instance.state in {Instance.State.DELETING, Instance.State.DELETED}:
            pending = instance.operations.filter(verb="delete").order_by("-created_at").first()
            if pending is not None:
                return pending
        now = timezone.now()
        instance.operations.filter(state=Operation.State.QUEUED).update(
            state=Operation.State.CANCELLED,
            finished_at=now,
            error="Cancelled: the instance is being deleted.",
        )
        instance.operations.filter(state=Operation.State.RUNNING).update(
            cancel_reason="The instance is being deleted."
        )
        spec = selectors.plan_spec(instance.plan_version)
        if (
            (spec.main.backup or {}).get("snapshotBeforeDeletion")
            and "backup" in spec.main.verbs
            and instance.state in {Instance.State.RUNNING, Instance.State.UPDATING}
        ):
            # A last snapshot, taken before the delete workflow runs (it queues first).
            extra = _snapshot_start(instance)
            last = Operation.objects.create(
                instance=instance,
                verb="backup",
                requested_by=actor.user,
                request_id=f"{request_id}:last-snapshot",
                plan_version=instance.plan_version,
                parameters=instance.parameters,
                secret_parameters=instance.secret_parameters,
                arguments=extra,
            )
            Snapshot.objects.filter(pk=extra["snapshot"]).update(operation=last)
            _dispatch(last)
        operation = Operation.objects.create(
            instance=instance,
            verb="delete",
            requested_by=actor.user,
            request_id=request_id,
            plan_version=instance.plan_version,
            parameters=instance.parameters,
            secret_parameters=instance.secret_parameters,
        )
        audit_record(actor=actor, action="instance.delete", tenant=tenant, target=instance)
        _dispatch(operation)
    return operation


def snapshot_restore(
    *,
    actor: Actor,
    snapshot: Snapshot,
    name: str,
    request_id: str,
    parameters: dict | None = None,
    target_time: datetime | None = None,
) -> Operation:
    """A NEW instance from a completed snapshot, on the snapshot's plan version; with
    `target_time`, recovered to that instant (`$sys.restore.targetTime`) instead.

    Parameters default to the source instance's (when it still exists) and may be changed
    within the plan's rules; the snapshot's metadata reaches the restore workflow as
    `$sys.restore.metadata.*`.
    """
    tenant = snapshot.tenant
    existing = Operation.objects.filter(
        instance__tenant=tenant, verb="restore", request_id=request_id
    ).first()
    if existing is not None:
        return existing
    with audited_action(actor=actor, action="instance.restore", tenant=tenant, target=snapshot):
        permission_require(actor=actor, tenant=tenant, action="backup.restore")
        if snapshot.status != Snapshot.Status.COMPLETED:
            raise ValidationError("Only a completed snapshot can be restored.")
        if target_time is not None and target_time < snapshot.created_at:
            raise ValidationError("The point in time is before the snapshot was taken.")
        if target_time is not None and target_time > timezone.now():
            raise ValidationError("The point in time is in the future.")
        version = snapshot.plan_version
        spec = selectors.plan_spec(version)
        if "restore" not in spec.main.verbs:
            raise ValidationError("This plan cannot restore snapshots.")
        source = snapshot.instance
        defaults = instance_parameters(source) if source is not None else {}
        instance, plain, hidden = _instance_new(
            actor=actor,
            tenant=tenant,
            version=version,
            cell=None,
            name=name,
            values={**defaults, **(parameters or {})},
        )
        restore = {
            "snapshotId": snapshot.name,
            "snapshotTime": snapshot.created_at.isoformat(),
            # Point in time: recover up to this instant (RFC 3339, UTC); "" means the snapshot.
            "targetTime": target_time.strftime("%Y-%m-%dT%H:%M:%SZ") if target_time else "",
            "metadata": snapshot.metadata,
        }
        operation = Operation.objects.create(
            instance=instance,
            verb="restore",
            requested_by=actor.user,
            request_id=request_id,
            plan_version=version,
            parameters=plain,
            secret_parameters=hidden,
            arguments={
                "sys": {
                    "restore": restore,
                    "sourceInstanceId": snapshot.source_instance_id,
                    "targetInstanceId": instance.pk,
                }
            },
        )
        audit_record(
            actor=actor,
            action="instance.restore",
            tenant=tenant,
            target=instance,
            payload={
                "name": name,
                "snapshot": snapshot.name,
                "source": snapshot.source_instance_id,
            },
        )
        _dispatch(operation)
    return operation


def snapshot_delete(*, actor: Actor, snapshot: Snapshot, request_id: str) -> Operation | None:
    """Forget a snapshot: its instance runs the plan's deleteBackup workflow when it still
    exists; otherwise the snapshot is only marked deleted (the object store's retention
    policy prunes the data)."""
    tenant = snapshot.tenant
    with audited_action(actor=actor, action="backup.delete", tenant=tenant, target=snapshot):
        permission_require(actor=actor, tenant=tenant, action="backup.delete")
        snapshot = Snapshot.objects.select_for_update().get(pk=snapshot.pk)
        if snapshot.status == Snapshot.Status.DELETED:
            return None
        instance = snapshot.instance
        spec = selectors.plan_spec(snapshot.plan_version)
        runs = (
            instance is not None
            and instance.state not in {Instance.State.DELETING, Instance.State.DELETED}
            and "deleteBackup" in spec.main.verbs
        )
        audit_record(
            actor=actor,
            action="backup.delete",
            tenant=tenant,
            target=snapshot,
            payload={"name": snapshot.name},
        )
        if not runs:
            snapshot.status = Snapshot.Status.DELETED
            snapshot.save(update_fields=["status"])
            return None
        existing = instance.operations.filter(request_id=request_id).first()
        if existing is not None:
            return existing
        operation = Operation.objects.create(
            instance=instance,
            verb="deleteBackup",
            requested_by=actor.user,
            request_id=request_id,
            plan_version=instance.plan_version,
            parameters=instance.parameters,
            secret_parameters=instance.secret_parameters,
            arguments={
                "forget_snapshot": snapshot.pk,
                "sys": {"snapshot": {"id": snapshot.name, "time": snapshot.created_at.isoformat()}},
            },
        )
        _dispatch(operation)
    return operation
