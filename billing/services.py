"""Writes for billing. Callers pass plain values; billing never imports deployments."""

import logging
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from accounts import idempotency, mail
from accounts.audit import SYSTEM, Actor, audit_record, audited_action
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Membership, Tenant
from accounts.roles import Role
from accounts.services import permission_require, tenant_lock
from billing import entitlements, periods, stripe_sync
from billing.models import (
    OVERRIDE_SAME_MOMENT,
    BillingProfile,
    Invoice,
    PastPrice,
    Plan,
    PlanOverride,
    Price,
    Subscription,
    UsageRecord,
)
from billing.stripe_gateway import gateway

log = logging.getLogger(__name__)


def billing_details_update(
    *, actor: Actor, tenant: Tenant, details: dict[str, str]
) -> tuple[BillingProfile, list[str]]:
    """Set whom the tenant's invoices are made out to (`BillingProfile.DETAILS`, each given):
    for members whose role manages billing. The profile and the names of the fields that
    changed (none: nothing written, nothing audited). A bad value is a ValidationError by
    field, nothing changed. Stripe's customer follows after the commit
    (`stripe_sync.billing_details_push`, called by the view, else beat's from now)."""
    with audited_action(actor=actor, action="billing.details_update", tenant=tenant):
        permission_require(actor=actor, tenant=tenant, action="billing.manage")
        profile = BillingProfile.objects.select_for_update().filter(tenant=tenant).first()
        if profile is None:  # its details until now: the tenant's name alone
            profile = BillingProfile(tenant=tenant, legal_name=tenant.name, version=0)
        before = {name: getattr(profile, name) for name in BillingProfile.DETAILS}
        for name in BillingProfile.DETAILS:
            setattr(profile, name, details[name].strip())
        profile.full_clean(exclude=["tenant"])
        changed = [
            name for name in BillingProfile.DETAILS if before[name] != getattr(profile, name)
        ]
        if not changed:
            return profile, []
        now = timezone.now()
        profile.version += 1
        profile.updated_at = now
        profile.updated_by = actor.user
        # New details: Stripe is due them now, whatever became of the ones before.
        profile.stripe_attempts = 0
        profile.stripe_error = ""
        profile.stripe_tax_id_behind = False
        profile.stripe_next_attempt_at = now
        profile.save()
        audit_record(
            actor=actor,
            action="billing.details_update",
            tenant=tenant,
            target=profile,
            payload={"changed": {name: getattr(profile, name) for name in changed}},
        )
    return profile, changed


@transaction.atomic
def plan_upsert(
    *,
    key: str,
    name: str,
    service: str,
    service_name: str = "",
    description: str = "",
    limits: dict | None = None,
) -> tuple[Plan, bool]:
    """Create the plan `key`, or update it; returns (plan, whether anything changed)."""
    values = {
        "name": name,
        "service": service,
        "service_name": service_name,
        "description": description,
        "limits": limits or {},
    }
    plan = Plan.objects.select_for_update().filter(key=key).first()
    if plan is None:
        new = Plan(key=key, **values)
        new.full_clean(validate_unique=False)
        try:
            with transaction.atomic():
                new.save(force_insert=True)
            return new, True
        except IntegrityError:
            # Two loads of a new plan at once (two deploys starting together): this one's
            # insert waited for the other's, which came first; it goes on with that row.
            plan = Plan.objects.select_for_update().get(key=key)
    changed = {field: value for field, value in values.items() if getattr(plan, field) != value}
    if not changed:
        return plan, False
    for field, value in changed.items():
        setattr(plan, field, value)
    plan.updated_at = timezone.now()
    plan.full_clean()
    plan.save()
    return plan, True


