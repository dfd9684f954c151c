"""What a tenant is entitled to: the one place entitlement rules live.

Callers (deployments' services) describe what is asked in plain values — the tenant's current
usage of a plan and the change requested — and get a `Decision` with a one-sentence reason
that names the limit and how to get more. Limits are the plan's (`Plan.limits`, from the
spec's `x-opsdeck.entitlements`) with the tenant's `PlanOverride` in effect applied on top;
the tenant's `Subscription` to the plan decides whether anything may run at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cached_property

from django.db import connection
from django.db.models import prefetch_related_objects
from django.utils import timezone

from accounts.models import Tenant
from billing import pricing
from billing.models import Plan, PlanOverride, Subscription

# The keys of `Plan.limits` (and of `PlanOverride.limits`) that are limits.
LIMIT_KEYS = (
    "max_instances",
    "max_total",
    "max_per_instance",
    "cells",
    "denied_verbs",
    "max_backup_retention_days",
)
# Keys of `Plan.limits` that are subscription terms, not limits.
TERM_KEYS = ("auto_approve", "grace_days", "stop_after_days")
DIMENSION_KEYS = ("max_total", "max_per_instance")  # overrides merge these per dimension

# A suspended tenant may still stop and delete what it runs, and forget backups.
ALWAYS_ALLOWED = frozenset({"stop", "delete", "deleteBackup"})
# The verbs that make a new instance: they count against the instance limit and the cells.
NEW_INSTANCE = frozenset({"create", "restore"})
# Denying this pseudo-verb refuses a restore to a point in time; plain restores still run.
POINT_IN_TIME = "restore.pointInTime"
# Settings that are not verbs: the subscription's status does not refuse them.
SETTINGS = frozenset({"backup.schedule"})

# How a quantity of each usage dimension reads after its number.
DIMENSION_UNITS = {
    "cpu": "CPU cores",
    "memory": "GiB of memory",
    "storage": "GiB of storage",
    "backupStorage": "GiB of backup storage",
    "replica": "servers",
    "deploymentCell": "deployment cells",
    "base": "base units",
}


class EntitlementDenied(Exception):
    """A request beyond what the tenant's plan allows; the message says which limit."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Usage:
    """What the tenant runs on the plan now: its instances (not deleted) and their summed
    quantities per usage dimension."""

    instances: int = 0
    totals: Mapping[str, Decimal] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """The change asked for. `quantities`: the instance's quantities per dimension after the
    change; `delta`: how much the tenant's totals grow (a new instance: its quantities);
    `cell`: the cell a new instance would run on; `retention_days`: a backup retention asked
    for; `point_in_time`: a restore to a point in time."""

    quantities: Mapping[str, Decimal] | None = None
    delta: Mapping[str, Decimal] | None = None
    cell: str | None = None
    retention_days: int | None = None
    point_in_time: bool = False


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""

    def require(self) -> None:
        """Raise EntitlementDenied with the reason when the request is refused."""
        if not self.allowed:
            raise EntitlementDenied(self.reason)


ALLOW = Decision(True)


@dataclass(frozen=True)
class Limits:
    """A plan's limits for one tenant at one time; None (or empty) means no limit."""

    max_instances: int | None = None
    max_total: Mapping[str, Decimal] = field(default_factory=dict)
    max_per_instance: Mapping[str, Decimal] = field(default_factory=dict)
    cells: tuple[str, ...] | None = None
    denied_verbs: frozenset[str] = frozenset()
    max_backup_retention_days: int | None = None


def quantity_text(dimension: str, quantity: Decimal | int | float) -> str:
    """`500 GiB of storage`, `3 servers`: a quantity as people read it, in plain digits however
    large or small (a float as it was written: 1.5e29, not its binary expansion)."""
    number = Decimal(str(quantity) if isinstance(quantity, float) else quantity)
    whole = number == number.to_integral_value()
    shown = str(int(number)) if whole else f"{number.normalize():f}"
    return f"{shown} {DIMENSION_UNITS.get(dimension, dimension)}"


