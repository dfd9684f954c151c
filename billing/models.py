import unicodedata
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from accounts.models import Tenant
from accounts.text import NOT_INTERNET, email_reaches_someone, text_visible
from billing.countries import COUNTRIES, COUNTRY_NAMES
from billing.tax_ids import TAX_ID_CHOICES, TAX_ID_TYPES, tax_id_clean


class Plan(models.Model):
    """A tier a tenant can run instances on; the commercial record of a service plan spec."""

    key = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    service = models.SlugField(max_length=100)
    # How people read the service (`x-opsdeck.serviceName`: "PostgreSQL"); "" when the spec
    # names none, and the key is shown.
    service_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    # Plain entitlements and subscription terms from the spec (`x-opsdeck.entitlements` and
    # `x-opsdeck.subscription`); the keys are `billing.entitlements.LIMIT_KEYS` and `TERM_KEYS`.
    limits = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["service", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def max_instances(self) -> int | None:
        value = self.limits.get("max_instances")
        return int(value) if value is not None else None

    @property
    def auto_approve(self) -> bool:
        """Whether subscribing takes effect at once (else staff approve it in the admin)."""
        return bool(self.limits.get("auto_approve", True))

    @property
    def paid_at_checkout(self) -> bool:
        """Whether a subscription to it waits for payment on Stripe's checkout: Stripe bills
        tenants, and a price of the plan is in effect (a plan without one, a free tier, has
        nothing to pay and starts as it would without Stripe; so does one whose first prices
        apply from the next billing period)."""
        from billing import pricing

        return self.pk in pricing.paid_at_checkout([self])

    @property
    def grace_days(self) -> int:
        """Days a past-due subscription keeps running before it is suspended."""
        return int(self.limits.get("grace_days", 7))

    @property
    def stop_after_days(self) -> int:
        """Days a suspended subscription's instances keep running before they are stopped."""
        return int(self.limits.get("stop_after_days", 7))


# How people read the pricing dimensions of a spec.
DIMENSION_LABELS = {
    "cpu": "CPU",
    "memory": "Memory",
    "storage": "Storage",
    "replica": "Servers",  # Omnistrate's replicas of the instance: every server it runs
    "deploymentCell": "Deployment cell",
    "backupStorage": "Backup storage",
    "base": "Base fee",
}
# Priced by a plan but not metered (so never charged) until a spec can say where a snapshot's
# size comes from: a price of one is shown as not charged, and Stripe's invoices list its
# metered price at 0.
UNMETERED_DIMENSIONS = frozenset({"backupStorage"})


class Price(models.Model):
    """What one unit of a usage dimension costs on a plan, per hour or per month (730 h): the
    plan's newest price, in effect unless a `PastPrice` still ahead keeps the one before it
    until the next billing period (`pricing.in_effect`)."""

    class TimeUnit(models.TextChoices):
        HOUR = "hour", "per hour"
        MONTH = "month", "per month"

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="prices")
    dimension = models.CharField(max_length=32)  # cpu, memory, storage, … (the spec's names)
    unit = models.CharField(max_length=32, blank=True)  # what one unit is: core, GiB
    time_unit = models.CharField(max_length=8, choices=TimeUnit.choices, default=TimeUnit.HOUR)
    unit_price = models.DecimalField(max_digits=18, decimal_places=8)
    currency = models.CharField(max_length=3, default="usd")

    class Meta:
        ordering = ["plan", "dimension"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "dimension"], name="price_plan_dimension")
        ]

    def __str__(self) -> str:
        return f"{self.dimension}: {self.unit_price} {self.currency} {self.get_time_unit_display()}"

    @property
    def label(self) -> str:
        return DIMENSION_LABELS.get(self.dimension, self.dimension)

    @property
    def charged(self) -> bool:
        """Whether usage of its dimension is metered, so charged (`UNMETERED_DIMENSIONS`)."""
        return self.dimension not in UNMETERED_DIMENSIONS


