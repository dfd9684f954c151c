"""Usage records: what each instance used, per dimension and UTC hour, and which hours are
metered. Deployments' metering works the quantities out and hands them over as plain rows;
billing never imports deployments.

Each hour is recorded once: one row per (instance, plan, dimension, hour), inserted with ON
CONFLICT DO NOTHING, so metering an hour again changes nothing. A row is billed in its hour's
month, unless that billing period was already closed when the hour was metered: then it goes
to the first open period after it, marked as an adjustment.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from billing import pricing
from billing.models import BillingPeriod, MeteredHour, Plan, UsageRecord

HOUR = timedelta(hours=1)


class UsageRow(NamedTuple):
    """One instance's use of one dimension during one hour, in unit-hours."""

    tenant_id: int
    plan_id: int
    instance_id: str
    instance_name: str
    dimension: str
    unit: str
    quantity: Decimal


@dataclass(frozen=True)
class Recorded:
    hour: datetime
    instances: int
    rows: int  # rows handed over
    inserted: int  # rows new in the table (0 when the hour was metered before)
    period: str
    adjustment: bool


def hour_start(moment: datetime) -> datetime:
    """The start of the UTC hour `moment` falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def is_hour_start(moment: datetime) -> bool:
    return moment.tzinfo is not None and hour_start(moment) == moment


def period_key(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m")


def period_bounds(key: str) -> tuple[datetime, datetime]:
    """The first hour of the period `key` ("YYYY-MM") and the first hour after it."""
    start = datetime.strptime(key, "%Y-%m").replace(tzinfo=UTC)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def billing_period_for(hour: datetime) -> tuple[str, bool]:
    """The period an hour metered now is billed in, and whether that is an adjustment (its own
    period is closed, so it goes to the first open one after it).

    Call it in the transaction that records the rows: it makes the period's row if there is
    none and locks it until that transaction ends, so closing the period (an UPDATE of its
    row) waits for the rows being recorded, and a record made after the close sees it closed.
    """
    key = period_key(hour)
    while True:
        BillingPeriod.objects.bulk_create([BillingPeriod(key=key)], ignore_conflicts=True)
        period = BillingPeriod.objects.select_for_update(no_key=True).get(key=key)
        if period.closed_at is None:
            return key, key != period_key(hour)
        key = period_key(period_bounds(key)[1])


# The rows arrive through COPY into a scratch table and go in with one INSERT … SELECT … ON
# CONFLICT DO NOTHING: for tens of thousands of rows an hour, a Django model per row costs
# several times what the database does with them.
_SCRATCH = """
CREATE TEMPORARY TABLE billing_usage_incoming (
    tenant_id bigint, plan_id bigint, instance_id text, instance_name text, dimension text,
    unit text, quantity numeric
) ON COMMIT DROP
"""
_COPY = """
COPY billing_usage_incoming
    (tenant_id, plan_id, instance_id, instance_name, dimension, unit, quantity) FROM STDIN
"""
_INSERT = """
INSERT INTO billing_usagerecord
    (tenant_id, plan_id, instance_id, instance_name, dimension, unit, quantity, hour, period,
     adjustment, recorded_at)
