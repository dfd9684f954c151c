"""The deployments API (`/api/v1/`): an organization's deployments and their operations, read,
created, acted on, deleted and cancelled with one of its API tokens (`accounts.api`), through
the services the portal uses, with the same role rules. Another organization's deployment is a
404."""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import ValidationError
from django.http import Http404
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import idempotency, roles
from accounts import services as account_services
from accounts.api import token_actor, token_require
from accounts.errors import ActionDenied
from billing import entitlements
from deployments import selectors, services
from deployments.models import Cell, Instance, Operation, Snapshot


class Conflict(APIException):
    """What the deployment as it is now forbids, said as the service says it."""

    status_code = 409


class Pages(PageNumberPagination):
    page_size = 25
    page_size_query_param = "per_page"
    max_page_size = 100


def _plan(instance: Instance) -> dict:
    version = instance.plan_version
    return {"key": version.plan.key, "name": version.plan.name, "version": version.number}


def instance_row(instance: Instance) -> dict:
    """A deployment as the list shows it."""
    return {
        "id": instance.pk,
        "name": instance.name,
        "state": instance.state,
        "health": instance.health,
        "plan": _plan(instance),
        "region": instance.cell.region,
        "cell": instance.cell.name,
        "created_at": instance.created_at,
    }


def upgrade_shown(instance: Instance) -> dict | None:
    """The upgrade its page offers: the plan's newest version, the parameters it adds and
    removes, and why it cannot be taken now (`refused`: the deployment's state, operations
    pending, a region the version does not run in, or values it refuses); None when the
    deployment runs the newest version."""
    preview = selectors.upgrade_preview(instance)
    if preview is None:
        return None
    refused = (
        selectors.lifecycle_refusal(instance, "upgrade")
        or selectors.upgrade_cell_refusal(instance, preview.target)
        or " ".join(preview.problems.values())
    )
    return {
        "version": preview.target.number,
        "adds": [change.key for change in preview.added],
        "removes": [change.key for change in preview.removed],
        "refused": refused or None,
    }


def instance_shown(instance: Instance) -> dict:
    """A deployment as its page shows it: parameters as listed there (a password only as
    "set, hidden"), never a secret, and the upgrade it offers."""
    return {
        **instance_row(instance),
        "health_reason": instance.health_reason,
        "deletion_protected": instance.deletion_protected,
        "parameters": {
            shown.key: {"name": shown.name, "value": shown.value}
            for shown in selectors.instance_parameters_shown(instance)
        },
        "outputs": instance.outputs,
        "upgrade": upgrade_shown(instance),
    }


def _requester(operation: Operation) -> str | None:
    """Who asked for it, as the Operations tab says: an address, an API token, or None (the
    system)."""
    if operation.requested_by is not None:
        return operation.requested_by.email
    if operation.requested_by_token is not None:
        return operation.requested_by_token.label
    return None


def operation_shown(operation: Operation) -> dict:
    return {
        "id": str(operation.pk),
        "deployment": operation.instance_id,
        "verb": operation.verb,
        "state": operation.state,
        "error": operation.error,
        "requested_by": _requester(operation),
        "created_at": operation.created_at,
        "started_at": operation.started_at,
        "finished_at": operation.finished_at,
    }


def _instance(request, instance_id: str) -> Instance:
    token_require(request, "instance.view")
    instance = selectors.instance_for_tenant(request.auth.tenant, instance_id)
    if instance is None:
        raise Http404("No such deployment.")
    return instance


def _refused(request, exc: ActionDenied, action: str) -> Response:
    """A service's refusal: the token revoked or expired meanwhile is a 401, a role that does
    not allow `action` a 403 (raised on, as audited), and what the deployment's state or the
    plan's limits forbid now a 409 with the service's reason."""
    if exc.reason == account_services.TOKEN_INVALID:
        raise AuthenticationFailed(exc.reason) from None
    if roles.can(request.auth.role, action):
        return Response({"error": exc.reason}, status=409)
    raise exc


def _body(request) -> dict:
    if not isinstance(request.data, dict):
        raise ValidationError('Send a JSON object, e.g. {"parameters": {}}.')
    return request.data


def _queued(operation: Operation) -> Response:
    """202 with the operation as the API shows it (read again with who asked for it)."""
    operation = _operations(operation.instance).get(pk=operation.pk)
    return Response(operation_shown(operation), status=202)


def _key(request) -> str:
    return request.headers.get("Idempotency-Key", "")