class UsageRecord(models.Model):
    """How much of one dimension one instance used in one UTC hour on one plan, in unit-hours
    (3 servers for 40 minutes are 2 replica-hours): an hour in which it moved to another plan
    has a row on each. Written once by metering; never changed."""

    tenant = models.ForeignKey(
        "accounts.Tenant", on_delete=models.PROTECT, related_name="usage_records"
    )
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="usage_records")
    # A plain value: billing knows instances only by their id and name.
    instance_id = models.CharField(max_length=13)
    instance_name = models.CharField(max_length=100)
    dimension = models.CharField(max_length=32)
    unit = models.CharField(max_length=32, blank=True)
    hour = models.DateTimeField()  # the start of a UTC hour
    quantity = models.DecimalField(max_digits=24, decimal_places=6)
    # The billing period it is billed in ("YYYY-MM"): the hour's own, unless that one was
    # already closed when the hour was metered.
    period = models.CharField(max_length=7)
    adjustment = models.BooleanField(default=False)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["hour", "instance_id", "dimension"]
        constraints = [
            models.UniqueConstraint(
                fields=["instance_id", "plan", "dimension", "hour"], name="usagerecord_once"
            )
        ]
        # `usagerecord_hour`: the staff's list, newest hour first (then by id, as the admin
        # orders it), reads one page along it, not the whole of an hour's rows to sort them.
        indexes = [
            models.Index(fields=["tenant", "period"], name="usagerecord_tenant_period"),
            models.Index(fields=["hour", "id"], name="usagerecord_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id} {self.dimension} {self.hour:%Y-%m-%d %H:00}: {self.quantity}"


class MeteredHour(models.Model):
    """An hour metering has covered (with every instance alive in it)."""

    hour = models.DateTimeField(unique=True)
    instances = models.PositiveIntegerField(default=0)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-hour"]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} UTC"


class BillingPeriod(models.Model):
    """A calendar month of billing ("YYYY-MM"); a period without a row is open."""

    key = models.CharField(max_length=7, unique=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-key"]

    def __str__(self) -> str:
        return self.key


class Invoice(models.Model):
    """What a tenant owes for one plan and one billing period.

    Opsdeck drafts it when the period closes (`billing.invoicing`); staff finalize it, which
    numbers it and freezes it (a database trigger refuses any later change to its amounts or
    lines), or void it. Mirrored Stripe invoices (`source` stripe) are shown the same way.
    """

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        OPEN = "open", "Finalized"  # Stripe's name for a finalized, unpaid invoice
        PAID = "paid", "Paid"
        VOID = "void", "Void"

    class Source(models.TextChoices):
        LOCAL = "local", "Opsdeck"
        STRIPE = "stripe", "Stripe"

    tenant = models.ForeignKey("accounts.Tenant", on_delete=models.PROTECT, related_name="invoices")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="invoices")
    period = models.CharField(max_length=7)  # "YYYY-MM"
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.DRAFT)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.LOCAL)
    # Given at finalization, in order, without gaps (`InvoiceCounter`).
    number = models.CharField(max_length=32, unique=True, null=True, blank=True)
    currency = models.CharField(max_length=3, default="usd")
    # Three places: a Kuwaiti dinar's amounts are in thousandths (`pricing.minor_unit`).
    total = models.DecimalField(max_digits=19, decimal_places=3, default=Decimal(0))
    stripe_invoice_id = models.CharField(max_length=255, unique=True, null=True, blank=True)
    hosted_invoice_url = models.URLField(max_length=1000, blank=True)
    pdf_url = models.URLField(max_length=1000, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finalized_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    # Whom it is made out to and who issues it, as they were when it was finalized
    # (`BillingProfile.details()`, the OPSDECK_INVOICE_ISSUER setting); frozen with it. Null
    # on a draft, and on one finalized before invoices kept them: the page prints the tenant's
    # details as they are now, and its name alone for an older one.
    billed_to = models.JSONField(null=True, blank=True)
    issuer = models.TextField(blank=True)
    # What Stripe took off a mirrored invoice's lines (its coupons) and added to them (a tax
    # not included in their amounts), as it finalized it: its lines less `discount` plus `tax`
    # make its total. Frozen with it; 0 on ours, whose lines make the total alone.
    discount = models.DecimalField(max_digits=19, decimal_places=3, default=Decimal(0))
    tax = models.DecimalField(max_digits=19, decimal_places=3, default=Decimal(0))
    # What Stripe took back off a mirrored invoice once finalized (not frozen with it;
    # `stripe_sync.invoice_credits_total`): what each charge that paid it had refunded, in the
    # currency's minor unit ({charge id: amount}); what was refunded to the payment, by those
    # charges or by its credit notes; and what its issued credit notes took off beyond their
    # refunds (credited to the customer's balance or outside Stripe, or off what was still
    # due). Not usage: the cost reports never read these.
    charge_refunds = models.JSONField(default=dict, blank=True)
    amount_refunded = models.DecimalField(max_digits=19, decimal_places=3, default=Decimal(0))
    amount_credited = models.DecimalField(max_digits=19, decimal_places=3, default=Decimal(0))

    class Meta:
        ordering = ["-period", "tenant", "plan"]
        constraints = [
            # One Opsdeck invoice per tenant, plan, period and currency (a voided one keeps its
            # place): a plan whose currency changed bills a month used before it in the old one.
            models.UniqueConstraint(
                fields=["tenant", "plan", "period", "currency"],
                condition=models.Q(source="local"),
                name="invoice_local_once_per_currency",
            )
        ]
        indexes = [models.Index(fields=["period", "status"], name="invoice_period_status")]

    def __str__(self) -> str:
        """Its number; a draft, by its period and, when it was read with it, its organization's
        name (read for it, a list of drafts would read each one's)."""
        if self.number:
            return self.number
        tenant = f" of {self.tenant.name}" if Invoice.tenant.is_cached(self) else ""
        return f"Draft {self.period}{tenant}"

    @property
    def frozen(self) -> bool:
        return self.status != self.Status.DRAFT

    @property
    def subtotal(self) -> Decimal:
        """What its lines add up to, before Stripe's discount and tax (its total, on ours)."""
        return self.total + self.discount - self.tax

    @property
    def per_deployment(self) -> bool:
        """Whether its lines are per deployment (Opsdeck's) or per price (Stripe's)."""
        return self.source == self.Source.LOCAL

    @property
    def amount_remaining(self) -> Decimal:
        """Its total less what was refunded and credited: what remains paid (or due)."""
        return max(self.total - self.amount_refunded - self.amount_credited, Decimal(0))

    @property
    def taken_back(self) -> bool:
        """Whether refunds or credit notes took something off it."""
        return bool(self.amount_refunded or self.amount_credited)

    @property
    def badge(self) -> str:
        """The state its label is coloured as: its status, "refunded" once nothing of it
        remains, "credited" while part does."""
        if not self.taken_back or self.status not in (self.Status.PAID, self.Status.OPEN):
            return self.status
        return "refunded" if not self.amount_remaining else "credited"

    def status_text(self) -> str:
        """Its status as people read it: "Paid"; or "Refunded", "Partly refunded (12.00 of
        40.00)", "Credited (10.00 of 40.00)" once refunds or credit notes took part of it
        back (an unpaid one says "Finalized" first)."""
        said = self.get_status_display()
        if not self.taken_back or self.status not in (self.Status.PAID, self.Status.OPEN):
            return said
        from billing.pricing import rounded

        total = rounded(self.total, self.currency)
        refunded = rounded(self.amount_refunded, self.currency)
        credited = rounded(self.amount_credited, self.currency)
        if refunded >= total:
            taken = "Refunded"
        elif not refunded:
            taken = "Credited" if credited >= total else f"Credited ({credited} of {total})"
        else:
            taken = f"Partly refunded ({refunded} of {total})"
            if credited:
                taken += f", credited {credited}"
        return (
            taken if self.status == self.Status.PAID else f"{said}; {taken[0].lower()}{taken[1:]}"
        )


class InvoiceLine(models.Model):
    """One instance's use of one dimension in the invoice's period, at one unit price."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    instance_id = models.CharField(max_length=13, blank=True)  # blank: not about one instance
    instance_name = models.CharField(max_length=100, blank=True)
    dimension = models.CharField(max_length=32)
    unit = models.CharField(max_length=32, blank=True)
    # Unit-hours used, and the price of one unit-hour (a monthly price spread over 730 h).
    quantity = models.DecimalField(max_digits=24, decimal_places=6)
    unit_price = models.DecimalField(max_digits=24, decimal_places=12)
    amount = models.DecimalField(max_digits=19, decimal_places=3)  # as `Invoice.total`
    # Usage of an earlier, already closed period metered late (an adjustment line).
    adjustment_of = models.CharField(max_length=7, blank=True)

    class Meta:
        ordering = ["invoice", "instance_name", "instance_id", "dimension", "adjustment_of"]

    def __str__(self) -> str:
        return f"{self.instance_name or '-'} {self.dimension}: {self.amount}"

    @property
    def label(self) -> str:
        return DIMENSION_LABELS.get(self.dimension, self.dimension)

    @property
    def unmetered(self) -> bool:
        """A line at 0 of a dimension nothing measures (`UNMETERED_DIMENSIONS`): Stripe lists
        every price of a subscription on its invoices, those too."""
        return self.dimension in UNMETERED_DIMENSIONS and not self.amount


class CreditNote(models.Model):
    """An amount taken off a finalized invoice: refunded to the customer (`refunded`), or
    credited (off what was still due, to the customer's balance, or outside Stripe). A void one
    keeps its number and no longer counts.

    A Stripe invoice's are mirrored from Stripe's webhooks (`stripe_sync.credit_note_mirror`);
    an Opsdeck invoice's are issued by the billing team (`invoicing.credit_note_issue`), numbered
    in their own series and, once issued, never changed but to be voided (a database trigger,
    migration `0027_local_credit_notes`). One model for both, so that every page, the export and
    the invoice's totals read them alike; only Stripe's have a Stripe id."""

    class Status(models.TextChoices):
        ISSUED = "issued", "Issued"
        VOID = "void", "Void"

    # Stripe's reasons, as people read them.
    REASONS = {
        "duplicate": "Duplicate",
        "fraudulent": "Fraudulent",
        "order_change": "Order change",
        "product_unsatisfactory": "Product unsatisfactory",
    }
    # The reasons the billing team gives an Opsdeck invoice's (a fraud is Stripe's to judge).
    LOCAL_REASONS = {
        "duplicate": "Duplicate",
        "order_change": "Order change",
        "product_unsatisfactory": "Product unsatisfactory",
        "other": "Other",
    }

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="credit_notes")
    # As its invoice's: whoever issued it.
    source = models.CharField(
        max_length=8, choices=Invoice.Source.choices, default=Invoice.Source.STRIPE
    )
    stripe_credit_note_id = models.CharField(max_length=255, unique=True, null=True, blank=True)
    number = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.ISSUED)
    currency = models.CharField(max_length=3)
    amount = models.DecimalField(max_digits=19, decimal_places=3)  # as `Invoice.total`
    refunded = models.DecimalField(max_digits=19, decimal_places=3, default=Decimal(0))
    reason = models.CharField(max_length=100, blank=True)  # as people read it
    memo = models.TextField(blank=True)
    pdf_url = models.URLField(max_length=1000, blank=True)
    created = models.DateTimeField()  # when it was issued
    voided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["invoice", "created", "pk"]
        constraints = [
            # Stripe's have Stripe's id; Opsdeck's have none, and a number of their own series.
            models.CheckConstraint(
                condition=models.Q(source="stripe", stripe_credit_note_id__isnull=False)
                | models.Q(source="local", stripe_credit_note_id__isnull=True),
                name="creditnote_stripe_id_if_stripes",
            ),
            models.UniqueConstraint(
                fields=["number"],
                condition=models.Q(source="local"),
                name="creditnote_local_number_once",
            ),
        ]

    def __str__(self) -> str:
        return self.number or self.stripe_credit_note_id or ""

    @property
    def audit_name(self) -> str:
        return str(self)

    @property
    def credited(self) -> Decimal:
        """What it took off beyond what it refunded."""
        return self.amount - self.refunded


class InvoiceCounter(models.Model):
    """The last invoice number given, per series; locked while a number is taken, so numbers
    follow each other without gaps (a database sequence would skip on a rollback)."""

    series = models.CharField(max_length=16, unique=True)
    last = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.series}: {self.last}"


class Subscription(models.Model):
    """A tenant's subscription to a plan: without an active one it cannot create instances on it.

    pending → active → past_due → suspended → cancelled (the services in `billing.services`
    move it; a suspended one can be reactivated).
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Awaiting approval"
        ACTIVE = "active", "Active"
        PAST_DUE = "past_due", "Past due"
        SUSPENDED = "suspended", "Suspended"
        CANCELLED = "cancelled", "Cancelled"

    # Those on which the plan's instances may run (a suspended one until they are stopped):
    # not one awaiting payment or approval, nor one ended.
    LETS_RUN = (Status.ACTIVE, Status.PAST_DUE, Status.SUSPENDED)
    # Those that let the plan's instances run at some time: each start stamps its first period
    # (and Stripe's, when it began), which one cancelled while it awaited approval or payment
    # never had. Only such a one, ended, stops the instances still on its plan.
    RAN = models.Q(current_period_start__isnull=False) | models.Q(stripe_started_at__isnull=False)

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="subscriptions")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="subscriptions")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    stripe_customer_id = models.CharField(max_length=255, blank=True)
    stripe_subscription_id = models.CharField(max_length=255, blank=True)
    current_period_start = models.DateTimeField(null=True, blank=True)
    current_period_end = models.DateTimeField(null=True, blank=True)
    # When the Stripe subscription it holds began (Stripe's start_date): usage metered before
    # is in none of its periods, so a meter event of the hour it began is timed from then.
    stripe_started_at = models.DateTimeField(null=True, blank=True)
    past_due_since = models.DateTimeField(null=True, blank=True)
    # Checkout pages made for it: the next one's idempotency key, so a page made once the one
    # before expired is a new one (Stripe answers a key again with its first page for 24 h).
    checkout_pages = models.PositiveIntegerField(default=0)
    suspended_at = models.DateTimeField(null=True, blank=True)
    # Suspended by the platform team: it stays suspended until they reactivate it, whatever
    # Stripe reports (a suspension for an unpaid invoice ends when Stripe reports it paid).
    suspended_by_staff = models.BooleanField(default=False)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "plan", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "plan"],
                condition=~models.Q(status="cancelled"),
                name="subscription_one_open_per_tenant_plan",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant} — {self.plan} ({self.status_text()})"

    def ran(self) -> bool:
        """Whether it let the plan's instances run at some time (`RAN`)."""
        return self.current_period_start is not None or self.stripe_started_at is not None

    def suspended_unpaid(self) -> bool:
        """Suspended by the system for a Stripe invoice left unpaid past the grace period:
        paying it reactivates the subscription by itself (Stripe's webhook), not staff."""
        return (
            self.status == self.Status.SUSPENDED
            and not self.suspended_by_staff
            and self.past_due_since is not None
            and bool(self.stripe_subscription_id)
        )

    def stop_counted_from(self) -> datetime | None:
        """Since when the running instances on its plan are counted toward being stopped (the
        plan's `stop_after_days` later): its suspension; once ended, its end, or the
        suspension it ended in. Stripe ends a subscription, its instances still running, when
        its payment fails for good: ending does not let them run on unpaid. None while they
        may run."""
        if self.status == self.Status.SUSPENDED:
            return self.suspended_at
        if self.status == self.Status.CANCELLED:
            return min((t for t in (self.suspended_at, self.cancelled_at) if t), default=None)
        return None

    def stop_due_at(self) -> datetime | None:
        """When the running instances on its plan are stopped (`stop_counted_from`)."""
        since = self.stop_counted_from()
        return since + timedelta(days=self.plan.stop_after_days) if since else None

    # Its plan's `paid_at_checkout`, when whoever read it read those of many rows at once
    # (a page of the admin's list): `status_text` asks no more.
    plan_paid_at_checkout: bool | None = None

    def status_text(self, paid_at_checkout: bool | None = None) -> str:
        """Its status as people read it: while Stripe bills tenants, a pending subscription
        waits for payment on Stripe's checkout page, not for the platform team's approval.
        `paid_at_checkout`: its plan's (`Plan.paid_at_checkout`), when the caller read it."""
        if paid_at_checkout is None:
            paid_at_checkout = self.plan_paid_at_checkout
        if paid_at_checkout is None and self.status == self.Status.PENDING:
            paid_at_checkout = self.plan.paid_at_checkout
        if self.status == self.Status.PENDING and paid_at_checkout:
            return "Awaiting payment"
        if self.status == self.Status.SUSPENDED and self.suspended_by_staff:
            return "Suspended by staff"
        if self.status == self.Status.CANCELLED and self.suspended_by_staff:
            return "Cancelled while suspended by staff"  # until staff lift it (`hold_lift`)
        return self.get_status_display()


