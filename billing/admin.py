from django.contrib import admin

from accounts.admin import ServiceOwnedAdmin
from billing.models import BillingPeriod, MeteredHour, Plan, Price, UsageRecord


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
