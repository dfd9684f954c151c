"""What usage costs: a plan's prices applied to quantities. Billing owns prices; the caller
(deployments' metering) owns the quantities and passes them as plain Decimals.

Rounding: every amount is computed exactly in Decimal, then rounded half up once, when it is
returned — per-hour amounts to 4 decimal places (a GiB of storage costs a fraction of a cent an
hour), per-month amounts and amounts for a span of hours to 2 (cents). A total is rounded from
the exact sum of its lines, so it may differ by one last digit from the sum of rounded lines.
A `month` price is for 730 hours (`HOURS_PER_MONTH`), everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from billing.models import DIMENSION_LABELS, Plan, Price

HOURS_PER_MONTH = Decimal(730)
HOURLY_PLACES = Decimal("0.0001")
CENTS = Decimal("0.01")


def _hourly(amount: Decimal) -> Decimal:
    return amount.quantize(HOURLY_PLACES, rounding=ROUND_HALF_UP)


def _cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENTS, rounding=ROUND_HALF_UP)


def unit_price_per_hour(price: Price) -> Decimal:
    """The exact price of one unit for one hour (a monthly price spread over 730 h)."""
    if price.time_unit == Price.TimeUnit.MONTH:
        return price.unit_price / HOURS_PER_MONTH
    return price.unit_price


@dataclass(frozen=True)
class CostLine:
    """One priced dimension: its quantity, unit price, and what it costs."""

    dimension: str
    unit: str
    quantity: Decimal
    unit_price: Decimal
    time_unit: str
    per_hour: Decimal
    per_month: Decimal
    amount: Decimal  # for the hours asked about

    @property
    def label(self) -> str:
        return DIMENSION_LABELS.get(self.dimension, self.dimension)


@dataclass(frozen=True)
class Cost:
    """The cost of some quantities on a plan, per dimension and in total."""

    currency: str
    hours: Decimal
    lines: list[CostLine]
    per_hour: Decimal
    per_month: Decimal
    amount: Decimal  # for `hours`


def cost(plan: Plan, quantities: dict[str, Decimal], hours: Decimal | int = 1) -> Cost:
    """Price `quantities` (per dimension, e.g. {"cpu": Decimal(2)}) on `plan` for `hours`.

    Only dimensions the plan prices count; a quantity the plan does not price is free, and a
    price whose dimension has no quantity costs nothing. Lines come in the plan's price order.
    """
    hours = Decimal(hours)
    lines = []
    exact_hourly = Decimal(0)
    currency = "usd"
    for price in plan.prices.all():
        currency = price.currency
        if price.dimension not in quantities:
            continue
        quantity = Decimal(quantities[price.dimension])
        hourly = quantity * unit_price_per_hour(price)
        exact_hourly += hourly
        lines.append(
            CostLine(
                dimension=price.dimension,
                unit=price.unit,
                quantity=quantity,
                unit_price=price.unit_price,
                time_unit=price.time_unit,
                per_hour=_hourly(hourly),
                per_month=_cents(hourly * HOURS_PER_MONTH),
                amount=_cents(hourly * hours),
            )
        )
    return Cost(
        currency=currency,
        hours=hours,
        lines=lines,
        per_hour=_hourly(exact_hourly),
        per_month=_cents(exact_hourly * HOURS_PER_MONTH),
        amount=_cents(exact_hourly * hours),
    )
