"""Servers the tests point clients at: a real SMTP server (aiosmtpd) that records what it
accepts and can answer an error first, an address that takes connections and never answers
(a hung mail server, a hung Redis, a hung cluster), an HTTP relay that can hold one answer
back (a slow network between a worker and Stripe), and a gate in front of a server that can
refuse connections for a while (a cluster's API server unreachable)."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from aiosmtpd.controller import Controller


class Recorder:
    """An SMTP server's handler: each DATA is an attempt; the first ones get `data_replies`
    (a 4xx, say) while any remain, then each message is accepted and kept. Recipients in
    `refused` get a 550 at RCPT."""

    def __init__(self, data_replies: list[str] | None = None, refused: set[str] | None = None):
        self.data_replies = list(data_replies or [])
        self.refused = refused or set()
        self.attempts = 0
        self.recipients_tried: list[str] = []
        self.messages: list = []
        self.connections: set = set()  # the client's (address, port) of each connection

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        self.connections.add(session.peer)
        self.recipients_tried.append(address)
        if address in self.refused:
            return "550 5.1.1 No such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.attempts += 1
        if self.data_replies:
            return self.data_replies.pop(0)
        message = message_from_bytes(envelope.content, policy=policy.default)
        self.messages.append((list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


@contextmanager
def smtp_server(settings, handler: Recorder):
    """A real SMTP server on a free local port, Django's SMTP backend pointed at it."""
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    try:
        yield handler
    finally:
        controller.stop()


class Blackhole:
    """A mail server's address that takes connections and never says a word (a hung server,
    or one behind a firewall that drops what it sends)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread waiting in accept()
        self.sock.close()
        for conn in self.accepted:
            conn.close()

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def blackhole_server(settings):
    """Django's SMTP backend pointed at a Blackhole, with a timeout far longer than a test
    waits."""
    with Blackhole() as hole:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", hole.port
        settings.EMAIL_TIMEOUT = 120
        yield hole


# What kube-apiserver answers a request it has no capacity for, with a 503: for a relay to
# answer in its place (`Relay.garble`).
UNAVAILABLE_SAID = "the server is currently unable to handle the request"
UNAVAILABLE = json.dumps({
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
    "reason": "ServiceUnavailable", "message": UNAVAILABLE_SAID,
}).encode()  # fmt: skip


class Relay:
    """An HTTP relay to `upstream` on a free local port (`url`): `hold(pattern)` makes the next
    request whose path matches wait — answered, once `release()` is called, with what the
    upstream said when it was asked — as a slow network delivers an answer late (with
    `before`, it waits before the upstream is asked, as a request the network delivers late
    does; with `method`, only a request of that method matches);
    `garble(pattern, body)` answers the next one with `body` (or `body(path)`) in place of what
    the upstream said (its status kept, unless `status` is given; the `times` next ones with
    `times`), as a proxy in front of it that mangles an answer does, or a server that fails a
    request (with `before`, the upstream is not asked: a server that refuses it)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.pattern: re.Pattern | None = None
        self.method: str | None = None
        self.before = False
        self.garbled: tuple[re.Pattern, bytes | Callable[[str], bytes], int | None] | None = None
        self.garbled_before = False
        self.garbles_left = 0
        self.holding = threading.Event()
        self.released = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                held = (
                    relay.pattern is not None
                    and relay.method in (None, self.command)
                    and relay.pattern.search(self.path)
                )
                if held:
                    relay.pattern = None
                    if relay.before:
                        relay.holding.set()
                        relay.released.wait(30)
                garbled = relay.garbled is not None and relay.garbled[0].search(self.path)
                if garbled and relay.garbled_before:
                    status, headers, data = 200, [("Content-Type", "application/json")], b""
                else:
                    upstream = http.client.HTTPConnection(
                        relay.upstream.hostname, relay.upstream.port
                    )
                    sent = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    upstream.request(self.command, self.path, body=body, headers=sent)
                    answer = upstream.getresponse()
                    status, headers, data = answer.status, answer.getheaders(), answer.read()
                    upstream.close()
                if held and not relay.before:
                    relay.holding.set()
                    relay.released.wait(30)
                if garbled:
                    body, status = relay.garbled[1], relay.garbled[2] or status
                    data = body(self.path) if callable(body) else body
                    relay.garbles_left -= 1
                    if not relay.garbles_left:
                        relay.garbled = None
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = relay

        return Handler

    def hold(self, pattern: str, *, before: bool = False, method: str | None = None) -> None:
        self.holding.clear()
        self.released.clear()
        self.before, self.method = before, method
        self.pattern = re.compile(pattern)

    def release(self) -> None:
        self.released.set()

    def garble(
        self,
        pattern: str,
        body: bytes | Callable[[str], bytes],
        *,
        status: int | None = None,
        times: int = 1,
        before: bool = False,
    ) -> None:
        self.garbled, self.garbles_left = (re.compile(pattern), body, status), times
        self.garbled_before = before

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Gate:
    """A TCP forwarder in front of a local server's port. `close()` stops listening (the gate's
    address refuses connections, as an unreachable API server's does) and drops the
    connections open through it; `open()` listens again on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = 0
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.open()

    @property
    def closed(self) -> bool:
        return self.listener is None

    def open(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        sock.listen(64)
        self.listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread waiting in accept()
        self.listener.close()
        self.listener = None
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        self.conns = []

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.close()


def kubeconfig(server: str) -> dict:
    """A kubeconfig (as a mapping) for the cluster at `server` (`http://host:port`)."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