def override_in_effect(tenant: Tenant, plan: Plan, at: datetime | None = None):
    """The tenant's override of `plan` in effect at `at` (now): the latest that started by
    then, or None."""
    return _overrides_started(tenant, plan, at).first()


def _overrides_started(tenant: Tenant, plan: Plan, at: datetime | None):
    """The tenant's overrides of `plan` that started by `at` (now), the latest first."""
    return PlanOverride.objects.filter(
        tenant=tenant, plan=plan, effective_from__lte=at or timezone.now()
    ).order_by("-effective_from", "-pk")


def limits_merge(base: Mapping, override: Mapping) -> dict:
    """`base` limits with `override`'s on top: per dimension for the dimension limits, whole
    for the others; an override's null removes the limit."""
    merged = {key: base[key] for key in LIMIT_KEYS if key in base}
    for key in LIMIT_KEYS:
        if key not in override:
            continue
        value = override[key]
        if key in DIMENSION_KEYS and isinstance(value, Mapping):
            dimensions = {**(merged.get(key) or {}), **value}
            merged[key] = {dim: limit for dim, limit in dimensions.items() if limit is not None}
        else:
            merged[key] = value
    return {key: value for key, value in merged.items() if value is not None}


def limits_for(tenant: Tenant, plan: Plan, at: datetime | None = None) -> Limits:
    """The plan's limits for `tenant` at `at` (now), its override applied (`limits_of`)."""
    return limits_of(tenant, [plan], at)[plan.pk]


def limits_of(tenant: Tenant, plans: list[Plan], at: datetime | None = None) -> dict[int, Limits]:
    """`limits_for` of each plan, by plan id, with the overrides' limits read alone in one
    statement (every entitlement check reads them, and building the query cost more than
    running it; a page listing plans reads them all at once)."""
    overrides = _overrides([tenant.pk], [plan.pk for plan in plans], at)
    return {plan.pk: _limits(plan, overrides.get((tenant.pk, plan.pk))) for plan in plans}


def limits_among(
    pairs: set[tuple[int, Plan]], at: datetime | None = None
) -> dict[tuple[int, int], Limits]:
    """`limits_for` of each (tenant id, plan) pair, by (tenant id, plan id), in one statement
    however many tenants: a page listing instances of many organizations."""
    overrides = _overrides({t for t, _ in pairs}, {plan.pk for _, plan in pairs}, at)
    return {
        (tenant_id, plan.pk): _limits(plan, overrides.get((tenant_id, plan.pk)))
        for tenant_id, plan in pairs
    }


def _overrides(tenant_ids, plan_ids, at: datetime | None) -> dict[tuple[int, int], dict]:
    """The limits of the override in effect at `at` (now) of each tenant and plan that has one,
    by (tenant id, plan id), read alone: building the query cost more than running it."""
    table = PlanOverride._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT ON (tenant_id, plan_id) tenant_id, plan_id, limits FROM {table}"  # noqa: S608 - our table
            " WHERE tenant_id = ANY(%s) AND plan_id = ANY(%s) AND effective_from <= %s"
            " ORDER BY tenant_id, plan_id, effective_from DESC, id DESC",
            [list(tenant_ids), list(plan_ids), at or timezone.now()],
        )
        return {(t, p): json.loads(limits) for t, p, limits in cursor.fetchall()}


def _limits(plan: Plan, override: Mapping | None) -> Limits:
    raw = limits_merge(plan.limits, override or {})
    cells = raw.get("cells")
    return Limits(
        max_instances=_whole(raw.get("max_instances")),
        max_total={k: Decimal(str(v)) for k, v in (raw.get("max_total") or {}).items()},
        max_per_instance={
            k: Decimal(str(v)) for k, v in (raw.get("max_per_instance") or {}).items()
        },
        cells=tuple(cells) if cells is not None else None,
        denied_verbs=frozenset(raw.get("denied_verbs") or ()),
        max_backup_retention_days=_whole(raw.get("max_backup_retention_days")),
    )


_STANDING = ["id", "status", "past_due_since"]  # in the model's order, as `from_db` reads them


