from datetime import UTC
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect
from django.urls import reverse

from accounts.admin import ServiceOwnedAdmin, run_action, staff_actor, values_filter
from accounts.errors import ActionDenied
from billing import invoicing, meter_events, periods, pricing, services, stripe_sync
from billing.models import (
    OVERRIDE_SAME_MOMENT,
    BillingPeriod,
    BillingProfile,
    CreditNote,
    Invoice,
    InvoiceLine,
    MeteredHour,
    MeterEvent,
    PastPrice,
    Plan,
    PlanOverride,
    Price,
    StripeCustomer,
    StripeEvent,
    StripeMeter,
    StripePrice,
    Subscription,
    UsageRecord,
)
from billing.usage import period_key


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


@admin.register(PastPrice)
class PastPriceAdmin(ServiceOwnedAdmin):
    """A plan's prices before a change (`manage.py load_specs` keeps them): usage before
    `until` is priced at them, so one whose `until` is still ahead is the price in effect now
    (a change to a plan in use applies from the next billing period)."""

    list_display = ["plan", "dimension", "price", "unit", "time_unit", "currency", "until",
                    "stripe_price_id"]  # fmt: skip
    list_filter = ["plan", "dimension"]
    date_hierarchy = "until"
    list_select_related = ["plan"]

    @admin.display(description="unit price", ordering="unit_price")
    def price(self, obj: PastPrice) -> str:
        return "free (not priced)" if obj.unit_price is None else str(obj.unit_price)


def _dimensions_priced() -> set[str]:
    """The dimensions priced on a plan, now or before: those usage is metered in."""
    return set(Price.objects.values_list("dimension", flat=True)) | set(
        PastPrice.objects.values_list("dimension", flat=True)
    )


def _periods_metered() -> set[str]:
    """The periods usage can be billed in: those of the hours metered (an hour metered after its
    period closed is billed in the next, in which hours are metered too) and those closed."""
    months = MeteredHour.objects.datetimes("hour", "month", tzinfo=UTC)
    return {period_key(month) for month in months} | set(
        BillingPeriod.objects.values_list("key", flat=True)
    )


@admin.register(UsageRecord)
class UsageRecordAdmin(ServiceOwnedAdmin):
    """Usage comes from hourly metering (`manage.py meter_usage`); the admin shows it, newest
    hour first. A row per instance, dimension and hour: the list reads one page along the index
    on `hour`, and offers the periods metered and the dimensions priced to filter on rather
    than a DISTINCT over every row. No date hierarchy (the `hour` filter narrows by date).
    Unfiltered, a large table's rows are estimated, not counted; no second count of every row
    beside a filtered one, and no facet counts."""

    list_display = ["hour", "instance_name", "instance_id", "dimension", "quantity", "unit",
                    "tenant", "period", "adjustment"]  # fmt: skip
    list_filter = [
        ("period", values_filter(_periods_metered)),
        "adjustment",
        ("dimension", values_filter(_dimensions_priced)),
        "plan",
        "hour",
    ]
    search_fields = ["instance_id", "instance_name", "tenant__name"]
    list_select_related = ["tenant"]
    ordering = ["-hour"]
    count_estimated = True
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER


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


class CreditNoteInline(InvoiceLineInline):
    """An invoice's credit notes: Stripe's, as its webhooks mirrored them; Opsdeck's, as the
    billing team issued them (on its pages, which issue and void them)."""

    model = CreditNote
    fields = [
        "number",
        "source",
        "status",
        "amount",
        "refunded",
        "currency",
        "reason",
        "memo",
        "created",
    ]
    fields += ["voided_at", "pdf_url"]
    readonly_fields = fields


