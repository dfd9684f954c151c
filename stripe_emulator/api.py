"""The Python API: start an emulated Stripe on loopback and drive it from tests."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import credit_notes, invoices, payments, sessions, subscriptions
from .events import type_matches
from .faults import Faults
from .forms import Params
from .idempotency import IdempotencyKeys
from .persistence import StateFileError, state_dump, state_load, state_save
from .server import make_server
from .state import State
from .webhooks import Endpoint, WebhookSender

log = logging.getLogger("stripe_emulator")


class StripeEmulator:
    """A small stateful Stripe in this process, reached by the `stripe` SDK over HTTP.

    Every helper below is also a control endpoint (README.md); helpers return copies, so a
    test cannot change the emulator's state by editing what it reads.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        api_key: str | None = None,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        state_file: str | Path | None = None,
        auto_bill: bool = False,
        auto_bill_interval: float = 5.0,
    ) -> None:
        """`state_file`: load the state from it (a missing file is an empty state;
        StateFileError for one that cannot be read) and write it back after every change.
        `auto_bill`: every `auto_bill_interval` seconds, do what Stripe does as its clock
        passes (`invoices.billing_cycle_run`). Off, tests drive billing themselves."""
        self.host = host
        self.requested_port = port
        # Any sk_test_/rk_test_ key is accepted unless one is named here.
        self.api_key = api_key
        self.state = State()
        self.fault_rules = Faults()
        self.idempotency = IdempotencyKeys()
        self.webhooks = WebhookSender()
        self.state.on_event = self.webhooks.enqueue
        self.stopping = threading.Event()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._biller: threading.Thread | None = None
        if auto_bill_interval <= 0:
            raise ValueError("auto_bill_interval must be positive")
        self.auto_bill = auto_bill
        self.auto_bill_interval = auto_bill_interval
        if webhook_url or webhook_secret:
            self.set_webhook(webhook_url or "", webhook_secret or "")
        self.state_file = Path(state_file) if state_file is not None else None
        if self.state_file is not None:
            state_load(self.state_file, self.state, self.idempotency)
            try:  # an unwritable place fails now, not at the first change
                self._write_state()
            except OSError as exc:
                raise StateFileError(
                    f"cannot write the state file {self.state_file}: {exc}"
                ) from None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> StripeEmulator:
        """Bind the port and serve in background threads."""
        self.stopping.clear()
        self._server = make_server(self, self.host, self.requested_port)
        self.state.base_url = self.url
        self.webhooks.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.05,),  # the poll interval: stop() waits for one
            name="stripe-emulator-http",
            daemon=True,
        )
        self._thread.start()
        if self.auto_bill:
            self._biller = threading.Thread(
                target=self._auto_bill, name="stripe-emulator-auto-bill", daemon=True
            )
            self._biller.start()
        log.info("stripe emulator serving on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving (hanging faults end at once) and delivering; joins every thread."""
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.close_all()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._biller is not None:
            self._biller.join(timeout=10)
            self._biller = None
        self.save_state()
        self.webhooks.stop()

    def __enter__(self) -> StripeEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.server_address[1] if self._server else self.requested_port

    @property
    def url(self) -> str:
        """Base URL: give it to the SDK as every base address."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_addresses(self) -> dict[str, str]:
        """`base_addresses` for `stripe.StripeClient`."""
        return {"api": self.url, "meter_events": self.url, "files": self.url}

    # ---- state file and auto-bill ------------------------------------------------------------

    def save_state(self) -> None:
        """Write the state file (when there is one): after every change and at stop. A failed
        write is logged, not raised: the change it follows is made and answered already."""
        try:
            self._write_state()
        except OSError:
            log.exception("cannot write the state file %s", self.state_file)

    def _write_state(self) -> None:
        if self.state_file is None:
            return
        # Under the lock: a snapshot of one moment, and writes in the order of the changes.
        with self.state.lock:
            state_save(self.state_file, state_dump(self.state, self.idempotency))

    def _auto_bill(self) -> None:
        while not self.stopping.wait(self.auto_bill_interval):
            try:
                with self.state.lock:
                    if invoices.billing_cycle_run(self.state):
                        self.save_state()
            except Exception:  # a bug must not end the ticker; the next tick tries again
                log.exception("auto-bill failed")

    # ---- control ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to empty: objects, events, meter events, idempotency keys, recorded requests
        and deliveries, faults. The webhook endpoint and the clock stay."""
        with self.state.lock:
            self.state.reset()
            self.idempotency.clear()
            self.save_state()
        self.fault_rules.clear()
        self.webhooks.clear()

    def add_fault(
        self,
        path: str,
        *,
        method: str | None = None,
        status: int = 500,
        count: int | None = None,
        rate: float | None = None,
        hang: float = 0.0,
    ) -> dict[str, Any]:
        """Break requests under a path prefix: the next `count` (all when None), a `rate`
        fraction of them, answering `status` after `hang` seconds. ValueError for a bad rule."""
        fault = self.fault_rules.add(
            path=path, method=method, status=status, count=count, rate=rate, hang=hang
        )
        return asdict(fault)

    def clear_faults(self) -> None:
        """Remove every fault."""
        self.fault_rules.clear()

    def faults(self) -> list[dict[str, Any]]:
        """The faults in force."""
        return self.fault_rules.to_list()

    def set_webhook(
        self,
        url: str,
        secret: str,
        *,
        auto_deliver: bool = True,
        retries: int = 3,
        retry_delay: float = 0.5,
    ) -> None:
        """Deliver events emitted from now on to url, signed with secret (`whsec_...`); with
        auto_deliver off they wait for `deliver()`. ValueError for a bad url or secret."""
        self.webhooks.configure(Endpoint(url, secret, auto_deliver, retries, retry_delay))

    def clear_webhook(self) -> None:
        """Stop delivering events."""
        self.webhooks.configure(None)

    def webhook(self) -> dict[str, Any] | None:
        """The endpoint's settings, or None."""
        endpoint = self.webhooks.endpoint
        return endpoint.to_dict() if endpoint else None

    def meter_events(self, event_name: str | None = None) -> list[dict[str, Any]]:
        """Every accepted meter event (cancelled ones flagged), oldest first."""
        with self.state.lock:
            return [
                e.to_dict()
                for e in self.state.meter_events
                if event_name is None or e.event_name == event_name
            ]

    def requests(self) -> list[dict[str, Any]]:
        """Every API request answered, oldest first."""
        with self.state.lock:
            return copy.deepcopy(self.state.requests)

    def events(self, event_type: str | None = None) -> list[dict[str, Any]]:
        """Emitted events, oldest first; `event_type` may end in `*`."""
        with self.state.lock:
            found = reversed(self.state.all("event"))
            return [
                copy.deepcopy(e)
                for e in found
                if event_type is None or type_matches(e["type"], event_type)
            ]

    def deliver(self, event_ids: list[str]) -> list[dict[str, Any]]:
        """Deliver these events now, in this order (one attempt each, also when delivered
        before); the attempts. ValueError without an endpoint or for an unknown event."""
        with self.state.lock:
            chosen = []
            for event_id in event_ids:
                event = self.state.find("event", event_id)
                if event is None:
                    raise ValueError(f"no such event: {event_id}")
                chosen.append(copy.deepcopy(event))
        return self.webhooks.deliver(chosen)

    def replay(self, event_id: str) -> dict[str, Any]:
        """Deliver one event again (same id, same payload); the attempt."""
        return self.deliver([event_id])[0]

    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery attempt, oldest first: event, type, attempt, status, error, ok."""
        return self.webhooks.attempts()

    def wait_for_webhooks(self, timeout: float = 10.0) -> None:
        """Wait until automatic deliveries (with their retries) are done."""
        if not self.webhooks.wait_idle(timeout):
            raise TimeoutError(f"webhook deliveries still pending after {timeout}s")

    def advance_clock(self, seconds: int) -> int:
        """Move the emulator's clock forward (past the 24-hour windows); the new time."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        with self.state.lock:
            self.state.clock_offset += seconds
            self.save_state()
            return self.state.now()

    def complete_checkout(self, session_id: str) -> dict[str, Any]:
        """What the hosted page's Pay button does."""
        return self._locked(sessions.checkout_session_complete, session_id)

    def close_period(self, subscription_id: str) -> dict[str, Any]:
        """Invoice the subscription's current period (a draft) and start the next one."""
        return self._locked(invoices.period_close, subscription_id)

    def pause_subscription(self, subscription_id: str) -> dict[str, Any]:
        """Its trial ended with no payment method, set to pause then (status `paused`;
        `customer.subscription.paused`, `customer.subscription.updated`)."""
        return self._locked(subscriptions.subscription_pause, subscription_id)

    def finalize_invoice(self, invoice_id: str) -> dict[str, Any]:
        """draft → open (`invoice.finalized`)."""
        return self._locked(invoices.invoice_finalize, invoice_id)

    def pay_invoice(self, invoice_id: str) -> dict[str, Any]:
        """The payment succeeds (`invoice.paid`)."""
        return self._locked(invoices.invoice_pay, invoice_id)

    def pay_invoices_at_once(self, invoice_ids: list[str]) -> list[dict[str, Any]]:
        """One payment pays each of the invoices, as a customer paying several at once does
        (`invoice.paid` for each)."""
        with self.state.lock:
            result = copy.deepcopy(invoices.invoices_pay(self.state, invoice_ids))
            self.save_state()
            return result

    def fail_invoice(self, invoice_id: str) -> dict[str, Any]:
        """The payment fails (`invoice.payment_failed`; the subscription goes past_due)."""
        return self._locked(invoices.invoice_fail, invoice_id)

    def void_invoice(self, invoice_id: str) -> dict[str, Any]:
        """An open invoice voided (`invoice.voided`, `invoice.updated`)."""
        return self._locked(invoices.invoice_void, invoice_id)

    def delete_draft(self, invoice_id: str) -> dict[str, Any]:
        """A draft invoice deleted (`invoice.deleted`)."""
        return self._locked(invoices.invoice_draft_delete, invoice_id)

    def refund_invoice(self, invoice_id: str, amount: int | None = None) -> dict[str, Any]:
        """A paid invoice's payment refunded, in full or `amount` of it, without a credit note,
        as Stripe's dashboard refunds a payment (`charge.refunded`); the refund."""
        with self.state.lock:
            result = copy.deepcopy(payments.invoice_refund(self.state, invoice_id, amount))
            self.save_state()
            return result

    def create_credit_note(self, invoice_id: str, **fields: Any) -> dict[str, Any]:
        """A credit note of the invoice, as `POST /v1/credit_notes` makes one (`amount`,
        `refund_amount`, `credit_amount`, `out_of_band_amount`, `reason`, `memo`)."""
        params = {key: str(value) for key, value in fields.items()}
        with self.state.lock:
            made = credit_notes.credit_note_create(
                self.state, Params({"invoice": invoice_id, **params})
            )
            self.save_state()
            return copy.deepcopy(made)

    def void_credit_note(self, credit_note_id: str) -> dict[str, Any]:
        """An issued credit note of an open invoice voided (`credit_note.voided`)."""
        with self.state.lock:
            made = credit_notes.credit_note_void(self.state, Params({}), credit_note_id)
            self.save_state()
            return copy.deepcopy(made)

    def _locked(self, action: Callable[[State, str], dict[str, Any]], object_id: str) -> Any:
        with self.state.lock:
            result = copy.deepcopy(action(self.state, object_id))
            self.save_state()
            return result
