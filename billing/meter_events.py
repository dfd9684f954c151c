"""The Stripe meter-event outbox: each usage record becomes one `MeterEvent` row, sent by
`flush()` until Stripe holds it exactly once.

Value: whole millionths of a unit-hour (a usage record's 6 decimals, exactly), so Stripe's
sums, which its summaries report as floats, stay exact integers; the metered price charges
per millionth (`pricing.stripe_unit_amount`). Identifier: `opsdeck-usage-<usage record
id>`, stable and never reused. Timestamp: the usage record's hour.

Stripe de-duplicates identifiers over a rolling 24 hours (at least) and takes timestamps from
the past 35 days only. So:
- a row is re-sent as it is (same identifier) only within `RESEND_WINDOW` (20 h) of its first
  attempt: whatever Stripe accepted since then is still remembered and refused as a duplicate
  (which marks the row sent);
- later, and after an admin retry of a dead row, the meter's summary for that customer and hour
  is read first and the row is sent only if Stripe does not hold it (`_held`);
- a row whose hour is older than Stripe takes, or of a month whose invoices Stripe has
  finalized (`_invoiced`), becomes `adjusted`: a local adjustment line (`adjustments()`), never
  sent.
Failures back off exponentially (`BACKOFF_BASE` doubling, capped at `BACKOFF_CAP`); after
`STRIPE_METER_EVENT_MAX_ATTEMPTS` a row is parked as `dead`.

Workers claim due rows with `SELECT … FOR UPDATE SKIP LOCKED` in a short transaction that
moves their next attempt a lease ahead, then send without holding a lock: two workers never
send one row, and a worker that dies mid-batch leaves rows that come back after the lease.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce, Greatest, TruncHour
from django.utils import timezone

from accounts.audit import Actor, audit_record
from billing import usage
from billing.models import BillingPeriod, MeterEvent, StripeMeter, Subscription, UsageRecord
from billing.pricing import MICRO
from billing.stripe_gateway import StripeGateway, StripeRefused, StripeRetryable, gateway

log = logging.getLogger(__name__)

RESEND_WINDOW = timedelta(hours=20)  # Stripe remembers identifiers for at least 24 h
# Stripe refuses timestamps older than 35 days; an hour this close to the limit could cross it
# on its way there.
PAST_LIMIT = timedelta(days=35) - timedelta(minutes=10)
FINALIZATION_MARGIN = timedelta(minutes=10)  # before Stripe finalizes a month's invoices
BACKOFF_BASE = timedelta(seconds=30)
BACKOFF_CAP = timedelta(hours=1)
LEASE = timedelta(minutes=10)  # a claimed row comes back after this if its worker died
BATCH = 100
# This many transport failures in a row end a batch: Stripe is down, the rest waits unclaimed.
OUTAGE_AFTER = 3
# Beyond this many other uncertain rows in one customer-hour, the exact match is not searched.
MATCH_LIMIT = 16
HOUR = timedelta(hours=1)


def identifier_for(usage_record_id: int) -> str:
    return f"opsdeck-usage-{usage_record_id}"


def value_for(quantity: Decimal) -> str:
    """Unit-hours (6 decimals) as Stripe's value: whole millionths, a string of digits."""
    return str(int(quantity * MICRO))


# --- filling the outbox ------------------------------------------------------------------------


def _timed(hour: datetime, started: datetime | None) -> datetime:
    """When a record's meter event happened for Stripe: its hour, or for the hour its Stripe
    subscription began, that moment (an event before the subscription's start is in none of
    its periods, and Stripe bills it on no invoice)."""
    if started is not None and hour < started < hour + HOUR:
        return started
    return hour