@transaction.atomic
def plan_prices_replace(
    *,
    plan: Plan,
    currency: str,
    prices: list[dict],
    at: datetime | None = None,
    in_use: bool = False,
) -> bool:
    """Make `plan`'s prices exactly `prices` (each `{dimension, unit, time_unit, unit_price}`,
    in `currency`), changed at `at` (now); returns whether anything changed.

    A plan no one used yet takes them at once, for all its usage (its first prices, or a
    correction before anyone used it): no usage was recorded on it, and none is being used
    (`in_use`: an instance on it has run, whose hour under way is not recorded until it ends).
    On a plan already used they apply from the start of the next billing period
    (`periods.next_start`): the month under way is priced entirely at the prices in effect when
    it began, as Stripe charges it (a metered item bills its whole period at the price it holds
    when the period is invoiced). Each dimension whose price changes, goes or comes keeps what
    it costs now as a `PastPrice` until then, with the Stripe price that charges it; a second
    change before then replaces the price to come and keeps that one (taken back to the price
    in effect, nothing is coming any more)."""
    wanted = {
        item["dimension"]: Price(
            plan=plan,
            dimension=item["dimension"],
            unit=item.get("unit", ""),
            time_unit=item.get("time_unit", Price.TimeUnit.HOUR),
            unit_price=Decimal(item["unit_price"]),
            currency=currency,
        )
        for item in prices
    }

    def shape(price: Price) -> tuple:
        return (price.dimension, price.unit, price.time_unit, price.unit_price, price.currency)

    current = {price.dimension: price for price in plan.prices.select_for_update()}
    if {shape(p) for p in current.values()} == {shape(p) for p in wanted.values()}:
        return False
    if in_use or UsageRecord.objects.filter(plan=plan).exists():
        _units_kept(current, wanted)
        starts = periods.next_start(at or timezone.now())
        _overrides_kept(plan, current, wanted, starts)
        _prices_keep(plan, current, wanted, currency, starts, shape)
    # Each dimension keeps its row (and with it the Stripe prices it replaced, which Stripe
    # invoices may still name): changed in place, added, or removed.
    for dimension, price in wanted.items():
        if dimension in current:
            price.pk = current[dimension].pk
        price.full_clean(validate_unique=False, validate_constraints=False)
    Price.objects.filter(plan=plan).exclude(dimension__in=list(wanted)).delete()
    for price in wanted.values():
        price.save()
    return True


def _units_kept(current: dict[str, Price], wanted: dict[str, Price]) -> None:
    """ValidationError unless each dimension of a plan in use keeps its unit: its instances on
    earlier versions go on measuring it in that unit (an instance keeps its version until it is
    upgraded), and every hour of a dimension is priced at its one price per unit, whichever
    version measured it."""
    changed = [
        f"{dimension} is priced per {current[dimension].unit} on a plan in use, and its "
        f"instances on earlier versions measure it in {current[dimension].unit}: priced per "
        f"{price.unit}, each {current[dimension].unit} they use would be charged as a "
        f"{price.unit}. Keep its unit, or price {price.unit} under another dimension's name."
        for dimension, price in wanted.items()
        if dimension in current and current[dimension].unit != price.unit
    ]
    if changed:
        raise ValidationError(changed)


def _overrides_kept(
    plan: Plan, current: dict[str, Price], wanted: dict[str, Price], starts: datetime
) -> None:
    """ValidationError when a tenant's price override that applies from `starts` on (the one
    in effect then, or a later one) prices a dimension whose time unit or currency changes: its
    number is in the plan's time unit and currency, and would come to mean another price
    (0.02 a core-hour read as 0.02 a core-month, or 0.02 yen)."""
    changed = {
        dimension
        for dimension, price in wanted.items()
        if dimension in current
        and (current[dimension].time_unit, current[dimension].currency.lower())
        != (price.time_unit, price.currency.lower())
    }
    if not changed:
        return
    named, in_effect = set(), set()
    overrides = PlanOverride.objects.filter(plan=plan).select_related("tenant")
    for override in overrides.order_by("tenant_id", "-effective_from"):
        applies = override.effective_from > starts or override.tenant_id not in in_effect
        if override.effective_from <= starts:
            in_effect.add(override.tenant_id)
        if applies and changed & set(override.prices):
            named.add(override.tenant.name)
    if named:
        raise ValidationError(
            f"The price overrides of {', '.join(sorted(named))} price "
            f"{', '.join(sorted(changed))} per {current[min(changed)].time_unit} in "
            f"{current[min(changed)].currency.upper()}, which this spec changes from "
            f"{starts:%-d %B %Y}: read in the new terms, their prices would mean others. Give "
            "each an override from then without those prices first, then set them anew."
        )


def _charged(price: Price | PastPrice | None) -> tuple | None:
    """What a price charges (None: nothing, the dimension is free)."""
    if price is None or price.unit_price is None:
        return None
    return (price.unit_price, price.time_unit, price.currency.lower())


