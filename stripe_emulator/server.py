"""The HTTP/1.1 front end: Stripe's API (key, faults, idempotency), the hosted pages, and the
control API. One lock serializes every read and write of the state."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from .control import CONTROL
from .errors import StripeError
from .forms import Params, parse_form
from .idempotency import Saved
from .routes import API, PAGES, Page, resolve
from .state import API_VERSION, new_id

if TYPE_CHECKING:
    from .api import StripeEmulator
    from .faults import Fault

log = logging.getLogger("stripe_emulator.http")

MAX_BODY = 1024 * 1024
TEST_KEY_PREFIXES = ("sk_test_", "rk_test_")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], emulator: StripeEmulator) -> None:
        self.emulator = emulator
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(addr, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def close_all(self) -> None:
        """Cut keep-alive connections (the SDK keeps them) so their threads end."""
        with self.sockets_lock:
            socks = list(self.open_sockets)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def make_server(emulator: StripeEmulator, host: str, port: int) -> _Server:
    """A bound, not yet serving, HTTP server."""
    return _Server((host, port), emulator)


def mask(api_key: str) -> str:
    """A key as Stripe prints it in errors: its prefix and last four characters."""
    prefix = api_key[:8] if api_key.startswith(TEST_KEY_PREFIXES) else ""
    return f"{prefix}{'*' * max(len(api_key) - len(prefix) - 4, 0)}{api_key[-4:]}"


class Handler(BaseHTTPRequestHandler):
    """One request: an API call, a hosted page, or a control call."""

    protocol_version = "HTTP/1.1"
    server_version = "stripe-emulator"
    disable_nagle_algorithm = True
    server: _Server

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # _handle logs one line per request.
        pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- dispatch --------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        started = time.monotonic()
        self.status = 0
        self.request_id = new_id("req_", 14)
        try:
            self._answer(method)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (a timeout while a fault hung): nothing to answer.
            self.close_connection = True
        log.debug(
            "%s %s %s %.1fms", method, self.path, self.status, (time.monotonic() - started) * 1000
        )

    def _answer(self, method: str) -> None:
        try:
            body = self._read_body()
            url = urlsplit(self.path)
            if url.path.startswith("/_emulator/"):
                self._control(method, url.path, url.query, body)
            elif url.path.startswith("/v1/"):
                self._api(method, url.path, url.query, body)
            else:
                self._page(method, url.path)
        except StripeError as err:
            self._send_json(err.status, err.body(), err.headers())
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception:  # a bug in the emulator must not stop it serving
            log.exception("internal error on %s %s", method, self.path)
            err = StripeError(500, "The emulator failed on this request.", type="api_error")
            self._send_json(500, err.body())

    def _read_body(self) -> str:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            raise StripeError(413, "Request body too large.")
        return self.rfile.read(length).decode("utf-8", "replace") if length else ""

    @property
    def emulator(self) -> StripeEmulator:
        return self.server.emulator

    # ---- Stripe's API ----------------------------------------------------------------------

    def _api(self, method: str, path: str, query: str, body: str) -> None:
        api_key = self._api_key()
        self._fault(method, path)
        handler, args = resolve(API, method, path)
        data = parse_form(query if method in ("GET", "DELETE") else body)
        key = self.headers.get("Idempotency-Key") if method == "POST" else None
        state = self.emulator.state
        with state.lock:
            try:
                status, payload, replayed = self._execute(api_key, key, path, handler, args, data)
            except StripeError as err:
                self._record(path, data, key, err.status)
                raise
            self._record(path, data, key, status, replayed=replayed)
            if method != "GET" and not replayed:
                self.emulator.save_state()
        headers = {"Idempotent-Replayed": "true"} if replayed else {}
        if key:
            headers["Idempotency-Key"] = key
        self._send_bytes(status, "application/json", payload, headers)

    def _execute(
        self,
        api_key: str,
        key: str | None,
        path: str,
        handler: Any,
        args: tuple[str, ...],
        data: Any,
    ) -> tuple[int, bytes, bool]:
        """Run the handler, or replay what it answered for this idempotency key."""
        state, keys = self.emulator.state, self.emulator.idempotency
        fingerprint = keys.fingerprint(self.command, path, data)
        if key:
            saved = keys.lookup(api_key, key, fingerprint, state.now())
            if saved is not None:
                return saved.status, saved.body, True
        result = handler(state, Params(data), *args)
        payload = json.dumps(result, indent=2).encode()
        if key:
            keys.save(api_key, key, Saved(fingerprint, 200, payload, state.now()))
        return 200, payload, False

    def _api_key(self) -> str:
        """The bearer key; Stripe's 401 when it is missing, not a test key, or not ours."""
        header = self.headers.get("Authorization") or ""
        scheme, _, api_key = header.partition(" ")
        if scheme.lower() != "bearer" or not api_key.strip():
            raise StripeError(
                401,
                "You did not provide an API key. You need to provide your API key in the "
                "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
                "YOUR_SECRET_KEY').",
            )
        api_key = api_key.strip()
        expected = self.emulator.api_key
        if not api_key.startswith(TEST_KEY_PREFIXES) or (expected and api_key != expected):
            raise StripeError(401, f"Invalid API Key provided: {mask(api_key)}")
        return api_key

    def _fault(self, method: str, path: str) -> None:
        """Answer with an injected fault, before anything is read or written."""
        fault: Fault | None = self.emulator.fault_rules.take(method, path)
        if fault is None:
            return
        if fault.hang:
            self.emulator.stopping.wait(fault.hang)
        with self.emulator.state.lock:
            self._record(path, None, self.headers.get("Idempotency-Key"), fault.status, fault=True)
        raise fault.error()

    def _record(
        self,
        path: str,
        params: Any,
        key: str | None,
        status: int,
        *,
        replayed: bool = False,
        fault: bool = False,
    ) -> None:
        """Keep the request for `requests()`; called under the state lock."""
        self.emulator.state.requests.append(
            {
                "method": self.command,
                "path": path,
                "params": params,
                "idempotency_key": key,
                "status": status,
                "replayed": replayed,
                "fault": fault,
            }
        )

    # ---- hosted pages ----------------------------------------------------------------------

    def _page(self, method: str, path: str) -> None:
        self._fault(method, path)
        handler, args = resolve(PAGES, method, path)
        state = self.emulator.state
        with state.lock:
            page: Page = handler(state, *args)
            if method == "POST":  # the Pay button
                self.emulator.save_state()
        headers = {"Location": page.location} if page.location else {}
        self._send_bytes(page.status, page.content_type, page.body, headers)

    # ---- control ---------------------------------------------------------------------------

    def _control(self, method: str, path: str, query: str, body: str) -> None:
        handler, args = resolve(CONTROL, method, path)
        try:
            data = json.loads(body) if body.strip() else dict(parse_qsl(query))
        except ValueError:
            raise StripeError(400, "The control API takes a JSON body.") from None
        if not isinstance(data, dict):
            raise StripeError(400, "The control API takes a JSON object.")
        try:
            result = handler(self.emulator, data, *args)
        except (ValueError, TypeError) as exc:
            raise StripeError(400, str(exc)) from None
        self._send_json(200, result)

    # ---- responses -------------------------------------------------------------------------

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, "application/json", json.dumps(body, indent=2).encode(), headers)

    def _send_bytes(
        self, status: int, content_type: str, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", self.request_id)
        self.send_header("Stripe-Version", self.headers.get("Stripe-Version") or API_VERSION)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