def enqueue() -> int:
    """Add an outbox row for each usage record not yet in it whose tenant has a Stripe customer
    (from the customer's first hour on) and a Stripe subscription to its plan that bills its
    hour, and whose plan has a meter for its dimension (the record goes to that meter); how
    many were added. Nothing while Stripe is not configured. Safe to run concurrently (ON
    CONFLICT DO NOTHING).

    A record of an hour metered after its own month closed (`adjustment`) stays local too, on
    the Opsdeck invoice of the month it was metered in, as late usage.

    A record no Stripe subscription bills stays local, on the period's Opsdeck invoice: sent to
    the meter, no invoice would hold it (an instance still running after Stripe ended its
    subscription, say). So a record goes to Stripe only while the tenant's subscription to its
    plan is open, and only for hours since it was made (not the hours before a subscription
    started again, billed locally already). Every hour is metered after it ends: a record of an
    hour before a cancel, enqueued after it, stays local too (one cancelled by the tenant still
    bills until its period ends, but instances are gone before a cancel is accepted; one Stripe
    ended at once bills nothing more).
    """
    if not settings.STRIPE_API_KEY:
        return 0
    meters = {
        (plan_id, dimension): event_name
        for plan_id, dimension, event_name in StripeMeter.objects.filter(
            plan__isnull=False
        ).values_list("plan_id", "dimension", "event_name")
    }
    if not meters:
        return 0
    metered = Q()
    for plan_id, dimension in meters:
        metered |= Q(plan_id=plan_id, dimension=dimension)
    billed = (
        Subscription.objects.filter(tenant_id=OuterRef("tenant_id"), plan_id=OuterRef("plan_id"))
        .exclude(stripe_subscription_id="")
        .exclude(status=Subscription.Status.CANCELLED)
        # It billed in that hour: from when it was made, and from the start Stripe reports if
        # later (one made at the checkout's start begins once paid; one resumed holds the
        # start of the Stripe subscription it took over, older than itself).
        .alias(billing_from=Greatest("created_at", "stripe_started_at"))  # NULL is ignored
        .filter(billing_from__lt=OuterRef("hour") + HOUR)
    )
    # A record of a closed period without an outbox row is on that period's Opsdeck invoice
    # (a dimension whose meter was made after the close, say): sent now, it was billed twice.
    closed = BillingPeriod.objects.filter(key=OuterRef("period"), closed_at__isnull=False)
    records = (
        UsageRecord.objects.filter(
            metered,
            Exists(billed),
            ~Exists(closed),
            # An hour metered after its month closed is billed with the month it was metered
            # in, on Opsdeck's invoice as late usage: sent, stamped in its own month, Stripe
            # bills it on that month's invoice while it is still a draft.
            adjustment=False,
            meter_event__isnull=True,
            tenant__stripe_customer__isnull=False,
            hour__gte=TruncHour(F("tenant__stripe_customer__created_at")),
        )
        .annotate(started=Subquery(billed.values("stripe_started_at")[:1]))
        .order_by("id")
        .values_list(
            "id", "plan_id", "dimension", "hour", "quantity",
            "tenant__stripe_customer__customer_id", "started",
        )
    )  # fmt: skip
    now = timezone.now()
    added, batch = 0, []
    for record_id, plan_id, dimension, hour, quantity, customer_id, started in records.iterator(
        chunk_size=5000
    ):
        batch.append(
            MeterEvent(
                usage_record_id=record_id,
                identifier=identifier_for(record_id),
                customer_id=customer_id,
                event_name=meters[plan_id, dimension],
                value=value_for(quantity),
                timestamp=_timed(hour, started),
                next_attempt_at=now,
                created_at=now,
            )
        )
        if len(batch) == 5000:
            added += _insert(batch)
            batch = []
    return added + _insert(batch)


def _insert(rows: list[MeterEvent]) -> int:
    """Insert, skipping rows another enqueue added meanwhile; how many are new."""
    if not rows:
        return 0
    ours = MeterEvent.objects.filter(usage_record_id__in=[row.usage_record_id for row in rows])
    before = ours.count()
    MeterEvent.objects.bulk_create(rows, ignore_conflicts=True)
    return ours.count() - before


# --- sending -----------------------------------------------------------------------------------


@dataclass
class Flushed:
    """What one `flush()` did, row by row."""

    sent: int = 0
    held: int = 0  # Stripe already had it (a duplicate identifier, or found in its summaries)
    adjusted: int = 0
    retrying: int = 0
    dead: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.sent + self.held + self.adjusted + self.retrying + self.dead


def flush(now: datetime | None = None, *, gateway_: StripeGateway | None = None) -> Flushed:
    """Send every due pending row, a batch at a time, until none is due or Stripe is down."""
    gw = gateway_ or gateway()
    result = Flushed()
    if gw is None:
        return result
    now = now or timezone.now()
    meters = dict(StripeMeter.objects.values_list("event_name", "meter_id"))
    while True:
        rows = _claim(now)
        if not rows:
            return result
        if not _send_batch(gw, rows, now, meters, result):
            return result


