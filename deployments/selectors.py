"""Reads for deployments. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db.models import QuerySet

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
