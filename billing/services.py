"""Writes for billing. Callers pass plain values; billing never imports deployments."""

from django.db import transaction
from django.utils import timezone

from billing.models import Plan


@transaction.atomic
def plan_upsert(
    *, key: str, name: str, service: str, description: str = "", limits: dict | None = None
) -> tuple[Plan, bool]:
    """Create the plan `key`, or update it; returns (plan, whether anything changed)."""
    values = {
        "name": name,
        "service": service,
        "description": description,
        "limits": limits or {},
    }
    plan = Plan.objects.select_for_update().filter(key=key).first()
    if plan is None:
        plan = Plan(key=key, **values)
        plan.full_clean()
        plan.save()
        return plan, True
    changed = {field: value for field, value in values.items() if getattr(plan, field) != value}
    if not changed:
        return plan, False
    for field, value in changed.items():
        setattr(plan, field, value)
    plan.updated_at = timezone.now()
    plan.full_clean()
    plan.save()
    return plan, True
