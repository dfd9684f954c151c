"""The deployments API (`/api/v1/`): an organization's deployments and their operations, read
and acted on with one of its API tokens (`accounts.api`), through the services the portal
uses, with the same role rules. Another organization's deployment is a 404."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.http import Http404
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import roles
from accounts import services as account_services
from accounts.api import token_actor, token_require
from accounts.errors import ActionDenied
from deployments import lifecycle, selectors, services
from deployments.models import Instance, Operation


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


def instance_shown(instance: Instance) -> dict:
    """A deployment as its page shows it: parameters as listed there (a password only as
    "set, hidden"), never a secret."""
    return {
        **instance_row(instance),
        "health_reason": instance.health_reason,
        "deletion_protected": instance.deletion_protected,
        "parameters": {
            shown.key: {"name": shown.name, "value": shown.value}
            for shown in selectors.instance_parameters_shown(instance)
        },
        "outputs": instance.outputs,
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


def _verb_action(instance: Instance, verb: str) -> str:
    """The role action `verb` needs on the instance (as the portal's buttons ask)."""
    spec_verb = selectors.plan_spec(instance.plan_version).main.verbs.get(verb)
    return lifecycle.rule(verb, custom=bool(spec_verb and spec_verb.custom)).action


class InstanceList(APIView):
    def get(self, request):
        token_require(request, "instance.view")
        pages = Pages()
        rows = pages.paginate_queryset(
            selectors.instances_for_tenant(request.auth.tenant), request, view=self
        )
        return pages.get_paginated_response([instance_row(i) for i in rows])


class InstanceDetail(APIView):
    def get(self, request, instance_id: str):
        return Response(instance_shown(_instance(request, instance_id)))


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


class InstanceAction(APIView):
    """Queue a verb (stop, start, restart, backup, modify, a custom one) as the portal's
    buttons do; the body's `parameters` are the verb's own (a modify's: the values to change).
    The `Idempotency-Key` header is the request id: a repeat returns the first operation, the
    same key with another action or parameters is a 409."""

    def post(self, request, instance_id: str, verb: str):
        instance = _instance(request, instance_id)
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise ValidationError('Send a JSON object, e.g. {"parameters": {}}.')
        try:
            operation = services.instance_action(
                actor=token_actor(request),
                instance=instance,
                verb=verb,
                request_id=request.headers.get("Idempotency-Key", ""),
                parameters=body.get("parameters"),
            )
        except ActionDenied as exc:
            if exc.reason == account_services.TOKEN_INVALID:  # revoked or expired meanwhile
                raise AuthenticationFailed(exc.reason) from None
            if roles.can(request.auth.role, _verb_action(instance, verb)):
                # The role allows it; the instance's state or a limit forbids it now.
                return Response({"error": exc.reason}, status=409)
            raise
        operation = _operations(instance).get(pk=operation.pk)
        return Response(operation_shown(operation), status=202)
