"""Fault injection, the control endpoints, and `python -m sandbox serve` with --state."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
G, V = "postgresql.cnpg.io", "v1"


def test_control_endpoint_switches_api_errors_at_run_time(make_sandbox, raw_at):
    sb = make_sandbox(operators=False)
    raw = raw_at(sb.url)
    status, _, faults = raw.request("PUT", "/sandbox/v1/faults", {"error_503": 1.0})
    assert status == 200 and faults["error_503"] == 1.0
    status, _, body = raw.request("GET", "/api/v1/namespaces")
    assert (status, body["reason"], body["message"]) == (
        503,
        "ServiceUnavailable",
        "the server is currently unable to handle the request",
    )
    raw.request("PUT", "/sandbox/v1/faults", {"error_503": 0, "error_429": 1.0})
    status, headers, body = raw.request("GET", "/api/v1/namespaces")
    assert (status, body["reason"], headers["Retry-After"]) == (429, "TooManyRequests", "1")
    raw.request("PUT", "/sandbox/v1/faults", {"error_429": 0, "error_500": 1.0})
    status, _, body = raw.request("GET", "/api/v1/namespaces")
    assert (status, body["reason"]) == (500, "InternalError")
    raw.request("PUT", "/sandbox/v1/faults", {"error_500": 0})
    assert raw.request("GET", "/api/v1/namespaces")[0] == 200
    status, _, body = raw.request("PUT", "/sandbox/v1/faults", {"nonsense": 1})
    assert (status, body["reason"]) == (400, "BadRequest")


def test_discovery_requests_fail_as_the_others_do(make_sandbox, raw_at):
    """kube-apiserver answers a request for the kinds it serves as it answers any: with a 503
    when it has no capacity for it, and a client has to tell that from a kind not served."""
    sb = make_sandbox(operators=False)
    raw = raw_at(sb.url)
    sb.set_faults(error_503=1.0)
    for path in ("/version", "/api", "/api/v1", "/apis", f"/apis/{G}/{V}"):
        status, _, body = raw.request("GET", path)
        assert (status, body["reason"]) == (503, "ServiceUnavailable"), path
    assert raw.request("GET", "/healthz")[0] == 200  # the server's health, not the API's
    sb.set_faults(error_503=0)
    status, _, body = raw.request("GET", f"/apis/{G}/{V}")
    assert status == 200 and "Cluster" in {r["kind"] for r in body["resources"]}


def test_injected_conflicts_hit_writes_only(make_sandbox):
    sb = make_sandbox(operators=False, faults={"conflict": 1.0})
    api = config.new_client_from_config(str(sb.kubeconfig_path))
    try:
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_config_map(
            "default", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
        )
        with pytest.raises(client.ApiException) as exc:
            v1.patch_namespaced_config_map("c", "default", {"data": {"a": "b"}})
        assert exc.value.status == 409
        assert json.loads(exc.value.body)["reason"] == "Conflict"
        assert v1.read_namespaced_config_map("c", "default").data is None
    finally:
        api.close()


def test_latency_is_added(make_sandbox, raw_at):
    sb = make_sandbox(operators=False)
    sb.set_faults(latency_ms=150)
    started = time.monotonic()
    raw_at(sb.url).request("GET", "/api/v1/namespaces")
    assert time.monotonic() - started >= 0.15


def test_dropped_watch_ends_without_the_final_chunk(make_sandbox):
    sb = make_sandbox(operators=False, faults={"drop_watch": 1.0})
    sb.core.bookmark_seconds = 0.02
    conn = http.client.HTTPConnection(sb.host, sb.port, timeout=5)
    conn.request("GET", "/api/v1/namespaces?watch=true&allowWatchBookmarks=true&timeoutSeconds=5")
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()


def test_speed_endpoint(make_sandbox, raw_at):
    sb = make_sandbox(operators=False)
    raw = raw_at(sb.url)
    assert raw.request("PUT", "/sandbox/v1/speed", {"speed": 50})[2] == {"speed": 50.0}
    assert sb.speed == 50.0
    status, _, body = raw.request("PUT", "/sandbox/v1/speed", {"speed": 0})
    assert (status, body["reason"]) == (400, "BadRequest")


def test_bearer_token_is_enforced_when_set(make_sandbox, raw_at):
    sb = make_sandbox(operators=False, token="s3cret")
    status, _, body = raw_at(sb.url).request("GET", "/api/v1/namespaces")
    assert (status, body["reason"]) == (401, "Unauthorized")
    api = config.new_client_from_config(str(sb.kubeconfig_path))
    try:
        names = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items]
    finally:
        api.close()
    assert "default" in names


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(port: int, state: Path, kubeconfig: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(  # noqa: S603 - this interpreter running our own module
        [
            sys.executable,
            "-m",
            "sandbox",
            "serve",
            "--port",
            str(port),
            "--state",
            str(state),
            "--speed",
            "2000",
            "--kubeconfig-out",
            str(kubeconfig),
            "--faults",
            "latency=1ms",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 15
    while not kubeconfig.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kubeconfig.exists(), proc.stdout.read() if proc.poll() is not None else "no kubeconfig"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


def test_serve_command_persists_objects_and_object_store(tmp_path):
    state, kubeconfig = tmp_path / "state.json", tmp_path / "kubeconfig"
    port = _free_port()
    proc = _serve(port, state, kubeconfig)
    try:
        api = config.new_client_from_config(str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        body = {
            "apiVersion": f"{G}/{V}",
            "kind": "Cluster",
            "metadata": {"name": "keep"},
            "spec": {
                "instances": 1,
                "storage": {"size": "1Gi"},
                "backup": {"barmanObjectStore": {"destinationPath": "s3://persist/"}},
            },
        }
        uid = custom.create_namespaced_custom_object(G, V, "default", "clusters", body)["metadata"][
            "uid"
        ]
        deadline = time.monotonic() + 10
        while (
            custom.get_namespaced_custom_object(G, V, "default", "clusters", "keep").get("status")
            or {}
        ).get("phase") != "Cluster in healthy state":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        custom.create_namespaced_custom_object(
            G,
            V,
            "default",
            "backups",
            {
                "apiVersion": f"{G}/{V}",
                "kind": "Backup",
                "metadata": {"name": "b"},
                "spec": {"cluster": {"name": "keep"}},
            },
        )
        while (
            custom.get_namespaced_custom_object(G, V, "default", "backups", "b").get("status") or {}
        ).get("phase") != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        api.close()
    finally:
        _stop(proc)
    kubeconfig.unlink()
    proc = _serve(port, state, kubeconfig)
    try:
        api = config.new_client_from_config(str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        kept = custom.get_namespaced_custom_object(G, V, "default", "clusters", "keep")
        assert (
            kept["metadata"]["uid"] == uid and kept["status"]["phase"] == "Cluster in healthy state"
        )
        assert json.loads(state.read_text())["objectStore"]["s3://persist/"]["keep"]["backups"]
        api.close()
    finally:
        _stop(proc)