def _claim(now: datetime) -> list[MeterEvent]:
    """Lock up to BATCH due rows (skipping those another worker holds), count an attempt on
    each and move it a lease ahead."""
    with transaction.atomic():
        rows = list(
            MeterEvent.objects.select_for_update(skip_locked=True)
            .filter(status=MeterEvent.Status.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "id")[:BATCH]
        )
        MeterEvent.objects.filter(pk__in=[row.pk for row in rows]).update(
            attempts=F("attempts") + 1,
            first_attempt_at=Coalesce("first_attempt_at", Value(now)),
            next_attempt_at=now + LEASE,
        )
    for row in rows:
        row.untried = row.first_attempt_at is None
        row.attempts += 1
        row.first_attempt_at = row.first_attempt_at or now
        row.next_attempt_at = now + LEASE
    return rows


def _send_batch(
    gw: StripeGateway,
    claimed: list[MeterEvent],
    now: datetime,
    meters: dict[str, str],
    result: Flushed,
) -> bool:
    """Send a claimed batch and store each outcome; False when Stripe looked down (the rest
    of the batch is released untried, and flushing stops for now)."""
    done, failures_in_a_row = [], 0
    for row in claimed:
        try:
            _send_one(gw, row, now, meters, result)
            failures_in_a_row = 0
        except _Mismatch as exc:
            _retry_later(row, now, str(exc), result)
        except StripeRetryable as exc:
            _retry_later(row, now, str(exc), result)
            failures_in_a_row += 1
        done.append(row)
        if failures_in_a_row >= OUTAGE_AFTER:
            break
    with transaction.atomic():
        _store(done)
        _billed_late([r.usage_record_id for r in done if r.status == MeterEvent.Status.ADJUSTED])
    untouched = claimed[len(done) :]
    if untouched:
        # As they were: due, and never tried when they had not been.
        MeterEvent.objects.filter(pk__in=[row.pk for row in untouched]).update(
            attempts=F("attempts") - 1, next_attempt_at=now
        )
        MeterEvent.objects.filter(pk__in=[row.pk for row in untouched if row.untried]).update(
            first_attempt_at=None
        )
    return not untouched and failures_in_a_row < OUTAGE_AFTER


_OUTCOME = ["status", "next_attempt_at", "check_first", "last_error", "sent_at"]


