"""Reads for billing pages."""

from __future__ import annotations

from dataclasses import dataclass, field

from accounts.models import Tenant
from billing import entitlements
from billing.models import Plan, Subscription

# The badge of each subscription status (one colour per status, as for instance states).
STATUS_BADGES = {
    Subscription.Status.ACTIVE: "badge-ok",
    Subscription.Status.PENDING: "badge-op-queued",
    Subscription.Status.PAST_DUE: "badge-state-degraded",
    Subscription.Status.SUSPENDED: "badge-error",
    Subscription.Status.CANCELLED: "badge-state-deleted",
}


@dataclass
class PlanRow:
    """One plan on the billing page: the tenant's subscription to it, and its limits with the
    tenant's usage against them, as sentences."""

    plan: Plan
    subscription: Subscription | None
    usage: list[str] = field(default_factory=list)  # "3 of 10 instances"
    limits: list[str] = field(default_factory=list)  # the limits usage does not measure
    instances: int = 0

    @property
    def badge(self) -> str:
        return STATUS_BADGES.get(self.subscription.status, "") if self.subscription else ""


def _usage_lines(limits: entitlements.Limits, usage: entitlements.Usage | None) -> list[str]:
    lines = []
    if limits.max_instances is not None:
        most = limits.max_instances
        noun = "instance" if most == 1 else "instances"
        lines.append(f"{usage.instances} of {most} {noun}" if usage else f"At most {most} {noun}")
    for dimension, most in limits.max_total.items():
        limit = entitlements.quantity_text(dimension, most)
        if usage is None:
            lines.append(f"At most {limit} in all")
        else:
            used = entitlements.quantity_text(dimension, usage.totals.get(dimension, 0))
            lines.append(f"{used.split(' ', 1)[0]} of {limit}")
    return lines


def _limit_lines(limits: entitlements.Limits) -> list[str]:
    lines = [
        f"At most {entitlements.quantity_text(dimension, most)} per instance"
        for dimension, most in limits.max_per_instance.items()
    ]
    if limits.cells is not None:
        lines.append(f"Regions: {', '.join(limits.cells) or 'none'}")
    denied = sorted(limits.denied_verbs)
    if denied:
        names = [
            "point-in-time restore" if verb == entitlements.POINT_IN_TIME else verb
            for verb in denied
        ]
        lines.append(f"Not included: {', '.join(names)}")
    if limits.max_backup_retention_days is not None:
        lines.append(f"Backups kept at most {limits.max_backup_retention_days} days")
    return lines


def plan_rows(tenant: Tenant) -> list[PlanRow]:
    """Every plan, the tenant's subscribed ones first, with its limits and the tenant's usage."""
    open_ = {
        s.plan_id: s
        for s in Subscription.objects.filter(tenant=tenant).exclude(
            status=Subscription.Status.CANCELLED
        )
    }
    rows = []
    for plan in Plan.objects.all():
        subscription = open_.get(plan.pk)
        limits = entitlements.limits_for(tenant, plan)
        usage = entitlements.usage_of(tenant, plan) if subscription else None
        rows.append(
            PlanRow(
                plan=plan,
                subscription=subscription,
                usage=_usage_lines(limits, usage),
                limits=_limit_lines(limits),
                instances=usage.instances if usage else 0,
            )
        )
    rows.sort(key=lambda row: row.subscription is None)
    return rows