def _cell(tenant, name) -> Cell | None:
    """The region named in a create's body (None: the organization's default one)."""
    if name is None:
        return None
    cell = (
        Cell.objects.offered_to(tenant).filter(name=name).first() if isinstance(name, str) else None
    )
    if cell is None:
        raise ValidationError({"cell": "No such region is offered to your organization."})
    return cell


def _parameter_shown(parameter) -> dict:
    """A plan parameter as a create's body gives it (a password has no default to show)."""
    return {
        "key": parameter.key,
        "name": parameter.name or parameter.key,
        "description": parameter.description,
        "type": parameter.type,
        "required": parameter.required,
        "modifiable": parameter.modifiable,
        "default": None if parameter.type == "Password" else parameter.default,
        "options": parameter.options,
        "limits": parameter.limits,
    }


class PlanList(APIView):
    """The plans the organization may create deployments of, as its catalog lists them: each
    with its parameters and the regions (cells) it runs in for the organization."""

    def get(self, request):
        token_require(request, "instance.view")
        tenant = request.auth.tenant
        available = selectors.plans_available(tenant)
        offered = list(Cell.objects.offered_to(tenant).order_by("name").only("name", "region"))
        limits = entitlements.limits_of(tenant, [version.plan for version, _ in available])
        plans = []
        for version, spec in sorted(available, key=lambda found: found[0].plan.key):
            runs_in = limits[version.plan.pk].cells
            plans.append(
                {
                    "key": version.plan.key,
                    "name": version.plan.name,
                    "version": version.number,
                    "parameters": [_parameter_shown(p) for p in spec.main.parameters],
                    "regions": [
                        {"cell": cell.name, "region": cell.region}
                        for cell in offered
                        if runs_in is None or cell.name in runs_in
                    ],
                }
            )
        return Response({"results": plans})


class InstanceList(APIView):
    def get(self, request):
        """The organization's deployments, as its Deployments page lists them: `?search=` (a
        name, any part of it, or the start of an id) and `?state=` filter them as its filters
        do; deleted ones only when `state=deleted` asks for them."""
        token_require(request, "instance.view")
        state = request.query_params.get("state", "")
        if state and state not in Instance.State.values:
            raise ValidationError({"state": f"Use one of {', '.join(Instance.State.values)}."})
        found = selectors.instances_for_tenant(
            request.auth.tenant, search=request.query_params.get("search", ""), state=state
        )
        pages = Pages()
        rows = pages.paginate_queryset(found, request, view=self)
        return pages.get_paginated_response([instance_row(i) for i in rows])

    def post(self, request):
        """Create a deployment, as the portal's create form does: body `{"name", "plan" (its
        key), "parameters", "cell" (optional: the organization's default region)}`. The
        `Idempotency-Key` is the request id: a repeat returns the first create's operation."""
        token_require(request, "instance.create")
        tenant = request.auth.tenant
        body = _body(request)
        key = body.get("plan")
        found = selectors.plan_available(tenant, key) if isinstance(key, str) else None
        if found is None:
            raise ValidationError(
                {"plan": "No such plan: name one by its key, as the catalog does."}
            )
        try:
            operation = services.instance_create(
                actor=token_actor(request),
                tenant=tenant,
                plan=found[0].plan,
                name=body.get("name"),
                parameters=body.get("parameters", {}),
                request_id=_key(request),
                cell=_cell(tenant, body.get("cell")),
            )
        except ActionDenied as exc:
            return _refused(request, exc, "instance.create")
        return _queued(operation)