class PastPrice(models.Model):
    """What a dimension of a plan costs until `until` (the first moment the price that replaced
    it applies), kept when the plan's prices change so that usage before is priced as it was:
    invoices and cost reports read it (`pricing.PriceBook`). A null `unit_price` marks a
    dimension the plan did not price before `until` (usage of it then is free).

    A change to a plan already used applies from the next billing period
    (`services.plan_prices_replace`): until then, the row whose `until` is still ahead is the
    price in effect, and the plan's `Price` the one to come. (Rows written before that rule
    end at the hour after their change.)"""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="past_prices")
    dimension = models.CharField(max_length=32)
    unit_price = models.DecimalField(max_digits=18, decimal_places=8, null=True, blank=True)
    time_unit = models.CharField(max_length=8, choices=Price.TimeUnit.choices, default="hour")
    currency = models.CharField(max_length=3, default="usd")
    until = models.DateTimeField()
    unit = models.CharField(max_length=32, blank=True)  # "" on rows kept before it was
    # The Stripe price that charges it: a Stripe subscription's item for the dimension stays
    # on it while its period began before `until` (`stripe_sync.subscription_align`). "" while
    # none is known (the catalog sync makes one for a row in effect).
    stripe_price_id = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["plan", "dimension", "until"]
        indexes = [models.Index(fields=["plan", "until"], name="pastprice_plan_until")]

    def __str__(self) -> str:
        return (
            f"{self.dimension}: {self.unit_price} {self.currency} until {self.until:%Y-%m-%d %H:%M}"
        )