def _prices_keep(plan: Plan, current: dict, wanted: dict, currency: str, starts, shape) -> None:
    """Keep what each dimension whose price changes, goes or comes costs now until `starts`
    (a dimension priced anew is free until then: a null price), unless a change already waits
    for `starts`: the price in effect it keeps stays, and is dropped when the new price is
    that one again (no price ever applies to no hour)."""
    waiting = {
        past.dimension: past
        for past in PastPrice.objects.select_for_update().filter(plan=plan, until=starts)
    }
    kept = []
    for dimension in sorted(current.keys() | wanted.keys()):
        was, will = current.get(dimension), wanted.get(dimension)
        if was is not None and will is not None and shape(was) == shape(will):
            continue
        if dimension in waiting:
            if _charged(waiting[dimension]) == _charged(will):
                waiting[dimension].delete()
            continue
        kept.append(
            PastPrice(
                plan=plan, dimension=dimension, until=starts,
                currency=was.currency if was else currency,
                **({"unit_price": was.unit_price, "time_unit": was.time_unit, "unit": was.unit,
                    "stripe_price_id": stripe_sync.stripe_price_charging(was)} if was else {}),
            )
        )  # fmt: skip
    PastPrice.objects.bulk_create(kept)


# --- subscriptions ----------------------------------------------------------------------------

Status = Subscription.Status
# Which statuses each transition may start from.
_FROM = {
    "approve": {Status.PENDING},
    "mark_past_due": {Status.ACTIVE},
    "suspend": {Status.ACTIVE, Status.PAST_DUE},
    "reactivate": {Status.SUSPENDED, Status.PAST_DUE},
    "cancel": {Status.PENDING, Status.ACTIVE, Status.PAST_DUE, Status.SUSPENDED},
}
# What a transition is called in refusals and mails.
_DOING = {
    "approve": "approved",
    "mark_past_due": "marked past due",
    "suspend": "suspended",
    "reactivate": "reactivated",
    "cancel": "cancelled",
}


def subscribe(
    *,
    actor: Actor,
    tenant: Tenant,
    plan: Plan,
    request_id: str = "",
    check: Callable[[], None] | None = None,
) -> Subscription:
    """Subscribe `tenant` to `plan`: active at once when the plan auto-approves, else pending
    until staff approve it in the admin. One subscription per request id, and at most one
    open subscription per tenant and plan (subscribing again returns it). `check` runs before
    a new one is made: what it raises refuses it, nothing made.

    When Stripe is configured, the subscription starts pending whatever the plan: the view
    sends the tenant to Stripe Checkout (`stripe_sync.checkout_start`), and the webhook
    approves it through `subscription_approve` once Stripe reports it active.
    """
    with audited_action(actor=actor, action="subscription.create", tenant=tenant):
        permission_require(actor=actor, tenant=tenant, action="billing.manage")
        request_id = idempotency.request_id_clean(request_id)
        claim = idempotency.request_claim(
            scope=idempotency.tenant_scope(tenant),
            request_id=request_id,
            action="subscription.create",
            raw={"plan": plan.key},
        )
        if claim.earlier is not None:
            return Subscription.objects.get(pk=claim.earlier.target_id)
        # The tenant row lock orders concurrent subscribes with different request ids.
        tenant_lock(tenant.pk)
        subscription = (
            Subscription.objects.filter(tenant=tenant, plan=plan)
            .exclude(status=Status.CANCELLED)
            .first()
        )
        if subscription is not None:
            claim.bind(subscription)
            return subscription
        if entitlements.held_by_staff(tenant, plan):
            raise ActionDenied(
                f"The platform team suspended your {plan.name} subscription: contact them to "
                "subscribe again."
            )
        if check is not None:
            check()
        now = timezone.now()
        # With Stripe, a subscription starts when its Checkout is paid (the webhook); one to a
        # plan without a price has nothing to pay, and starts as it would without Stripe.
        through_checkout = plan.paid_at_checkout
        at_once = plan.auto_approve and not through_checkout
        subscription = Subscription(
            tenant=tenant,
            plan=plan,
            status=Status.ACTIVE if at_once else Status.PENDING,
            requested_by=actor.user,
            current_period_start=periods.current_start(now) if at_once else None,
        )
        subscription.full_clean()
        subscription.save()
        claim.bind(subscription)
        audit_record(
            actor=actor,
            action="subscription.create",
            tenant=tenant,
            target=subscription,
            payload={"plan": plan.key, "status": subscription.status},
        )
        if not through_checkout:  # with Stripe, the mail follows the paid Checkout
            _notify(subscription, "created" if at_once else "requested")
    return subscription


