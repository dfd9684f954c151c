"""What usage costs: a plan's prices applied to quantities. Billing owns prices; the caller
(deployments' metering) owns the quantities and passes them as plain Decimals.

Rounding: every amount is computed exactly in Decimal, then rounded half up once, when it is
returned — per-hour amounts to 4 decimal places (a GiB of storage costs a fraction of a cent an
hour), per-month amounts and amounts for a span of hours to 2 (cents). A total is rounded from
the exact sum of its lines, so it may differ by one last digit from the sum of rounded lines.
A `month` price is for 730 hours (`HOURS_PER_MONTH`), everywhere.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Case, IntegerField, Min, Value, When
from django.utils import timezone

from accounts.models import Tenant
from billing.models import DIMENSION_LABELS, PastPrice, Plan, PlanOverride, Price
from billing.stripe_gateway import stripe_bills

HOURS_PER_MONTH = Decimal(730)
HOURLY_PLACES = Decimal("0.0001")
CENTS = Decimal("0.01")


def hourly(amount: Decimal) -> Decimal:
    """An amount per hour, rounded half up to 4 decimal places."""
    return amount.quantize(HOURLY_PLACES, rounding=ROUND_HALF_UP)


# Stripe's zero-decimal currencies: amounts in them have no minor unit.
ZERO_DECIMAL_CURRENCIES = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga"}
    | {"pyg", "rwf", "ugx", "vnd", "vuv", "xaf", "xof", "xpf"}
)


# Stripe's three-decimal currencies: amounts in them are in thousandths (1.500 KWD is 1500).
THREE_DECIMAL_CURRENCIES = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})
THOUSANDTHS = Decimal("0.001")


def minor_unit(currency: str) -> Decimal:
    """The smallest amount of `currency` an invoice shows, as Stripe counts its amounts: 0.01;
    1 for yen and the like; 0.001 for the Kuwaiti dinar and the like."""
    code = currency.lower()
    if code in ZERO_DECIMAL_CURRENCIES:
        return Decimal(1)
    return THOUSANDTHS if code in THREE_DECIMAL_CURRENCIES else CENTS


def rounded(amount: Decimal, currency: str) -> Decimal:
    """`amount` rounded half up to the currency's minor unit (what an invoice line shows)."""
    return amount.quantize(minor_unit(currency), rounding=ROUND_HALF_UP)


# Stripe's metered prices charge per millionth of a unit-hour (meter events carry whole
# millionths), in the currency's minor unit, to 12 decimal places.
MICRO = Decimal(1_000_000)
STRIPE_PLACES = Decimal("1e-12")


def stripe_unit_amount(per_hour: Decimal, currency: str) -> Decimal:
    """The `unit_amount_decimal` of the Stripe price charging `per_hour` for a unit-hour: per
    meter unit, in the minor unit, rounded half up to Stripe's 12 places. The rounding is at
    most half a minor unit per million unit-hours (3 cents on 10 TiB kept a month at $0.10 a
    GiB-month)."""
    exact = per_hour / MICRO / minor_unit(currency)
    return exact.quantize(STRIPE_PLACES, rounding=ROUND_HALF_UP).normalize()


def stripe_hourly(unit_amount: Decimal, currency: str) -> Decimal:
    """What a Stripe price of `unit_amount` per meter unit charges for a unit-hour."""
    return unit_amount * MICRO * minor_unit(currency)


def stripe_per_hour(per_hour: Decimal, currency: str) -> Decimal:
    """What Stripe charges for a unit-hour priced `per_hour` (`stripe_unit_amount`): what the
    portal shows of the usage Stripe bills, so that it says what Stripe's invoice will."""
    return stripe_hourly(stripe_unit_amount(per_hour, currency), currency)


def unit_price_per_hour(price: Price | PastPrice) -> Decimal:
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

    @property
    def quantity_shown(self) -> str:
        """The quantity with its unit: "2 cores", "0 cores", "0.5 core", "8 GiB" (a unit
        written as a lowercase word takes an s for none or more than one, unless it ends in
        one already; a symbol never does)."""
        unit = self.unit
        plural = self.quantity > 1 or self.quantity == 0
        if unit.isalpha() and unit.islower() and plural and not unit.endswith("s"):
            unit += "s"
        return f"{self.quantity.normalize():f} {unit}".strip()


@dataclass(frozen=True)
class Cost:
    """The cost of some quantities on a plan, per dimension and in total."""

    currency: str
    hours: Decimal
    lines: list[CostLine]
    per_hour: Decimal
    per_month: Decimal
    amount: Decimal  # for `hours`


