"""Reads for billing pages: only the columns a page shows, in a constant number of queries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, Exists, F, Max, OuterRef, Q, QuerySet, Sum, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from accounts.models import Tenant
from billing import entitlements, pricing
from billing.models import (
    BillingPeriod,
    BillingProfile,
    CreditNote,
    Invoice,
    MeterEvent,
    Plan,
    Price,
    Subscription,
    UsageRecord,
)
from billing.usage import period_bounds, period_key, unmetered_use

# The badge of each subscription status (one colour per status, as for instance states).
STATUS_BADGES = {
    Subscription.Status.ACTIVE: "badge-ok",
    Subscription.Status.PENDING: "badge-op-queued",
    Subscription.Status.PAST_DUE: "badge-state-degraded",
    Subscription.Status.SUSPENDED: "badge-error",
    Subscription.Status.CANCELLED: "badge-state-deleted",
}


@dataclass(frozen=True)
class Alternative:
    plan: Plan
    subscribed: bool  # an active subscription: instances can move there now
    held: bool = False  # held by a staff suspension (`held_by_staff`): not to subscribe to


@dataclass
class PlanRow:
    """One plan on the billing page: the tenant's subscription to it, and its limits with the
    tenant's usage against them, as sentences."""

    plan: Plan
    subscription: Subscription | None
    usage: list[str] = field(default_factory=list)  # "3 of 10 instances"
    limits: list[str] = field(default_factory=list)  # the limits usage does not measure
    instances: int = 0
    # The other plans of the same service its instances could move to (a change of plan), and
    # whether the tenant may already run instances on each.
    alternatives: list[Alternative] = field(default_factory=list)
    # Not subscribed because staff suspended the subscription the tenant then cancelled.
    held: bool = False
    # Its unit prices as the tenant pays them now, and the change coming to them.
    prices: pricing.PriceList = field(default_factory=lambda: pricing.PriceList([]))
    # Not subscribed since a subscription ended with instances on the plan: when the running
    # ones are stopped (`Subscription.stop_due_at`).
    stop_due: datetime | None = None
    # A subscription to it waits for payment on Stripe's checkout (`Plan.paid_at_checkout`).
    paid_at_checkout: bool = False
    # Its open Stripe invoices, when its subscription is suspended for one unpaid
    # (`Subscription.suspended_unpaid`): paying them reactivates it.
    unpaid: list[Invoice] = field(default_factory=list)

    @property
    def badge(self) -> str:
        return STATUS_BADGES.get(self.subscription.status, "") if self.subscription else ""

    @property
    def status_text(self) -> str:
        """Its subscription's status as people read it (`Subscription.status_text`)."""
        return self.subscription.status_text(self.paid_at_checkout) if self.subscription else ""


# What a list of invoices shows (never the lines).
_INVOICE_ROW = [
    "id",
    "number",
    "period",
    "status",
    "source",
    "currency",
    "total",
    "amount_refunded",
    "amount_credited",
    "finalized_at",
    "hosted_invoice_url",
    "pdf_url",
    "plan__name",
]


def _shown_to(tenant: Tenant) -> QuerySet[Invoice]:
    """The tenant's invoices it may see: finalized, paid and void ones. A draft is under staff
    review and not shown to the tenant, nor one staff voided as a draft (it has no number),
    which it was never sent."""
    return (
        Invoice.objects.filter(tenant=tenant)
        .exclude(status=Invoice.Status.DRAFT)
        .exclude(status=Invoice.Status.VOID, number=None)
    )


def invoices_of(tenant: Tenant) -> QuerySet[Invoice]:
    """The tenant's invoices it may see (`_shown_to`), newest period first."""
    return (
        _shown_to(tenant)
        .select_related("plan")
        .only(*_INVOICE_ROW)
        .order_by("-period", "-finalized_at", "-pk")
    )


def invoice_to_come(tenant: Tenant, period: str) -> bool:
    """Whether `tenant` used something in `period` ("YYYY-MM") that no invoice it may see
    bills yet: the period has not closed, or one of its invoices is still a draft staff
    review. In one statement."""
    invoices = Invoice.objects.filter(tenant=tenant, period=period)
    return Tenant.objects.filter(
        Exists(UsageRecord.objects.filter(tenant=tenant, period=period)),
        ~Exists(invoices) | Exists(_drafts_billing(invoices)),
        pk=tenant.pk,
    ).exists()


def _drafts_billing(invoices: QuerySet[Invoice]) -> QuerySet[Invoice]:
    """The drafts among `invoices` that may still bill something: a draft of ours at 0 (usage
    of a plan that prices nothing) will ask nothing, issued or not; Stripe's may still gain
    lines until Stripe finalizes it."""
    return invoices.filter(status=Invoice.Status.DRAFT).exclude(
        total=0, source=Invoice.Source.LOCAL
    )