def subscription_hold_lift(*, actor: Actor, subscription: Subscription) -> Subscription:
    """Staff let a tenant subscribe to a plan again after cancelling a subscription to it that
    they had suspended (`entitlements.held_by_staff`)."""
    tenant = subscription.tenant
    action = "subscription.hold_lift"
    with audited_action(actor=actor, action=action, tenant=tenant, target=subscription):
        if not actor.is_platform_staff:
            raise ActionDenied("Only the platform team can lift a suspension.")
        subscription = Subscription.objects.select_for_update().get(pk=subscription.pk)
        if subscription.status != Status.CANCELLED or not subscription.suspended_by_staff:
            raise ActionDenied(
                "Only a cancelled subscription that the platform team had suspended keeps its "
                "organization from subscribing again."
            )
        subscription.suspended_by_staff = False
        subscription.save(update_fields=["suspended_by_staff"])
        audit_record(
            actor=actor,
            action=action,
            tenant=tenant,
            target=subscription,
            payload={"plan": subscription.plan.key},
        )
    return subscription


def subscription_create_active(*, actor: Actor, tenant: Tenant, plan: Plan) -> Subscription:
    """An active subscription for a tenant already running `plan` (the data migration's rule,
    and the demo's): no role is checked, so only the platform calls this, never a view.
    Returns the open subscription when there is one."""
    with transaction.atomic():
        tenant_lock(tenant.pk)
        subscription = (
            Subscription.objects.filter(tenant=tenant, plan=plan)
            .exclude(status=Status.CANCELLED)
            .first()
        )
        if subscription is not None:
            return subscription
        subscription = Subscription.objects.create(
            tenant=tenant,
            plan=plan,
            status=Status.ACTIVE,
            current_period_start=periods.current_start(),
        )
        audit_record(
            actor=actor,
            action="subscription.create",
            tenant=tenant,
            target=subscription,
            payload={"plan": plan.key, "status": subscription.status},
        )
    return subscription


def _transition(
    *,
    actor: Actor,
    subscription: Subscription,
    transition: str,
    to: str,
    stamp: dict | None = None,
    reason: str = "",
    check=None,
    tenant_may: bool = False,
    tenant_locked: bool = False,
) -> Subscription:
    """Move a subscription to `to` when its status allows `transition` (else ActionDenied),
    audit it and mail the tenant's owners and billing members after commit. Only staff and
    the system may, unless `tenant_may` lets the tenant's billing managers too. With
    `tenant_locked`, the tenant's row is locked before the subscription's (`check` then sees
    what the tenant's creates committed, and none commits beside it)."""
    tenant = subscription.tenant
    action = f"subscription.{transition}"
    with audited_action(actor=actor, action=action, tenant=tenant, target=subscription):
        if actor.user is None:
            pass  # the system (beat, Stripe's webhooks): never reached from a view
        elif tenant_may:
            permission_require(actor=actor, tenant=tenant, action="billing.manage")
        elif not actor.is_platform_staff:
            raise ActionDenied(
                f"Only the platform team can have a subscription {_DOING[transition]}."
            )
        if tenant_locked:
            tenant_lock(tenant.pk)
        subscription = Subscription.objects.select_for_update().get(pk=subscription.pk)
        if subscription.status not in _FROM[transition]:
            raise ActionDenied(
                f"A subscription that is {subscription.status_text().lower()} cannot be "
                f"{_DOING[transition]}."
            )
        if check is not None:
            check(subscription)
        before = subscription.status
        subscription.status = to
        for field_name, value in (stamp or {}).items():
            setattr(subscription, field_name, value)
        subscription.updated_at = timezone.now()
        subscription.full_clean()
        subscription.save()
        audit_record(
            actor=actor,
            action=action,
            tenant=tenant,
            target=subscription,
            payload={
                "plan": subscription.plan.key,
                "from": before,
                "to": to,
                **({"reason": reason} if reason else {}),
            },
        )
        _notify(subscription, transition)
    return subscription


