from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from accounts.admin import ServiceOwnedAdmin, _run, _staff
from accounts.errors import ActionDenied
from billing import entitlements, periods, services
from billing.models import Plan, PlanOverride, Price, Subscription


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


@admin.register(Subscription)
class SubscriptionAdmin(ServiceOwnedAdmin):
    """Subscriptions change only through the actions below (each calls a billing service,
    which audits it and emails the tenant)."""

    list_display = ["tenant", "plan", "status", "created_at", "past_due_since", "suspended_at"]
    list_filter = ["status", "plan"]
    search_fields = ["tenant__name", "tenant__slug", "plan__key"]
    actions = ["approve", "suspend", "reactivate", "cancel"]

    @admin.action(description="Approve the selected subscriptions")
    def approve(self, request, queryset):
        _run(
            self,
            request,
            queryset,
            lambda s: services.subscription_approve(actor=_staff(request), subscription=s),
            "Approved",
        )

    @admin.action(description="Suspend the selected subscriptions")
    def suspend(self, request, queryset):
        _run(
            self,
            request,
            queryset,
            lambda s: services.subscription_suspend(
                actor=_staff(request), subscription=s, reason="suspended by staff"
            ),
            "Suspended",
        )

    @admin.action(description="Reactivate the selected subscriptions")
    def reactivate(self, request, queryset):
        _run(
            self,
            request,
            queryset,
            lambda s: services.subscription_reactivate(actor=_staff(request), subscription=s),
            "Reactivated",
        )

    @admin.action(description="Cancel the selected subscriptions")
    def cancel(self, request, queryset):
        def call(subscription):
            usage = entitlements.usage_of(subscription.tenant, subscription.plan)
            services.subscription_cancel(
                actor=_staff(request),
                subscription=subscription,
                running_instances=usage.instances if usage else 0,
            )

        _run(self, request, queryset, call, "Cancelled")


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
        try:
            services.plan_override_validate(
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
                saved = services.plan_override_update(actor=_staff(request), override=obj, **values)
            else:
                saved = services.plan_override_create(
                    actor=_staff(request), tenant=data["tenant"], plan=data["plan"], **values
                )
        except (ActionDenied, ValidationError) as exc:
            reason = exc.reason if isinstance(exc, ActionDenied) else "; ".join(exc.messages)
            self.message_user(request, reason, messages.ERROR)
            return
        obj.pk = saved.pk