def subscription_of(tenant: Tenant, plan: Plan) -> Subscription | None:
    """The tenant's open (not cancelled) subscription to `plan`, or None (at most one is open),
    with what an entitlement check reads of it (`subscriptions_of`)."""
    return subscriptions_of(tenant, [plan]).get(plan.pk)


def subscriptions_of(tenant: Tenant, plans: list[Plan]) -> dict[int, Subscription]:
    """`subscription_of` each plan that has one, by plan id, with what an entitlement check
    reads of it (its status and since when it is past due; the rest is read if asked for). In
    SQL: every entitlement check reads it, and building the query cost more than running it."""
    by_pk = {plan.pk: plan for plan in plans}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT ON (plan_id) plan_id, {', '.join(_STANDING)}"  # noqa: S608 - our names
            f" FROM {Subscription._meta.db_table}"
            " WHERE tenant_id = %s AND plan_id = ANY(%s) AND status <> %s"
            " ORDER BY plan_id, created_at DESC",
            [tenant.pk, list(by_pk), Subscription.Status.CANCELLED],
        )
        rows = cursor.fetchall()
    found = {}
    for plan_id, *row in rows:
        subscription = Subscription.from_db(connection.alias, _STANDING, row)
        subscription.tenant, subscription.plan = tenant, by_pk[plan_id]
        found[plan_id] = subscription
    return found


def suspended_in_effect(subscription: Subscription, now: datetime | None = None) -> bool:
    """Suspended, or past due beyond the plan's grace period (the sweep suspends it soon)."""
    if subscription.status == Subscription.Status.SUSPENDED:
        return True
    if subscription.status != Subscription.Status.PAST_DUE or subscription.past_due_since is None:
        return False
    grace = timedelta(days=subscription.plan.grace_days)
    return subscription.past_due_since + grace <= (now or timezone.now())


def _whole(value) -> int | None:
    return int(value) if value is not None else None


def held_by_staff(tenant: Tenant, plan: Plan | None = None) -> set[int]:
    """The plans (of `plan` alone, when given) the tenant may not subscribe to again until
    staff lift the suspension: its subscription cancelled last was suspended by staff then
    (cancelling does not lift a suspension)."""
    cancelled = Subscription.objects.filter(tenant=tenant, status=Subscription.Status.CANCELLED)
    if plan is not None:
        cancelled = cancelled.filter(plan=plan)
    last: dict[int, bool] = {}
    for plan_id, held in cancelled.order_by("plan_id", "-cancelled_at", "-pk").values_list(
        "plan_id", "suspended_by_staff"
    ):
        last.setdefault(plan_id, held)
    return {plan_id for plan_id, held in last.items() if held}


class Reads:
    """What checks of `tenant`'s requests on `plans` read of the database, each read for all
    the plans at once when a check first needs it: deciding for every plan a page lists costs
    as many queries as deciding for one."""

    def __init__(self, tenant: Tenant, plans: list[Plan], at: datetime | None = None):
        self.tenant, self.plans, self.at = tenant, list(plans), at

    @cached_property
    def limits(self) -> dict[int, Limits]:
        """The plans' limits for the tenant at `at` (now), by plan id (`limits_of`)."""
        return limits_of(self.tenant, self.plans, self.at)

    @cached_property
    def subscriptions(self) -> dict[int, Subscription]:
        """The tenant's open subscription to each plan that has one (`subscriptions_of`)."""
        return subscriptions_of(self.tenant, self.plans)

    @cached_property
    def held(self) -> set[int]:
        """The plans staff hold (`held_by_staff`)."""
        return held_by_staff(self.tenant, self.plans[0] if len(self.plans) == 1 else None)

    @cached_property
    def paid_at_checkout(self) -> set[int]:
        """The plans a subscription to which waits for payment (`Plan.paid_at_checkout`)."""
        prefetch_related_objects(self.plans, "prices")
        return pricing.paid_at_checkout(self.plans)

    @cached_property
    def beside(self) -> set[int]:
        """The plans whose service offers another plan (one to move to for more)."""
        services: dict[str, set[int]] = {}
        for service, pk in Plan.objects.filter(
            service__in={plan.service for plan in self.plans}
        ).values_list("service", "pk"):
            services.setdefault(service, set()).add(pk)
        return {plan.pk for plan in self.plans if services.get(plan.service, set()) - {plan.pk}}