# What refuses a second override of an organization's plan from the same moment.
OVERRIDE_SAME_MOMENT = (
    "Another override of this organization's plan starts at this moment; choose another."
)


class PlanOverride(models.Model):
    """Staff's per-tenant change to a plan's limits and prices from `effective_from` on: the
    override in effect at a time is the latest that started by then; it never reaches back
    into a closed period (`billing.periods.is_closed`)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="plan_overrides")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="overrides")
    effective_from = models.DateTimeField(default=timezone.now)
    # The plan's limit keys (e.g. {"max_instances": 20, "max_total": {"storage": 2000}}).
    limits = models.JSONField(default=dict, blank=True)
    # {dimension: unit price as a string}, in the plan's currency and time unit.
    prices = models.JSONField(default=dict, blank=True)
    note = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "plan", "-effective_from"]
        constraints = [
            # Two from the same moment: which is in effect would be a coin toss.
            models.UniqueConstraint(
                fields=["tenant", "plan", "effective_from"],
                name="planoverride_once_per_moment",
                violation_error_message=OVERRIDE_SAME_MOMENT,
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant} — {self.plan} from {self.effective_from:%Y-%m-%d %H:%M}"


class BillingProfile(models.Model):
    """Who a tenant's invoices are made out to: its legal name, billing email and address, and
    an optional tax ID (`billing.tax_ids`). A tenant without one is billed under its name.

    Stripe's customer follows it (`stripe_sync.billing_details_push`): each change counts up
    `version`, and `stripe_version` is the version Stripe holds. A push that failed is tried
    again by beat from `stripe_next_attempt_at`; one Stripe refused (`stripe_error`, no next
    attempt) waits for the details to change."""

    tenant = models.OneToOneField(
        "accounts.Tenant", on_delete=models.CASCADE, related_name="billing_profile"
    )
    legal_name = models.CharField("Legal name", max_length=200)
    email = models.EmailField("Billing email", max_length=254, blank=True)
    line1 = models.CharField("Address line 1", max_length=200, blank=True)
    line2 = models.CharField("Address line 2", max_length=200, blank=True)
    city = models.CharField("City", max_length=100, blank=True)
    postal_code = models.CharField("Postal code", max_length=20, blank=True)
    state = models.CharField("State or region", max_length=100, blank=True)
    country = models.CharField("Country", max_length=2, blank=True, choices=COUNTRIES)
    tax_id_type = models.CharField("Tax ID type", max_length=16, blank=True, choices=TAX_ID_CHOICES)
    tax_id_value = models.CharField("Tax ID number", max_length=40, blank=True)
    version = models.PositiveIntegerField(default=0)  # 0: never saved
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    stripe_version = models.PositiveIntegerField(default=0)
    stripe_attempts = models.PositiveIntegerField(default=0)  # since the last success
    # Claimed while a push is under way (another waits `stripe_sync.DETAILS_LEASE`).
    stripe_attempted_at = models.DateTimeField(null=True, blank=True)
    stripe_next_attempt_at = models.DateTimeField(null=True, blank=True)
    stripe_error = models.TextField(blank=True)
    # Stripe took the name, email and address of these details, not their tax ID: it refused
    # it (`stripe_error`) or could not be reached for it (`stripe_next_attempt_at`).
    stripe_tax_id_behind = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(
                fields=["stripe_next_attempt_at"],
                name="billingprofile_push_due",
                condition=models.Q(stripe_next_attempt_at__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return self.legal_name

    @property
    def audit_name(self) -> str:
        return self.legal_name

    @property
    def stripe_refusal(self) -> str:
        """What Stripe refused of these details, and what its invoices show meanwhile."""
        if self.stripe_tax_id_behind:
            return f"Stripe refused the tax ID: {self.stripe_error} {self.stripe_shows}"
        return f"Stripe refused these details: {self.stripe_error} {self.stripe_shows}"

    @property
    def stripe_shows(self) -> str:
        """What Stripe's invoices show while it does not hold these details (no full stop)."""
        if self.stripe_tax_id_behind:
            return (
                "Stripe's invoices show the new name and address, with the tax ID it held "
                "before, if any"
            )
        return "Stripe's invoices show the details it held before"

    # The fields a customer fills in, in the order the form asks for them.
    DETAILS = (
        "legal_name", "email", "line1", "line2", "city", "postal_code", "state", "country",
        "tax_id_type", "tax_id_value",
    )  # fmt: skip

    # The fields printed on invoices and sent to Stripe as typed.
    TEXTS = ("legal_name", "line1", "line2", "city", "postal_code", "state", "tax_id_value")

    def clean(self) -> None:
        """Every field's error at once: a text no one can read as printed (a line break, a
        control or direction character, a legal name of blank letters only), a billing email
        mail cannot reach (`localhost`), an address
        without its first line, city or country, a tax ID of the wrong shape."""
        errors: dict[str, str] = {}
        for name in self.TEXTS:
            # A no-break or narrow space (pasted from a web page, "DE 123 456 789") is a space.
            spaced = "".join(
                " " if unicodedata.category(c) == "Zs" else c for c in getattr(self, name)
            )
            setattr(self, name, spaced)
            if not spaced.isprintable():
                errors[name] = "Use letters, digits, spaces and punctuation only."
        if "legal_name" not in errors and not text_visible(self.legal_name):
            errors["legal_name"] = "Enter the legal name, as registered."
        if self.email and not email_reaches_someone(self.email):
            errors["email"] = NOT_INTERNET
        try:
            self.tax_id_value = tax_id_clean(self.tax_id_type, self.tax_id_value)
        except ValidationError as exc:
            for name, said in exc.message_dict.items():
                errors.setdefault(name, " ".join(said))
        if any((self.line1, self.line2, self.city, self.postal_code, self.state)):
            needed = {
                "line1": "Enter the first line of the address, or clear the address.",
                "city": "Enter the city, or clear the address.",
                "country": "Choose the country, or clear the address.",
            }
            for name, said in needed.items():
                if not getattr(self, name):
                    errors.setdefault(name, said)
        if errors:
            raise ValidationError(errors)

    def details(self) -> dict[str, str]:
        """The details as an invoice prints them: what is frozen on a finalized one."""
        values = {name: getattr(self, name) for name in self.DETAILS}
        values["country_name"] = COUNTRY_NAMES.get(self.country, "")
        kind = TAX_ID_TYPES.get(self.tax_id_type)
        values["tax_id_label"] = kind.label if kind else ""
        return values

    @property
    def stripe_pending(self) -> bool:
        """Whether Stripe's customer does not hold these details yet."""
        return self.stripe_version < self.version