def invoice_of(tenant: Tenant, invoice_id: int) -> Invoice | None:
    """One of the invoices the tenant may see (`_shown_to`), with its lines and credit notes;
    None otherwise."""
    return (
        _shown_to(tenant)
        .filter(pk=invoice_id)
        .select_related("plan", "tenant")
        .prefetch_related("lines", "credit_notes")
        .first()
    )


def tenant_delete_blockers(tenants: Sequence[Tenant]) -> dict[int, list[str]]:
    """What in billing keeps each of `tenants` from being deleted, as sentences by tenant id:
    each subscription not cancelled (Stripe would go on billing it, or it would wait in the
    platform team's queue), usage not invoiced yet (`_uninvoiced`), and each finalized invoice
    still unpaid, but one at 0 or that credit notes cover whole (registered with accounts'
    `tenant_delete`); what remains of it is what it asks. In a constant number of queries,
    however many tenants."""
    ids = [tenant.pk for tenant in tenants]
    said: dict[int, list[str]] = defaultdict(list)
    subscriptions = (
        Subscription.objects.filter(tenant_id__in=ids)
        .exclude(status=Subscription.Status.CANCELLED)
        .select_related("plan")
        .order_by("plan__name")
    )
    for subscription in subscriptions:
        said[subscription.tenant_id].append(
            f"Its subscription to {subscription.plan.name} is "
            f"{subscription.status_text().lower()}: cancel it on the Billing page first."
        )
    for tenant_id, sentences in _uninvoiced(ids).items():
        said[tenant_id] += sentences
    unpaid = (
        Invoice.objects.filter(tenant_id__in=ids, status=Invoice.Status.OPEN)
        .exclude(total=0)  # nothing to pay (free usage's, `invoicing._drafts`)
        .order_by("number")
    )
    fields = ("number", "period", "total", "amount_refunded", "amount_credited", "currency")
    for invoice in unpaid.only("tenant_id", *fields):
        due = pricing.rounded(invoice.amount_remaining, invoice.currency)
        if not due:  # its credit notes cover it: nothing is left to pay
            continue
        said[invoice.tenant_id].append(
            f"Invoice {invoice.number or invoice.period} ({due} "
            f"{invoice.currency.upper()}) is unpaid: pay it first."
        )
    return dict(said)


# How long past a cancelled subscription's last period Stripe's last invoice is waited for:
# Stripe retries a webhook for three days.
STRIPE_LAST_INVOICE_WAIT = timedelta(days=3)


def _uninvoiced(ids: list[int]) -> dict[int, list[str]]:
    """What of the usage of the tenants of `ids` has no invoice yet, as sentences by tenant id:
    a month not closed yet with priced usage, recorded or still to be metered (its invoice
    comes once it ends), and invoices drafted and not issued. An organization deleted before
    would get that invoice with no one able to open it."""
    said: dict[int, list[str]] = defaultdict(list)
    priced = Price.objects.filter(plan_id=OuterRef("pk"), unit_price__isnull=False)
    priced_plans = Plan.objects.filter(Exists(priced))
    last = dict(
        UsageRecord.objects.filter(tenant_id__in=ids, quantity__gt=0, plan__in=priced_plans)
        .exclude(period__in=BillingPeriod.objects.filter(closed_at__isnull=False).values("key"))
        .values_list("tenant_id")
        .annotate(last=Max("period"))
        .order_by()
    )
    # An instance deleted in an hour not metered yet (its month's first, or it lived less than
    # an hour) has no usage recorded so far: its month's invoice is to come all the same.
    for tenant_id, unmetered in unmetered_use(ids, priced_plans).items():
        last[tenant_id] = max(filter(None, [last.get(tenant_id), period_key(unmetered)]))
    for tenant_id, period in last.items():
        start, end = period_bounds(period)
        said[tenant_id].append(
            f"Its usage of {start:%B %Y} is invoiced once the month has ended, from "
            f"{end:%-d %B %Y}: delete the organization once that invoice is paid."
        )
    # A subscription cancelled is billed by Stripe to its period's end: its last invoice comes
    # then, for the usage sent to Stripe's meters in that period, though ours closed its month
    # with nothing to bill. Waited for until an invoice of Stripe's comes after that end, or
    # for as long as Stripe retries a webhook past it (one Stripe ended at once makes none).
    now = timezone.now()
    last_invoice = Invoice.objects.filter(
        tenant_id=OuterRef("tenant_id"),
        plan_id=OuterRef("plan_id"),
        source=Invoice.Source.STRIPE,
        created_at__gte=OuterRef("current_period_end"),
    )
    metered = MeterEvent.objects.filter(
        usage_record__tenant_id=OuterRef("tenant_id"),
        usage_record__plan_id=OuterRef("plan_id"),
        usage_record__hour__gte=OuterRef("current_period_start"),
        status=MeterEvent.Status.SENT,
    )
    billing_on = (
        Subscription.objects.filter(
            tenant_id__in=ids,
            status=Subscription.Status.CANCELLED,
            current_period_end__gt=now - STRIPE_LAST_INVOICE_WAIT,
        )
        .exclude(stripe_subscription_id="")
        .filter(Exists(metered))
        .exclude(Exists(last_invoice))
        .select_related("plan")
        .order_by("current_period_end")
    )
    for subscription in billing_on.only("tenant_id", "plan__name", "current_period_end"):
        said[subscription.tenant_id].append(
            f"Stripe invoices its usage of the {subscription.plan.name} plan when the "
            f"subscription's last period ends, {subscription.current_period_end:%-d %B %Y %H:%M} "
            "UTC: delete the organization once that invoice is paid."
        )
    drafts = _drafts_billing(Invoice.objects.filter(tenant_id__in=ids)).order_by("period")
    for tenant_id, period in drafts.values_list("tenant_id", "period").distinct():
        said[tenant_id].append(
            f"Its invoice for {period} is being prepared: delete the organization once it is "
            "issued and paid."
        )
    return said


