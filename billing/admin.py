from django.contrib import admin

from accounts.admin import ServiceOwnedAdmin, _run, _staff
from billing import meter_events
from billing.models import (
    BillingPeriod,
    MeteredHour,
    MeterEvent,
    Plan,
    Price,
    StripeCustomer,
    StripeEvent,
    StripeMeter,
    StripePrice,
    UsageRecord,
)


@admin.register(Plan)
class PlanAdmin(ServiceOwnedAdmin):
    """Plans come from spec files (`manage.py load_specs`); the admin shows them."""

    list_display = ["name", "key", "service", "updated_at"]
    list_filter = ["service"]
    search_fields = ["key", "name", "service"]


@admin.register(Price)
class PriceAdmin(ServiceOwnedAdmin):
    """Prices come from the spec's `pricing` (`manage.py load_specs`)."""

    list_display = ["plan", "dimension", "unit", "time_unit", "unit_price", "currency"]
    list_filter = ["plan", "currency"]


@admin.register(UsageRecord)
class UsageRecordAdmin(ServiceOwnedAdmin):
    """Usage comes from hourly metering (`manage.py meter_usage`); the admin shows it."""

    list_display = ["hour", "instance_name", "instance_id", "dimension", "quantity", "unit",
                    "tenant", "period", "adjustment"]  # fmt: skip
    list_filter = ["period", "adjustment", "dimension", "plan"]
    search_fields = ["instance_id", "instance_name", "tenant__name"]
    date_hierarchy = "hour"
    list_select_related = ["tenant"]


@admin.register(MeteredHour)
class MeteredHourAdmin(ServiceOwnedAdmin):
    """The hours metering has covered: a period closes only once all of its hours are here."""

    list_display = ["hour", "instances", "recorded_at"]
    date_hierarchy = "hour"


@admin.register(BillingPeriod)
class BillingPeriodAdmin(ServiceOwnedAdmin):
    list_display = ["key", "closed_at"]


@admin.register(MeterEvent)
class MeterEventAdmin(ServiceOwnedAdmin):
    """The Stripe outbox; a dead row goes back to the flusher through "Retry"."""

    list_display = ["identifier", "status", "event_name", "value", "timestamp", "customer_id",
                    "attempts", "next_attempt_at", "sent_at", "last_error"]  # fmt: skip
    list_filter = ["status", "event_name"]
    search_fields = ["identifier", "customer_id"]
    date_hierarchy = "timestamp"
    actions = ["retry"]

    def has_manage_permission(self, request):
        return request.user.has_perm("billing.change_meterevent")

    @admin.action(
        description="Retry (dead rows: checked against Stripe first)", permissions=["manage"]
    )
    def retry(self, request, queryset):
        _run(
            self,
            request,
            queryset,
            lambda row: meter_events.meter_event_retry(actor=_staff(request), meter_event=row),
            "Queued again",
        )


@admin.register(StripeEvent)
class StripeEventAdmin(ServiceOwnedAdmin):
    list_display = ["event_id", "type", "created", "received_at", "processed_at", "error"]
    list_filter = ["type", "processed_at"]
    search_fields = ["event_id", "type"]
    date_hierarchy = "created"


@admin.register(StripeCustomer)
class StripeCustomerAdmin(ServiceOwnedAdmin):
    list_display = ["tenant", "customer_id", "created_at"]
    search_fields = ["customer_id", "tenant__name", "tenant__slug"]
    list_select_related = ["tenant"]


@admin.register(StripeMeter)
class StripeMeterAdmin(ServiceOwnedAdmin):
    """Written by `manage.py stripe_sync_catalog`."""

    list_display = ["dimension", "event_name", "meter_id", "created_at"]


@admin.register(StripePrice)
class StripePriceAdmin(ServiceOwnedAdmin):
    """Written by `manage.py stripe_sync_catalog`."""

    list_display = ["lookup_key", "price", "stripe_price_id", "stripe_product_id",
                    "unit_amount_decimal"]  # fmt: skip
    list_select_related = ["price__plan"]
