from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import Tenant


class Plan(models.Model):
    """A tier a tenant can run instances on; the commercial record of a service plan spec."""

    key = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    service = models.SlugField(max_length=100)
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
    "replica": "Replicas",
    "deploymentCell": "Deployment cell",
    "backupStorage": "Backup storage",
    "base": "Base fee",
}


class Price(models.Model):
    """What one unit of a usage dimension costs on a plan, per hour or per month (730 h)."""

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

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="subscriptions")
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="subscriptions")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    stripe_customer_id = models.CharField(max_length=255, blank=True)
    stripe_subscription_id = models.CharField(max_length=255, blank=True)
    current_period_start = models.DateTimeField(null=True, blank=True)
    current_period_end = models.DateTimeField(null=True, blank=True)
    past_due_since = models.DateTimeField(null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True)
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
        return f"{self.tenant} — {self.plan} ({self.get_status_display()})"


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

    def __str__(self) -> str:
        return f"{self.tenant} — {self.plan} from {self.effective_from:%Y-%m-%d %H:%M}"