def in_effect(plans: Iterable[Plan], at: datetime) -> dict[int, dict[str, Price | PastPrice]]:
    """Each plan's own price of each dimension in effect at `at`, by plan id and dimension: the
    `PastPrice` a change keeps until after `at`, else the plan's `Price`; a dimension free then
    (priced only from later on, or not at all) is left out. The plans' prices are read as
    prefetched; one query for the kept prices of them all."""
    by_pk = {plan.pk: plan for plan in plans}
    kept: dict[tuple[int, str], PastPrice] = {}
    for past in PastPrice.objects.filter(plan_id__in=by_pk, until__gt=at).order_by("until", "pk"):
        kept.setdefault((past.plan_id, past.dimension), past)  # the first to end holds then
    found: dict[int, dict[str, Price | PastPrice]] = {}
    for pk, plan in by_pk.items():
        own = {price.dimension: price for price in plan.prices.all()}
        dimensions = own.keys() | {dimension for plan_id, dimension in kept if plan_id == pk}
        found[pk] = {}
        for dimension in sorted(dimensions):
            price = kept.get((pk, dimension), own.get(dimension))
            if price is not None and price.unit_price is not None:
                found[pk][dimension] = price
    return found


def paid_at_checkout(plans: Iterable[Plan]) -> set[int]:
    """The ids of the `plans` a subscription to which waits for payment on Stripe's checkout
    (`Plan.paid_at_checkout`); their prices are read as prefetched."""
    if not stripe_bills():
        return set()
    return {pk for pk, prices in in_effect(plans, timezone.now()).items() if prices}


def prices_at(plans: Iterable[Plan], at: datetime) -> dict[int, list[Price]]:
    """Each plan's own prices in effect at `at` (`in_effect`), by plan id, in dimension order,
    as `Price`s: a kept one is an unsaved copy, with the unit its plan gives the dimension
    when the kept row has none."""
    by_pk = {plan.pk: plan for plan in plans}
    found = {}
    for pk, prices in in_effect(by_pk.values(), at).items():
        plan = by_pk[pk]
        units = {price.dimension: price.unit for price in plan.prices.all()}
        found[pk] = [
            price
            if isinstance(price, Price)
            else Price(
                plan=plan,
                dimension=price.dimension,
                unit=price.unit or units.get(price.dimension, ""),
                time_unit=price.time_unit,
                unit_price=price.unit_price,
                currency=price.currency,
            )
            for price in prices.values()
        ]
    return found


def prices_for(
    tenant: Tenant, plans: Iterable[Plan], at: datetime | None = None
) -> dict[int, list[Price]]:
    """Each plan's prices as `tenant` pays them at `at` (now), by plan id: the plan's in effect
    then (`prices_at`: a change waiting for the next billing period is not yet), with the unit
    prices of the tenant's `PlanOverride` in effect then put in their place, read by the
    `PriceBook` invoices are priced with. The prices with an overridden unit price are copies,
    never saved. One query for the overrides of all the plans.

    While Stripe bills tenants, the plan's own: Stripe charges its catalog's prices, which hold
    none of an organization's (an override's prices, which can be set only while billing is
    local, still price the usage billed locally, before)."""
    by_pk = {plan.pk: plan for plan in plans}
    at = at or timezone.now()
    own = prices_at(by_pk.values(), at)
    if stripe_bills():
        return own
    # The span that starts at `at`: the overrides started by then (`PriceBook`'s span 0).
    book = PriceBook(by_pk, at, at + timedelta(microseconds=1), tenant_ids=[tenant.pk])
    found = {}
    for pk, prices in own.items():
        paid = []
        for price in prices:
            unit_price = book.unit_price(tenant.pk, pk, 0, price.dimension)
            if unit_price != price.unit_price:
                price = copy.copy(price)
                price.unit_price = unit_price
            paid.append(price)
        found[pk] = paid
    return found


@dataclass(frozen=True)
class PriceLine:
    """One dimension's unit price as a tenant reads it: the price in effect now (None: not
    charged yet) and, when a change to it is coming, the price then (None: no longer charged)."""

    dimension: str
    now: Price | None
    changes: bool = False
    then: Price | None = None

    @property
    def label(self) -> str:
        return DIMENSION_LABELS.get(self.dimension, self.dimension)


@dataclass(frozen=True)
class PriceList:
    """A plan's unit prices as a tenant reads them before it pays (`price_lists`), and when the
    change coming to some of them applies (None when none is coming)."""

    lines: list[PriceLine]
    changes_at: datetime | None = None

    def __bool__(self) -> bool:
        return bool(self.lines)