SELECT tenant_id, plan_id, instance_id, instance_name, dimension, unit, quantity, %s, %s, %s, %s
FROM billing_usage_incoming
ON CONFLICT (instance_id, plan_id, dimension, hour) DO NOTHING
"""


@transaction.atomic
def record(hour: datetime, rows: Iterable[UsageRow], *, instances: int | None = None) -> Recorded:
    """Store the usage of `hour` (the start of a UTC hour) and mark the hour metered, in one
    transaction. Rows already recorded for the same (instance, plan, dimension, hour) are left
    as they are. `instances`: how many instances were metered (default: those in `rows`)."""
    if not is_hour_start(hour):
        raise ValueError(f"{hour} is not the start of an hour.")
    rows = list(rows)
    period, adjustment = billing_period_for(hour)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(_SCRATCH)
        with cursor.cursor.copy(_COPY) as copy:
            for row in rows:
                copy.write_row(row)  # the columns in UsageRow's order
        cursor.execute(_INSERT, [hour, period, adjustment, now])
        inserted = cursor.rowcount
        cursor.execute("DROP TABLE billing_usage_incoming")
    count = len({row.instance_id for row in rows}) if instances is None else instances
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=hour, instances=count, recorded_at=now)], ignore_conflicts=True
    )
    return Recorded(hour, count, len(rows), inserted, period, adjustment)


def record_none(hours: list[datetime]) -> list[Recorded]:
    """Mark `hours` metered that no instance existed in (nothing to store), in one statement:
    their month can close."""
    now = timezone.now()
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=hour, instances=0, recorded_at=now) for hour in hours],
        ignore_conflicts=True,
    )
    return [Recorded(hour, 0, 0, 0, period_key(hour), False) for hour in hours]


def last_metered_hour() -> datetime | None:
    return MeteredHour.objects.order_by("-hour").values_list("hour", flat=True).first()


def unmetered_hours(start: datetime, end: datetime) -> list[datetime]:
    """The hours from `start` up to (not including) `end` that metering has not covered."""
    first = hour_start(start)
    if first < start:
        first += HOUR
    metered = set(
        MeteredHour.objects.filter(hour__gte=first, hour__lt=end).values_list("hour", flat=True)
    )
    hours, hour = [], first
    while hour < end:
        if hour not in metered:
            hours.append(hour)
        hour += HOUR
    return hours


# Where billing reads when tenants' deleted instances ran: deployments registers it (billing
# never imports deployments), called as `source(tenant_ids, plans, since)` and answering with
# the (tenant id, created, deleted) of each of those tenants' instances of `plans` deleted after
# `since` (any, when None). None until it has.
Lives = Callable[..., list[tuple[int, datetime, datetime]]]
_lives_source: Lives | None = None


def lives_source_register(source: Lives) -> None:
    """Name the function that tells billing when tenants' deleted instances ran."""
    global _lives_source
    _lives_source = source


def unmetered_use(tenant_ids: list[int], plans: QuerySet[Plan]) -> dict[int, datetime]:
    """By tenant id, the last hour not metered yet that one of the tenant's deleted instances
    of `plans` was alive in (its usage is recorded, and billed, once it is: an hour is metered
    after it ends); a tenant left out when metering has covered every hour of them. In a
    constant number of queries, however many tenants."""
    since = _unmetered_from()
    lives = _lives_source(tenant_ids, plans, since) if _lives_source is not None else []
    if not lives:
        return {}
    first = hour_start(min(created for _, created, _ in lives))
    hours = unmetered_hours(
        first if since is None else max(first, since),
        hour_start(max(deleted for _, _, deleted in lives)) + HOUR,
    )
    last: dict[int, datetime] = {}
    for tenant_id, created, deleted in lives:
        alive = [hour for hour in hours if created < hour + HOUR and hour < deleted]
        if alive and (tenant_id not in last or last[tenant_id] < alive[-1]):
            last[tenant_id] = alive[-1]
    return last


def _unmetered_from() -> datetime | None:
    """The start of the first month that may hold an hour not metered yet: the first one not
    closed from the month metering began in (a month closes once each of its hours is metered).
    None before any hour is metered."""
    first = MeteredHour.objects.order_by("hour").values_list("hour", flat=True).first()
    if first is None:
        return None
    closed = set(
        BillingPeriod.objects.filter(closed_at__isnull=False).values_list("key", flat=True)
    )
    key = period_key(first)
    while key in closed:
        key = period_key(period_bounds(key)[1])
    return period_bounds(key)[0]


def hour_cost(hour: datetime) -> dict[str, Decimal]:
    """What the usage recorded for `hour` costs, per currency, to 4 decimal places: each
    tenant's at the prices it pays then (`pricing.PriceBook`: its plan's, or its override's), as
    its invoice will (a dimension a plan does not price is free)."""
    records = UsageRecord.objects.filter(hour=hour)
    plans = {
        plan.pk: plan
        for plan in Plan.objects.filter(pk__in=records.values("plan_id")).prefetch_related("prices")
    }
    book = pricing.PriceBook(plans, hour, hour + HOUR)
    exact: dict[str, Decimal] = defaultdict(Decimal)
    for row in (
        records.annotate(span=book.span())
        .values("tenant_id", "plan_id", "dimension", "span")
        .annotate(total=Sum("quantity"))
        .order_by()
    ):
        priced = book.per_hour(row["tenant_id"], row["plan_id"], row["span"], row["dimension"])
        if priced is not None:
            unit_price, currency = priced
            exact[currency] += row["total"] * unit_price
    return {currency: pricing.hourly(amount) for currency, amount in exact.items()}


def period_close_check(key: str) -> list[datetime]:
    """The hours of the period `key` ("YYYY-MM") still unmetered: a period may be closed only
    when this is empty (so never before it has ended)."""
    return unmetered_hours(*period_bounds(key))