@admin.register(Invoice)
class InvoiceAdmin(ServiceOwnedAdmin):
    """Drafts come from closing a period (`manage.py close_billing_period`); staff finalize,
    void or mark them paid with the actions, through `billing.invoicing` (audited)."""

    list_display = ["__str__", "tenant", "plan", "period", "status", "amount", "currency"]
    list_filter = ["status", "period", "source", "currency"]
    search_fields = ["number", "tenant__name", "tenant__slug"]
    inlines = [InvoiceLineInline, CreditNoteInline]
    actions = ["finalize", "void", "mark_paid"]
    readonly_fields = [field.name for field in Invoice._meta.fields]

    @admin.display(description="Total", ordering="total")
    def amount(self, invoice: Invoice) -> Decimal:
        """As the invoice writes it: 17 in yen, not 17.00."""
        return pricing.rounded(invoice.total, invoice.currency)

    def has_manage_permission(self, request):
        # The model permission, not the admin's change permission (read-only here): staff who
        # may only view invoices are offered no action.
        return request.user.has_perm("billing.change_invoice")

    @admin.action(
        description="Finalize the selected drafts (numbers them; final)", permissions=["manage"]
    )
    def finalize(self, request, queryset):
        actor = staff_actor(request)
        run_action(
            self,
            request,
            queryset.order_by("pk"),
            lambda invoice: invoicing.invoice_finalize(actor=actor, invoice=invoice),
            "Finalized",
        )

    @admin.action(description="Void the selected invoices", permissions=["manage"])
    def void(self, request, queryset):
        actor = staff_actor(request)
        run_action(
            self,
            request,
            queryset,
            lambda invoice: invoicing.invoice_void(actor=actor, invoice=invoice),
            "Voided",
        )

    @admin.action(description="Mark the selected invoices paid", permissions=["manage"])
    def mark_paid(self, request, queryset):
        actor = staff_actor(request)
        run_action(
            self,
            request,
            queryset,
            lambda invoice: invoicing.invoice_mark_paid(actor=actor, invoice=invoice),
            "Marked paid",
        )