def _charges(price: Price) -> tuple:
    return (price.unit, price.time_unit, price.unit_price, price.currency.lower())


def price_lists(
    tenant: Tenant, plans: Iterable[Plan], at: datetime | None = None
) -> dict[int, PriceList]:
    """Each plan's unit prices as `tenant` pays them at `at` (now: `prices_for`), by plan id,
    in dimension order, each with the change coming to it: a changed price applies from the
    start of a billing period, so until then the Billing page and the catalog show the price in
    effect, and the one to come with the date it applies from."""
    by_pk = {plan.pk: plan for plan in plans}
    at = at or timezone.now()
    now = prices_for(tenant, by_pk.values(), at)
    coming = dict(
        PastPrice.objects.filter(plan_id__in=by_pk, until__gt=at)
        .values("plan_id")
        .annotate(first=Min("until"))
        .values_list("plan_id", "first")
    )
    later: dict[int, list[Price]] = {}
    for moment in set(coming.values()):
        later |= prices_for(tenant, [by_pk[pk] for pk in coming if coming[pk] == moment], moment)
    found = {}
    for pk in by_pk:
        before = {price.dimension: price for price in now[pk]}
        after = {price.dimension: price for price in later.get(pk, now[pk])}
        lines = []
        for dimension in sorted(before.keys() | after.keys()):
            was, will = before.get(dimension), after.get(dimension)
            if was is not None and will is not None and _charges(was) == _charges(will):
                lines.append(PriceLine(dimension, was))
            else:
                lines.append(PriceLine(dimension, was, True, will))
        changing = any(line.changes for line in lines)
        found[pk] = PriceList(lines, coming[pk] if changing else None)
    return found


def cost(
    plan: Plan,
    quantities: dict[str, Decimal],
    hours: Decimal | int = 1,
    *,
    prices: list[Price] | None = None,
) -> Cost:
    """Price `quantities` (per dimension, e.g. {"cpu": Decimal(2)}) on `plan` for `hours`, at
    `prices` (a tenant's, `prices_for`; the plan's list prices when not given).

    Only dimensions the plan prices count; a quantity the plan does not price is free, and a
    price whose dimension has no quantity costs nothing. Lines come in the plan's price order.
    """
    hours = Decimal(hours)
    lines = []
    exact_hourly = Decimal(0)
    currency = "usd"
    for price in plan.prices.all() if prices is None else prices:
        currency = price.currency
        if price.dimension not in quantities:
            continue
        quantity = Decimal(quantities[price.dimension])
        line_hourly = quantity * unit_price_per_hour(price)
        exact_hourly += line_hourly
        lines.append(
            CostLine(
                dimension=price.dimension,
                unit=price.unit,
                quantity=quantity,
                unit_price=price.unit_price,
                time_unit=price.time_unit,
                per_hour=hourly(line_hourly),
                per_month=rounded(line_hourly * HOURS_PER_MONTH, price.currency),
                amount=rounded(line_hourly * hours, price.currency),
            )
        )
    return Cost(
        currency=currency,
        hours=hours,
        lines=lines,
        per_hour=hourly(exact_hourly),
        per_month=rounded(exact_hourly * HOURS_PER_MONTH, currency),
        amount=rounded(exact_hourly * hours, currency),
    )


