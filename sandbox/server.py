"""The HTTP/1.1 front end: routing, content negotiation, watch streaming, faults."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import re
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import yaml

from . import errors as E
from . import metrics
from .core import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, Ctx
from .patch import json_patch, merge_patch
from .resources import ResourceType
from .table import to_table

if TYPE_CHECKING:
    from .api import Sandbox

log = logging.getLogger("sandbox.http")

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's request body limit
GIT_VERSION = "v1.34.0"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], sandbox: Sandbox) -> None:
        self.sandbox = sandbox
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
        """Cut keep-alive and watch connections so their threads end."""
        with self.sockets_lock:
            socks = list(self.open_sockets)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class Handler(BaseHTTPRequestHandler):
    """One request of the Kubernetes API (or of the sandbox control API)."""

    protocol_version = "HTTP/1.1"
    server_version = "sandbox"
    # Headers and body go out as separate writes: without this, Nagle's algorithm and the
    # client's delayed ACK cost 40 ms per request.
    disable_nagle_algorithm = True
    server: _Server

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # _handle already logs one line per request.
        pass

    def log_message(self, format: str, *args: Any) -> None:
        # Only http.server's own complaints (malformed request lines) get here.
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing --------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        self.warnings: list[str] = []
        self.sent = False
        self.body: bytes | None = None
        self.duplicates: list[str] = []
        started = time.monotonic()
        status = 0
        try:
            # Read the body first: an early error must not leave it in a keep-alive stream.
            self.body = self._receive_body()
            status = self._route(method)
        except E.ApiError as err:
            status = err.code
            if self.sent:
                self.close_connection = True
            else:
                extra = {"Retry-After": "1"} if err.code == 429 else None
                self._send_json(err.code, err.status(), extra)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a 500 is a bug, but the server must keep serving
            log.exception("internal error on %s %s", method, self.path)
            status = 500
            err = E.ApiError(500, "InternalError", f"Internal error occurred: {exc}")
            if not self.sent:
                self._send_json(500, err.status())
        log.debug("%s %s %s %.1fms", method, self.path, status, (time.monotonic() - started) * 1000)

    def _send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        for warning in self.warnings:
            quoted = warning.replace("\\", "\\\\").replace('"', '\\"')
            self.send_header("Warning", f'299 - "{quoted}"')
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.sent = True

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.sent = True

    def _read_body(self) -> bytes:
        return self.body or b""

    def _receive_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        if not length:
            return b""
        try:
            size = int(length)
        except ValueError:
            raise E.bad_request("invalid Content-Length") from None
        if size > MAX_BODY:
            self.close_connection = True
            # Drain what the client sends so it reads our answer instead of a broken pipe.
            remaining = min(size, 16 * MAX_BODY)
            while remaining > 0:
                chunk = self.rfile.read(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)
            raise E.ApiError(
                413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}"
            )
        return self.rfile.read(size)

    def _read_chunked(self) -> bytes:
        data = b""
        while True:
            line = self.rfile.readline()
            size = int(line.strip().split(b";")[0] or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return data
            data += self.rfile.read(size)
            self.rfile.readline()
            if len(data) > MAX_BODY:
                self.close_connection = True
                raise E.ApiError(
                    413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}"
                )

    def _decode(self, raw: bytes, content_type: str) -> Any:
        """Parse a request body as JSON, or YAML when the content type says so."""
        if not raw.strip():
            raise E.bad_request("the body of the request was empty")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise E.bad_request("the body of the request is not valid UTF-8") from None
        # JSON is YAML too, but a YAML reader turns a JSON escape such as "\ud83d\ude00" into
        # two surrogate halves: a body that parses as JSON is read as JSON, whatever its type.
        try:
            body = json.loads(text, object_pairs_hook=self._pairs)
        except json.JSONDecodeError as exc:
            if "yaml" not in content_type:
                raise E.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
            self.duplicates.clear()
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise E.bad_request(f"error converting YAML to JSON: yaml: {exc}") from None
        # A lone surrogate escape ("\ud800") is not a character: Go's decoder, and so the API
        # server, reads it as U+FFFD.
        return _without_surrogates(body) if "\\u" in text.lower() else body

    def _pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # Duplicate keys are kept last-wins, as Go does, and reported for fieldValidation.
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                self.duplicates.append(key)
            out[key] = value
        return out

    # ---- routing ---------------------------------------------------------------------------

    def _route(self, method: str) -> int:
        sb = self.server.sandbox
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = [p for p in url.path.split("/") if p]
        if parts[:2] == ["sandbox", "v1"]:
            return self._control(method, parts[2:])
        if parts in (["healthz"], ["livez"], ["readyz"]):
            self._send_text(200, "ok")
            return 200
        if sb.token and self.headers.get("Authorization") != f"Bearer {sb.token}":
            raise E.ApiError(401, "Unauthorized", "Unauthorized")
        if method == "GET":
            found = self._discovery(parts)
            if found is not None:
                self._faults(method, query)  # an API server fails discovery as any request
                self._send_json(200, found)
                return 200
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise E.path_not_found()
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        elif len(rest) == 2 and rest[0] == "namespaces" and method != "POST":
            pass
        if not rest or len(rest) > 3:
            raise E.path_not_found()
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if (group, version) == (metrics.GROUP, metrics.VERSION):
            return self._metrics(method, plural, ns, name, sub, query)
        if (group, plural, sub) == ("", "pods", "log") and ns is not None:
            if method != "GET":
                raise E.method_not_allowed()
            self._faults(method, query)
            return self._pod_log(ns, name, query)
        with sb.core.lock:
            rt = sb.core.resolve(group, version, plural)
        if rt is None:
            raise E.path_not_found()
        if rt.namespaced and ns is None and name:
            raise E.path_not_found()
        if not rt.namespaced and ns is not None:
            raise E.path_not_found()
        if sub and not (
            (sub == "status" and rt.status) or (sub == "scale" and rt.scale is not None)
        ):
            raise E.path_not_found()
        self._faults(method, query)
        return self._resource(method, rt, ns or "", name, sub, query, ns is None)

    def _faults(self, method: str, query: dict[str, str]) -> None:
        faults = self.server.sandbox.faults
        if faults.latency_ms:
            time.sleep(faults.latency_ms / 1000)
        if faults.roll(faults.error_429):
            raise E.ApiError(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                {"retryAfterSeconds": 1},
            )
        if faults.roll(faults.error_503):
            raise E.ApiError(
                503, "ServiceUnavailable", "the server is currently unable to handle the request"
            )
        if faults.roll(faults.error_500):
            raise E.ApiError(
                500,
                "InternalError",
                "Internal error occurred: sandbox fault injection",
                {"causes": [{"message": "sandbox fault injection"}]},
            )
        if method in ("PUT", "PATCH") and faults.roll(faults.conflict):
            parts = [p for p in urlsplit(self.path).path.split("/") if p]
            raise E.ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled: {E.MODIFIED}",
                {"name": parts[-1] if parts else ""},
            )

    def _ctx(self, query: dict[str, str]) -> Ctx:
        dry = query.get("dryRun", "")
        if dry and dry != "All":
            raise E.bad_request(f"Unsupported dry run value: {dry}")
        fv = query.get("fieldValidation", "Warn") or "Warn"
        if fv not in ("Strict", "Warn", "Ignore"):
            raise E.bad_request(f"fieldValidation must be one of Ignore, Warn or Strict, got {fv}")
        ctx = Ctx(
            field_manager=query.get("fieldManager", ""),
            dry_run=dry == "All",
            field_validation=fv,
            user_agent=self.headers.get("User-Agent", ""),
            force=_truthy(query.get("force")),
        )
        ctx.warnings = self.warnings
        ctx.duplicates = self.duplicates
        return ctx

    def _resource(
        self,
        method: str,
        rt: ResourceType,
        ns: str,
        name: str,
        sub: str,
        query: dict[str, str],
        all_namespaces: bool,
    ) -> int:
        core = self.server.sandbox.core
        content_type = (
            (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        )
        if method == "GET":
            if name:
                obj = core.get_scale(rt, ns, name) if sub == "scale" else core.get(rt, ns, name)
                return self._reply(200, rt, obj)
            scope = None if all_namespaces else ns
            if _truthy(query.get("watch")):
                return self._watch(rt, scope, query)
            listed = core.list(
                rt,
                scope,
                query.get("labelSelector"),
                query.get("fieldSelector"),
                _int(query.get("limit"), "limit"),
                query.get("continue") or None,
            )
            return self._reply(200, rt, listed, is_list=True)
        if method == "DELETE":
            if sub:  # /status and /scale are read and written, never deleted
                raise E.method_not_allowed()
            options = {}
            raw = self._read_body()
            if raw.strip():
                options = self._decode(raw, content_type)
                if not isinstance(options, dict):
                    raise E.bad_request("the body of a delete must be DeleteOptions")
            policy = query.get("propagationPolicy") or options.get("propagationPolicy")
            if options.get("orphanDependents") is True:
                policy = "Orphan"
            if policy and policy not in ("Orphan", "Background", "Foreground"):
                raise E.invalid_object(
                    "DeleteOptions",
                    "meta.k8s.io",
                    "",
                    [
                        E.FieldError(
                            "FieldValueNotSupported",
                            "propagationPolicy",
                            value=policy,
                            supported=["Foreground", "Background", "Orphan", "nil"],
                        )
                    ],
                )
            dry = query.get("dryRun") == "All" or options.get("dryRun") == ["All"]
            if not name:
                scope = None if all_namespaces else ns
                listed = core.delete_collection(
                    rt, scope, query.get("labelSelector"), query.get("fieldSelector"), policy, dry
                )
                return self._reply(200, rt, listed, is_list=True)
            code, obj = core.delete(rt, ns, name, policy, dry, options.get("preconditions"))
            return self._reply(code, rt, obj)
        raw = self._read_body()
        if method == "POST":
            if name:
                raise E.method_not_allowed()
            self._check_content_type(content_type)
            obj = core.create(rt, ns, self._decode(raw, content_type), self._ctx(query))
            return self._reply(201, rt, obj)
        if not name:
            raise E.method_not_allowed()
        if method == "PUT":
            self._check_content_type(content_type)
            body = self._decode(raw, content_type)
            if sub == "scale":
                replicas, rv = _scale_fields(body)
                obj = core.set_scale(rt, ns, name, replicas, rv, self._ctx(query))
                return self._reply(200, rt, obj)
            obj = core.update(rt, ns, name, body, self._ctx(query), sub)
            return self._reply(200, rt, obj)
        if method == "PATCH":
            ctx = self._ctx(query)
            if content_type != APPLY_PATCH and ctx.force:
                raise E.invalid_object(
                    "PatchOptions",
                    "meta.k8s.io",
                    "",
                    [
                        E.FieldError(
                            "FieldValueForbidden",
                            "force",
                            "may not be specified for non-apply patch",
                        )
                    ],
                )
            if content_type not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH):
                # Refused before the body is parsed, with the media types the kind accepts.
                core.patch(rt, ns, name, content_type, None, ctx, sub)
            body = self._decode(raw, "yaml" if content_type == APPLY_PATCH else content_type)
            if sub == "scale":
                current = core.get_scale(rt, ns, name)
                patched = (
                    json_patch(current, body)
                    if content_type == JSON_PATCH
                    else merge_patch(current, body)
                )
                replicas, rv = _scale_fields(patched)
                obj = core.set_scale(rt, ns, name, replicas, rv, ctx)
                return self._reply(200, rt, obj)
            created = content_type == APPLY_PATCH and not _exists(core, rt, ns, name)
            obj = core.patch(rt, ns, name, content_type, body, ctx, sub)
            return self._reply(201 if created else 200, rt, obj)
        raise E.method_not_allowed()

    def _check_content_type(self, content_type: str) -> None:
        if content_type not in ("application/json", "application/yaml", "*/*", ""):
            raise E.unsupported_media_type(
                content_type,
                ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"],
            )

    def _reply(
        self, code: int, rt: ResourceType, obj: dict[str, Any], is_list: bool = False
    ) -> int:
        accept = self.headers.get("Accept", "")
        if "as=Table" in accept and obj.get("kind") not in ("Status", "Scale"):
            query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
            include = query.get("includeObject", "Metadata")
            items = obj["items"] if is_list else [obj]
            meta = obj.get("metadata") or {}
            obj = to_table(
                rt, items, meta.get("resourceVersion", ""), include, meta.get("continue")
            )
        self._send_json(code, obj)
        return code

    def _watch(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> int:
        sb = self.server.sandbox
        timeout = _int(query.get("timeoutSeconds"), "timeoutSeconds") or None
        events = sb.core.watch(
            rt,
            ns,
            query.get("resourceVersion"),
            query.get("labelSelector"),
            query.get("fieldSelector"),
            float(timeout) if timeout else None,
            _truthy(query.get("allowWatchBookmarks")),
            send_initial=_truthy(query.get("sendInitialEvents")),
        )
        self.watch_table = None
        if "as=Table" in self.headers.get("Accept", ""):
            self.watch_table = (rt, query.get("includeObject", "Metadata"))
        # Headers go out at once, as kube-apiserver sends them: a client may wait for them
        # before it makes the change it is watching for.
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.sent = True
        drop = sb.faults.roll(sb.faults.drop_watch)
        started = time.monotonic()
        try:
            for event in events:
                self._chunk(event)
                if drop and time.monotonic() - started > 0.05:
                    # Fault injection: cut the stream without the terminating chunk.
                    self.close_connection = True
                    return 200
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            events.close()
        return 200

    def _chunk(self, event: Any) -> None:
        obj = event.object
        if self.watch_table is not None and event.type in ("ADDED", "MODIFIED", "DELETED"):
            # kubectl get -w asks for Tables: each event carries a one-row Table.
            rt, include = self.watch_table
            obj = to_table(rt, [obj], obj["metadata"].get("resourceVersion", ""), include)
        data = json.dumps({"type": event.type, "object": obj}, separators=(",", ":")).encode()
        self._write_chunk(data + b"\n")

    def _pod_fault(self, method: str, ns: str, name: str, content_type: str) -> int:
        """POST fails a pod (`{"seconds": 30}`, null: until cleared); DELETE clears it."""
        sb = self.server.sandbox
        if method == "DELETE":
            cleared = sb.pod_fail_clear(ns, name)
            self._send_json(200, {"namespace": ns, "name": name, "cleared": cleared})
            return 200
        if method not in ("POST", "PUT"):
            raise E.method_not_allowed()
        raw = self._read_body()
        body = self._decode(raw, content_type) if raw.strip() else {}
        if not isinstance(body, dict):
            raise E.bad_request("the body must be a JSON object")
        seconds = body.get("seconds", 60.0)
        valid = seconds is None or (
            isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0
        )
        if not valid:
            raise E.bad_request("seconds must be a positive number or null")
        sb.pod_fail(ns, name, seconds=seconds)
        self._send_json(200, {"namespace": ns, "name": name, "seconds": seconds})
        return 200

    # ---- metrics.k8s.io and pod logs --------------------------------------------------------

    def _metrics(
        self, method: str, plural: str, ns: str | None, name: str, sub: str, query: dict[str, str]
    ) -> int:
        """PodMetrics get and list, as metrics-server serves them through the aggregator."""
        if plural != "pods" or sub or (name and ns is None):
            raise E.path_not_found()
        if method != "GET":
            raise E.method_not_allowed()
        self._faults(method, query)
        core = self.server.sandbox.core
        if name:
            self._send_json(200, metrics.get_pod_metrics(core, ns or "", name))
        else:
            listed = metrics.list_pod_metrics(
                core, ns, query.get("labelSelector"), query.get("fieldSelector")
            )
            self._send_json(200, listed)
        return 200

    def _pod_log(self, ns: str, name: str, query: dict[str, str]) -> int:
        """`GET pods/{name}/log`: what the kubelet keeps of a container's output."""
        core = self.server.sandbox.core
        options = _log_options(name, query)
        pod = core.get(core.builtin("pods"), ns, name)
        container = _log_container(pod, query.get("container", ""))
        if options.previous and not _restarted(pod, container):
            raise E.bad_request(
                f'previous terminated container "{container}" in pod "{name}" not found'
            )
        kept = core.logs.open(ns, name, pod["metadata"]["uid"], container)
        with core.lock:
            current = core.store.get(core.builtin("pods").key, ns, name)
            if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
                core.logs.drop(ns, name)  # deleted meanwhile: what it wrote, then the end
        lines = core.logs.after(kept, 0)
        last = lines[-1].seq if lines else 0
        if options.since_seconds is not None:
            since_ns = time.time_ns() - options.since_seconds * 1_000_000_000
            lines = [line for line in lines if line.time_ns >= since_ns]
        if options.tail_lines is not None:
            lines = lines[len(lines) - options.tail_lines :] if options.tail_lines else []
        budget = options.limit_bytes
        text, budget = _log_text(lines, options.timestamps, budget)
        if not options.follow:
            self._send_text(200, text)
            return 200
        # Streamed like the kubelet's follow: chunks as lines are written, until the pod goes.
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.sent = True
        try:
            self._write_chunk(text.encode())
            while budget != 0 and not core.closing:
                new = core.logs.after(kept, last)
                if new:
                    last = new[-1].seq
                    text, budget = _log_text(new, options.timestamps, budget)
                    self._write_chunk(text.encode())
                    continue
                if kept.dropped:
                    break  # the pod is gone, and all it wrote was sent
                if self._client_gone():
                    self.close_connection = True
                    return 200
                core.logs.wait(0.5)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        return 200

    def _write_chunk(self, data: bytes) -> None:
        """One chunk of a chunked response (an empty one would end it, so none is sent)."""
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _client_gone(self) -> bool:
        """True once the client closed a streamed response (it sends nothing while reading)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # ---- discovery -------------------------------------------------------------------------

    def _discovery(self, parts: list[str]) -> dict[str, Any] | None:
        core = self.server.sandbox.core
        with core.lock:
            if parts == ["version"]:
                return {
                    "major": "1",
                    "minor": "34",
                    "gitVersion": GIT_VERSION,
                    "gitCommit": "sandbox",
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.24.0",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                }
            if parts[:2] == ["openapi", "v3"]:
                return _openapi_v3(core, parts[2:])
            if parts == ["api"]:
                host = self.headers.get("Host", "127.0.0.1")
                return {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": host}
                    ],
                }
            if parts == ["api", "v1"]:
                return _resource_list("v1", core.resources_in("", "v1"))
            if parts == ["apis"]:
                return {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_group(g, vs) for g, vs in core.groups().items()]
                    + [metrics.api_group()],
                }
            if parts == ["apis", metrics.GROUP]:
                return {"kind": "APIGroup", "apiVersion": "v1", **metrics.api_group()}
            if parts == ["apis", metrics.GROUP, metrics.VERSION]:
                return metrics.api_resources()
            if len(parts) == 2 and parts[0] == "apis":
                versions = core.groups().get(parts[1])
                if versions is None:
                    raise E.path_not_found()
                return {"kind": "APIGroup", "apiVersion": "v1", **_group(parts[1], versions)}
            if len(parts) == 3 and parts[0] == "apis":
                found = core.resources_in(parts[1], parts[2])
                if not found:
                    raise E.path_not_found()
                return _resource_list(f"{parts[1]}/{parts[2]}", found)
        return None

    # ---- sandbox control API ---------------------------------------------------------------

    def _control(self, method: str, parts: list[str]) -> int:
        sb = self.server.sandbox
        content_type = self.headers.get("Content-Type") or "application/json"
        if parts == ["faults"]:
            if method in ("PUT", "POST", "PATCH"):
                body = self._decode(self._read_body(), content_type)
                if not isinstance(body, dict):
                    raise E.bad_request("faults must be a JSON object")
                try:
                    sb.faults.update(body)
                except (ValueError, TypeError) as exc:
                    raise E.bad_request(str(exc)) from None
                sb.poke()
            elif method != "GET":
                raise E.method_not_allowed()
            self._send_json(200, sb.faults.to_dict())
            return 200
        if parts == ["speed"]:
            if method in ("PUT", "POST", "PATCH"):
                body = self._decode(self._read_body(), content_type)
                speed = body.get("speed") if isinstance(body, dict) else None
                if not isinstance(speed, (int, float)) or isinstance(speed, bool) or speed <= 0:
                    raise E.bad_request("speed must be a positive number")
                sb.speed = float(speed)
            elif method != "GET":
                raise E.method_not_allowed()
            self._send_json(200, {"speed": sb.speed})
            return 200
        if parts == ["compact"]:
            if method not in ("POST", "PUT"):
                raise E.method_not_allowed()
            self._send_json(200, {"resourceVersion": str(sb.compact())})
            return 200
        if len(parts) == 5 and (parts[0], parts[2], parts[4]) == ("namespaces", "pods", "fail"):
            return self._pod_fault(method, parts[1], parts[3], content_type)
        if parts == ["healthz"] or parts == []:
            self._send_json(200, {"status": "ok", "resourceVersion": str(sb.core.store.rv)})
            return 200
        raise E.path_not_found()


@dataclass
class LogOptions:
    """PodLogOptions from the query string, validated as kube-apiserver does."""

    follow: bool = False
    timestamps: bool = False
    previous: bool = False
    tail_lines: int | None = None
    since_seconds: int | None = None
    limit_bytes: int | None = None


def _log_options(name: str, query: dict[str, str]) -> LogOptions:
    def number(key: str) -> int | None:
        value = query.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            # The query parameter codec's error, answered 400 BadRequest.
            raise E.bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None

    def flag(key: str) -> bool:
        # Go's conversion: absent is false, "0" and "false" are false, anything else is true.
        value = query.get(key)
        return value is not None and value != "0" and value.lower() != "false"

    options = LogOptions(
        follow=flag("follow"),
        timestamps=flag("timestamps"),
        previous=flag("previous"),
        tail_lines=number("tailLines"),
        since_seconds=number("sinceSeconds"),
        limit_bytes=number("limitBytes"),
    )
    since_time = query.get("sinceTime")
    problems = []
    if options.tail_lines is not None and options.tail_lines < 0:
        problems.append(
            E.invalid("tailLines", options.tail_lines, "must be greater than or equal to 0")
        )
    if options.limit_bytes is not None and options.limit_bytes < 1:
        problems.append(E.invalid("limitBytes", options.limit_bytes, "must be greater than 0"))
    if options.since_seconds is not None and since_time:
        problems.append(
            E.FieldError(
                "FieldValueForbidden",
                "",
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            )
        )
    elif options.since_seconds is not None and options.since_seconds < 1:
        problems.append(E.invalid("sinceSeconds", options.since_seconds, "must be greater than 0"))
    if problems:
        raise E.invalid_object("PodLogOptions", "", name, problems)
    if since_time:
        try:
            when = dt.datetime.fromisoformat(since_time.replace("Z", "+00:00"))
        except ValueError:
            raise E.bad_request(
                f'parsing time "{since_time}" as "2006-01-02T15:04:05Z07:00": cannot parse'
            ) from None
        options.since_seconds = max(math.ceil(time.time() - when.timestamp()), 0)
    return options


def _log_container(pod: dict[str, Any], container: str) -> str:
    """The container whose log is asked for, with the API server's and kubelet's refusals."""
    name = pod["metadata"]["name"]
    spec = pod.get("spec") or {}
    names = [c.get("name", "") for c in spec.get("containers") or []]
    init_names = [c.get("name", "") for c in spec.get("initContainers") or []]
    if not container:
        if len(names) == 1:
            container = names[0]
        elif not names:
            raise E.bad_request(f"a container name must be specified for pod {name}")
        else:
            message = (
                f"a container name must be specified for pod {name}, "
                f"choose one of: [{' '.join(names)}]"
            )
            if init_names:
                message += f" or one of the init containers: [{' '.join(init_names)}]"
            raise E.bad_request(message)
    elif container not in names + init_names:
        raise E.bad_request(f"container {container} is not valid for pod {name}")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not any(s.get("name") == container for s in statuses) and container in names:
        raise E.bad_request(
            f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
        )
    return container


def _restarted(pod: dict[str, Any], container: str) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(s.get("name") == container and s.get("restartCount") for s in statuses)


def _log_text(lines: list[Any], timestamps: bool, budget: int | None) -> tuple[str, int | None]:
    """Lines as served, cut at a byte budget (limitBytes); the budget left (None: no limit)."""
    text = "".join(line.render(timestamps) for line in lines)
    if budget is None:
        return text, None
    data = text.encode()[:budget]
    return data.decode(errors="ignore"), budget - len(data)


def _scale_fields(body: Any) -> tuple[Any, str | None]:
    """spec.replicas and metadata.resourceVersion of a Scale body (400 if it is not one)."""
    if not isinstance(body, dict) or not isinstance(body.get("spec", {}), dict):
        raise E.bad_request(
            'Scale in version "v1" cannot be handled as a Scale: the body must be an object'
        )
    meta = body.get("metadata") or {}
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return (body.get("spec") or {}).get("replicas"), rv if isinstance(rv, str) else None


def _exists(core: Any, rt: ResourceType, ns: str, name: str) -> bool:
    with core.lock:
        return core.store.get(rt.key, ns if rt.namespaced else "", name) is not None


def _truthy(value: str | None) -> bool:
    # The Python client sends booleans as "True"/"False".
    return (value or "").lower() in ("true", "1")


def _int(value: str | None, name: str) -> int:
    if value in (None, ""):
        return 0
    try:
        return int(value)
    except ValueError:
        raise E.bad_request(f"invalid value for {name}: {value!r}") from None


def _group(group: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def _resource_list(group_version: str, types: list[ResourceType]) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for rt in types:
        resources.extend(rt.api_resource())
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _openapi_v3(core: Any, gv_parts: list[str]) -> dict[str, Any]:
    """Just enough OpenAPI v3 for kubectl to see that the server validates fields itself."""
    by_gv: dict[str, list[ResourceType]] = {}
    for rt in core.types.values():
        prefix = f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"
        by_gv.setdefault(prefix, []).append(rt)
    if not gv_parts:
        stamp = str(len(core.types))
        return {
            "paths": {
                gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={stamp}{abs(hash(gv)) % 10**8}"}
                for gv in by_gv
            }
        }
    types = by_gv.get("/".join(gv_parts))
    if types is None:
        raise E.path_not_found()
    params = [
        {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for n in ("dryRun", "fieldManager", "fieldValidation", "force")
    ]
    body = {
        "content": {
            t: {"schema": {"type": "object"}} for t in (JSON_PATCH, MERGE_PATCH, APPLY_PATCH)
        }
    }
    paths: dict[str, Any] = {}
    for rt in types:
        base = f"/{'/'.join(gv_parts)}/"
        path = base + ("namespaces/{namespace}/" if rt.namespaced else "") + rt.plural + "/{name}"
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[path] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "parameters": params,
                "requestBody": body,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }


def make_server(sandbox: Sandbox, host: str, port: int) -> _Server:
    """Bind the HTTP server (port 0 = a free port)."""
    return _Server((host, port), sandbox)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """`value` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    return value