def subscription_approve(*, actor: Actor, subscription: Subscription) -> Subscription:
    """Staff approve a pending subscription: it is active from now. While Stripe bills
    tenants, only Stripe's webhook starts one (no Stripe subscription would bill its usage)."""

    def billed(subscription: Subscription) -> None:
        if subscription.plan.paid_at_checkout and not subscription.stripe_subscription_id:
            raise ActionDenied(
                "It waits for payment on Stripe's checkout page and starts when Stripe reports "
                "it paid: approved without it, no Stripe subscription would bill its usage."
            )

    return _transition(
        actor=actor,
        subscription=subscription,
        transition="approve",
        to=Status.ACTIVE,
        stamp={"current_period_start": periods.current_start()},
        check=billed,
    )


def subscription_mark_past_due(
    *, actor: Actor, subscription: Subscription, since: datetime | None = None
) -> Subscription:
    """An unpaid invoice: the subscription keeps running for the plan's grace period."""
    return _transition(
        actor=actor,
        subscription=subscription,
        transition="mark_past_due",
        to=Status.PAST_DUE,
        stamp={"past_due_since": since or timezone.now()},
    )


def subscription_suspend(
    *, actor: Actor, subscription: Subscription, reason: str = "", at: datetime | None = None
) -> Subscription:
    """Suspend a subscription (past due beyond its grace period, or a staff action): its
    instances may only be stopped or deleted; after `stop_after_days` they are stopped. Under
    the tenant's lock, as a cancel is: a create or start checked against the subscription
    commits before it, never after."""
    return _transition(
        actor=actor,
        subscription=subscription,
        transition="suspend",
        to=Status.SUSPENDED,
        stamp={"suspended_at": at or timezone.now(), "suspended_by_staff": actor.staff},
        reason=reason,
        tenant_locked=True,
    )


def subscription_reactivate(*, actor: Actor, subscription: Subscription) -> Subscription:
    """Back to active: nothing restarts by itself, but starting instances is allowed again.
    A suspension by staff is theirs to lift: the system (Stripe reporting the subscription
    paid) is refused, judged under the row's lock."""

    def not_held(subscription: Subscription) -> None:
        if subscription.suspended_by_staff and not actor.staff:
            raise ActionDenied("The platform team suspended it; only they can reactivate it.")

    return _transition(
        actor=actor,
        subscription=subscription,
        transition="reactivate",
        to=Status.ACTIVE,
        stamp={"suspended_at": None, "past_due_since": None, "suspended_by_staff": False},
        check=not_held,
    )


def subscription_cancel(
    *,
    actor: Actor,
    subscription: Subscription,
    instances_may_run: bool = False,
    then: Callable[[Subscription], None] | None = None,
) -> Subscription:
    """Cancel a subscription; refused while the tenant has instances on the plan, unless
    `instances_may_run` (Stripe ended it: they keep running, new ones are refused), or it only
    awaits approval or payment (it lets none run: those on the plan run on what an ended one
    left them, until they are stopped). They are counted as the checks count them, an
    instance whose move onto the plan is queued included
    (its upgrade would run on a cancelled subscription), under the tenant's lock, which every
    new instance's check of the subscription takes too: a create and a cancel at once cannot
    both succeed. `then` runs inside the cancelling transaction once it is allowed (telling
    Stripe): if it raises, nothing is cancelled."""

    def no_instances(subscription: Subscription) -> None:
        if not instances_may_run and subscription.status != Status.PENDING:
            usage = entitlements.usage_of(subscription.tenant, subscription.plan, pending=True)
            running = usage.instances if usage else 0
            if running:
                still, them = (
                    ("instance still runs", "it")
                    if running == 1
                    else ("instances still run", "them")
                )
                raise ActionDenied(
                    f"{running} {still} on the {subscription.plan.name} plan; delete {them} "
                    "before cancelling."
                )
        if then is not None:
            then(subscription)

    return _transition(
        actor=actor,
        subscription=subscription,
        transition="cancel",
        to=Status.CANCELLED,
        stamp={"cancelled_at": timezone.now()},
        check=no_instances,
        tenant_may=True,
        tenant_locked=not instances_may_run,
    )