@admin.register(Subscription)
class SubscriptionAdmin(ServiceOwnedAdmin):
    """Subscriptions change only through the actions below (each calls a billing service,
    which audits it and emails the tenant)."""

    list_display = ["tenant", "plan", "standing", "created_at", "past_due_since", "suspended_at"]
    list_filter = ["status", "plan"]
    search_fields = ["tenant__name", "tenant__slug", "plan__key"]
    actions = ["approve", "suspend", "reactivate", "cancel", "hold_lift"]

    def get_queryset(self, request):
        # Its status reads whether the plan has a price ("Awaiting payment").
        return super().get_queryset(request).prefetch_related("plan__prices")

    def get_changelist_instance(self, request):
        """The page's rows, each told whether its plan is paid at checkout, read for them all
        at once: its status and its checkbox's label say it."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        paid = pricing.paid_at_checkout(row.plan for row in rows)
        for row in rows:
            row.plan_paid_at_checkout = row.plan_id in paid
        return changelist

    @admin.display(description="Status", ordering="status")
    def standing(self, subscription: Subscription) -> str:
        return subscription.status_text()

    def has_manage_permission(self, request):
        return request.user.has_perm("billing.change_subscription")

    @admin.action(description="Approve the selected subscriptions", permissions=["manage"])
    def approve(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            lambda s: services.subscription_approve(actor=staff_actor(request), subscription=s),
            "Approved",
        )

    @admin.action(description="Suspend the selected subscriptions", permissions=["manage"])
    def suspend(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            lambda s: services.subscription_suspend(
                actor=staff_actor(request), subscription=s, reason="suspended by staff"
            ),
            "Suspended",
        )

    @admin.action(description="Reactivate the selected subscriptions", permissions=["manage"])
    def reactivate(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            lambda s: services.subscription_reactivate(actor=staff_actor(request), subscription=s),
            "Reactivated",
        )

    @admin.action(description="Cancel the selected subscriptions", permissions=["manage"])
    def cancel(self, request, queryset):
        def call(subscription):
            services.subscription_cancel(
                actor=staff_actor(request),
                subscription=subscription,
                then=stripe_sync.subscription_end,
            )

        run_action(self, request, queryset, call, "Cancelled")

    @admin.action(
        description="Let the organizations subscribe again (cancelled while suspended)",
        permissions=["manage"],
    )
    def hold_lift(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            lambda s: services.subscription_hold_lift(actor=staff_actor(request), subscription=s),
            "Lifted",
        )


class PlanOverrideForm(forms.ModelForm):
    class Meta:
        model = PlanOverride
        fields = ["tenant", "plan", "effective_from", "limits", "prices", "note"]
        help_texts = {
            "limits": 'The plan\'s limit keys, e.g. {"max_instances": 20, "max_total": '
            '{"storage": 2000}}; null removes a limit.',
            "prices": 'Unit prices per dimension, e.g. {"cpu": "0.03"}.',
        }

    def clean(self):
        data = super().clean()
        if self.instance.pk and periods.is_closed(self.instance.effective_from):
            raise ValidationError(
                "This override took effect in a closed billing period; add a new one instead."
            )
        # Editing, the organization and plan are read-only, so the form's own check of the
        # constraint leaves them out: checked here, beside the field.
        if self.instance.pk and data.get("effective_from"):
            clash = PlanOverride.objects.filter(
                tenant_id=self.instance.tenant_id, plan_id=self.instance.plan_id,
                effective_from=data["effective_from"],
            ).exclude(pk=self.instance.pk)  # fmt: skip
            if clash.exists():
                self.add_error("effective_from", OVERRIDE_SAME_MOMENT)
        try:
            services.plan_override_validate(
                plan=data.get("plan") or getattr(self.instance, "plan", None),
                effective_from=data.get("effective_from"),
                limits=data.get("limits") or {},
                prices=data.get("prices") or {},
            )
        except ValidationError as exc:
            for name, errors in exc.message_dict.items():
                self.add_error(name, errors)
        return data


@admin.register(PlanOverride)
class PlanOverrideAdmin(admin.ModelAdmin):
    """Per-tenant limits and prices from a date on; saved through the billing services
    (validated against closed periods, audited). An override is never deleted: a later one
    replaces it."""

    form = PlanOverrideForm
    list_display = ["tenant", "plan", "effective_from", "note", "created_by"]
    # created_by may be empty, so the admin would not follow it by itself: one query per row.
    list_select_related = ["tenant", "plan", "created_by"]
    list_filter = ["plan"]
    search_fields = ["tenant__name", "tenant__slug", "plan__key", "note"]

    def has_delete_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "plan"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        values = {
            "effective_from": data["effective_from"],
            "limits": data.get("limits") or {},
            "prices": data.get("prices") or {},
            "note": data.get("note", ""),
        }
        try:
            if change:
                saved = services.plan_override_update(
                    actor=staff_actor(request), override=obj, **values
                )
            else:
                saved = services.plan_override_create(
                    actor=staff_actor(request), tenant=data["tenant"], plan=data["plan"], **values
                )
        except (ActionDenied, ValidationError) as exc:
            # Refused after the form's checks passed: another save of the same moment won a
            # race (a double-clicked Save). Said, and neither reported nor logged as saved.
            reason = exc.reason if isinstance(exc, ActionDenied) else "; ".join(exc.messages)
            self.message_user(request, reason, messages.ERROR)
            obj._refused = True
            return
        obj.pk = saved.pk

    def log_addition(self, request, obj, message):
        if not getattr(obj, "_refused", False):
            super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        if not getattr(obj, "_refused", False):
            super().log_change(request, obj, message)

    def response_add(self, request, obj, post_url_continue=None):
        if getattr(obj, "_refused", False):
            return HttpResponseRedirect(reverse("admin:billing_planoverride_changelist"))
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request, obj):
        if getattr(obj, "_refused", False):
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)


def _meters_event_names() -> list[str]:
    return list(StripeMeter.objects.values_list("event_name", flat=True))


@admin.register(MeterEvent)
class MeterEventAdmin(ServiceOwnedAdmin):
    """The Stripe outbox; a dead row goes back to the flusher through "Retry"."""

    list_display = ["identifier", "status", "event_name", "value", "timestamp", "customer_id",
                    "attempts", "next_attempt_at", "sent_at", "last_error"]  # fmt: skip
    # A row per usage record: the list reads one page along the index on `timestamp`, and
    # offers the meters' event names to filter on; no date hierarchy (the `timestamp` filter
    # narrows by date), count of every row, second count or facet counts, as for usage records.
    list_filter = [
        "status",
        ("event_name", values_filter(_meters_event_names)),
        "timestamp",
    ]
    search_fields = ["identifier", "customer_id"]
    actions = ["retry"]
    count_estimated = True
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def has_manage_permission(self, request):
        return request.user.has_perm("billing.change_meterevent")

    @admin.action(
        description="Retry (dead rows: checked against Stripe first)", permissions=["manage"]
    )
    def retry(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            lambda row: meter_events.meter_event_retry(actor=staff_actor(request), meter_event=row),
            "Queued again",
        )


@admin.register(StripeEvent)
class StripeEventAdmin(ServiceOwnedAdmin):
    list_display = ["event_id", "type", "created", "received_at", "processed_at", "error"]
    list_columns = ("event_id", "type", "created", "received_at", "processed_at", "error")
    list_filter = ["type", "processed_at"]
    search_fields = ["event_id", "type"]
    date_hierarchy = "created"


def _details_retry(modeladmin, request, queryset) -> None:
    """Send each selected row's tenant's details (or name) to Stripe again now."""
    actor = staff_actor(request)
    run_action(
        modeladmin,
        request,
        queryset.select_related("tenant"),
        lambda row: stripe_sync.billing_details_retry(actor=actor, tenant=row.tenant),
        "Sent to Stripe again",
    )


def _push_state(pending: bool, error: str, next_attempt_at) -> str:
    """Whether Stripe's customer holds what the tenant is billed under, in words."""
    if not pending:
        return "Up to date"
    if error and next_attempt_at is None:
        return f"Refused: {error}"
    if error:
        return f"Could not be reached, tried again at {next_attempt_at:%Y-%m-%d %H:%M} UTC"
    return "Due"


