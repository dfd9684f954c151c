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


# --- Stripe: the ids of what Opsdeck created there, the meter-event outbox, webhook events ---


class StripeCustomer(models.Model):
    """The Stripe customer of a tenant."""

    tenant = models.OneToOneField(
        "accounts.Tenant", on_delete=models.PROTECT, related_name="stripe_customer"
    )
    customer_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.customer_id


class StripeMeter(models.Model):
    """The Stripe meter summing one usage dimension (`manage.py stripe_sync_catalog`)."""

    dimension = models.CharField(max_length=32, unique=True)
    event_name = models.CharField(max_length=100, unique=True)
    meter_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["dimension"]

    def __str__(self) -> str:
        return f"{self.dimension}: {self.meter_id}"


class StripePrice(models.Model):
    """The Stripe product and metered price of one of our prices; `Price` stays as the spec
    wrote it."""

    price = models.OneToOneField(Price, on_delete=models.CASCADE, related_name="stripe")
    # `stripe_`: `price_id` is the foreign key's column.
    stripe_product_id = models.CharField(max_length=255)
    stripe_price_id = models.CharField(max_length=255, unique=True)
    lookup_key = models.CharField(max_length=200, unique=True)
    # What the Stripe price charges per meter unit (a millionth of a unit-hour), in cents.
    unit_amount_decimal = models.DecimalField(max_digits=30, decimal_places=12)
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
