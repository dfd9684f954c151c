from django.contrib import admin

from accounts.admin import ServiceOwnedAdmin
from billing.models import Plan, Price


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
