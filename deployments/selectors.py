"""Reads for deployments. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import Any

from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import Tenant
from billing.models import Plan
from billing.pricing import Cost
from deployments.models import Instance, Operation, PlanVersion
from deployments.spec.loader import load_spec
from deployments.spec.model import PlanSpec
from deployments.spec.params import number_text


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


# --- catalog ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogPlan:
    """A plan as the catalog shows it: its latest version's spec, main limits and the cost of
    an instance with the default parameters (None when the defaults cannot be priced)."""

    plan: Plan
    version: PlanVersion
    spec: PlanSpec
    limits: list[tuple[str, str]]
    cost: Cost | None


def plans_available(tenant: Tenant) -> list[tuple[PlanVersion, PlanSpec]]:
    """The plans `tenant` may create instances of, each with its latest version: every plan
    with a released version (no plan is restricted to some tenants yet)."""
    versions = (
        PlanVersion.objects.select_related("plan")
        .prefetch_related("plan__prices")
        .order_by("plan_id", "-number")
        .distinct("plan_id")
    )
    return [(version, plan_spec(version)) for version in versions]


def plan_available(tenant: Tenant, key: str) -> tuple[PlanVersion, PlanSpec] | None:
    """The plan `key` with its latest version, if `tenant` may create instances of it."""
    version = (
        PlanVersion.objects.select_related("plan")
        .prefetch_related("plan__prices")
        .filter(plan__key=key)
        .order_by("-number")
        .first()
    )
    return (version, plan_spec(version)) if version is not None else None


def default_values(spec: PlanSpec) -> dict[str, Any]:
    """The main service's parameter defaults (a plan's price in the catalog is theirs)."""
    return {p.key: p.default for p in spec.main.parameters if p.default is not None}


def _main_limits(spec: PlanSpec) -> list[tuple[str, str]]:
    limits = []
    if spec.max_instances is not None:
        limits.append(("Instances per organization", f"up to {spec.max_instances}"))
    for parameter in spec.main.parameters:
        if parameter.type != "Float64":
            continue
        if parameter.options:
            limits.append((parameter.name, ", ".join(parameter.options)))
        elif parameter.limits and {"min", "max"} <= set(parameter.limits):
            low, high = (number_text(parameter.limits[k]) for k in ("min", "max"))
            limits.append((parameter.name, f"{low} to {high}"))
    return limits


def catalog(tenant: Tenant) -> list[tuple[str, list[CatalogPlan]]]:
    """The plans `tenant` may use, grouped by service (`x-opsdeck.service`), by name."""
    from deployments import metering  # metering reads plan specs through this module

    services: dict[str, list[CatalogPlan]] = {}
    for version, spec in plans_available(tenant):
        try:
            cost = metering.estimate(version.plan, spec, default_values(spec))
        except metering.UsageError:
            cost = None
        entry = CatalogPlan(version.plan, version, spec, _main_limits(spec), cost)
        services.setdefault(version.plan.service, []).append(entry)
    return [
        (service, sorted(plans, key=lambda p: p.plan.name))
        for service, plans in sorted(services.items())
    ]
