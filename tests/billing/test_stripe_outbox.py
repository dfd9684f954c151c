"""The meter-event outbox: every usage record reaches Stripe's meter exactly once, through
errors, timeouts, concurrent flushers and Stripe's 24-hour and 35-day limits."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from accounts.models import AuditEvent
from billing import meter_events, stripe_sync
from billing.meter_events import flush
from billing.models import MeterEvent, StripeMeter, Subscription, UsageRecord
from billing.stripe_gateway import StripeGateway
from tests.billing.conftest import API_KEY
from tests.concurrency import race

METER_EVENTS = "/v1/billing/meter_events"


def _hours_ago(hours: int):
    return timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours)


@pytest.fixture
def catalog(gw, priced_plan):
    return stripe_sync.catalog_sync(gw)


@pytest.fixture
def stripe_ready(catalog, customer, tenant, priced_plan):
    """The catalog synced, the tenant a Stripe customer subscribed to the plan through Stripe
    (its subscription as the webhook leaves ours: Stripe's own is not needed here)."""
    Subscription.objects.update_or_create(
        tenant=tenant, plan=priced_plan,
        defaults={"status": Subscription.Status.ACTIVE, "stripe_subscription_id": "sub_outbox",
                  "stripe_customer_id": customer.customer_id, "created_at": customer.created_at},
    )  # fmt: skip
    return customer


def _stripe_events(emulator) -> list[tuple[str, str]]:
    return [(e["identifier"], e["payload"]["value"]) for e in emulator.meter_events()]


def _sends(emulator) -> list[dict]:
    return [r for r in emulator.requests() if r["path"] == METER_EVENTS]


def _rows() -> dict[str, MeterEvent]:
    return {
        row.usage_record.instance_id: row
        for row in MeterEvent.objects.select_related("usage_record")
    }


def _send_directly(gw, row: MeterEvent) -> None:
    """Stripe accepted this row earlier, though we never learnt it (an answer lost)."""
    gw.meter_event_send(
        event_name=row.event_name,
        customer_id=row.customer_id,
        value=row.value,
        identifier=row.identifier,
        timestamp=int(row.timestamp.timestamp()),
        attempt=0,
    )


def _attempted(row: MeterEvent, *, hours_ago: float) -> None:
    """Mark the row as sent that long ago with no answer (a timeout, a dead worker)."""
    row.attempts = 1
    row.first_attempt_at = timezone.now() - timedelta(hours=hours_ago)
    row.save(update_fields=["attempts", "first_attempt_at"])


def test_each_usage_record_is_sent_once_as_millionths_of_a_unit_hour(
    stripe_ready, emulator, record_usage
):
    hour = _hours_ago(2)
    record_usage(
        hour, ("inst-a", "cpu", "2.333333"), ("inst-a", "storage", "10"), ("inst-b", "cpu", "1")
    )

    assert meter_events.enqueue() == 3
    assert meter_events.enqueue() == 0
    first = flush()
    again = flush()

    assert (first.sent, again.done) == (3, 0)
    records = {(r.instance_id, r.dimension): r.pk for r in UsageRecord.objects.all()}
    assert sorted(_stripe_events(emulator)) == sorted(
        [
            (f"opsdeck-usage-{records['inst-a', 'cpu']}", "2333333"),
            (f"opsdeck-usage-{records['inst-a', 'storage']}", "10000000"),
            (f"opsdeck-usage-{records['inst-b', 'cpu']}", "1000000"),
        ]
    )
    sent = emulator.meter_events()[0]
    assert sent["payload"]["stripe_customer_id"] == stripe_ready.customer_id
    assert sent["timestamp"] == int(hour.timestamp())
    assert set(MeterEvent.objects.values_list("status", flat=True)) == {"sent"}


def test_usage_of_tenants_without_a_customer_or_of_unmetered_dimensions_stays_local(
    catalog, tenant, record_usage
):
    record_usage(_hours_ago(2), ("inst-a", "cpu", "1"))
    assert meter_events.enqueue() == 0  # no customer yet

    stripe_sync.customer_remember(tenant=tenant, customer_id="cus_later")
    record_usage(_hours_ago(1), ("inst-a", "cpu", "1"), ("inst-a", "replica", "3"))

    # Only the hours from the customer's on, and only dimensions with a meter.
    assert meter_events.enqueue() == 0
    assert MeterEvent.objects.count() == 0


def test_usage_no_stripe_subscription_bills_stays_local(
    stripe_ready, emulator, record_usage, tenant, priced_plan
):
    """Stripe ended the subscription (an unpaid invoice, a deletion in its dashboard): an
    instance still running since is billed on Opsdeck's invoice, not sent to a meter no
    subscription of the customer reads — nor an hour before the end, metered after it."""
    record_usage(_hours_ago(4), ("inst-sent", "cpu", "1"))
    assert meter_events.enqueue() == 1  # while the subscription was open
    Subscription.objects.filter(tenant=tenant).update(
        status=Subscription.Status.CANCELLED, cancelled_at=_hours_ago(3) + timedelta(minutes=40)
    )
    record_usage(_hours_ago(3), ("inst-local", "cpu", "1"))  # the hour it ended in
    record_usage(_hours_ago(1), ("inst-local", "cpu", "1"))

    assert meter_events.enqueue() == 0
    flush()
    assert [identifier for identifier, _ in _stripe_events(emulator)] == [
        meter_events.identifier_for(UsageRecord.objects.get(instance_id="inst-sent").pk)
    ]


def test_usage_from_before_a_subscription_started_again_is_not_sent_to_it(
    stripe_ready, emulator, record_usage, tenant, priced_plan
):
    """Hours run while the organization had no Stripe subscription (billed on Opsdeck's
    invoice) are not sent to the one it takes later."""
    Subscription.objects.filter(tenant=tenant).update(created_at=_hours_ago(2))
    record_usage(_hours_ago(5), ("inst-local", "cpu", "1"))
    record_usage(_hours_ago(2), ("inst-sent", "cpu", "1"))

    assert meter_events.enqueue() == 1
    assert list(_rows()) == ["inst-sent"]


def test_usage_between_subscribing_again_and_paying_is_not_sent_to_it(
    stripe_ready, emulator, record_usage, tenant, priced_plan
):
    """Subscribed again two days before paying on Stripe's checkout: the hours between run
    without a Stripe subscription (billed on Opsdeck's invoice); Stripe bills from the start
    it reports, and the hour it began in from that moment."""
    started = _hours_ago(2) + timedelta(minutes=20)
    Subscription.objects.filter(tenant=tenant).update(
        created_at=_hours_ago(48), stripe_started_at=started
    )
    record_usage(_hours_ago(5), ("inst-local", "cpu", "1"))
    record_usage(_hours_ago(2), ("inst-sent", "cpu", "1"))

    assert meter_events.enqueue() == 1
    assert list(_rows()) == ["inst-sent"]
    assert _rows()["inst-sent"].timestamp == started


@pytest.mark.parametrize("stripe_answers", ["an error to retry", "accepted"])
def test_usage_moved_to_the_local_invoice_while_being_sent_stays_there(
    stripe_ready, emulator, record_usage, tenant, priced_plan, gw, stripe_answers
):
    """Stripe ends the subscription while a worker is sending its last usage: whatever Stripe
    answers that send, the usage stays on Opsdeck's invoice, rather than going back in the
    queue for a subscription no longer billing it."""
    record_usage(_hours_ago(3), ("inst-a", "cpu", "1"))
    meter_events.enqueue()
    if stripe_answers == "an error to retry":
        emulator.add_fault(METER_EVENTS, status=500, count=1)
    now = timezone.now()
    meters = dict(StripeMeter.objects.values_list("event_name", "meter_id"))
    claimed = meter_events._claim(now)  # a flush, under way

    meter_events.unsent_to_local(tenant_id=tenant.pk, plan_id=priced_plan.pk)
    meter_events._send_batch(gw, claimed, now, meters, meter_events.Flushed())

    assert MeterEvent.objects.get().status == MeterEvent.Status.ADJUSTED


def test_usage_from_before_a_resumed_subscription_is_not_sent_to_it(
    stripe_ready, emulator, record_usage, tenant, priced_plan
):
    """Subscribed again by taking over the Stripe subscription a cancel left running to its
    period's end: ours is new, Stripe's start is a month old. The hours between the cancel and
    the new subscription were billed on Opsdeck's invoice, and are not sent."""
    Subscription.objects.filter(tenant=tenant).update(
        created_at=_hours_ago(2), stripe_started_at=_hours_ago(30 * 24)
    )
    record_usage(_hours_ago(5), ("inst-local", "cpu", "1"))
    record_usage(_hours_ago(2), ("inst-sent", "cpu", "1"))

    assert meter_events.enqueue() == 1
    assert list(_rows()) == ["inst-sent"]


def test_stripe_errors_are_retried_later_with_the_same_identifier(
    stripe_ready, emulator, record_usage
):
    record_usage(_hours_ago(3), *[(f"inst-{i}", "cpu", str(i + 1)) for i in range(5)])
    meter_events.enqueue()
    emulator.add_fault(METER_EVENTS, status=500, count=2)

    first = flush()

    assert (first.sent, first.retrying) == (3, 2)
    failed = MeterEvent.objects.filter(status="pending")
    assert {row.attempts for row in failed} == {1} and "500" in failed[0].last_error
    assert flush().done == 0  # not due yet: backing off

    later = flush(timezone.now() + timedelta(minutes=1))

    assert later.sent == 2
    events = _stripe_events(emulator)
    assert len(events) == 5 and len({identifier for identifier, _ in events}) == 5
    assert set(MeterEvent.objects.values_list("status", flat=True)) == {"sent"}
    assert sorted(v for _, v in events) == sorted(str((i + 1) * 1_000_000) for i in range(5))


def test_a_stripe_outage_ends_the_flush_and_loses_nothing(stripe_ready, emulator, record_usage):
    record_usage(_hours_ago(3), *[(f"inst-{i}", "cpu", "1") for i in range(10)])
    meter_events.enqueue()
    emulator.add_fault(METER_EVENTS, status=503)

    down = flush()

    # Three failures in a row end the flush; the other rows were not even tried.
    assert (down.retrying, down.sent) == (3, 0)
    assert len(_sends(emulator)) == 3
    assert MeterEvent.objects.filter(attempts=0, first_attempt_at__isnull=True).count() == 7

    emulator.clear_faults()
    back = flush(timezone.now() + timedelta(minutes=5))

    assert back.sent == 10
    assert len(emulator.meter_events()) == 10


def test_a_request_that_times_out_is_sent_again_and_stripe_holds_one_event(
    stripe_ready, emulator, record_usage, settings
):
    record_usage(_hours_ago(2), ("inst-a", "cpu", "4"))
    meter_events.enqueue()
    emulator.add_fault(METER_EVENTS, count=1, hang=5.0)
    impatient = StripeGateway(
        API_KEY, api_version=settings.STRIPE_API_VERSION, api_base=emulator.url, timeout=0.5
    )

    timed_out = flush(gateway_=impatient)

    row = MeterEvent.objects.get()
    assert timed_out.retrying == 1 and row.status == "pending" and row.attempts == 1
    assert "APIConnectionError" in row.last_error

    flush(timezone.now() + timedelta(minutes=1), gateway_=impatient)

    row.refresh_from_db()
    assert row.status == "sent" and row.attempts == 2
    assert _stripe_events(emulator) == [(row.identifier, "4000000")]


def test_an_event_stripe_took_without_us_hearing_is_not_counted_twice(
    stripe_ready, emulator, gw, record_usage
):
    record_usage(_hours_ago(2), ("inst-a", "cpu", "4"))
    meter_events.enqueue()
    row = MeterEvent.objects.get()
    _send_directly(gw, row)
    _attempted(row, hours_ago=1)

    result = flush()

    row.refresh_from_db()
    assert (result.held, row.status) == (1, "sent")
    assert len(emulator.meter_events()) == 1


def test_after_20_hours_a_row_stripe_holds_is_found_in_its_summary_and_not_sent(
    stripe_ready, emulator, gw, record_usage
):
    record_usage(_hours_ago(30), ("inst-a", "cpu", "4"))
    meter_events.enqueue()
    row = MeterEvent.objects.get()
    _send_directly(gw, row)
    _attempted(row, hours_ago=1)
    # A day later Stripe has forgotten the identifier: only its summary knows the event.
    emulator.advance_clock(25 * 3600)

    result = flush(timezone.now() + timedelta(hours=25))

    row.refresh_from_db()
    assert (result.held, row.status, row.last_error) == (1, "sent", "Found in the meter's summary.")
    assert len(emulator.meter_events()) == 1 and _sends(emulator)[-1]["method"] == "POST"
    assert len(_sends(emulator)) == 1  # the direct send only


def test_after_20_hours_a_row_missing_from_the_summary_is_sent(
    stripe_ready, emulator, record_usage
):
    record_usage(_hours_ago(30), ("inst-a", "cpu", "4"))
    meter_events.enqueue()
    row = MeterEvent.objects.get()
    _attempted(row, hours_ago=21)

    result = flush()

    row.refresh_from_db()
    assert (result.sent, row.status) == (1, "sent")
    assert _stripe_events(emulator) == [(row.identifier, "4000000")]


def test_the_summary_check_tells_rows_of_the_same_customer_and_hour_apart(
    stripe_ready, emulator, gw, record_usage
):
    # Three instances in one hour; Stripe got b's event only, a never, c's fate is unknown.
    record_usage(
        _hours_ago(30), ("inst-a", "cpu", "1"), ("inst-b", "cpu", "2"), ("inst-c", "cpu", "4")
    )
    meter_events.enqueue()
    rows = _rows()
    _send_directly(gw, rows["inst-b"])
    for name in ("inst-a", "inst-b", "inst-c"):
        _attempted(rows[name], hours_ago=26)
    emulator.advance_clock(25 * 3600)

    result = flush(timezone.now() + timedelta(hours=25))

    assert (result.sent, result.held) == (2, 1)
    rows = _rows()
    assert rows["inst-b"].last_error == "Found in the meter's summary."
    # Stripe's sum for the hour is now the three rows', each counted once.
    totals = Counter(e["identifier"] for e in emulator.meter_events())
    assert set(totals.values()) == {1}
    assert sum(int(e["payload"]["value"]) for e in emulator.meter_events()) == 7_000_000


def test_rows_older_than_35_days_become_local_adjustments(stripe_ready, emulator, record_usage):
    too_old = _hours_ago(36 * 24)  # read once: the test may run across the turn of an hour
    record_usage(too_old, ("inst-a", "cpu", "3"))
    record_usage(_hours_ago(2), ("inst-a", "cpu", "1"))
    meter_events.enqueue()

    result = flush()

    assert (result.adjusted, result.sent) == (1, 1)
    old = meter_events.adjustments().get()
    assert old.usage_record.hour == too_old and old.status == "adjusted"
    assert len(emulator.meter_events()) == 1


def test_a_row_tried_before_it_grew_too_old_is_adjusted_only_if_stripe_lacks_it(
    stripe_ready, emulator, gw, record_usage
):
    record_usage(_hours_ago(34 * 24), ("inst-a", "cpu", "3"), ("inst-b", "cpu", "5"))
    meter_events.enqueue()
    rows = _rows()
    _send_directly(gw, rows["inst-a"])  # a's answer was lost, b never got there
    for row in rows.values():
        _attempted(row, hours_ago=1)
    emulator.advance_clock(2 * 24 * 3600)

    result = flush(timezone.now() + timedelta(days=2))

    assert (result.held, result.adjusted, result.sent) == (1, 1, 0)
    rows = _rows()
    assert (rows["inst-a"].status, rows["inst-b"].status) == ("sent", "adjusted")
    assert list(meter_events.adjustments()) == [rows["inst-b"]]
    assert len(emulator.meter_events()) == 1


def test_a_row_failing_every_time_is_parked_dead_and_the_admin_retries_it(
    stripe_ready, emulator, record_usage, settings, admin_client
):
    settings.STRIPE_METER_EVENT_MAX_ATTEMPTS = 3
    record_usage(_hours_ago(2), ("inst-a", "cpu", "2"))
    meter_events.enqueue()
    emulator.add_fault(METER_EVENTS, status=500)
    now = timezone.now()
    for minutes in (0, 5, 10):
        flush(now + timedelta(minutes=minutes))
    row = MeterEvent.objects.get()
    assert (row.status, row.attempts) == ("dead", 3)
    assert flush(now + timedelta(hours=5)).done == 0

    emulator.clear_faults()
    answer = admin_client.post(
        reverse("admin:billing_meterevent_changelist"),
        {"action": "retry", "_selected_action": [row.pk]},
        follow=True,
    )

    assert "Queued again: 1." in answer.content.decode()
    row.refresh_from_db()
    assert (row.status, row.attempts, row.check_first) == ("pending", 0, True)
    audit = AuditEvent.objects.get(action="meter_event.retry")
    assert (audit.actor_kind, audit.target_id) == ("staff", str(row.pk))

    result = flush()

    row.refresh_from_db()
    assert (result.sent, row.status) == (1, "sent")
    assert _stripe_events(emulator) == [(row.identifier, "2000000")]


def test_only_dead_rows_can_be_retried(stripe_ready, record_usage, admin_client):
    record_usage(_hours_ago(2), ("inst-a", "cpu", "2"))
    meter_events.enqueue()
    row = MeterEvent.objects.get()

    answer = admin_client.post(
        reverse("admin:billing_meterevent_changelist"),
        {"action": "retry", "_selected_action": [row.pk]},
        follow=True,
    )

    assert "Only dead meter events can be retried" in answer.content.decode()
    assert MeterEvent.objects.get().status == "pending"


@pytest.mark.django_db(transaction=True)
def test_two_flushers_at_once_send_each_row_once(stripe_ready, emulator, record_usage):
    record_usage(_hours_ago(2), *[(f"inst-{i:03}", "cpu", "1") for i in range(250)])
    meter_events.enqueue()

    results = race(flush, times=2)

    assert not [r for r in results if isinstance(r, Exception)]
    assert sum(r.sent for r in results) == 250
    sends = [r["params"]["identifier"] for r in _sends(emulator)]
    assert len(sends) == 250 and len(set(sends)) == 250
    assert len(emulator.meter_events()) == 250


def test_without_stripe_nothing_is_queued_or_sent(stripe_ready, record_usage, settings, client):
    record_usage(_hours_ago(2), ("inst-a", "cpu", "2"))
    settings.STRIPE_API_KEY = ""

    assert meter_events.enqueue() == 0
    assert flush().done == 0
    assert MeterEvent.objects.count() == 0
    assert (
        client.post(reverse("stripe_webhook"), b"{}", content_type="application/json").status_code
        == 404
    )


def test_a_flush_storing_outcomes_waits_behind_rows_locked_in_id_order_and_never_deadlocks(
    transactional_db, stripe_ready, record_usage, tenant, priced_plan
):
    """Stripe ending the subscription moves its unsent rows to Opsdeck's invoice, locking them
    in id order. A flush storing two outcomes (a row to retry, one sent), the higher id first
    as its claim order may have them, takes its locks in id order too: one waits for the
    other, and neither is aborted as a deadlock."""
    from tests.concurrency import beside_a_lock

    record_usage(_hours_ago(3), ("inst-a", "cpu", "1"), ("inst-b", "cpu", "1"))
    meter_events.enqueue()
    low, high = MeterEvent.objects.order_by("id")
    now = timezone.now()
    low.next_attempt_at, low.last_error = now + timedelta(minutes=5), "Stripe: 500"  # to retry
    high.status, high.sent_at = MeterEvent.Status.SENT, now

    def lock(pk):
        return lambda: list(MeterEvent.objects.select_for_update().filter(pk=pk))

    def store():
        with transaction.atomic():
            meter_events._store([high, low])
        return "stored"

    held, stored = beside_a_lock(lock(low.pk), lock(high.pk), store)

    assert (held, stored) == ("committed", "stored")
    assert MeterEvent.objects.get(pk=high.pk).status == MeterEvent.Status.SENT


@pytest.mark.unsubscribed
def test_the_first_hours_event_whose_answer_was_lost_is_found_or_sent_once(
    tenant, gw, emulator, customer, priced_plan
):
    """The first hour of a Stripe subscription has its event at the moment it began, seconds
    and all. Checked against Stripe's total for its hour (an answer lost, retried after
    Stripe's 20-hour window), the total was asked for from that moment: Stripe sums whole
    minutes only and refused, the row was left dead, billed by neither Stripe nor Opsdeck, and
    staff's Retry failed the same way. From that moment the window took in the next hour's
    event too."""
    from decimal import Decimal

    from billing import usage
    from billing.usage import UsageRow

    stripe_sync.catalog_sync(gw)
    hour = usage.hour_start(timezone.now() - timedelta(hours=30))
    began = hour + timedelta(minutes=17, seconds=23)  # paid on Checkout at 10:17:23, say
    subscription = Subscription.objects.create(
        tenant=tenant, plan=priced_plan, status="active", stripe_subscription_id="sub_first",
        stripe_customer_id=customer.customer_id, current_period_start=began,
    )  # fmt: skip
    Subscription.objects.filter(pk=subscription.pk).update(
        created_at=began - timedelta(minutes=5), stripe_started_at=began
    )
    for at in (hour, hour + usage.HOUR):
        usage.record(at, [UsageRow(tenant.pk, priced_plan.pk, "inst-a", "db", "cpu", "core",
                                   Decimal("2"))])  # fmt: skip
    assert meter_events.enqueue() == 2
    first = MeterEvent.objects.get(timestamp=began)
    emulator.add_fault("/v1/billing/meter_events", method="POST", status=500, count=1)
    sent_at = timezone.now()
    flush(sent_at)  # the first's answer lost (Stripe stored nothing); the next hour's sent
    first.refresh_from_db()
    assert first.status == MeterEvent.Status.PENDING

    flush(sent_at + timedelta(hours=21))  # after Stripe's window: its total is read first

    first.refresh_from_db()
    assert first.status == MeterEvent.Status.SENT, first.last_error
    assert [e["identifier"] for e in emulator.meter_events()].count(first.identifier) == 1
