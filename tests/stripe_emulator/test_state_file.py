"""`serve --state FILE`: what clients stored the ids of is still there after a restart."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import stripe

from stripe_emulator import API_VERSION, StateFileError, StripeEmulator

from .conftest import API_KEY, metered_catalog

ROOT = Path(__file__).resolve().parents[2]


class Served:
    """`python -m stripe_emulator serve --port 0 ...` in a child process."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", "stripe_emulator", "serve", "--port", "0", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = self.process.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.process.stderr.read()
        self.client = stripe.StripeClient(
            API_KEY,
            stripe_version=API_VERSION,
            base_addresses={"api": self.url, "meter_events": self.url},
            max_network_retries=0,
        )

    def control(self, method: str, path: str, body: dict | None = None) -> dict:
        answer = requests.request(method, f"{self.url}/_emulator/{path}", json=body, timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            assert self.process.wait(timeout=15) == 0
        self.process.stdout.close()
        self.process.stderr.close()


@pytest.fixture
def serve() -> Iterator[type[Served]]:
    """Start emulators with `serve(*args)`; every one still running is stopped at the end."""
    started: list[Served] = []

    def start(*args: str) -> Served:
        started.append(Served(*args))
        return started[-1]

    yield start  # type: ignore[misc]
    for served in started:
        served.stop()


def _subscribe(served: Served, customer: str, price: str) -> str:
    session = served.client.v1.checkout.sessions.create(
        {
            "mode": "subscription",
            "customer": customer,
            "line_items": [{"price": price}],
            "success_url": "https://opsdeck.test/done",
        }
    )
    return served.control("POST", f"checkout/sessions/{session.id}/complete")["subscription"]


def _invoice_number(served: Served, subscription: str) -> str:
    draft = served.control("POST", f"subscriptions/{subscription}/close_period")
    return served.control("POST", f"invoices/{draft['id']}/finalize")["number"]


def test_a_restarted_emulator_keeps_objects_meter_events_and_its_clock(serve, tmp_path):
    state = tmp_path / "state.json"
    first = serve("--state", str(state))
    client = first.client
    customer = client.v1.customers.create(
        {"email": "ada@example.com"}, {"idempotency_key": "opsdeck-customer-1"}
    )
    price = metered_catalog(client, customer)["price"]
    usage = {"stripe_customer_id": customer.id, "value": "7"}
    client.v1.billing.meter_events.create(
        {"event_name": "vcpu_hours", "payload": usage, "identifier": "usage-1"}
    )
    subscription = _subscribe(first, customer.id, price.id)
    first_number = _invoice_number(first, subscription)
    moved_to = first.control("POST", "clock", {"seconds": 3600})["now"]
    first.stop()

    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    second = serve("--state", str(state))
    client = second.client
    assert client.v1.customers.retrieve(customer.id).email == "ada@example.com"
    found = client.v1.prices.list({"lookup_keys": ["vcpu_hours"]}).data
    assert [p.id for p in found] == [price.id]
    assert client.v1.subscriptions.retrieve(subscription).status == "active"
    recorded = second.control("GET", "meter_events")["meter_events"]
    assert [(e["identifier"], e["payload"]) for e in recorded] == [("usage-1", usage)]
    assert second.control("POST", "clock", {"seconds": 0})["now"] >= moved_to
    # Identifiers, idempotency keys and invoice numbers carry on where they were.
    with pytest.raises(stripe.InvalidRequestError, match="already exists"):
        client.v1.billing.meter_events.create(
            {"event_name": "vcpu_hours", "payload": usage, "identifier": "usage-1"}
        )
    replayed = client.v1.customers.create(
        {"email": "ada@example.com"}, {"idempotency_key": "opsdeck-customer-1"}
    )
    assert replayed.id == customer.id
    other = client.v1.customers.create({"email": "grace@example.com"})
    assert other.id != customer.id
    assert {c.id for c in client.v1.customers.list().data} == {customer.id, other.id}
    second_number = _invoice_number(second, subscription)
    assert (first_number[-4:], second_number[-4:]) == ("0001", "0002")


def test_a_corrupt_state_file_is_refused_and_left_as_it_was(tmp_path):
    state = tmp_path / "state.json"
    state.write_text('{"objects": ')

    run = subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "stripe_emulator", "serve", "--port", "0", "--state", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"python -m stripe_emulator: the state file {state} is unreadable")
    assert state.read_text() == '{"objects": '


def test_a_file_of_something_else_is_refused_from_python(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"objects": {}}))

    with pytest.raises(StateFileError, match="not a Stripe emulator state file"):
        StripeEmulator(state_file=state)


def test_each_change_is_on_disk_before_it_is_answered(tmp_path):
    state = tmp_path / "state.json"
    with StripeEmulator(state_file=state) as em:
        client = stripe.StripeClient(
            API_KEY, stripe_version=API_VERSION, base_addresses=em.base_addresses
        )
        assert json.loads(state.read_text())["objects"] == {}  # a missing file: empty, written
        customer = client.v1.customers.create({"email": "ada@example.com"})
        saved = json.loads(state.read_text())["objects"]["customer"]
        modified = state.stat().st_mtime_ns
        client.v1.customers.retrieve(customer.id)
        time.sleep(0.01)
        client.v1.customers.list()

        assert list(saved) == [customer.id]
        assert state.stat().st_mtime_ns == modified  # reads write nothing
        assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left