def _status_refusal(plan: Plan, action: str, reads: Reads) -> str | None:
    if action in ALWAYS_ALLOWED or action in SETTINGS:
        return None
    subscription = reads.subscriptions.get(plan.pk)
    what = "create instances on it" if action in NEW_INSTANCE else "run this action"
    if subscription is None and plan.pk in reads.held:
        return f"The platform team suspended your {plan.name} subscription: contact them to {what}."
    if subscription is None:
        return f"Subscribe to the {plan.name} plan on the Billing page to {what}."
    if subscription.status == Subscription.Status.PENDING and plan.pk in reads.paid_at_checkout:
        return (
            f"Your subscription to the {plan.name} plan is awaiting payment: finish it on the "
            f"Billing page (Continue to payment); you can {what} once Stripe confirms it."
        )
    if subscription.status == Subscription.Status.PENDING:
        return (
            f"Your subscription to the {plan.name} plan is awaiting approval by the platform "
            f"team; you can {what} once it is approved."
        )
    if suspended_in_effect(subscription):
        return (
            f"Your subscription to the {plan.name} plan is suspended, so its instances can only "
            "be stopped or deleted; see the Billing page to reactivate it."
        )
    return None


def _beyond(plan: Plan, reads: Reads, change: str, ask: str) -> str:
    """How a refusal ends: where the customer gets more than `plan` allows. Another plan of the
    same service is a move away (the Billing page's Change plan: `change`); without one, only
    the platform team can help ("ask the platform team " and `ask`)."""
    if plan.pk in reads.beside:
        return change
    return f"ask the platform team {ask}"


def _verb_refusal(
    plan: Plan, reads: Reads, action: str, limits: Limits, request: Request
) -> str | None:
    if action in limits.denied_verbs:
        return f"The {plan.name} plan does not include the {action} action; " + _beyond(
            plan, reads, "change plan on the Billing page to use it.", "if you need it."
        )
    if action == "restore" and request.point_in_time and POINT_IN_TIME in limits.denied_verbs:
        return (
            f"The {plan.name} plan does not include point-in-time restore; restore the snapshot "
            "as it was taken, or "
            + _beyond(plan, reads, "change plan on the Billing page.", "if you need it.")
        )
    return None


def _size_refusal(
    plan: Plan, reads: Reads, limits: Limits, usage: Usage, request: Request
) -> str | None:
    for dimension, limit in limits.max_per_instance.items():
        asked = Decimal((request.quantities or {}).get(dimension, 0))
        if asked > limit:
            return (
                f"The {plan.name} plan allows at most {quantity_text(dimension, limit)} per "
                f"instance and this asks for {quantity_text(dimension, asked)}; "
                + _beyond(
                    plan, reads, "change plan on the Billing page for more.", "if you need more."
                )
            )
    for dimension, limit in limits.max_total.items():
        grows = Decimal((request.delta or {}).get(dimension, 0))
        total = Decimal(usage.totals.get(dimension, 0)) + grows
        if grows > 0 and total > limit:
            return (
                f"The {plan.name} plan allows at most {quantity_text(dimension, limit)} across "
                f"your organization's instances and this would make "
                f"{quantity_text(dimension, total)}; free some or "
                + _beyond(plan, reads, "change plan on the Billing page.", "for more.")
            )
    return None


def _new_instance_refusal(
    plan: Plan, reads: Reads, limits: Limits, usage: Usage, request: Request
) -> str | None:
    if request.cell is not None and limits.cells is not None and request.cell not in limits.cells:
        offered = ", ".join(limits.cells) or "none"
        return (
            f"The {plan.name} plan does not run in the {request.cell} cell; "
            f"choose one of: {offered}."
        )
    most = limits.max_instances
    if most is not None and usage.instances >= most:
        return (
            f"The {plan.name} plan allows at most {most} instance{'s' if most != 1 else ''} per "
            f"organization and you have {usage.instances}; delete one or "
            + _beyond(plan, reads, "change plan on the Billing page.", "for more.")
        )
    return None


