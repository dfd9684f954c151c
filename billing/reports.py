"""What a tenant's usage costs in a billing period, for the Billing page and the billing team's
usage explorer: cost per dimension and per instance, and a chart of daily cost by dimension.

Amounts are worked out as the invoice that bills them will be: a unit-hour's price times the
unit-hours used, rounded to the currency's minor unit per instance and dimension on Opsdeck's
invoice (`billing.invoicing`), and once per plan, dimension and price over every instance on
Stripe's, for the usage sent to its meters (Stripe rounds a metered line's total) — so the
period's cost so far is what its invoices will say if nothing else runs. Usage is read in a
constant number of aggregate queries whatever the number of instances or hours.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.db.models import Exists, Max, OuterRef, Sum
from django.db.models.functions import TruncDate, TruncMonth
from django.utils import timezone

from accounts.models import Tenant
from billing import usage
from billing.invoicing import billed_late
from billing.models import DIMENSION_LABELS, Invoice, MeterEvent, Plan, UsageRecord
from billing.pricing import PriceBook, minor_unit, rounded, stripe_per_hour


@dataclass(frozen=True)
class InstanceCost:
    instance_id: str
    name: str
    plan: str
    amount: Decimal


@dataclass
class CurrencyCost:
    """Everything of one currency (a tenant's plans normally share one)."""

    currency: str
    total: Decimal = Decimal(0)
    by_dimension: dict[str, Decimal] = field(default_factory=dict)
    by_instance: list[InstanceCost] = field(default_factory=list)
    chart: dict = field(default_factory=dict)

    @property
    def dimensions(self) -> list[tuple[str, Decimal]]:
        return [(DIMENSION_LABELS.get(d, d), amount) for d, amount in self.by_dimension.items()]


@dataclass(frozen=True)
class PeriodCost:
    period: str
    first_day: date
    last_day: date  # the period's last day (it may not have ended yet)
    currencies: list[CurrencyCost]

    @property
    def ended(self) -> bool:
        """Whether the period is over (UTC): its figures are final, not "so far"."""
        return timezone.now().date() > self.last_day


def period_cost(
    tenant: Tenant, period: str, *, plan: Plan | None = None, billed_by: str = ""
) -> PeriodCost:
    """The cost of `tenant`'s usage billed in `period` ("YYYY-MM") so far, on every plan or
    on `plan` only; with `billed_by` (an `Invoice.Source`), only the usage that side bills:
    what went to Stripe's meters, on Stripe's invoice, or the rest, on Opsdeck's — what one
    invoice covers."""
    start, end = usage.period_bounds(period)
    records = UsageRecord.objects.filter(tenant=tenant, period=period)
    if plan is not None:
        records = records.filter(plan=plan)
    # Sent to Stripe's meters, on Stripe's invoice (what its meters refused comes back here).
    on_stripe = Exists(
        MeterEvent.objects.filter(usage_record=OuterRef("pk")).exclude(
            status=MeterEvent.Status.ADJUSTED
        )
    )
    if billed_by == Invoice.Source.STRIPE:
        records = records.filter(on_stripe)
    elif billed_by == Invoice.Source.LOCAL:
        records = records.exclude(on_stripe)
    plans = Plan.objects.prefetch_related("prices").in_bulk(
        set(records.values_list("plan_id", flat=True).distinct().order_by())
    )
    book = PriceBook.for_records(plans, records, start, end, tenant_ids={tenant.pk})
    spanned = records.annotate(span=book.span(), on_stripe=on_stripe)
    per_instance = (
        spanned.annotate(late=billed_late(), used_in=TruncMonth("hour"))
        .values("plan_id", "instance_id", "dimension", "span", "on_stripe", "late", "used_in")
        .annotate(quantity=Sum("quantity"), name=Max("instance_name"))
        .order_by()
    )
    per_day = (
        spanned.annotate(day=TruncDate("hour"))
        .values("plan_id", "dimension", "day", "span", "on_stripe")
        .annotate(quantity=Sum("quantity"))
        .order_by()
    )
    # The invoices' lines, each rounded once: Opsdeck's per instance, dimension, unit price and
    # month used in when billed late (`invoicing.billed_late`); Stripe's per plan, dimension
    # and unit price, over every instance ("" in the key).
    lines: dict[tuple[str, int, str, str, Decimal, object], Decimal] = defaultdict(Decimal)
    names: dict[str, str] = {}
    # What each instance costs on each plan it was on: its lines on Opsdeck's invoice of the
    # plan, and its share of Stripe's.
    instances: dict[tuple[str, str, int], Decimal] = defaultdict(Decimal)
    shares: dict[tuple[str, str, int], Decimal] = defaultdict(Decimal)
    for row in per_instance:
        priced = _unit_hour(book, tenant.pk, row)
        if priced is None:
            continue  # a dimension the plan does not price is free
        unit_price, currency = priced
        instance_id = row["instance_id"]
        line = "" if row["on_stripe"] else instance_id
        used_in = row["used_in"] if row["late"] and not row["on_stripe"] else None
        key = (currency, row["plan_id"], line, row["dimension"], unit_price, used_in)
        lines[key] += row["quantity"]
        names[instance_id] = row["name"]
        if row["on_stripe"]:
            shares[(currency, instance_id, row["plan_id"])] += row["quantity"] * unit_price
    costs: dict[str, CurrencyCost] = {}
    for (currency, plan_id, line, dimension, unit_price, _), quantity in lines.items():
        amount = rounded(quantity * unit_price, currency)
        cost = costs.setdefault(currency, CurrencyCost(currency))
        cost.total += amount
        cost.by_dimension[dimension] = cost.by_dimension.get(dimension, 0) + amount
        if line:
            instances[(currency, line, plan_id)] += amount
    for key, share in shares.items():
        instances[key] += rounded(share, key[0])
    for (currency, instance_id, plan_id), amount in instances.items():
        item = InstanceCost(instance_id, names[instance_id], plans[plan_id].name, amount)
        costs[currency].by_instance.append(item)
    days = [start.date() + timedelta(days=n) for n in range((end - start).days)]
    daily: dict[str, dict[str, dict[date | None, Decimal]]] = defaultdict(lambda: defaultdict(dict))
    late = False
    for row in per_day:
        priced = _unit_hour(book, tenant.pk, row)
        if priced is None:
            continue
        unit_price, currency = priced
        spent = daily[currency][row["dimension"]]
        # Usage of an earlier month billed late (`invoicing.billed_late`) is a bar of its own,
        # before the period's days: it is in the totals, on no day of the period.
        day = row["day"] if row["day"] >= days[0] else EARLIER
        late = late or day is EARLIER
        spent[day] = spent.get(day, Decimal(0)) + row["quantity"] * unit_price
    columns = [EARLIER, *days] if late else days
    for currency, cost in costs.items():
        cost.by_instance.sort(key=lambda item: (-item.amount, item.name, item.plan))
        cost.by_dimension = dict(sorted(cost.by_dimension.items(), key=lambda kv: -kv[1]))
        cost.chart = daily_chart(columns, daily[currency], currency, cost.by_dimension)
    return PeriodCost(
        period=period,
        first_day=days[0],
        last_day=days[-1],
        currencies=sorted(costs.values(), key=lambda cost: -cost.total),
    )


def _unit_hour(book: PriceBook, tenant_id: int, row: dict) -> tuple[Decimal, str] | None:
    """What a unit-hour of the row's usage costs, and its currency (None: free): at the price
    the tenant pays on Opsdeck's invoice, or, sent to Stripe's meters, at its catalog's price
    as Stripe charges it (`stripe_per_hour`), which holds no override."""
    on_stripe = row["on_stripe"]
    priced = book.per_hour(
        tenant_id, row["plan_id"], row["span"], row["dimension"], catalog=on_stripe
    )
    if priced is None or not on_stripe:
        return priced
    unit_price, currency = priced
    return stripe_per_hour(unit_price, currency), currency


# The chart's column of usage billed in a period but used in an earlier month.
EARLIER = None
EARLIER_LABEL = "Used earlier"


def daily_chart(
    days: list[date | None],
    spent: dict[str, dict[date | None, Decimal]],
    currency: str,
    totals: dict[str, Decimal] | None = None,
) -> dict:
    """A stacked bar chart of cost per day and dimension, as `includes/chart.html` draws it:
    JSON-ready (amounts as numbers in the minor unit). A dimension's days add up to its total
    in `totals` (the invoice's, rounded per line: `_apportioned`); without one, each day is
    rounded by itself. A day of `EARLIER` is the column of usage of earlier months billed
    late."""
    unit = minor_unit(currency)
    amounts = {}
    for dimension, by_day in sorted(spent.items()):
        each = [by_day.get(day, Decimal(0)) for day in days]
        total = (totals or {}).get(dimension)
        amounts[dimension] = (
            [rounded(amount, currency) for amount in each]
            if total is None
            else _apportioned(each, total, unit)
        )
    labels = [EARLIER_LABEL if day is EARLIER else day.strftime("%d %b") for day in days]
    return {
        "kind": "bar",
        "stacked": True,
        "labels": labels,
        "series": [
            {
                "label": DIMENSION_LABELS.get(dimension, dimension),
                "values": [float(a) for a in each],
            }
            for dimension, each in amounts.items()
        ],
        "unit": currency.upper(),
        # The same figures as table rows, for reading without JavaScript: as amounts are written
        # (0.00, not the chart's 0.0).
        "rows": [
            [label, [str(each[n]) for each in amounts.values()]] for n, label in enumerate(labels)
        ],
    }


def _apportioned(amounts: list[Decimal], total: Decimal, unit: Decimal) -> list[Decimal]:
    """`amounts` (a dimension's cost per day, unrounded) shown in `unit`s so that they add up
    to `total`: each day's share of it, rounded down, then the units left over given to the
    days that rounding cut most (largest remainder). The invoice rounds per instance and
    dimension over the period, so rounding each day by itself could miss its total by a few
    units; a day without usage shows none."""
    spent = sum(amounts, Decimal(0))
    if not spent:
        return [Decimal(0).quantize(unit) for _ in amounts]
    shares = [amount * total / spent for amount in amounts]
    shown = [share.quantize(unit, rounding=ROUND_FLOOR) for share in shares]
    left = int((total - sum(shown, Decimal(0))) / unit)
    cut = sorted(range(len(shares)), key=lambda n: shares[n] - shown[n], reverse=True)
    for n in cut[:left]:
        shown[n] += unit
    # A share the division rounded up onto a unit's edge: that unit comes off the day that
    # rounding cut least.
    for n in [n for n in reversed(cut) if shown[n]][: max(0, -left)]:
        shown[n] -= unit
    return shown