# --- Stripe: the ids of what Opsdeck created there, the meter-event outbox, webhook events ---


class StripeCustomer(models.Model):
    """The Stripe customer of a tenant.

    A tenant without billing details is billed under its name: `name` is the one Stripe's
    customer holds (as made, or last sent; blank: not known), and while it is not the tenant's
    the name is due to Stripe (`stripe_sync.billing_details_push`). A push that failed is tried
    again by beat from `name_next_attempt_at`; one Stripe refused (`name_error`, no next
    attempt) waits for the tenant's next rename. A tenant with billing details follows its
    `BillingProfile` instead."""

    tenant = models.OneToOneField(
        "accounts.Tenant", on_delete=models.PROTECT, related_name="stripe_customer"
    )
    customer_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    name = models.CharField(max_length=200, blank=True)
    name_attempts = models.PositiveIntegerField(default=0)  # since the last success
    # Claimed while a push is under way (another waits `stripe_sync.DETAILS_LEASE`).
    name_attempted_at = models.DateTimeField(null=True, blank=True)
    name_next_attempt_at = models.DateTimeField(null=True, blank=True)
    name_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.customer_id


class StripeMeter(models.Model):
    """The Stripe meter summing one plan's usage of one dimension (`manage.py
    stripe_sync_catalog`). A meter bills every subscription of the customer whose prices are on
    it, so each plan has its own: a tenant on two plans is billed each plan's usage once.

    Rows without a plan are the meters of earlier versions, one per dimension shared by every
    plan: kept so that events sent to them can still be looked up, never sent to again."""

    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.PROTECT, related_name="stripe_meters"
    )
    dimension = models.CharField(max_length=32)
    event_name = models.CharField(max_length=100, unique=True)
    meter_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["plan", "dimension"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "dimension"], name="stripemeter_plan_dimension")
        ]

    def __str__(self) -> str:
        return f"{self.event_name}: {self.meter_id}"