def subscriptions_suspend_overdue(*, now: datetime | None = None) -> int:
    """Suspend every past-due subscription beyond its plan's grace period (run by beat); the
    number suspended. Each is suspended by the system, audited and mailed."""
    now = now or timezone.now()
    suspended = 0
    overdue = Subscription.objects.filter(status=Status.PAST_DUE, past_due_since__isnull=False)
    for subscription in overdue.select_related("plan", "tenant"):
        ends = subscription.past_due_since + timedelta(days=subscription.plan.grace_days)
        if ends > now:
            continue
        try:
            subscription_suspend(
                actor=SYSTEM,
                subscription=subscription,
                reason="past due beyond the grace period",
                at=now,
            )
        except ActionDenied:
            continue  # it changed meanwhile (paid, or suspended by staff)
        suspended += 1
    return suspended


def subscription_recipients(tenant: Tenant) -> list[str]:
    """Who hears about a tenant's billing: its owners and billing members (not an account
    staff closed: it signs in no more)."""
    return sorted(
        Membership.objects.filter(
            tenant=tenant, role__in=[Role.OWNER, Role.BILLING], user__is_active=True
        )
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )


def _notify(subscription: Subscription, event: str) -> None:
    """The email of a change, written in its transaction: sent once it commits, never if it
    rolls back, and kept whatever becomes of the broker (`accounts.mail`)."""
    subscription_email_send(subscription=subscription, event=event)


_SUBJECTS = {
    "created": "Your subscription to {plan} is active",
    "requested": "Your subscription to {plan} awaits approval",
    "approve": "Your subscription to {plan} is approved",
    "mark_past_due": "Your subscription to {plan} is past due",
    "suspend": "Your subscription to {plan} is suspended",
    "reactivate": "Your subscription to {plan} is active again",
    "cancel": "Your subscription to {plan} is cancelled",
    "stopped": "Instances on {plan} were stopped",
}


def subscription_email_send(*, subscription: Subscription, event: str) -> None:
    """Tell the tenant's owners and billing members what happened to its subscription. Not for
    a deleted tenant: its members can no longer open it (a Stripe event after its deletion still
    moves the subscription, recorded and audited); the mail left unsent is logged for staff."""
    if subscription.tenant.deleted_at is not None:
        log.warning(
            "subscription %s of deleted organization %s (%s): %r not mailed to its members",
            subscription.pk, subscription.tenant.slug, subscription.tenant.pk, event,
        )  # fmt: skip
        return
    recipients = subscription_recipients(subscription.tenant)
    if not recipients:
        return
    path = reverse("billing_overview", kwargs={"tenant_slug": subscription.tenant.slug})
    context = {
        "subscription": subscription,
        "event": event,
        "link": settings.OPSDECK_BASE_URL.rstrip("/") + path,
    }
    if event in ("mark_past_due", "suspend") and subscription.stripe_subscription_id:
        # The Stripe invoices left unpaid: paying them keeps it, or makes it, active again.
        context["unpaid"] = list(
            Invoice.objects.filter(
                tenant=subscription.tenant,
                plan=subscription.plan,
                source=Invoice.Source.STRIPE,
                status=Invoice.Status.OPEN,
            )
            .exclude(number=None)
            .order_by("period", "pk")
            .values_list("number", flat=True)
        )
    if event == "cancel" and subscription.ran():  # ended with instances on it: when they stop
        usage = entitlements.usage_of(subscription.tenant, subscription.plan)
        if usage is not None and usage.instances:
            context.update(instances=usage.instances, stop_due=subscription.stop_due_at())
    subject = _SUBJECTS[event].format(plan=subscription.plan.name)
    mail.send(
        subject=f"[Opsdeck] {subject}",
        body=render_to_string("billing/email/subscription.txt", context),
        to=recipients,
    )


# --- overrides ---------------------------------------------------------------------------------


