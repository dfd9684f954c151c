"""Reads for deployments. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from django.db.models import QuerySet

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