class StripePrice(models.Model):
    """The Stripe product and metered price of one of our prices (the plan's newest, `Price`,
    which stays as the spec wrote it). The Stripe price of a price a change replaced is kept
    on its `PastPrice`, which stays in effect until the next billing period."""

    price = models.OneToOneField(Price, on_delete=models.CASCADE, related_name="stripe")
    # `stripe_`: `price_id` is the foreign key's column.
    stripe_product_id = models.CharField(max_length=255)
    stripe_price_id = models.CharField(max_length=255, unique=True)
    lookup_key = models.CharField(max_length=200, unique=True)
    # What the Stripe price charges per meter unit (a millionth of a unit-hour), in cents.
    unit_amount_decimal = models.DecimalField(max_digits=30, decimal_places=12)
    # The Stripe prices this one replaced (an amount or meter changed): an invoice line of one
    # is read as this price's dimension.
    replaced_price_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["lookup_key"]

    def __str__(self) -> str:
        return self.lookup_key


class MeterEvent(models.Model):
    """The outbox: one usage record on its way to a Stripe meter."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        SENT = "sent", "sent"
        DEAD = "dead", "dead"  # failed too often; the admin can retry it
        ADJUSTED = "adjusted", "adjusted"  # too old for Stripe: a local adjustment line

    usage_record = models.OneToOneField(
        UsageRecord, on_delete=models.PROTECT, related_name="meter_event"
    )
    identifier = models.CharField(max_length=100, unique=True)
    customer_id = models.CharField(max_length=255)
    event_name = models.CharField(max_length=100)
    # Whole millionths of a unit-hour, as Stripe wants them: a string of digits.
    value = models.CharField(max_length=40)
    timestamp = models.DateTimeField()  # the usage record's hour
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # Once set, Stripe may hold the event: a later send must not count it twice.
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # Ask the meter's summaries whether Stripe has it before sending (an admin retry).
    check_first = models.BooleanField(default=False)
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-timestamp", "id"]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="meterevent_due"),
            models.Index(
                fields=["customer_id", "event_name", "timestamp"], name="meterevent_window"
            ),
            # The staff's list, in the order above, reads one page along it: an hour's events
            # (one per instance and dimension) ordered by id within it, without sorting them.
            models.Index(fields=["-timestamp", "id"], name="meterevent_timestamp"),
        ]

    def __str__(self) -> str:
        return self.identifier


class StripeEvent(models.Model):
    """A webhook event as Stripe sent it, stored once per id."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    created = models.DateTimeField()  # when Stripe created the event
    payload = models.JSONField()
    received_at = models.DateTimeField(default=timezone.now)
    processed_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id}"
