"""Idempotency keys, API keys, and injected faults, as the SDK experiences them."""

from __future__ import annotations

import time

import pytest
import requests
import stripe

from .conftest import make_client


def test_a_repeated_idempotency_key_replays_the_first_customer(client, emulator):
    first = client.v1.customers.create(
        {"email": "ada@example.com"}, {"idempotency_key": "customer-for-tenant-7"}
    )
    again = client.v1.customers.create(
        {"email": "ada@example.com"}, {"idempotency_key": "customer-for-tenant-7"}
    )

    assert again.id == first.id
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert [c.id for c in client.v1.customers.list().data] == [first.id]
    assert [r["replayed"] for r in emulator.requests() if r["method"] == "POST"] == [False, True]


def test_an_idempotency_key_reused_with_other_parameters_is_refused(client):
    client.v1.customers.create({"email": "ada@example.com"}, {"idempotency_key": "k-1"})

    with pytest.raises(stripe.IdempotencyError) as exc:
        client.v1.customers.create({"email": "bob@example.com"}, {"idempotency_key": "k-1"})
    assert exc.value.http_status == 400
    assert exc.value.error.type == "idempotency_error"
    assert [c.email for c in client.v1.customers.list().data] == ["ada@example.com"]


def test_a_replayed_meter_event_is_not_a_duplicate_identifier(client, emulator, metered):
    params = {
        "event_name": "vcpu_hours",
        "payload": {"stripe_customer_id": metered["customer"].id, "value": "3"},
        "identifier": "usage-42",
    }
    client.v1.billing.meter_events.create(params, {"idempotency_key": "usage-42"})
    replayed = client.v1.billing.meter_events.create(params, {"idempotency_key": "usage-42"})

    assert replayed.identifier == "usage-42"
    assert len(emulator.meter_events()) == 1


def test_requests_without_a_test_key_are_401(emulator):
    response = requests.get(f"{emulator.url}/v1/customers", timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"

    live = stripe.StripeClient(
        "sk_live_abcdefgh1234", base_addresses=emulator.base_addresses, max_network_retries=0
    )
    with pytest.raises(stripe.AuthenticationError) as auth:
        live.v1.customers.list()
    assert auth.value.http_status == 401
    assert "1234" in auth.value.user_message and "abcdefgh" not in auth.value.user_message


def test_an_injected_500_raises_api_error_and_changes_nothing(client, emulator):
    emulator.add_fault("/v1/customers", method="POST", count=1)

    with pytest.raises(stripe.APIError) as exc:
        client.v1.customers.create({"email": "ada@example.com"})
    assert exc.value.http_status == 500
    assert client.v1.customers.list().data == []
    assert client.v1.customers.create({"email": "ada@example.com"}).email == "ada@example.com"
    assert emulator.faults() == []


def test_the_sdks_retries_with_its_idempotency_key_create_one_object(emulator):
    retrying = make_client(emulator, max_network_retries=2)
    emulator.add_fault("/v1/customers", method="POST", count=2)

    customer = retrying.v1.customers.create({"email": "ada@example.com"})

    assert [c.id for c in retrying.v1.customers.list().data] == [customer.id]
    posts = [r for r in emulator.requests() if r["method"] == "POST"]
    assert [r["status"] for r in posts] == [500, 500, 200]


def test_a_hanging_request_times_out_in_the_sdk_and_changes_nothing(emulator):
    impatient = make_client(emulator, http_client=stripe.RequestsClient(timeout=0.3))
    emulator.add_fault("/v1/billing/meter_events", count=1, hang=1.5)

    with pytest.raises(stripe.APIConnectionError):
        impatient.v1.billing.meter_events.create(
            {"event_name": "e", "payload": {"stripe_customer_id": "cus_1", "value": "1"}}
        )

    # Once the hang is over the emulator answers the fault; nothing was recorded.
    deadline = time.monotonic() + 10
    while not any(r["fault"] for r in emulator.requests()):
        assert time.monotonic() < deadline, "the hanging request never finished"
        time.sleep(0.05)
    assert emulator.meter_events() == []


def test_a_rate_fault_fails_about_that_fraction_until_cleared(client, emulator):
    emulator.add_fault("/v1/customers", rate=0.5)

    failed = 0
    for _ in range(200):
        try:
            client.v1.customers.list({"limit": 1})
        except stripe.APIError:
            failed += 1

    # Binomial(200, 0.5) falls outside 50..150 with a probability below 1e-12.
    assert 50 <= failed <= 150
    emulator.clear_faults()
    assert client.v1.customers.list().data == []


def test_faults_are_set_through_the_control_api(client, emulator):
    rule = {"path": "/v1/prices", "status": 503, "count": 1}
    response = requests.post(f"{emulator.url}/_emulator/faults", json=rule, timeout=10)
    assert response.json()["count"] == 1

    with pytest.raises(stripe.APIError) as exc:
        client.v1.prices.list()
    assert exc.value.http_status == 503
    assert client.v1.prices.list().data == []


def test_a_bad_fault_is_refused(emulator):
    with pytest.raises(ValueError, match="rate"):
        emulator.add_fault("/v1/", rate=1.5)
