"""The Python API: start a sandbox cluster, write its kubeconfig, drive its controllers."""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from .core import Core, Ctx
from .errors import ApiError
from .faults import Faults
from .server import make_server

log = logging.getLogger("sandbox")

CRD_DIR = Path(__file__).parent / "crds"
SYSTEM_NAMESPACES = ["default", "kube-system", "kube-public", "kube-node-lease"]


@functools.lru_cache(maxsize=1)
def _parsed_crds() -> tuple[dict[str, Any], ...]:
    # Parsing the CNPG CRDs takes most of a start-up: do it once per process.
    return tuple(yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml")))


def _bundled_crds() -> list[dict[str, Any]]:
    """The CRDs installed at start (fresh copies)."""
    return copy.deepcopy(list(_parsed_crds()))


class Controller(Protocol):
    """A simulated controller run by the sandbox's control loop."""

    name: str

    def reconcile(self) -> bool:
        """Do what is due now; True if anything was written."""
        ...

    def next_due(self) -> float | None:
        """Monotonic time of the next timer, or None when nothing is pending."""
        ...

    def busy(self) -> bool:
        """True while simulated work is in flight (run_until_idle waits for it)."""
        ...


class Sandbox:
    """An emulated Kubernetes API server with simulated operators, in this process."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        speed: float = 1.0,
        state: str | os.PathLike[str] | None = None,
        faults: dict[str, Any] | None = None,
        token: str | None = None,
        operators: bool = True,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.speed = speed
        self.state_path = Path(state) if state else None
        self.token = token
        self.core = Core()
        self.faults = Faults()
        if faults:
            self.faults.update(faults)
        self.controllers: list[Controller] = []
        self.object_store: dict[str, Any] = {}  # the simulated Barman object store
        self._server: Any = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._idle_rv = -1
        self._pokes = 0
        self._rounds = 0
        self._kubeconfig: Path | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._saved_rv = -1
        self._load_state()
        self._bootstrap()
        if operators:
            from .operators.cnpg import CnpgOperator
            from .operators.statefulset import StatefulSetController
            from .operators.volumes import VolumeController

            self.controllers += [
                VolumeController(self),
                StatefulSetController(self),
                CnpgOperator(self),
            ]

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> Sandbox:
        """Bind the port and start serving and reconciling in background threads."""
        self._stop.clear()
        self.core.closing = False
        self._server = make_server(self, self.host, self.requested_port)
        serve = threading.Thread(
            target=self._server.serve_forever, name="sandbox-http", daemon=True
        )
        loop = threading.Thread(target=self._control_loop, name="sandbox-controllers", daemon=True)
        self._threads = [serve, loop]
        for t in self._threads:
            t.start()
        log.info("sandbox serving on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving, end watches and controllers, save state; joins every thread."""
        self._stop.set()
        self.core.closing = True
        with self.core.lock:
            self.core.store.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.close_all()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        self._save_state()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.server_address[1] if self._server else self.requested_port

    @property
    def url(self) -> str:
        """Base URL of the API server."""
        return f"http://{self.host}:{self.port}"

    def scaled(self, seconds: float) -> float:
        """A simulated duration shortened by the speed factor."""
        return seconds / self.speed

    # ---- kubeconfig ------------------------------------------------------------------------

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig for the `kubernetes` client and kubectl."""
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": user}],
            "contexts": [
                {
                    "name": "sandbox",
                    "context": {"cluster": "sandbox", "user": "sandbox", "namespace": "default"},
                }
            ],
            "current-context": "sandbox",
            "preferences": {},
        }

    def write_kubeconfig(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the kubeconfig (to a temp file unless a path is given) and return its path."""
        if path is None:
            if self._tmpdir is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="sandbox-")
            path = Path(self._tmpdir.name) / "kubeconfig"
        target = Path(path)
        # Whole or not at all: a reader waiting for the file never reads it half written.
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))
        partial.replace(target)
        self._kubeconfig = target
        return target

    @property
    def kubeconfig_path(self) -> Path:
        """Path of the kubeconfig, written on first use."""
        return self._kubeconfig or self.write_kubeconfig()

    # ---- controllers -----------------------------------------------------------------------

    def _control_loop(self) -> None:
        store = self.core.store
        while not self._stop.is_set():
            with self.core.lock:
                rv_before, pokes_before = store.rv, self._pokes
            try:
                changed = self.reconcile_once()
            except Exception:
                log.exception("controller round failed")
                changed = False
                time.sleep(0.05)
            with self.core.lock:
                self._rounds += 1
                if changed or store.rv != rv_before or self._pokes != pokes_before:
                    continue
                # A frozen controller makes no progress, so it cannot keep the sandbox busy.
                active = [c for c in self.controllers if c.name not in self.faults.frozen]
                if not any(c.busy() for c in active):
                    self._idle_rv = store.rv
                due = [d for d in (c.next_due() for c in self.controllers) if d is not None]
                wait = min(due) - time.monotonic() if due else 0.5
                if wait > 0:
                    store.changed.wait(min(wait, 0.5))

    def reconcile_once(self) -> bool:
        """One round of every controller (garbage collector and namespaces first)."""
        changed = False
        if "garbage-collector" not in self.faults.frozen:
            changed = self.core.collect_garbage()
        for controller in self.controllers:
            if controller.name in self.faults.frozen:
                continue
            changed |= bool(controller.reconcile())
        return changed

    def run_until_idle(self, timeout: float = 30.0) -> None:
        """Wait until every controller has settled (no pending work, no timers)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.core.lock:
                if self._idle_rv == self.core.store.rv:
                    return
                self.core.store.changed.notify_all()
            time.sleep(0.01)
        raise TimeoutError(f"sandbox controllers still busy after {timeout}s")

    def set_faults(self, **settings: Any) -> None:
        """Change fault injection; controllers see the change in every round that follows."""
        self.faults.update(settings)
        self.poke()

    def poke(self, timeout: float = 5.0) -> None:
        """Make the controllers run a round now, and wait for one that started after this call."""
        with self.core.lock:
            self._pokes += 1
            self._idle_rv = -1
            target = self._rounds + 2  # the round in flight may predate the change
            self.core.store.changed.notify_all()
        if not self._threads:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.core.lock:
                if self._rounds >= target:
                    return
                self.core.store.changed.notify_all()
            time.sleep(0.002)

    def compact(self) -> int:
        """Forget the event history, as etcd compaction does; the compacted resourceVersion.

        From now on a watch or a continue token from an older resourceVersion is answered
        410 Gone (a watch gets an ERROR event with a 410 Expired status, as from kube-apiserver),
        and so is a watch still open with changes from before the compaction left to read; a
        watch already caught up goes on. The controllers look at every object again.
        """
        with self.core.lock:
            self.core.store.compact()
            self.core.store.notify_all()
            return self.core.store.compacted_rv

    def pod_fail(self, namespace: str, name: str, *, seconds: float | None = 60.0) -> None:
        """Crash a pod's containers for `seconds` of real time (None: until cleared).

        The pod stays Running but not ready (its containers back off, restartCount grows, the
        crash is in its log and a kubelet BackOff Event), and its controller reports it: a CNPG
        Cluster fails over from a failing primary or waits for a failing replica, a
        StatefulSet's readyReplicas drops. When the time is up, or `pod_fail_clear` is called,
        the containers start again and the owner recovers. 404 ApiError for an unknown pod.
        """
        self.core.get(self.core.builtin("pods"), namespace, name)
        self.faults.fail_pod(namespace, name, seconds)
        self.poke()

    def pod_fail_clear(self, namespace: str, name: str) -> bool:
        """End a pod failure early (False if the pod was not failing); it then recovers."""
        cleared = self.faults.clear_pod(namespace, name)
        self.poke()
        return cleared

    # ---- state -----------------------------------------------------------------------------

    def _bootstrap(self) -> None:
        core = self.core
        ns_rt = core.builtin("namespaces")
        crd_rt = core.builtin("customresourcedefinitions")
        for name in SYSTEM_NAMESPACES:
            if core.store.get(ns_rt.key, "", name) is None:
                core.create(
                    ns_rt,
                    "",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                    Ctx(field_manager="sandbox"),
                )
        for crd in _bundled_crds():
            if core.store.get(crd_rt.key, "", crd["metadata"]["name"]) is None:
                core.create(crd_rt, "", crd, Ctx(field_manager="sandbox"))

    def _load_state(self) -> None:
        if not self.state_path or not self.state_path.exists():
            return
        data = json.loads(self.state_path.read_text())
        self.core.store.load(data.get("store", {}))
        self.object_store = data.get("objectStore", {})
        crd_rt = self.core.builtin("customresourcedefinitions")
        for crd in self.core.store.items(crd_rt.key):
            self.core.sync_crd(crd)
        self._saved_rv = self.core.store.rv

    def _save_state(self) -> None:
        if not self.state_path:
            return
        with self.core.lock:
            if self.core.store.rv == self._saved_rv:
                return
            data = {"store": self.core.store.dump(), "objectStore": self.object_store}
            self._saved_rv = self.core.store.rv
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.state_path)

    def save(self) -> None:
        """Write --state now (also done on stop)."""
        self._save_state()

    # ---- measuring -------------------------------------------------------------------------

    def use_instant_operators(self) -> None:
        """Replace the simulated operators by `operators.instant.InstantOperator` from the next
        round on: status objects are ready at once, so a benchmark measures its client."""
        from .operators.instant import InstantOperator

        self.controllers = [InstantOperator(self)]

    def stored_at(self, resource_version: str | int) -> float | None:
        """When (`time.time()`) the change that made `resource_version` was stored; None once
        the event log has forgotten it. A client's delay in noticing a change starts here."""
        return self.core.store.stored_at(int(resource_version))


__all__ = ["ApiError", "Sandbox"]
