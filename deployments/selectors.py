"""Reads for deployments. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import Tenant
from billing.models import Plan
from deployments.models import Instance, Operation, PlanVersion
from deployments.spec.loader import load_spec
from deployments.spec.model import PlanSpec


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


INSTANCES_PER_PAGE = 25

# What a row of the deployments list shows: never a plan version's spec text or parsed JSON,
# nor a cell's kubeconfig (decrypting one per row is what made a long list slow).
_INSTANCE_ROW = [
    "id",
    "name",
    "state",
    "created_at",
    "plan_version__number",
    "plan_version__plan__name",
    "plan_version__plan__service",
    "cell__name",
    "cell__region",
]


def instances_for_tenant(
    tenant: Tenant, *, search: str = "", state: str = "", service: str = ""
) -> QuerySet[Instance]:
    """The tenant's instances, newest first, with only the columns a list shows.

    `search` matches a name (any part, any case) or the start of an id, with or without its
    "inst-"; deleted instances are left out unless `state` asks for them.
    """
    instances = Instance.objects.for_tenant(tenant)
    instances = instances.filter(state=state) if state else instances.active()
    if search:
        # An id may be typed without its "inst-" (which alone would match every instance).
        prefix = search.lower()
        prefix = prefix if prefix.startswith("inst-") else "inst-" + prefix
        instances = instances.filter(Q(name__icontains=search) | Q(id__startswith=prefix))
    if service:
        instances = instances.filter(plan_version__plan__service=service)
    return (
        instances.select_related("plan_version__plan", "cell")
        .only(*_INSTANCE_ROW)
        .order_by("-created_at", "-id")
    )


def instance_services(tenant: Tenant) -> list[str]:
    """The services of the plans the tenant's instances (deleted ones too) run on."""
    return list(
        Instance.objects.for_tenant(tenant)
        .order_by("plan_version__plan__service")
        .values_list("plan_version__plan__service", flat=True)
        .distinct()
    )


def instance_counts_by_state(tenant: Tenant) -> list[tuple[str, str, int]]:
    """(state, label, how many) of the tenant's instances, in the order of Instance.State;
    states with none, and deleted instances, left out."""
    counts = dict(
        Instance.objects.for_tenant(tenant)
        .active()
        .order_by()
        .values_list("state")
        .annotate(count=Count("pk"))
    )
    return [
        (state, label, counts[state]) for state, label in Instance.State.choices if state in counts
    ]


@dataclass(frozen=True)
class OperationDigest:
    operations: list[Operation]  # the newest few
    total: int


# What a dashboard row shows: never an operation's encrypted state or parameters.
_OPERATION_ROW = [
    "id",
    "verb",
    "state",
    "created_at",
    "started_at",
    "finished_at",
    "error",
    "instance__id",
    "instance__name",
]


def _operation_digest(operations: QuerySet[Operation], limit: int) -> OperationDigest:
    rows = operations.select_related("instance").only(*_OPERATION_ROW)
    return OperationDigest(operations=list(rows[:limit]), total=operations.count())


def operations_running(tenant: Tenant, *, limit: int = 10) -> OperationDigest:
    """The tenant's operations running now, the most recently started first."""
    running = Operation.objects.filter(
        instance__tenant=tenant, state=Operation.State.RUNNING
    ).order_by(F("started_at").desc(nulls_last=True), "-created_at")
    return _operation_digest(running, limit)


def operations_failed_recently(
    tenant: Tenant, *, days: int = 7, limit: int = 10
) -> OperationDigest:
    """The tenant's operations that failed in the last `days` days, the latest first."""
    failed_at = Coalesce("finished_at", "created_at")
    failed = (
        Operation.objects.filter(instance__tenant=tenant, state=Operation.State.FAILED)
        .alias(failed_at=failed_at)
        .filter(failed_at__gte=timezone.now() - timedelta(days=days))
        .order_by("-failed_at")
    )
    return _operation_digest(failed, limit)


def operations_pending(instance: Instance) -> QuerySet[Operation]:
    """The instance's queued and running operations, oldest first."""
    return instance.operations.filter(
        state__in=[Operation.State.QUEUED, Operation.State.RUNNING]
    ).order_by("created_at")