def _store(rows: list[MeterEvent]) -> None:
    """Write the outcomes: one UPDATE per distinct outcome (most of a batch shares one), of the
    rows still pending: one moved to Opsdeck's invoice while it was being sent
    (`unsent_to_local`) stays there, whatever Stripe answered."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for row in rows:
        groups[tuple(getattr(row, name) for name in _OUTCOME)].append(row.pk)
    # Every row first, in id order, as `unsent_to_local` locks them: one UPDATE per outcome,
    # in the batch's order, would take them in another and deadlock with it.
    list(MeterEvent.objects.select_for_update().filter(pk__in=[r.pk for r in rows]).order_by("pk"))
    for values, pks in groups.items():
        MeterEvent.objects.filter(pk__in=pks, status=MeterEvent.Status.PENDING).update(
            **dict(zip(_OUTCOME, values, strict=True))
        )


def _send_one(
    gw: StripeGateway, row: MeterEvent, now: datetime, meters: dict[str, str], result: Flushed
) -> None:
    """Decide and act on one claimed row; `StripeRetryable` when it must be tried again."""
    too_old = row.timestamp <= now - PAST_LIMIT
    invoiced = _invoiced(row.timestamp, now)
    try:
        # A row tried before may be in Stripe already: past the identifier window (or too late
        # to send at all, or retried by the admin) only the meter's summary can tell.
        if not row.untried and (
            too_old or invoiced or row.check_first or now - row.first_attempt_at > RESEND_WINDOW
        ):
            if _held(gw, row, meters):
                _mark(row, MeterEvent.Status.SENT, "Found in the meter's summary.", sent_at=now)
                result.held += 1
                return
            if not (too_old or invoiced):
                # Checked: from now on, Stripe's identifier window guards the re-sends.
                row.check_first = False
                row.first_attempt_at = now
                MeterEvent.objects.filter(pk=row.pk).update(check_first=False, first_attempt_at=now)
        if too_old or invoiced:
            why = "Older than Stripe takes" if too_old else "Stripe has invoiced its month"
            _mark(row, MeterEvent.Status.ADJUSTED, f"{why}: a local adjustment.")
            result.adjusted += 1
            return
        accepted = gw.meter_event_send(
            event_name=row.event_name,
            customer_id=row.customer_id,
            value=row.value,
            identifier=row.identifier,
            timestamp=int(row.timestamp.timestamp()),
            attempt=row.attempts,
        )
    except StripeRefused as exc:
        if exc.code == "timestamp_too_far_in_past":
            _mark(row, MeterEvent.Status.ADJUSTED, str(exc))
            result.adjusted += 1
        else:  # a request Stripe refuses is refused again: someone has to look at it
            _mark(row, MeterEvent.Status.DEAD, str(exc))
            result.dead += 1
        result.errors.append(f"{row.identifier}: {exc}")
        return
    _mark(row, MeterEvent.Status.SENT, "" if accepted else "Stripe already had it.", sent_at=now)
    if accepted:
        result.sent += 1
    else:
        result.held += 1


def _invoiced(timestamp: datetime, now: datetime) -> bool:
    """Whether Stripe has finalized the invoice of the month `timestamp` is in (its periods are
    calendar months): it updates its drafts with what reaches the meters until then, the
    account's finalization grace period after the month ends; usage sent later is on no
    invoice. Judged 10 minutes early, as the send may take that long to reach it."""
    month_end = usage.period_bounds(usage.period_key(timestamp))[1]
    grace = timedelta(minutes=settings.STRIPE_FINALIZATION_GRACE_MINUTES)
    return now >= month_end + max(grace - FINALIZATION_MARGIN, timedelta(0))


def _mark(row: MeterEvent, status: str, note: str, *, sent_at: datetime | None = None) -> None:
    row.status = status
    row.last_error = note
    row.sent_at = sent_at
    row.check_first = False


def _retry_later(row: MeterEvent, now: datetime, error: str, result: Flushed) -> None:
    row.last_error = error
    result.errors.append(f"{row.identifier}: {error}")
    if row.attempts >= settings.STRIPE_METER_EVENT_MAX_ATTEMPTS:
        row.status = MeterEvent.Status.DEAD
        result.dead += 1
        return
    row.next_attempt_at = now + min(BACKOFF_BASE * 2 ** (row.attempts - 1), BACKOFF_CAP)
    result.retrying += 1


# --- does Stripe already hold it? --------------------------------------------------------------


class _Mismatch(Exception):
    """Stripe's total for the customer-hour matches no combination of our rows."""


def _held(gw: StripeGateway, row: MeterEvent, meters: dict[str, str]) -> bool:
    """Whether Stripe holds this row's event, from the meter's total for its customer and hour.

    That total also counts the other rows of the same customer, meter and hour. Rows sent are
    in it; rows never attempted are not; rows attempted with no answer (timed out, dead, being
    sent by another worker) may be. The row is held when Stripe's total minus the sent rows is
    made of this row plus some of those uncertain ones, and not when it is made of uncertain
    ones only. When both are possible (equal values) it counts as held: never twice. When
    neither is, something else wrote to the meter or Stripe has not processed everything yet:
    `_Mismatch`, tried again later.
    """
    meter_id = meters.get(row.event_name)
    if meter_id is None:
        raise _Mismatch(f"No meter for {row.event_name}; run stripe_sync_catalog.")
    # The hour the event is in: Stripe sums whole minutes only, and the first hour of a
    # subscription has its event at the moment it began (`_timed`), seconds and all, from which
    # an hour's window would take in the next hour's event too.
    hour = row.timestamp.replace(minute=0, second=0, microsecond=0)
    start = int(hour.timestamp())
    total = gw.meter_total(
        meter_id=meter_id, customer_id=row.customer_id, start=start, end=start + 3600
    )
    others = MeterEvent.objects.filter(
        customer_id=row.customer_id,
        event_name=row.event_name,
        timestamp__gte=hour,
        timestamp__lt=hour + HOUR,
    ).exclude(pk=row.pk)
    sent = sum(
        int(v) for v in others.filter(status=MeterEvent.Status.SENT).values_list("value", flat=True)
    )
    uncertain = [
        int(v)
        for v in others.filter(
            status__in=[MeterEvent.Status.PENDING, MeterEvent.Status.DEAD],
            first_attempt_at__isnull=False,
        ).values_list("value", flat=True)
    ]
    unexplained = total - sent
    value = int(row.value)
    if len(uncertain) > MATCH_LIMIT:
        return unexplained >= value
    sums = {0}
    for other in uncertain:
        sums |= {s + other for s in sums}
    with_row, without_row = unexplained - value in sums, unexplained in sums
    if with_row and without_row:
        log.warning("meter event %s: Stripe's total fits with and without it", row.identifier)
    if not (with_row or without_row):
        raise _Mismatch(
            f"Stripe's total {total} for the hour fits none of our rows (sent: {sent})."
        )
    return with_row