def plans_to_subscribe(tenant: Tenant, plans: list[Plan]) -> set[str]:
    """The keys of the `plans` the tenant may subscribe to on the Billing page: it holds no open
    subscription to them, and staff hold none of them (`held_by_staff`). Two queries, however
    many plans."""
    open_ = set(
        Subscription.objects.filter(tenant=tenant, plan__in=plans)
        .exclude(status=Subscription.Status.CANCELLED)
        .values_list("plan_id", flat=True)
    )
    held = entitlements.held_by_staff(tenant) if len(open_) < len(plans) else set()
    return {plan.key for plan in plans if plan.pk not in open_ and plan.pk not in held}


# --- billing details ---------------------------------------------------------------------


def billing_profile_of(tenant: Tenant) -> BillingProfile | None:
    return BillingProfile.objects.filter(tenant=tenant).first()


def billing_details_of(tenant: Tenant) -> dict[str, str]:
    """Whom the tenant's invoices are made out to now (`billing_details_from`)."""
    return billing_details_from(tenant, billing_profile_of(tenant))


def billing_details_from(tenant: Tenant, profile: BillingProfile | None) -> dict[str, str]:
    """Whom the tenant's invoices are made out to, given its profile (read already): its
    billing details, or its name alone while it has none."""
    if profile is not None:
        return profile.details()
    return {"legal_name": tenant.name}


def invoice_parties(invoice: Invoice) -> tuple[dict[str, str], str]:
    """Whom an invoice is made out to and who issues it, as it prints them: a finalized one
    keeps both as they were when it was finalized (one finalized before invoices kept them
    names the tenant alone); a draft shows them as they are now."""
    if invoice.frozen:
        return invoice.billed_to or {"legal_name": invoice.tenant.name}, invoice.issuer
    return billing_details_of(invoice.tenant), settings.OPSDECK_INVOICE_ISSUER


def credit_note_of(tenant: Tenant, invoice_id: int, credit_note_id: int) -> CreditNote | None:
    """One of Opsdeck's credit notes on one of the tenant's invoices, with its invoice; None
    otherwise (Stripe's have Stripe's PDF)."""
    return (
        CreditNote.objects.filter(
            pk=credit_note_id, invoice_id=invoice_id, invoice__tenant=tenant,
            source=Invoice.Source.LOCAL,
        )
        .select_related("invoice__tenant", "invoice__plan")
        .first()
    )  # fmt: skip


def credit_note_for_team(credit_note_id: int) -> CreditNote | None:
    """One of Opsdeck's credit notes, with its invoice, for the billing team."""
    return (
        CreditNote.objects.filter(pk=credit_note_id, source=Invoice.Source.LOCAL)
        .select_related("invoice__tenant", "invoice__plan")
        .first()
    )


# --- the billing team's pages ---------------------------------------------------------------

# The columns of the billing team's list (`invoices_for_team`), and those its export adds.
_TEAM_ROW = [
    "id",
    "number",
    "period",
    "status",
    "currency",
    "total",
    "amount_refunded",
    "amount_credited",
    "plan__name",
    "tenant__name",
    "tenant__slug",
    "tenant__deleted_at",
]
_TEAM_EXPORT_ROW = [*_TEAM_ROW, "finalized_at"]


