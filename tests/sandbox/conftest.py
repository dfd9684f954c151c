"""Fixtures: an in-process sandbox cluster reached over HTTP by the official client and kubectl."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
SAMPLES = Path(__file__).parent / "samples"
# Simulated durations (seconds of bootstrap, backups) shrink by this factor in tests.
TEST_SPEED = 2000.0

_counter = itertools.count()


def _sandbox_threads() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("sandbox-") or "process_request_thread" in t.name
    ]


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    """Every sandbox started by the suite must be fully stopped at the end."""
    yield
    deadline = time.monotonic() + 5
    while _sandbox_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _sandbox_threads(), f"threads left running: {_sandbox_threads()}"


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox cluster for the session, on a free port."""
    sb = Sandbox(speed=TEST_SPEED).start()
    yield sb
    sb.stop()


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., Sandbox]]:
    """Factory for a private sandbox (for tests that break or restart things)."""
    started: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("speed", TEST_SPEED)
        sb = Sandbox(**kwargs).start()
        started.append(sb)
        return sb

    yield make
    for sb in started:
        sb.stop()


@pytest.fixture(scope="session")
def kubeconfig(sandbox: Sandbox) -> Path:
    """Path of the session sandbox's kubeconfig."""
    return sandbox.kubeconfig_path


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    """A `kubernetes` ApiClient built from the sandbox kubeconfig."""
    api = config.new_client_from_config(str(kubeconfig))
    yield api
    api.close()


@pytest.fixture
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    """CoreV1Api on the session sandbox."""
    return client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    """CustomObjectsApi on the session sandbox."""
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def namespace(core_v1: client.CoreV1Api, sandbox: Sandbox) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t{next(_counter)}-{int(time.time() * 1000) % 100000}"
    core_v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    with contextlib.suppress(client.ApiException):
        core_v1.delete_namespace(name)


@pytest.fixture
def kubectl(kubeconfig: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real kubectl against the sandbox (its own discovery cache in a temp folder)."""
    cache = tmp_path / "kubectl-cache"

    def run(
        *args: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(  # noqa: S603 - our own kubectl, fixed arguments
            [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stdout}\n{proc.stderr}")
        return proc

    return run


class Raw:
    """Plain HTTP requests, for what the client cannot send (bad bodies, odd headers)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | dict[str, Any] | list[Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """Send one request; return (status, headers, parsed JSON body or text)."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        headers = dict(headers or {})
        if body is not None:
            # urllib would otherwise label the body as a form.
            headers.setdefault("Content-Type", "application/json")
        # Only ever http://127.0.0.1 URLs of a sandbox.
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
                status, hdrs, data = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            status, hdrs, data = err.code, err.headers, err.read()
        text = data.decode()
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        return status, {k: v for k, v in hdrs.items()}, parsed


@pytest.fixture
def raw_at() -> Callable[[str], Raw]:
    """Raw HTTP access to any sandbox, by base URL."""
    return Raw


@pytest.fixture
def raw(sandbox: Sandbox) -> Raw:
    """Raw HTTP access to the session sandbox."""
    return Raw(sandbox.url)


@pytest.fixture
def pg_cluster(
    custom: client.CustomObjectsApi, sandbox: Sandbox, namespace: str
) -> Callable[..., dict[str, Any]]:
    """Create a CNPG Cluster in the test's namespace and return it once it is healthy."""

    def make(name: str = "pg", instances: int = 3, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "postgresql.cnpg.io/v1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"instances": instances, "storage": {"size": "1Gi"}, **spec},
        }
        custom.create_namespaced_custom_object(
            "postgresql.cnpg.io", "v1", namespace, "clusters", body
        )
        sandbox.run_until_idle()
        found = custom.get_namespaced_custom_object(
            "postgresql.cnpg.io", "v1", namespace, "clusters", name
        )
        assert found["status"]["phase"] == "Cluster in healthy state"
        return found

    return make


def wait_for(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll until check() returns something truthy (and return it), or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s (last: {value!r})")
        time.sleep(0.02)


@pytest.fixture
def until() -> Callable[..., Any]:
    """wait_for as a fixture: poll a check until it holds."""
    return wait_for


def cache_statefulset(replicas: int, **container: Any) -> dict[str, Any]:
    """A StatefulSet "cache" of `replicas` one-container pods labelled app=cache (`container`:
    more of the container's fields, e.g. resources)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "cache"},
        "spec": {
            "replicas": replicas,
            "serviceName": "cache",
            "selector": {"matchLabels": {"app": "cache"}},
            "template": {
                "metadata": {"labels": {"app": "cache"}},
                "spec": {
                    "containers": [{"name": "valkey", "image": "valkey/valkey:8.1", **container}]
                },
            },
        },
    }