# --- the admin's retry, and rows left to local billing -----------------------------------------


@transaction.atomic
def meter_event_retry(*, actor: Actor, meter_event: MeterEvent) -> MeterEvent:
    """Send a dead row again, after checking Stripe does not already hold it."""
    row = (
        MeterEvent.objects.select_for_update().select_related("usage_record").get(pk=meter_event.pk)
    )
    if row.status != MeterEvent.Status.DEAD:
        raise ValidationError(f"Only dead meter events can be retried; this one is {row.status}.")
    row.status = MeterEvent.Status.PENDING
    row.attempts = 0
    row.check_first = True
    row.next_attempt_at = timezone.now()
    row.save(update_fields=["status", "attempts", "check_first", "next_attempt_at"])
    audit_record(
        actor=actor,
        action="meter_event.retry",
        tenant=row.usage_record.tenant,
        target=row,
        payload={"identifier": row.identifier, "last_error": row.last_error},
    )
    return row


def unsent_to_local(*, tenant_id: int, plan_id: int) -> int:
    """When Stripe ended the tenant's subscription to the plan: its rows still waiting to be
    sent go on Opsdeck's invoice, as adjustments (sent now, no Stripe invoice would bill them);
    how many."""
    with transaction.atomic():
        rows = (
            MeterEvent.objects.select_for_update()
            .filter(
                status=MeterEvent.Status.PENDING,
                usage_record__tenant_id=tenant_id,
                usage_record__plan_id=plan_id,
            )
            .order_by("pk")  # as a flush storing its outcomes locks them (`_store`)
        )
        locked = dict(rows.values_list("pk", "usage_record_id"))
        records = list(locked.values())
        MeterEvent.objects.filter(pk__in=locked).update(
            status=MeterEvent.Status.ADJUSTED,
            last_error="Stripe ended its subscription before it was sent: a local adjustment.",
            check_first=False,
        )
        _billed_late(records)
    return len(records)


def _billed_late(record_ids: list[int]) -> None:
    """Usage records whose rows became local adjustments: one whose billing period closed while
    its row waited (its invoice was drafted without it) goes to the first open period, as an
    adjustment, as usage metered after its period closed does (`usage.billing_period_for`).

    Call it in the transaction that made them adjustments: it locks their periods as usage
    recording does, so a close of one comes either after (its invoice bills them, they stay)
    or before (they move), never between."""
    if not record_ids:
        return
    records = UsageRecord.objects.filter(pk__in=record_ids)
    periods = BillingPeriod.objects.select_for_update(no_key=True).filter(
        key__in=records.values("period")
    )
    closed = [key for key, at in periods.order_by("key").values_list("key", "closed_at") if at]
    for pk, hour in records.filter(period__in=closed).values_list("pk", "hour"):
        period, _ = usage.billing_period_for(hour)  # the first open one, locked too
        UsageRecord.objects.filter(pk=pk).update(period=period, adjustment=True)


def adjustments(period: str | None = None) -> QuerySet[MeterEvent]:
    """Rows too old for Stripe, to bill as local adjustment lines (optionally those of the usage
    records billed in `period`, "YYYY-MM")."""
    rows = MeterEvent.objects.filter(status=MeterEvent.Status.ADJUSTED).select_related(
        "usage_record"
    )
    return rows.filter(usage_record__period=period) if period else rows
