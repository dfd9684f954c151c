"""Webhook delivery: events signed as Stripe signs them, POSTed in a background thread with
retries, or held back and delivered on request, in any order, as often as asked."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("stripe_emulator.webhooks")

TIMEOUT = 10.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # Stripe does not follow a webhook endpoint's redirect: a 3xx is a failed delivery.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def sign(payload: bytes, secret: str, timestamp: int) -> str:
    """The `Stripe-Signature` header: `t=<ts>,v1=<hex HMAC-SHA256 of "{t}.{body}">`."""
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


@dataclass
class Endpoint:
    """Where events go. With auto_deliver off, events wait for `deliver()`."""

    url: str
    secret: str
    auto_deliver: bool = True
    retries: int = 3  # attempts after the first, for automatic deliveries
    retry_delay: float = 0.5  # seconds before the first retry; doubles each time

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("the webhook url must be http:// or https://")
        if not self.secret.startswith("whsec_"):
            raise ValueError("the webhook secret must start with whsec_")
        if self.retries < 0 or self.retry_delay < 0:
            raise ValueError("retries and retry_delay must not be negative")

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values."""
        return {
            "url": self.url,
            "secret": self.secret,
            "auto_deliver": self.auto_deliver,
            "retries": self.retries,
            "retry_delay": self.retry_delay,
        }


class WebhookSender:
    """One endpoint, one delivery thread; every attempt is recorded for tests to read."""

    def __init__(self) -> None:
        self.endpoint: Endpoint | None = None
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._attempts: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the delivery thread."""
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="stripe-emulator-webhooks", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop delivering (what is still queued is dropped) and join the thread."""
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT + 5)
            self._thread = None

    def configure(self, endpoint: Endpoint | None) -> None:
        """Set or (with None) remove the endpoint; applies to events emitted from now on."""
        with self._lock:
            self.endpoint = endpoint

    def clear(self) -> None:
        """Forget recorded attempts (the endpoint stays)."""
        with self._lock:
            self._attempts.clear()

    # ---- delivery --------------------------------------------------------------------------

    def enqueue(self, event: dict[str, Any]) -> None:
        """Called for every new event: queued when an endpoint takes automatic deliveries."""
        with self._lock:
            if self.endpoint is None or not self.endpoint.auto_deliver:
                return
            self._pending += 1
        self._queue.put(event)

    def deliver(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Deliver these events now, in this order, one attempt each; the attempts made."""
        endpoint = self._endpoint()
        return [self._attempt(endpoint, event, 1) for event in events]

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every queued delivery (retries included) is done; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def attempts(self) -> list[dict[str, Any]]:
        """Every delivery attempt so far, oldest first."""
        with self._lock:
            return [dict(a) for a in self._attempts]

    def _endpoint(self) -> Endpoint:
        with self._lock:
            if self.endpoint is None:
                raise ValueError("no webhook endpoint is set")
            return self.endpoint

    def _run(self) -> None:
        while not self._stop.is_set():
            event = self._queue.get()
            if event is None:
                continue
            try:
                self._deliver_with_retries(event)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _deliver_with_retries(self, event: dict[str, Any]) -> None:
        with self._lock:
            endpoint = self.endpoint
        if endpoint is None:
            return
        delay = endpoint.retry_delay
        attempts = endpoint.retries + 1
        for attempt in range(1, attempts + 1):
            if self._attempt(endpoint, event, attempt)["ok"] or attempt == attempts:
                return
            if self._stop.wait(delay):
                return
            delay *= 2

    def _attempt(self, endpoint: Endpoint, event: dict[str, Any], attempt: int) -> dict[str, Any]:
        body = json.dumps(event, indent=2).encode()
        request = urllib.request.Request(  # noqa: S310 - the endpoint is http(s), checked above
            endpoint.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json; charset=utf-8",
                "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
                "Stripe-Signature": sign(body, endpoint.secret, int(time.time())),
            },
        )
        status: int | None = None
        error: str | None = None
        try:
            with _OPENER.open(request, timeout=TIMEOUT) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (OSError, ValueError) as exc:  # unreachable, refused, timed out, malformed URL
            error = str(exc)
        ok = status is not None and 200 <= status < 300
        record = {
            "event": event["id"],
            "type": event["type"],
            "attempt": attempt,
            "status": status,
            "error": error,
            "ok": ok,
            "at": time.time(),
        }
        if not ok:
            log.info(
                "webhook %s %s attempt %d failed: %s",
                event["id"],
                event["type"],
                attempt,
                error or status,
            )
        with self._lock:
            self._attempts.append(record)
        return record