def _count(value: Any) -> bool:
    """A whole number of at least 0 (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _amount(value: Any) -> bool:
    """A finite number of at least 0 (not a boolean)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _limits_problem(plan: Plan | None, priced: set[str], limits: dict) -> str | None:
    """What is wrong with an override's limits (each may be null, which removes it), in one
    sentence; None when nothing is. Counts are whole numbers, amounts finite and not negative,
    dimensions those the plan prices (`priced`) or limits, cells names, and no verb an instance
    cannot do without is denied."""
    for key in ("max_instances", "max_backup_retention_days"):
        if limits.get(key) is not None and not _count(limits[key]):
            return f"{key} must be a whole number of at least 0, or null."
    known = set(priced)
    if plan is not None:
        for key in entitlements.DIMENSION_KEYS:
            known |= set(plan.limits.get(key) or {})
    for key in entitlements.DIMENSION_KEYS:
        value = limits.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            return f'{key} must map dimensions to amounts, e.g. {{"storage": 2000}}.'
        for dimension, amount in value.items():
            if plan is not None and dimension not in known:
                return (
                    f"{key}: the {plan.name} plan has no dimension {dimension}; it has "
                    f"{', '.join(sorted(known)) or 'none'}."
                )
            if amount is not None and not _amount(amount):
                return f"{key}.{dimension} must be a number of at least 0, or null."
    cells = limits.get("cells")
    if cells is not None and not (
        isinstance(cells, list) and all(isinstance(c, str) and c for c in cells)
    ):
        return "cells must be a list of cell names, or null."
    if cells == []:
        return "cells must name at least one cell (no instance could be made), or be null."
    facts = entitlements.plan_facts(plan) if plan is not None else None
    if cells and facts is not None:
        unknown = sorted(set(cells) - facts.cells)
        if unknown:
            return (
                f"cells: there is no cell {', '.join(unknown)}; there are "
                f"{', '.join(sorted(facts.cells)) or 'none'}."
            )
    denied = limits.get("denied_verbs")
    if denied is not None:
        if not (isinstance(denied, list) and all(isinstance(v, str) and v for v in denied)):
            return "denied_verbs must be a list of verbs, or null."
        undeniable = sorted(set(denied) & {"create", *entitlements.ALWAYS_ALLOWED})
        if undeniable:
            return (
                f"{', '.join(undeniable)} cannot be denied: an organization can always make an "
                "instance, and stop or delete what it has, suspended or not."
            )
        unknown = sorted(set(denied) - facts.verbs) if facts is not None else []
        if unknown:
            return (
                f"denied_verbs: the {plan.name} plan has no verb {', '.join(unknown)}; it has "
                f"{', '.join(sorted(facts.verbs - {'create'} - entitlements.ALWAYS_ALLOWED))}."
            )
    return None


def plan_override_validate(
    *,
    plan: Plan | None,
    effective_from: datetime,
    limits: dict,
    prices: dict,
    now: datetime | None = None,
) -> None:
    """ValidationError, field by field, for an override that reaches into a closed billing
    period, holds limits or prices billing cannot read, or prices a dimension the plan does not
    price. Prices are refused while Stripe bills tenants: Stripe charges the plan's prices in
    its catalog, so a tenant's own would show on its Billing page and never on an invoice."""
    errors: dict[str, str] = {}
    priced = set(plan.prices.values_list("dimension", flat=True)) if plan is not None else set()
    if effective_from is not None and periods.is_closed(effective_from, now=now):
        errors["effective_from"] = (
            "This date is in a closed billing period; an override takes effect from "
            f"{periods.current_start(now):%Y-%m-%d} on."
        )
    if not isinstance(limits, dict):
        errors["limits"] = "Give the limits as a mapping."
    else:
        unknown = sorted(set(limits) - set(entitlements.LIMIT_KEYS))
        if unknown:
            errors["limits"] = (
                f"Unknown limit {', '.join(unknown)}; use {', '.join(entitlements.LIMIT_KEYS)}."
            )
        else:
            problem = _limits_problem(plan, priced, limits)
            if problem:
                errors["limits"] = problem
    if not isinstance(prices, dict):
        errors["prices"] = "Give the prices as a mapping of dimension to unit price."
    elif prices and gateway() is not None:
        errors["prices"] = (
            "Stripe bills this platform's tenants at the prices of its catalog, which hold no "
            "per-organization prices: this one would show on the tenant's Billing page but "
            "never on its invoices. Leave prices empty (a discount belongs on the customer in "
            "Stripe, as a coupon)."
        )
    else:
        unpriced = sorted(set(prices) - priced) if plan is not None else []
        if unpriced:
            errors["prices"] = (
                f"The {plan.name} plan does not price {', '.join(map(str, unpriced))}; it prices "
                f"{', '.join(sorted(priced)) or 'nothing'}."
            )
        for dimension, value in prices.items():
            problem = _price_problem(value)
            if problem:
                errors.setdefault("prices", f'"{value}" for {dimension} is not a price: {problem}')
    if errors:
        raise ValidationError(errors)


_PRICE_TEXT = re.compile(r"[0-9]+(\.[0-9]+)?")  # plain digits: not 1e20, 1_000 or -1
_PRICE_FIELD = Price._meta.get_field("unit_price")


