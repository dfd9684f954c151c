"""Meter events: identifiers, timestamp bounds, cancellations and event summaries."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import stripe

from .conftest import make_client

DAY = 86400


def _send(client, customer, value, identifier, timestamp=None):
    params = {
        "event_name": "vcpu_hours",
        "payload": {"stripe_customer_id": customer.id, "value": value},
        "identifier": identifier,
    }
    if timestamp is not None:
        params["timestamp"] = timestamp
    return client.v1.billing.meter_events.create(params)


def test_accepted_events_are_recorded(client, emulator, metered):
    event = _send(client, metered["customer"], "12", "usage-1")

    assert event.object == "billing.meter_event" and event.identifier == "usage-1"
    assert event.payload.to_dict() == {"stripe_customer_id": metered["customer"].id, "value": "12"}
    recorded = emulator.meter_events()
    assert [(e["identifier"], e["payload"]["value"], e["cancelled"]) for e in recorded] == [
        ("usage-1", "12", False)
    ]


def test_a_repeated_identifier_is_refused_without_retry(client, emulator, metered):
    _send(client, metered["customer"], "12", "usage-1")

    with pytest.raises(stripe.InvalidRequestError) as exc:
        _send(client, metered["customer"], "99", "usage-1")
    assert exc.value.http_status == 400
    assert exc.value.user_message == "An event already exists with identifier usage-1."
    assert exc.value.param == "identifier"
    assert exc.value.headers["Stripe-Should-Retry"] == "false"
    assert [e["payload"]["value"] for e in emulator.meter_events()] == ["12"]


def test_concurrent_repeats_of_an_identifier_are_accepted_once(emulator, metered):
    clients = [make_client(emulator) for _ in range(8)]

    def send(client):
        try:
            _send(client, metered["customer"], "1", "same")
        except stripe.InvalidRequestError:
            return False
        return True

    with ThreadPoolExecutor(len(clients)) as pool:
        accepted = list(pool.map(send, clients))

    assert accepted.count(True) == 1
    assert len(emulator.meter_events()) == 1


def test_an_identifier_is_free_again_after_24_hours(client, emulator, metered):
    _send(client, metered["customer"], "12", "usage-1")
    emulator.advance_clock(DAY + 1)

    _send(client, metered["customer"], "13", "usage-1")
    assert [e["payload"]["value"] for e in emulator.meter_events()] == ["12", "13"]


def test_identifier_longer_than_100_characters_is_refused(client, emulator, metered):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        _send(client, metered["customer"], "1", "x" * 101)
    assert exc.value.param == "identifier"
    assert emulator.meter_events() == []


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [(-36 * DAY, False), (-34 * DAY, True), (60, True), (10 * 60, False)],
    ids=["36-days-ago", "34-days-ago", "1-minute-ahead", "10-minutes-ahead"],
)
def test_timestamps_within_35_days_back_and_5_minutes_ahead(
    client, emulator, metered, offset, accepted
):
    timestamp = int(time.time()) + offset
    if accepted:
        assert _send(client, metered["customer"], "1", "e", timestamp).timestamp == timestamp
        assert len(emulator.meter_events()) == 1
    else:
        with pytest.raises(stripe.InvalidRequestError) as exc:
            _send(client, metered["customer"], "1", "e", timestamp)
        assert (exc.value.http_status, exc.value.param) == (400, "timestamp")
        assert emulator.meter_events() == []


def test_a_value_that_is_not_a_number_is_refused(client, emulator, metered):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        _send(client, metered["customer"], "lots", "e")
    assert exc.value.param == "payload[value]"
    assert emulator.meter_events() == []


def _this_hour():
    # Read once per test: every bound is derived from it, so an hour turning mid-test is harmless.
    now = int(time.time())
    return now - now % 3600


def test_hourly_summaries_sum_the_values_of_each_hour(client, metered):
    customer, meter = metered["customer"], metered["meter"]
    hour = _this_hour()
    first, second = hour - 3 * 3600, hour - 2 * 3600
    _send(client, customer, "2.5", "a", first + 10)
    _send(client, customer, "4", "b", first + 3599)
    _send(client, customer, "7", "c", second)
    other = client.v1.customers.create({"email": "other@example.com"})
    _send(client, other, "100", "d", first + 20)

    summaries = client.v1.billing.meters.event_summaries.list(
        meter.id,
        {
            "customer": customer.id,
            "start_time": first,
            "end_time": hour,
            "value_grouping_window": "hour",
        },
    )

    assert [(s.start_time, s.end_time, s.aggregated_value) for s in summaries.data] == [
        (second, second + 3600, 7.0),
        (first, first + 3600, 6.5),
    ]
    whole = client.v1.billing.meters.event_summaries.list(
        meter.id, {"customer": customer.id, "start_time": first, "end_time": hour}
    )
    assert [s.aggregated_value for s in whole.data] == [13.5]


def test_a_cancelled_event_no_longer_counts(client, emulator, metered):
    customer, meter = metered["customer"], metered["meter"]
    start = _this_hour() - 2 * 3600
    _send(client, customer, "5", "keep", start + 1)
    _send(client, customer, "8", "drop", start + 2)

    adjustment = client.v1.billing.meter_event_adjustments.create(
        {"event_name": "vcpu_hours", "type": "cancel", "cancel": {"identifier": "drop"}}
    )

    assert adjustment.cancel.identifier == "drop"
    summaries = client.v1.billing.meters.event_summaries.list(
        meter.id, {"customer": customer.id, "start_time": start, "end_time": start + 3600}
    )
    assert [s.aggregated_value for s in summaries.data] == [5.0]
    assert [e["identifier"] for e in emulator.meter_events() if e["cancelled"]] == ["drop"]


def test_summary_bounds_must_align_with_the_window(client, metered):
    hour = _this_hour()
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.billing.meters.event_summaries.list(
            metered["meter"].id,
            {
                "customer": metered["customer"].id,
                "start_time": hour - 2 * 3600 + 60,
                "end_time": hour,
                "value_grouping_window": "hour",
            },
        )
    assert exc.value.param == "start_time"