def invoices_for_team(
    *,
    status: str = "",
    period: str = "",
    tenant: str = "",
    min_total: Decimal | None = None,
    max_total: Decimal | None = None,
    export: bool = False,
) -> QuerySet[Invoice]:
    """Every tenant's invoices (drafts included), filtered, newest period first; with the
    columns the team's list shows, or with `export` those its CSV holds."""
    columns = _TEAM_EXPORT_ROW if export else _TEAM_ROW
    invoices = Invoice.objects.select_related("plan", "tenant").only(*columns)
    if status:
        invoices = invoices.filter(status=status)
    if period:
        invoices = invoices.filter(period=period)
    if tenant:
        invoices = invoices.filter(Q(tenant__name__icontains=tenant) | Q(tenant__slug=tenant))
    if min_total is not None:
        invoices = invoices.filter(total__gte=min_total)
    if max_total is not None:
        invoices = invoices.filter(total__lte=max_total)
    return invoices.order_by("-period", "tenant__name", "plan__name", "-pk")


@dataclass(frozen=True)
class PeriodTotal:
    period: str
    currency: str
    invoices: int
    total: Decimal
    net: Decimal  # what remains of the total once refunds and credit notes took theirs

    @property
    def taken_back(self) -> Decimal:
        return self.total - self.net


def period_totals(invoices: QuerySet[Invoice]) -> list[PeriodTotal]:
    """Totals per period and currency of `invoices`, voided ones left out, newest first, with
    what remains of them once refunds and credit notes took theirs (each invoice's
    `amount_remaining`)."""
    remaining = Greatest(
        F("total") - F("amount_refunded") - F("amount_credited"), Value(Decimal(0))
    )
    rows = (
        invoices.exclude(status=Invoice.Status.VOID)
        .order_by()
        .values("period", "currency")
        .annotate(count=Count("pk"), amount=Sum("total"), net=Sum(remaining))
        .order_by("-period", "currency")
    )
    return [
        PeriodTotal(r["period"], r["currency"], r["count"], r["amount"], r["net"]) for r in rows
    ]


def invoice_for_team(invoice_id: int) -> Invoice | None:
    return (
        Invoice.objects.filter(pk=invoice_id)
        .select_related("plan", "tenant")
        .prefetch_related("lines", "credit_notes")
        .first()
    )


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
    """Every plan, the tenant's subscribed ones first, with its limits, the tenant's usage and
    the unit prices the tenant pays."""
    open_ = {
        s.plan_id: s
        for s in Subscription.objects.filter(tenant=tenant).exclude(
            status=Subscription.Status.CANCELLED
        )
    }
    # The newest ended subscription that let instances run (`Subscription.RAN`) of each plan
    # with no open one but one awaiting payment: its instances may still run, until they are
    # stopped.
    running = [p for p, s in open_.items() if s.status in Subscription.LETS_RUN]
    ended = {
        s.plan_id: s
        for s in Subscription.objects.filter(
            Subscription.RAN, tenant=tenant, status=Subscription.Status.CANCELLED
        )
        .exclude(plan_id__in=running)
        .order_by("plan_id", "-created_at")
        .distinct("plan_id")
        .select_related("plan")
    }
    held = entitlements.held_by_staff(tenant)
    plans = list(Plan.objects.prefetch_related("prices"))
    prices = pricing.price_lists(tenant, plans)
    paid_at_checkout = pricing.paid_at_checkout(plans)
    limits_of = entitlements.limits_of(tenant, plans)
    usages = entitlements.usages_of(
        tenant, [plan for plan in plans if plan.pk in open_ or plan.pk in ended]
    )
    unpaid: dict[int, list[Invoice]] = {}
    if any(s.suspended_unpaid() for s in open_.values()):
        for invoice in Invoice.objects.filter(
            tenant=tenant, source=Invoice.Source.STRIPE, status=Invoice.Status.OPEN
        ).order_by("period", "pk"):
            unpaid.setdefault(invoice.plan_id, []).append(invoice)
    rows = []
    for plan in plans:
        subscription = open_.get(plan.pk)
        if subscription is not None:
            subscription.plan = plan  # with its prices, which its status reads
        limits = limits_of[plan.pk]
        usage = usages.get(plan.pk)
        instances = usage.instances if usage else 0
        rows.append(
            PlanRow(
                plan=plan,
                subscription=subscription,
                usage=_usage_lines(limits, usage) if subscription or instances else [],
                limits=_limit_lines(limits),
                instances=instances,
                held=subscription is None and plan.pk in held,
                prices=prices[plan.pk],
                stop_due=ended[plan.pk].stop_due_at() if instances and plan.pk in ended else None,
                paid_at_checkout=plan.pk in paid_at_checkout,
                unpaid=unpaid.get(plan.pk, [])
                if subscription and subscription.suspended_unpaid()
                else [],
            )
        )
    for row in rows:
        row.alternatives = [
            Alternative(other.plan, other.subscription is not None and other.subscription.status
                        == Subscription.Status.ACTIVE, other.held)
            for other in rows
            if other.plan.service == row.plan.service and other.plan.pk != row.plan.pk
        ]  # fmt: skip
    rows.sort(key=lambda row: row.subscription is None)
    return rows