def _price_problem(value) -> str:
    """Why `value` cannot be an override's unit price ("" when it can): it is written as the
    plan's own prices are, and fits where they are kept (an invoice prices with it, and a
    period's close would fail on one that does not fit)."""
    text = str(value).strip() if isinstance(value, str | int | float | Decimal) else ""
    if isinstance(value, bool) or not _PRICE_TEXT.fullmatch(text):
        return "write it in plain digits, with a point for decimals."
    try:
        _PRICE_FIELD.run_validators(Decimal(text))
    except ValidationError as exc:
        return " ".join(exc.messages)
    return ""


def _override_save(override: PlanOverride) -> None:
    """Check and save an override; a ValidationError beside its start when another of the
    organization's plan starts at the same moment (found by the check, or by the database's
    constraint when two saves meet)."""
    override.full_clean()
    try:
        with transaction.atomic():
            override.save()
    except IntegrityError as exc:
        raise ValidationError({"effective_from": OVERRIDE_SAME_MOMENT}) from exc


def plan_override_create(
    *,
    actor: Actor,
    tenant: Tenant,
    plan: Plan,
    effective_from: datetime,
    limits: dict | None = None,
    prices: dict | None = None,
    note: str = "",
) -> PlanOverride:
    """A per-tenant override of `plan`'s limits and prices from `effective_from` on (staff)."""
    limits, prices = limits or {}, prices or {}
    with audited_action(actor=actor, action="plan_override.create", tenant=tenant):
        plan_override_validate(
            plan=plan, effective_from=effective_from, limits=limits, prices=prices
        )
        override = PlanOverride(
            tenant=tenant,
            plan=plan,
            effective_from=effective_from,
            limits=limits,
            prices={k: str(v) for k, v in prices.items()},
            note=note,
            created_by=actor.user,
        )
        _override_save(override)
        audit_record(
            actor=actor,
            action="plan_override.create",
            tenant=tenant,
            target=override,
            payload={
                "plan": plan.key,
                "effective_from": effective_from.isoformat(),
                "limits": limits,
                "prices": override.prices,
            },
        )
    return override


def subscription_instances_stopped(
    *, subscription: Subscription, stopped: list[str], unstoppable: list[str]
) -> None:
    """Record that the system stopped a suspended subscription's running instances (their ids
    in `stopped`; those whose plan has no stop verb in `unstoppable`, flagged to staff), and
    tell the tenant's owners and billing members."""
    with transaction.atomic():
        audit_record(
            actor=SYSTEM,
            action="subscription.instances_stop",
            tenant=subscription.tenant,
            target=subscription,
            payload={"plan": subscription.plan.key, "stopped": stopped},
        )
        if unstoppable:
            # Staff read this in the audit log: the plan gives no way to stop these.
            audit_record(
                actor=SYSTEM,
                action="subscription.instances_unstoppable",
                tenant=subscription.tenant,
                target=subscription,
                result=AuditEvent.Result.ERROR,
                payload={
                    "plan": subscription.plan.key,
                    "instances": unstoppable,
                    "reason": "the plan has no stop verb",
                },
            )
        if stopped:
            _notify(subscription, "stopped")


def plan_override_update(
    *,
    actor: Actor,
    override: PlanOverride,
    effective_from: datetime,
    limits: dict,
    prices: dict,
    note: str = "",
) -> PlanOverride:
    """Change an override that has not reached into a closed billing period (staff)."""
    tenant = override.tenant
    with audited_action(actor=actor, action="plan_override.update", tenant=tenant, target=override):
        override = PlanOverride.objects.select_for_update().get(pk=override.pk)
        if periods.is_closed(override.effective_from):
            raise ActionDenied(
                "This override took effect in a closed billing period; add a new one instead."
            )
        plan_override_validate(
            plan=override.plan, effective_from=effective_from, limits=limits, prices=prices
        )
        override.effective_from = effective_from
        override.limits = limits
        override.prices = {k: str(v) for k, v in prices.items()}
        override.note = note
        _override_save(override)
        audit_record(
            actor=actor,
            action="plan_override.update",
            tenant=tenant,
            target=override,
            payload={
                "plan": override.plan.key,
                "effective_from": effective_from.isoformat(),
                "limits": limits,
                "prices": override.prices,
            },
        )
    return override
