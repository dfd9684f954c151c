"""How much of each pricing dimension an instance uses: the spec's `x-opsdeck.usage` rules
applied to its parameter values. Deployments owns quantities, billing owns prices
(`billing.pricing.cost`); the estimate on the create form and metering use the same pair.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from billing import pricing
from billing.models import Plan
from billing.pricing import Cost
from deployments import selectors
from deployments.models import PlanVersion
from deployments.spec.model import PlanSpec
from deployments.workflow.evaluator import ProgramError, ProgramLimitError, evaluate_cel

# Quantities come from CEL doubles: 0.1 * 3 is 0.30000000000000004, which is 0.3 here.
_PLACES = Decimal("0.000001")
_MAX = Decimal(10) ** 15  # far beyond any real quantity; keeps the arithmetic exact


class UsageError(ValueError):
    """A usage rule that cannot give a quantity for these values; one readable sentence."""


def quantities(plan: PlanVersion | PlanSpec, parameters: dict[str, Any]) -> dict[str, Decimal]:
    """The quantity of every dimension the plan's usage rules measure, for typed parameter
    values (as `validate_parameters` returns them). A `base` dimension without a rule counts
    one per instance. Raises UsageError when a rule fails, exceeds a bound of the evaluator or
    gives something other than a number of at least 0."""
    spec = _spec(plan)
    secret = {p.key for p in spec.main.parameters if p.type == "Password"}
    values = {key: value for key, value in parameters.items() if key not in secret}
    result: dict[str, Decimal] = {}
    for dimension, expression in spec.usage_rules.items():
        result[dimension] = _quantity(dimension, expression, values)
    if "base" not in result:
        result["base"] = Decimal(1)
    return result


def _quantity(dimension: str, expression: str, values: dict[str, Any]) -> Decimal:
    try:
        value = evaluate_cel(expression, "var", values).value
    except ProgramLimitError as exc:
        raise UsageError(f"The usage rule for {dimension} was stopped: {exc}") from None
    except ProgramError as exc:
        raise UsageError(f"The usage rule for {dimension} failed: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"The usage rule for {dimension} does not give a number.")
    quantity = Decimal(str(value))
    if not quantity.is_finite() or quantity < 0 or quantity >= _MAX:
        raise UsageError(f"The usage rule for {dimension} gives {value}, not a quantity.")
    quantity = quantity.quantize(_PLACES)
    # Written plainly: 10, 1.5 (never 10.000000 or 1E+1).
    return (
        quantity.quantize(1) if quantity == quantity.to_integral_value() else quantity.normalize()
    )


def _spec(plan: PlanVersion | PlanSpec) -> PlanSpec:
    return plan if isinstance(plan, PlanSpec) else selectors.plan_spec(plan)


def estimate(plan: Plan, version: PlanVersion | PlanSpec, parameters: dict[str, Any]) -> Cost:
    """What an instance of `plan` with these typed parameter values costs per hour and per
    month, per dimension and in total. Raises UsageError as `quantities` does."""
    return pricing.cost(plan, quantities(version, parameters))
