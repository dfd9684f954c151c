"""`python -m sandbox.bench`: request rates against a bare http.server, watch fan-out, and how the
CNPG simulation keeps up beside many clusters."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .api import Sandbox
from .core import Ctx

# One keep-alive connection, as the issue measures it: a single client's request rate.
THREADS = 1
SECONDS = 2.0
LIST_SIZE = 1000
# The CNPG figures: idle clusters beside the new one, at one speed (a 3-instance cluster is
# healthy in 10 s of simulated time, 0.5 s at this speed).
FLEETS = (10, 1000)
FLEET_SPEED = 20.0
CNPG = ("postgresql.cnpg.io", "v1", "clusters")
FAN_OUT_TIMEOUT = 120.0


class _Bare(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    body = json.dumps({"kind": "ConfigMap", "metadata": {"name": "x"}}).encode()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _rate(host: str, port: int, request: Callable[[http.client.HTTPConnection], None]) -> float:
    """Requests per second over THREADS keep-alive connections for SECONDS."""
    counts = [0] * THREADS
    stop = time.monotonic() + SECONDS

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        while time.monotonic() < stop:
            request(conn)
            counts[i] += 1
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / SECONDS


def _call(method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
    def request(conn: http.client.HTTPConnection) -> None:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": ctype})
        resp = conn.getresponse()
        resp.read()

    return request


def _fan_out(sb: Sandbox, watchers: int = 100) -> float:
    """Seconds until every one of `watchers` watches has seen one new ConfigMap.

    Opening the watches takes far longer than the figure (seconds on a loaded machine): every
    wait is bounded by FAN_OUT_TIMEOUT, so a watch that fails breaks the barriers and the
    benchmark stops with an error instead of waiting forever."""
    seen = threading.Barrier(watchers + 1, timeout=FAN_OUT_TIMEOUT)
    ready = threading.Barrier(watchers + 1, timeout=FAN_OUT_TIMEOUT)

    def watch() -> None:
        conn = http.client.HTTPConnection(sb.host, sb.port, timeout=FAN_OUT_TIMEOUT)
        rv = sb.core.store.rv
        conn.request(
            "GET",
            f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"
            f"&timeoutSeconds={FAN_OUT_TIMEOUT:.0f}",
        )
        resp = conn.getresponse()
        ready.wait()
        resp.readline()  # the event (http.client takes the chunked encoding off)
        seen.wait()
        conn.close()

    threads = [threading.Thread(target=watch) for _ in range(watchers)]
    for t in threads:
        t.start()
    ready.wait()
    started = time.monotonic()
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fan-out"}}
    _call("POST", "/api/v1/namespaces/default/configmaps", body)(
        http.client.HTTPConnection(sb.host, sb.port)
    )
    seen.wait()
    elapsed = time.monotonic() - started
    for t in threads:
        t.join()
    return elapsed


def _cluster(name: str, instances: int) -> dict[str, Any]:
    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"instances": instances, "storage": {"size": "1Gi"}},
    }


def _healthy(sb: Sandbox, ns: str, name: str) -> bool:
    rt = sb.core.resolve(*CNPG)
    with sb.core.lock:
        obj = sb.core.store.get(rt.key, ns, name)
        conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _cnpg_fleet(size: int) -> tuple[float, float]:
    """Seconds until a new 3-instance Cluster is healthy beside `size` healthy 1-instance ones,
    and seconds of one controller round (garbage collector and every controller) once idle.

    The fleet is created through the object model (`Core.create`, what the HTTP layer calls),
    in one namespace, with the controllers running; the new Cluster the same way, and its Ready
    condition is read from the store every millisecond.
    """
    ctx = Ctx(field_manager="bench")
    sb = Sandbox(speed=FLEET_SPEED).start()
    try:
        core, rt = sb.core, sb.core.resolve(*CNPG)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}
        core.create(core.builtin("namespaces"), "", namespace, ctx)
        for i in range(size):
            core.create(rt, "fleet", _cluster(f"pg-{i}", 1), ctx)
        sb.run_until_idle(timeout=900)
        started = time.monotonic()
        core.create(rt, "default", _cluster("newcomer", 3), ctx)
        while not _healthy(sb, "default", "newcomer"):
            time.sleep(0.001)
        healthy = time.monotonic() - started
        sb.run_until_idle(timeout=300)
    finally:
        sb.stop()
    # Rounds on this thread once the loop is stopped: nothing is due, nothing changed.
    rounds = []
    for _ in range(5):
        started = time.monotonic()
        sb.reconcile_once()
        rounds.append(time.monotonic() - started)
    return healthy, sorted(rounds)[len(rounds) // 2]


def main() -> None:
    """Print the figures."""
    bare = ThreadingHTTPServer(("127.0.0.1", 0), _Bare)
    bare.daemon_threads = True
    threading.Thread(target=bare.serve_forever, daemon=True).start()
    baseline = _rate("127.0.0.1", bare.server_address[1], _call("GET", "/"))
    bare.shutdown()
    bare.server_close()

    with Sandbox(operators=False) as sb:
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "bench"},
            "data": {"a": "1"},
        }
        setup = http.client.HTTPConnection(sb.host, sb.port)
        for i in range(LIST_SIZE - 1):
            body = {**cm, "metadata": {"name": f"cm-{i}"}}
            _call("POST", "/api/v1/namespaces/default/configmaps", body)(setup)
        _call("POST", "/api/v1/namespaces/default/configmaps", cm)(setup)
        setup.close()
        path = "/api/v1/namespaces/default/configmaps"
        figures = {
            "bare http.server GET": baseline,
            "GET configmap": _rate(sb.host, sb.port, _call("GET", f"{path}/bench")),
            f"LIST {LIST_SIZE} configmaps": _rate(sb.host, sb.port, _call("GET", path)),
            "PATCH configmap (merge)": _rate(
                sb.host,
                sb.port,
                _call(
                    "PATCH", f"{path}/bench", {"data": {"a": "2"}}, "application/merge-patch+json"
                ),
            ),
        }
        print(f"one keep-alive connection, {SECONDS:.0f} s per figure")
        for name, rps in figures.items():
            print(f"{name:28} {rps:9.0f} req/s")
        ratio = figures["GET configmap"] / baseline
        print(f"{'GET, sandbox vs baseline':28} {ratio:9.2f}   (aim: at least 0.5)")
        recorded = {
            "sandbox_get_ratio": round(ratio, 3),
            "sandbox_list_ratio": round(figures[f"LIST {LIST_SIZE} configmaps"] / baseline, 4),
        }
        print(f"{'watch fan-out to 100':28} {_fan_out(sb) * 1000:9.1f} ms")

    fleets = {size: _cnpg_fleet(size) for size in FLEETS}
    small, large = FLEETS
    print(
        f"CNPG at speed {FLEET_SPEED:.0f}: new 3-instance cluster (10 s simulated), idle 1-instance"
    )
    for size, (healthy, _) in fleets.items():
        print(f"{f'new cluster healthy, {size} idle':28} {healthy:9.2f} s")
    for size, (_, round_seconds) in fleets.items():
        print(f"{f'round, {size} idle clusters':28} {round_seconds * 1000:9.2f} ms")
    ratio = fleets[large][0] / fleets[small][0]
    print(f"{f'healthy, {large} vs {small}':28} {ratio:9.2f}   (aim: 1.0, as fast beside {large})")
    recorded["sandbox_cnpg_healthy_ratio"] = round(ratio, 3)
    recorded["sandbox_cnpg_round_s"] = round(fleets[large][1], 6)
    _record(recorded)


def _record(figures: dict[str, float]) -> None:
    """Merge the figures into `make bench`'s machine-readable copy, `var/bench.json` (the
    Opsdeck benchmarks add theirs)."""
    path = Path(os.environ.get("OPSDECK_VAR_DIR") or "var") / "bench.json"
    try:
        kept = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        kept = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".partial")
    scratch.write_text(json.dumps({**kept, **figures}, indent=2, sort_keys=True) + "\n")
    scratch.replace(path)


if __name__ == "__main__":
    main()