def _fields(body: dict, allowed: tuple[str, ...]) -> dict:
    """The body's fields, each of `allowed`; a 400 naming any other."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ValidationError(
            {name: f"Not a field that can be changed here: send {', '.join(allowed)}."
             for name in unknown}
        )  # fmt: skip
    return body


class InstanceDetail(APIView):
    def get(self, request, instance_id: str):
        return Response(instance_shown(_instance(request, instance_id)))

    def patch(self, request, instance_id: str):
        """Turn deletion protection on or off, as the page's switch does: body
        `{"deletion_protected": true}`. 200 with the deployment."""
        instance = _instance(request, instance_id)
        token_require(request, "instance.protect", target=instance)
        body = _fields(_body(request), ("deletion_protected",))
        if not isinstance(body.get("deletion_protected"), bool):
            raise ValidationError({"deletion_protected": "Send true or false."})
        try:
            services.instance_protect(
                actor=token_actor(request), instance=instance, on=body["deletion_protected"]
            )
        except ActionDenied as exc:
            return _refused(request, exc, "instance.protect")
        return Response(instance_shown(_instance(request, instance_id)))

    def delete(self, request, instance_id: str):
        """Delete a deployment, as its Delete button does: with a last backup when its plan
        takes one, unless `?last_backup=false`. A repeat (or a second delete) returns the
        delete already queued."""
        instance = _instance(request, instance_id)
        last_backup = request.query_params.get("last_backup", "true")
        if last_backup not in {"true", "false"}:
            raise ValidationError({"last_backup": "Use true or false."})
        try:
            operation = services.instance_delete(
                actor=token_actor(request),
                instance=instance,
                request_id=_key(request),
                last_backup=last_backup == "true",
            )
        except ActionDenied as exc:
            return _refused(request, exc, "instance.delete")
        return _queued(operation)


def _operations(instance: Instance):
    return (
        instance.operations.select_related("requested_by", "requested_by_token")
        .only(*selectors.OPERATION_LISTED)
        .order_by("-created_at", "-pk")
    )


class OperationList(APIView):
    def get(self, request, instance_id: str):
        instance = _instance(request, instance_id)
        pages = Pages()
        rows = pages.paginate_queryset(_operations(instance), request, view=self)
        return pages.get_paginated_response([operation_shown(o) for o in rows])


class OperationDetail(APIView):
    def get(self, request, instance_id: str, operation_id):
        instance = _instance(request, instance_id)
        operation = _operations(instance).filter(pk=operation_id).first()
        if operation is None:
            raise Http404("No such operation.")
        return Response(operation_shown(operation))


def _version(body: dict) -> int | None:
    """The version an upgrade's body expects to upgrade to (None: the newest, whichever)."""
    version = body.get("version")
    if version is not None and (type(version) is not int or version < 1):
        raise ValidationError({"version": "Give the version number to upgrade to, e.g. 3."})
    return version


class InstanceAction(APIView):
    """Queue a verb (stop, start, restart, backup, modify, upgrade, rollback, a custom one) as
    the portal's buttons do; the body's `parameters` are the verb's own (a modify's: the values
    to change; an upgrade and a roll back take none). An upgrade goes to the plan's newest
    version; with `version`, only if that is the newest (else a 409 naming the newest, as
    the deployment's `upgrade` does).
    The `Idempotency-Key` header is the request id: a repeat returns the first operation, the
    same key with another action or parameters is a 409."""

    def post(self, request, instance_id: str, verb: str):
        instance = _instance(request, instance_id)
        body = _body(request)
        if verb in {"upgrade", "rollback"} and body.get("parameters"):
            raise ValidationError(f"The {verb} takes no parameters: send {{}}.")
        if verb == "rollback" and "version" in body:
            raise ValidationError(
                {"version": "A roll back goes to what last ran: send no version."}
            )
        try:
            if verb == "upgrade":
                operation = _upgrade(request, instance, _version(body))
            elif verb == "rollback":
                operation = services.instance_rollback(
                    actor=token_actor(request), instance=instance, request_id=_key(request)
                )
            else:
                operation = services.instance_action(
                    actor=token_actor(request),
                    instance=instance,
                    verb=verb,
                    request_id=_key(request),
                    parameters=body.get("parameters"),
                )
        except ActionDenied as exc:
            return _refused(request, exc, selectors.verb_rule(instance.plan_version, verb).action)
        return _queued(operation)


def _upgrade(request, instance: Instance, version: int | None) -> Operation:
    try:
        return services.instance_upgrade(
            actor=token_actor(request), instance=instance, request_id=_key(request), seen=version
        )
    except services.UpgradeMoved as exc:
        raise Conflict(
            f"Version {exc.newest} is the plan's newest, not {exc.seen}: read what it changes "
            "(the deployment's upgrade), then upgrade to it."
        ) from None


class OperationCancel(APIView):
    """Cancel an operation, as the Operations tab's Cancel does: a queued one ends at once, a
    running one stops at its next step (202 either way, with the operation as it is now). One
    that has ended, is stopping already or cannot be stopped (a delete, a running backup) is a
    409 saying why."""

    def post(self, request, instance_id: str, operation_id):
        instance = _instance(request, instance_id)
        operation = instance.operations.filter(pk=operation_id).first()
        if operation is None:
            raise Http404("No such operation.")
        try:
            operation = services.operation_cancel(
                actor=token_actor(request), operation=operation, request_id=_key(request)
            )
        except ActionDenied as exc:
            return _refused(
                request, exc, selectors.verb_rule(operation.plan_version, operation.verb).action
            )
        except ValidationError as exc:
            if exc.messages == [idempotency.REUSED] or hasattr(exc, "error_dict"):
                raise  # a reused or unusable Idempotency-Key: 409 or 400, as everywhere
            raise Conflict(" ".join(exc.messages)) from None
        return _queued(operation)


