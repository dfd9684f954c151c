from django.contrib import admin

from accounts.admin import ServiceOwnedAdmin
from billing.models import Plan


@admin.register(Plan)
class PlanAdmin(ServiceOwnedAdmin):
    """Plans come from spec files (`manage.py load_specs`); the admin shows them."""

    list_display = ["name", "key", "service", "updated_at"]
    list_filter = ["service"]
    search_fields = ["key", "name", "service"]
