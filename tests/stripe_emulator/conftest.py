"""Fixtures: an emulator on a free port, the real `stripe` SDK pointed at it, and a little
webhook receiver."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import stripe

from stripe_emulator import API_VERSION, StripeEmulator

API_KEY = "sk_test_opsdeck_emulator"
WEBHOOK_SECRET = "whsec_test_opsdeck"


def _emulator_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("stripe-emulator-")]


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    """Every emulator started by these tests must be fully stopped at the end."""
    yield
    deadline = time.monotonic() + 5
    while _emulator_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _emulator_threads(), f"threads left running: {_emulator_threads()}"


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    """A fresh emulator per test (starting one takes a millisecond)."""
    with StripeEmulator() as em:
        yield em


def make_client(em: StripeEmulator, **options: Any) -> stripe.StripeClient:
    """The SDK as Opsdeck builds it, pointed at the emulator; no retries unless asked."""
    options.setdefault("max_network_retries", 0)
    return stripe.StripeClient(
        API_KEY,
        stripe_version=API_VERSION,
        base_addresses=em.base_addresses,  # type: ignore[arg-type]
        **options,
    )


@pytest.fixture
def client(emulator: StripeEmulator) -> stripe.StripeClient:
    return make_client(emulator)


@dataclass
class Delivery:
    """One webhook POST as the receiver saw it."""

    body: bytes
    signature: str


@dataclass
class Receiver:
    """A local HTTP endpoint recording the webhooks it gets; answers `statuses` in turn, then
    200."""

    url: str = ""
    deliveries: list[Delivery] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def types(self) -> list[str]:
        """The event types received, in arrival order."""
        with self.lock:
            return [json.loads(d.body)["type"] for d in self.deliveries]

    def verified(self) -> list[stripe.Event]:
        """Every delivery, verified and parsed by the SDK as a webhook handler would."""
        with self.lock:
            found = list(self.deliveries)
        return [stripe.Webhook.construct_event(d.body, d.signature, WEBHOOK_SECRET) for d in found]

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Wait until `count` deliveries arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.deliveries) >= count:
                    return
            time.sleep(0.01)
        raise AssertionError(f"expected {count} webhooks, got {self.types()}")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook endpoint on a free port, stopped at the end of the test."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with state.lock:
                status = state.statuses.pop(0) if state.statuses else 200
                if status == 200:
                    state.deliveries.append(Delivery(body, self.headers["Stripe-Signature"]))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/webhooks"
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def metered_catalog(client: stripe.StripeClient, customer: Any) -> dict[str, Any]:
    """For `customer`: a `sum` meter and a metered price of 0.5 cents per unit on it."""
    meter = client.v1.billing.meters.create(
        {
            "display_name": "vCPU hours",
            "event_name": "vcpu_hours",
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    price = client.v1.prices.create(
        {
            "currency": "usd",
            "unit_amount_decimal": "0.5",
            "product_data": {"name": "vCPU hours"},
            "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
            "lookup_key": "vcpu_hours",
        }
    )
    return {"customer": customer, "meter": meter, "price": price}


@pytest.fixture
def metered(client: stripe.StripeClient) -> dict[str, Any]:
    """A customer, a `sum` meter and a metered price of 0.5 cents per unit on it."""
    return metered_catalog(
        client, client.v1.customers.create({"email": "ada@example.com", "name": "Ada"})
    )


def subscribed(client: stripe.StripeClient, emulator: Any, metered: dict[str, Any]) -> Any:
    """An active subscription to the metered price, started through checkout."""
    session = client.v1.checkout.sessions.create(
        {
            "mode": "subscription",
            "customer": metered["customer"].id,
            "line_items": [{"price": metered["price"].id}],
            "success_url": "https://opsdeck.test/done",
        }
    )
    emulator.complete_checkout(session.id)
    return client.v1.subscriptions.retrieve(
        client.v1.checkout.sessions.retrieve(session.id).subscription
    )
