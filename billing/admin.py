from django.contrib import admin

from accounts.admin import ServiceOwnedAdmin, run_action, staff_actor
from billing import invoicing
from billing.models import (
    BillingPeriod,
    Invoice,
    InvoiceLine,
    MeteredHour,
    Plan,
    Price,
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


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    fields = ["instance_name", "instance_id", "dimension", "quantity", "unit", "unit_price"]
    fields += ["amount", "adjustment_of"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Invoice)
class InvoiceAdmin(ServiceOwnedAdmin):
    """Drafts come from closing a period (`manage.py close_billing_period`); staff finalize,
    void or mark them paid with the actions, through `billing.invoicing` (audited)."""

    list_display = ["__str__", "tenant", "plan", "period", "status", "total", "currency"]
    list_filter = ["status", "period", "source", "currency"]
    search_fields = ["number", "tenant__name", "tenant__slug"]
    inlines = [InvoiceLineInline]
    actions = ["finalize", "void", "mark_paid"]
    readonly_fields = [field.name for field in Invoice._meta.fields]

    @admin.action(description="Finalize the selected drafts (numbers them; final)")
    def finalize(self, request, queryset):
        actor = staff_actor(request)
        run_action(
            self,
            request,
            queryset.order_by("pk"),
            lambda invoice: invoicing.invoice_finalize(actor=actor, invoice=invoice),
            "Finalized",
        )

    @admin.action(description="Void the selected invoices")
    def void(self, request, queryset):
        actor = staff_actor(request)
        run_action(
            self,
            request,
            queryset,
            lambda invoice: invoicing.invoice_void(actor=actor, invoice=invoice),
            "Voided",
        )

    @admin.action(description="Mark the selected invoices paid")
    def mark_paid(self, request, queryset):
        actor = staff_actor(request)
        run_action(
            self,
            request,
            queryset,
            lambda invoice: invoicing.invoice_mark_paid(actor=actor, invoice=invoice),
            "Marked paid",
        )
