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
