from django.db import models
from django.utils import timezone


class Plan(models.Model):
    """A tier a tenant can run instances on; the commercial record of a service plan spec."""

    key = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    service = models.SlugField(max_length=100)
    description = models.TextField(blank=True)
    # Plain limits from the spec, e.g. {"max_instances": 5}.
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


class UsageRecord(models.Model):
    """How much of one dimension one instance used in one UTC hour, in unit-hours (3 servers
    for 40 minutes are 2 replica-hours). Written once by metering; never changed."""

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
                fields=["instance_id", "dimension", "hour"], name="usagerecord_once"
            )
        ]
        indexes = [models.Index(fields=["tenant", "period"], name="usagerecord_tenant_period")]

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