@admin.register(BillingProfile)
class BillingProfileAdmin(ServiceOwnedAdmin):
    """Organizations' billing details, as their billing members set them on the portal; and
    whether Stripe's customer holds them (`stripe_sync.billing_details_push`). Its action
    makes a push due now, after a refusal too (`stripe_sync.billing_details_retry`)."""

    list_display = ["tenant", "legal_name", "email", "country", "tax_id_value", "version",
                    "stripe_version", "stripe_state", "updated_at"]  # fmt: skip
    list_filter = ["country", "tax_id_type"]
    search_fields = ["legal_name", "email", "tax_id_value", "tenant__name", "tenant__slug"]
    list_select_related = ["tenant"]
    readonly_fields = [field.name for field in BillingProfile._meta.fields]
    actions = ["retry"]

    @admin.display(description="Stripe")
    def stripe_state(self, profile: BillingProfile) -> str:
        return _push_state(
            profile.stripe_pending, profile.stripe_error, profile.stripe_next_attempt_at
        )

    def has_manage_permission(self, request):
        return request.user.has_perm("billing.change_billingprofile")

    @admin.action(description="Send the details to Stripe again now", permissions=["manage"])
    def retry(self, request, queryset):
        _details_retry(self, request, queryset)


@admin.register(StripeCustomer)
class StripeCustomerAdmin(ServiceOwnedAdmin):
    """A tenant without billing details is billed under its name: `name` is the one Stripe's
    customer holds. Its action makes a push due now, after a refusal too
    (`stripe_sync.billing_details_retry`)."""

    list_display = ["tenant", "customer_id", "name", "name_state", "created_at"]
    search_fields = ["customer_id", "tenant__name", "tenant__slug"]
    list_select_related = ["tenant", "tenant__billing_profile"]
    actions = ["retry"]

    @admin.display(description="Stripe holds its name")
    def name_state(self, customer: StripeCustomer) -> str:
        if hasattr(customer.tenant, "billing_profile"):
            return "Billed under its billing details"
        return _push_state(
            customer.name != customer.tenant.name,
            customer.name_error,
            customer.name_next_attempt_at,
        )

    def has_manage_permission(self, request):
        return request.user.has_perm("billing.change_stripecustomer")

    @admin.action(description="Send the details to Stripe again now", permissions=["manage"])
    def retry(self, request, queryset):
        _details_retry(self, request, queryset)


@admin.register(StripeMeter)
class StripeMeterAdmin(ServiceOwnedAdmin):
    """Written by `manage.py stripe_sync_catalog`."""

    list_display = ["plan", "dimension", "event_name", "meter_id", "created_at"]
    list_select_related = ["plan"]


@admin.register(StripePrice)
class StripePriceAdmin(ServiceOwnedAdmin):
    """Written by `manage.py stripe_sync_catalog`."""

    list_display = ["lookup_key", "price", "stripe_price_id", "stripe_product_id",
                    "unit_amount_decimal"]  # fmt: skip
    list_select_related = ["price__plan"]