def check(
    *,
    tenant: Tenant,
    plan: Plan,
    action: str,
    usage: Usage | None = None,
    request: Request | None = None,
    at: datetime | None = None,
    limits: Limits | None = None,
    reads: Reads | None = None,
) -> Decision:
    """Whether `tenant` may do `action` on `plan` given its `usage` and the `request`;
    `limits`: the plan's for the tenant at `at`, when the caller has read them already;
    `reads`: what the check reads, shared by the checks of several plans (`plan` among them).

    `action` is a verb (create, modify, restore, stop, start, backup, a custom verb, upgrade,
    rollback, deleteBackup, delete) or the setting `backup.schedule`. Refusals come first from
    the subscription (none, awaiting approval, suspended), then from the limits.
    """
    usage = usage or Usage()
    request = request or Request()
    reads = reads if reads is not None else Reads(tenant, [plan], at)
    reason = _status_refusal(plan, action, reads)
    if reason:
        return Decision(False, reason)
    if action in ALWAYS_ALLOWED:
        return ALLOW
    limits = limits if limits is not None else reads.limits[plan.pk]
    reason = _verb_refusal(plan, reads, action, limits, request)
    if reason:
        return Decision(False, reason)
    if action in NEW_INSTANCE:
        reason = _new_instance_refusal(plan, reads, limits, usage, request)
        if reason:
            return Decision(False, reason)
    reason = _size_refusal(plan, reads, limits, usage, request)
    if reason:
        return Decision(False, reason)
    days, most = request.retention_days, limits.max_backup_retention_days
    if days is not None and most is not None and days > most:
        return Decision(
            False,
            f"The {plan.name} plan keeps backups for at most {most} days; choose {most} or "
            "fewer, or " + _beyond(plan, reads, "change plan on the Billing page.", "for longer."),
        )
    return ALLOW


# Where billing reads a tenant's usage of plans: deployments registers its counter (billing
# never imports deployments), called as `source(tenant, plans, pending=…)` and answering by
# plan id. None until it has.
_usage_source: Callable[..., dict[int, Usage]] | None = None


def usage_source_register(source: Callable[..., dict[int, Usage]]) -> None:
    """Name the function that tells billing a tenant's current usage of plans."""
    global _usage_source
    _usage_source = source


def usage_of(tenant: Tenant, plan: Plan, *, pending: bool = False) -> Usage | None:
    """The tenant's current usage of `plan`; with `pending`, the operations queued count too,
    as the checks count them (an instance whose move onto the plan is queued is on it already).
    None when no source is registered."""
    return usages_of(tenant, [plan], pending=pending).get(plan.pk)


def usages_of(tenant: Tenant, plans: list[Plan], *, pending: bool = False) -> dict[int, Usage]:
    """`usage_of` each plan, by plan id (none when no source is registered); without `pending`,
    in a constant number of statements (a page listing plans)."""
    if _usage_source is None or not plans:
        return {}
    return _usage_source(tenant, plans, pending=pending)


@dataclass(frozen=True)
class PlanFacts:
    """What a plan's limits may name: its verbs (and pseudo-verbs such as
    restore.pointInTime) and the cells instances can run on."""

    verbs: frozenset[str]
    cells: frozenset[str]


# Where billing reads what a plan's limits may name, to check an override's: deployments
# registers it, as the usage source. None until it has.
_facts_source: Callable[[Plan], PlanFacts | None] | None = None


def plan_facts_register(source: Callable[[Plan], PlanFacts | None]) -> None:
    """Name the function that tells billing a plan's verbs and the cells there are."""
    global _facts_source
    _facts_source = source


def plan_facts(plan: Plan) -> PlanFacts | None:
    """What `plan`'s limits may name, None when no source is registered or the plan has no
    version yet."""
    return _facts_source(plan) if _facts_source is not None else None


def require(**kwargs) -> None:
    """`check`, raising EntitlementDenied with the reason on a refusal."""
    check(**kwargs).require()
