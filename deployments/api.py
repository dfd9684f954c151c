"""The deployments API (`/api/v1/`): an organization's deployments and their operations, read
and acted on with one of its API tokens (`accounts.api`), through the services the portal
uses, with the same role rules. Another organization's deployment is a 404."""

from __future__ import annotations

from django.http import Http404
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api import token_require
from deployments import selectors
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


def operation_shown(operation: Operation) -> dict:
    return {
        "id": str(operation.pk),
        "deployment": operation.instance_id,
        "verb": operation.verb,
        "state": operation.state,
        "error": operation.error,
        "requested_by": operation.requested_by.email if operation.requested_by else None,
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
        instance.operations.select_related("requested_by")
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
