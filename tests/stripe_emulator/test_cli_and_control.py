"""`python -m stripe_emulator serve`, and the control API over HTTP."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import requests
import stripe

from stripe_emulator import API_VERSION

from .conftest import WEBHOOK_SECRET, make_client

ROOT = Path(__file__).resolve().parents[2]


def test_serve_prints_its_url_and_stops_on_sigterm(receiver):
    process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        [
            sys.executable,
            "-m",
            "stripe_emulator",
            "serve",
            "--port",
            "0",
            "--webhook-url",
            receiver.url,
            "--webhook-secret",
            WEBHOOK_SECRET,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        client = stripe.StripeClient(
            "sk_test_cli", stripe_version=API_VERSION, base_addresses={"api": url}
        )
        customer = client.v1.customers.create({"email": "ada@example.com"})
        client.v1.customers.update(customer.id, {"name": "Ada"})
        receiver.wait_for(1)
        assert [e.type for e in receiver.verified()] == ["customer.updated"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        process.stdout.close()


def test_events_are_held_delivered_and_replayed_over_http(emulator, receiver):
    control = f"{emulator.url}/_emulator"
    webhook = {"url": receiver.url, "secret": WEBHOOK_SECRET, "auto_deliver": False}
    assert requests.put(f"{control}/webhook", json=webhook, timeout=10).status_code == 200
    client = make_client(emulator)
    customer = client.v1.customers.create({"email": "ada@example.com"})
    client.v1.customers.update(customer.id, {"name": "Ada"})
    client.v1.customers.update(customer.id, {"name": "Ada L."})

    events = requests.get(f"{control}/events?type=customer.updated", timeout=10).json()["events"]
    first, second = (e["id"] for e in events)
    answer = requests.post(f"{control}/events/deliver", json={"ids": [second, first]}, timeout=10)
    replay = requests.post(f"{control}/events/{first}/replay", timeout=10)

    assert [d["ok"] for d in answer.json()["deliveries"]] == [True, True]
    assert replay.json()["event"] == first
    assert [e.id for e in receiver.verified()] == [second, first, first]
    names = [e.data.object.name for e in receiver.verified()]
    assert names == ["Ada L.", "Ada", "Ada"]


def test_control_api_reads_meter_events_and_resets(emulator, client, metered):
    control = f"{emulator.url}/_emulator"
    client.v1.billing.meter_events.create(
        {
            "event_name": "vcpu_hours",
            "payload": {"stripe_customer_id": metered["customer"].id, "value": "5"},
            "identifier": "once",
        }
    )

    recorded = requests.get(f"{control}/meter_events", timeout=10).json()["meter_events"]
    assert [(e["identifier"], e["payload"]["value"]) for e in recorded] == [("once", "5")]
    assert requests.post(f"{control}/reset", timeout=10).json() == {"reset": True}
    assert requests.get(f"{control}/meter_events", timeout=10).json() == {"meter_events": []}
    assert client.v1.customers.list().data == []


def test_control_api_refuses_bad_input_in_stripes_error_shape(emulator):
    control = f"{emulator.url}/_emulator"
    bad = requests.post(f"{control}/faults", json={"path": "v1", "status": 200}, timeout=10)
    missing = requests.post(f"{control}/invoices/in_nope/pay", timeout=10)

    assert bad.status_code == 400 and "path" in bad.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "resource_missing"
    assert requests.get(f"{control}/faults", timeout=10).json() == {"faults": []}
