"""Writes for billing. Callers pass plain values; billing never imports deployments."""

from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from billing.models import Plan, Price


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


@transaction.atomic
def plan_prices_replace(*, plan: Plan, currency: str, prices: list[dict]) -> bool:
    """Make `plan`'s prices exactly `prices` (each `{dimension, unit, time_unit, unit_price}`,
    in `currency`); returns whether anything changed."""
    wanted = {
        item["dimension"]: Price(
            plan=plan,
            dimension=item["dimension"],
            unit=item.get("unit", ""),
            time_unit=item.get("time_unit", Price.TimeUnit.HOUR),
            unit_price=Decimal(item["unit_price"]),
            currency=currency,
        )
        for item in prices
    }

    def shape(price: Price) -> tuple:
        return (price.dimension, price.unit, price.time_unit, price.unit_price, price.currency)

    current = {price.dimension: price for price in plan.prices.select_for_update()}
    if {shape(p) for p in current.values()} == {shape(p) for p in wanted.values()}:
        return False
    plan.prices.all().delete()
    for price in wanted.values():
        price.full_clean()
    Price.objects.bulk_create(wanted.values())
    return True