def snapshot_shown(snapshot: Snapshot) -> dict:
    return {
        "id": snapshot.pk,
        "name": snapshot.name,
        "status": snapshot.status,
        "scheduled": snapshot.scheduled,
        "created_at": snapshot.created_at,
        "taken_at": snapshot.taken_at,
        "expires_at": snapshot.expires_at,
    }


class BackupList(APIView):
    """The deployment's backups, newest first, as its Backups tab lists them (deleted ones
    left out)."""

    def get(self, request, instance_id: str):
        instance = _instance(request, instance_id)
        pages = Pages()
        backups = selectors.snapshots_of_instance(instance).only(
            "name", "status", "scheduled", "created_at", "taken_at", "expires_at"
        )
        rows = pages.paginate_queryset(backups, request, view=self)
        return pages.get_paginated_response([snapshot_shown(s) for s in rows])


def _moment(value) -> datetime | None:
    """A point in time given as ISO 8601 text (None: none given); the service refuses one
    without its time zone."""
    if value is None:
        return None
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well formed, but no such moment: 30 February, 25 o'clock
        raise ValidationError({"target_time": f"There is no such moment as {value}."}) from None
    if moment is None:
        raise ValidationError({"target_time": services.TIME_ZONE_NEEDED})
    return moment


class BackupRestore(APIView):
    """Restore a completed backup into a NEW deployment, as the Backups tab's Restore does:
    body `{"name", "parameters" (those to change from the backup's), "target_time" (where the
    plan can recover a point in time)}`. 202 with the restore operation, whose `deployment` is
    the new one."""

    def post(self, request, instance_id: str, snapshot_id: int):
        instance = _instance(request, instance_id)
        snapshot = selectors.snapshot_of_instance(instance, snapshot_id)
        if snapshot is None:
            raise Http404("No such backup.")
        body = _body(request)
        try:
            operation = services.snapshot_restore(
                actor=token_actor(request),
                snapshot=snapshot,
                name=body.get("name"),
                request_id=_key(request),
                parameters=body.get("parameters", {}),
                target_time=_moment(body.get("target_time")),
            )
        except ActionDenied as exc:
            return _refused(request, exc, "backup.restore")
        return _queued(operation)


SCHEDULE_FIELDS = ("interval_hours", "cron", "retention_days", "retention_count", "enabled")


def schedule_shown(schedule) -> dict:
    return {
        **{name: getattr(schedule, name) for name in SCHEDULE_FIELDS},
        "next_run_at": schedule.next_run_at if schedule.enabled else None,
    }


class BackupScheduleDetail(APIView):
    """The deployment's backup schedule, as its Backups tab shows and sets it: every
    `interval_hours`, or at the times of a five-field UTC `cron`; every backup kept
    `retention_days`, and with `retention_count` only that many scheduled ones; `enabled`."""

    def get(self, request, instance_id: str):
        instance = _instance(request, instance_id)
        return Response(schedule_shown(selectors.backup_schedule_of(instance)))

    def patch(self, request, instance_id: str):
        """Change the fields sent; the others keep their values (a `cron` replaces the
        interval, an `interval_hours` the cron). 200 with the schedule as saved. A changed
        retention is queued to the cluster as an operation, as the tab's Save does; the
        `Idempotency-Key` is its request id."""
        instance = _instance(request, instance_id)
        token_require(request, "backup.create", target=instance)
        body = _fields(_body(request), SCHEDULE_FIELDS)
        current = selectors.backup_schedule_of(instance)
        values = {name: getattr(current, name) for name in SCHEDULE_FIELDS} | body
        if body.get("cron"):
            values["interval_hours"] = body.get("interval_hours")
        elif "interval_hours" in body:
            values["cron"] = body.get("cron", "")
        if not isinstance(values["enabled"], bool):
            raise ValidationError({"enabled": "Send true or false."})
        if values["cron"] is None:
            values["cron"] = ""
        try:
            schedule = services.backup_schedule_update(
                actor=token_actor(request), instance=instance, request_id=_key(request),
                seen=current.settings_token, **values,
            )  # fmt: skip
        except ActionDenied as exc:
            return _refused(request, exc, "backup.create")
        except ValidationError as exc:
            if exc.messages != [services.SCHEDULE_CHANGED]:
                raise
            # Someone saved it between this request's read and its write: theirs stands.
            raise Conflict(
                "The schedule was changed by someone else while this request was made; "
                "nothing was saved: read it again, then send your change."
            ) from None
        return Response(schedule_shown(schedule))
