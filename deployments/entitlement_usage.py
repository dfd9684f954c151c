"""What deployments tells billing's entitlement check: a tenant's usage of a plan and the
quantities a change asks for, as plain values (billing never reads instances).

Quantities come from the plan's usage rules (`metering.quantities`), computed only when the
tenant's limits name a dimension: most checks need the instance count alone.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError

from accounts.errors import ActionDenied
from accounts.models import Tenant
from billing import entitlements
from billing.models import Plan
from deployments import metering
from deployments.models import Instance, PlanVersion


def usage_on_plan(tenant: Tenant, plan: Plan, *, dimensions: bool) -> entitlements.Usage:
    """The tenant's instances on `plan` that are not deleted, and with `dimensions`, their
    summed quantities per usage dimension (one query)."""
    instances = Instance.objects.for_tenant(tenant).active().filter(plan_version__plan=plan)
    if not dimensions:
        return entitlements.Usage(instances=instances.count())
    rows = list(instances.values_list("plan_version_id", "parameters"))
    totals: dict[str, Decimal] = {}
    for version_id, parameters in rows:
        try:
            measured = metering.stored_quantities(version_id, parameters)
        except metering.UsageError:
            continue  # its values cannot be measured: it cannot hold the tenant back either
        for dimension, quantity in measured.items():
            totals[dimension] = totals.get(dimension, Decimal(0)) + quantity
    return entitlements.Usage(instances=len(rows), totals=totals)


def _quantities(version: PlanVersion, values: dict[str, Any]) -> dict[str, Decimal]:
    try:
        return metering.quantities(version, values)
    except metering.UsageError as exc:
        raise ValidationError(str(exc)) from exc


def entitlement_require(
    *,
    tenant: Tenant,
    plan: Plan,
    action: str,
    version: PlanVersion | None = None,
    after: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    before_version: PlanVersion | None = None,
    cell: str | None = None,
    retention_days: int | None = None,
    point_in_time: bool = False,
) -> None:
    """Ask billing whether `tenant` may do `action` on `plan`; ActionDenied with its reason
    when not. `after` and `before`: the instance's parameter values after and before the
    change (`before` None for a new instance), read on `version` (`before` on `before_version`
    when given: an upgrade measures the values before it by the rules of the version left)."""
    limits = entitlements.limits_for(tenant, plan)
    sized = bool(limits.max_total or limits.max_per_instance) and after is not None
    usage = usage_on_plan(tenant, plan, dimensions=sized and bool(limits.max_total))
    quantities = delta = None
    if sized:
        quantities = _quantities(version, after)
        was = _quantities(before_version or version, before) if before is not None else {}
        delta = {dim: q - was.get(dim, Decimal(0)) for dim, q in quantities.items()}
    decision = entitlements.check(
        tenant=tenant,
        plan=plan,
        action=action,
        usage=usage,
        limits=limits,
        request=entitlements.Request(
            quantities=quantities,
            delta=delta,
            cell=cell,
            retention_days=retention_days,
            point_in_time=point_in_time,
        ),
    )
    if not decision.allowed:
        raise ActionDenied(decision.reason)


def moves_require(
    *, tenant: Tenant, plan: Plan, version: PlanVersion, moves: list[tuple[str, dict, str]]
) -> None:
    """Whether `plan` can take the tenant's instances moving onto it (a change of plan): each
    move — (instance name, values on `version`, cell) — counts as a new instance on `plan`,
    measured by `version`'s usage rules, on top of those before it. ActionDenied naming the
    first instance that does not fit, with billing's reason."""
    limits = entitlements.limits_for(tenant, plan)
    sized = bool(limits.max_total or limits.max_per_instance)
    usage = usage_on_plan(tenant, plan, dimensions=bool(limits.max_total))
    count, totals = usage.instances, dict(usage.totals)
    for name, values, cell in moves:
        quantities = _quantities(version, values) if sized else None
        decision = entitlements.check(
            tenant=tenant,
            plan=plan,
            action="create",
            usage=entitlements.Usage(instances=count, totals=totals),
            limits=limits,
            request=entitlements.Request(quantities=quantities, delta=quantities, cell=cell),
        )
        if not decision.allowed:
            raise ActionDenied(f"{name}: {decision.reason}")
        count += 1
        for dimension, quantity in (quantities or {}).items():
            totals[dimension] = totals.get(dimension, Decimal(0)) + quantity


def _tenant_usage(tenant: Tenant, plan: Plan) -> entitlements.Usage:
    return usage_on_plan(tenant, plan, dimensions=True)


entitlements.usage_source_register(_tenant_usage)