class PriceBook:
    """What a unit-hour of each dimension costs on some plans over a span of time: the plan's
    prices as they were at each hour (`PastPrice`), and a tenant's `PlanOverride` prices from
    the hour they take effect (the override in effect at an hour is the latest started by
    then, as for limits). Invoices and the cost reports price usage records through it, in
    SQL-grouped spans:

        book = PriceBook(plans, start, end)
        rows = records.annotate(span=book.span()).values(..., "span").annotate(Sum("quantity"))
        book.per_hour(tenant_id, plan_id, span, dimension)  # (price of a unit-hour, currency)
    """

    @classmethod
    def for_records(cls, plans: dict[int, Plan], records, start, end, tenant_ids=None):
        """The book that prices `records` (usage records of the period from `start` to
        `end`), from the earliest hour among them: late usage of a month before is priced as
        it was when it was used, not as it is when the period began."""
        first = records.aggregate(first=Min("hour"))["first"]
        return cls(plans, min(start, first) if first else start, end, tenant_ids)

    def __init__(self, plans: dict[int, Plan], start, end, tenant_ids=None):
        self._prices = {
            (plan.pk, price.dimension): price
            for plan in plans.values()
            for price in plan.prices.all()
        }
        # (plan, dimension) -> the prices it had before, oldest first; each until a moment.
        self._past: dict[tuple[int, str], list[PastPrice]] = {}
        changes: dict[int, set] = {}  # plan -> the moments in the span its prices changed
        for past in PastPrice.objects.filter(plan_id__in=plans, until__gt=start).order_by(
            "until", "pk"
        ):
            self._past.setdefault((past.plan_id, past.dimension), []).append(past)
            if past.until < end:
                changes.setdefault(past.plan_id, set()).add(past.until)
        overrides = PlanOverride.objects.filter(plan_id__in=plans, effective_from__lt=end)
        if tenant_ids is not None:
            overrides = overrides.filter(tenant_id__in=tenant_ids)

        def plan_spans(plan_id: int) -> list[tuple[object, dict]]:
            moments = sorted(changes.get(plan_id, ()))
            return [(moment, {}) for moment in [start, *moments]]

        # (tenant, plan) -> [(from, override prices)], oldest first, from `start`; a tenant of
        # None: the plan's own spans (its price changes), for tenants without an override.
        self._spans: dict[tuple[int | None, int], list[tuple[object, dict]]] = {
            (None, plan_id): plan_spans(plan_id) for plan_id in changes
        }
        for override in overrides.order_by("effective_from", "pk"):
            key = (override.tenant_id, override.plan_id)
            spans = self._spans.setdefault(key, plan_spans(override.plan_id))
            begins = max(override.effective_from, start)
            if all(at != begins for at, _ in spans):
                spans.append((begins, {}))
                spans.sort(key=lambda span: span[0])
            # From its start on, the override's prices, until a later override's start.
            spans[:] = [(at, override.prices if at >= begins else was) for at, was in spans]

    def span(self):
        """A SQL expression numbering the price span a usage record's hour falls in: a
        tenant's own spans first (they hold its plan's changes too), then the plan's."""
        whens = [
            When(plan_id=plan, hour__gte=starts, then=Value(index))
            if tenant is None
            else When(tenant_id=tenant, plan_id=plan, hour__gte=starts, then=Value(index))
            for (tenant, plan), spans in sorted(
                self._spans.items(), key=lambda item: item[0][0] is None
            )
            for index, (starts, _) in reversed(list(enumerate(spans)))
            if index > 0
        ]
        return Case(*whens, default=Value(0), output_field=IntegerField())

    def _at(self, tenant_id: int, plan_id: int, span: int) -> tuple[object | None, dict]:
        """When the span starts (None: the book's start) and the override prices in it."""
        spans = self._spans.get((tenant_id, plan_id)) or self._spans.get((None, plan_id))
        if not spans:
            return None, {}
        return spans[span]

    def _price(self, plan_id: int, dimension: str, at) -> Price | PastPrice | None:
        """The plan's price of `dimension` at the moment `at` (None: the book's start)."""
        for past in self._past.get((plan_id, dimension), ()):
            if at is None or past.until > at:
                return past if past.unit_price is not None else None
        return self._prices.get((plan_id, dimension))

    def _priced(
        self, tenant_id: int, plan_id: int, span: int, dimension: str, *, catalog: bool = False
    ) -> tuple[Price | PastPrice, Decimal] | None:
        """The plan's price of `dimension` in the span, and the unit price the tenant pays
        there: the override's where one sets it (unless `catalog`: the plan's, as Stripe's
        catalog charges it), else the plan's then; None when the plan did not price it
        (free)."""
        at, overrides = self._at(tenant_id, plan_id, span)
        price = self._price(plan_id, dimension, at)
        if price is None:
            return None
        overridden = None if catalog else overrides.get(dimension)
        return price, Decimal(str(overridden)) if overridden is not None else price.unit_price

    def unit_price(self, tenant_id: int, plan_id: int, span: int, dimension: str) -> Decimal | None:
        """The unit price of `dimension` in the span, in its price's time unit (`_priced`)."""
        priced = self._priced(tenant_id, plan_id, span, dimension)
        return priced[1] if priced is not None else None

    def per_hour(
        self, tenant_id: int, plan_id: int, span: int, dimension: str, *, catalog: bool = False
    ) -> tuple[Decimal, str] | None:
        """The exact price of one unit-hour of `dimension`, and its currency; None when the
        plan did not price it (free). `catalog`: at the plan's price, overrides aside."""
        priced = self._priced(tenant_id, plan_id, span, dimension, catalog=catalog)
        if priced is None:
            return None
        price, unit_price = priced
        if price.time_unit == Price.TimeUnit.MONTH:
            unit_price = unit_price / HOURS_PER_MONTH
        return unit_price, price.currency
