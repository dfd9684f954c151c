"""The cluster side of a benchmark, each part in a process or thread of its own.

- `SandboxProcess`: a sandbox cluster serving from a process of its own, so that no client
  shares its interpreter lock — Opsdeck's workers and the baseline's clients are separate
  processes, and both meet the server in the same conditions. It answers `stored_at`: when the
  sandbox stored a resourceVersion (`Sandbox.stored_at`).
- `NoticeWatch`: for every instance, when the sandbox stored the change that first satisfied
  the successCondition of each object the create waits on (`plan.Create.waits`), as evaluated
  by the engine's condition code.
- `CommitListener`: when the engine's move that found the condition satisfied COMMITTED. A
  trigger in the bench's own database sends a NOTIFY when a task run turns Succeeded;
  PostgreSQL delivers it at commit, and a process that does nothing else notes the time.

A notice delay is `CommitListener` time minus `NoticeWatch` time: from the sandbox storing the
change to the commit of the move that acted on it. The engine cannot evaluate a change before
it is stored, so no sample can be negative (any that were would be reported).

On the way, the same process notes when each operation was woken (the watcher's UPDATE making
it due, committed) and when a worker claimed it for a move, so that a delay can be split into
its stages: the watch delivering the change (`NoticeWatch` receiving it is the proxy), the
watcher waking the operation, the step waiting for a worker, and the move itself.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from .support import BenchError

# A spawned child imports only what it needs; a forked one would inherit the parent's
# database connections and threads.
SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 60.0
WATCH_TIMEOUT = 5  # seconds a watch request lasts before it is made again (and stop checked)
CHANNEL = "bench_task_succeeded"
STAGES = "bench_operation_moved"  # a claim taken (a move begins), or a wake-up
# Installed in the bench's throwaway database only.
TRIGGER = f"""
CREATE FUNCTION bench_task_succeeded() RETURNS trigger AS $$
BEGIN
  IF NEW.state = 'Succeeded' AND (TG_OP = 'INSERT' OR OLD.state IS DISTINCT FROM NEW.state) THEN
    PERFORM pg_notify('{CHANNEL}', NEW.operation_id::text || ' ' || NEW.node);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER bench_task_succeeded AFTER INSERT OR UPDATE OF state ON deployments_taskrun
  FOR EACH ROW EXECUTE FUNCTION bench_task_succeeded();
CREATE FUNCTION bench_operation_moved() RETURNS trigger AS $$
BEGIN
  IF OLD.claim_token IS NULL AND NEW.claim_token IS NOT NULL THEN
    PERFORM pg_notify('{STAGES}', 'claimed ' || NEW.id::text);
  ELSIF NEW.claim_token IS NOT DISTINCT FROM OLD.claim_token
        AND NEW.moves = OLD.moves
        AND NEW.next_step_at IS DISTINCT FROM OLD.next_step_at THEN
    PERFORM pg_notify('{STAGES}', 'woken ' || NEW.id::text);
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER bench_operation_moved AFTER UPDATE ON deployments_operation
  FOR EACH ROW EXECUTE FUNCTION bench_operation_moved();
"""
TRIGGERS = (
    ("deployments_taskrun", "bench_task_succeeded"),
    ("deployments_operation", "bench_operation_moved"),
)


def triggers_enable(cursor, enabled: bool) -> None:
    """Turn the triggers on for the windows that measure notice delays, off for those that
    measure throughput: the baseline pays for no such instrument."""
    verb = "ENABLE" if enabled else "DISABLE"
    for table, trigger in TRIGGERS:
        cursor.execute(f"ALTER TABLE {table} {verb} TRIGGER {trigger}")


def _ask(conn, lock: threading.Lock, message: tuple) -> Any:
    with lock:
        conn.send(message)
        if not conn.poll(START_TIMEOUT):
            raise BenchError(f"no answer to {message[0]} from a bench process")
        return conn.recv()


# --- the sandbox in a process of its own -------------------------------------------------------


def _serve_sandbox(conn, speed: float, instant: bool, latency_ms: int) -> None:
    import yaml

    from sandbox import Sandbox

    sandbox = Sandbox(speed=speed)
    if instant:
        sandbox.use_instant_operators()
    sandbox.start()
    if latency_ms:
        sandbox.set_faults(latency_ms=latency_ms)
    try:
        conn.send(yaml.safe_dump(sandbox.kubeconfig()))
        while True:
            message = conn.recv()
            if message[0] == "stored_at":
                conn.send([sandbox.stored_at(rv) for rv in message[1]])
            else:
                return
    except (EOFError, KeyboardInterrupt):
        return
    finally:
        sandbox.stop()


class SandboxProcess:
    """A sandbox cluster serving from a child process: simulated operators at `speed`, or
    instant ones (`Sandbox.use_instant_operators`); each API call answered `latency_ms` later
    (the sandbox's `latency_ms` fault), as a cluster slower to answer than the sandbox is."""

    def __init__(self, *, speed: float, instant: bool, latency_ms: int = 0) -> None:
        self._conn, child = SPAWN.Pipe()
        self._proc = SPAWN.Process(
            target=_serve_sandbox, args=(child, speed, instant, latency_ms), name="bench-sandbox",
            daemon=True,
        )  # fmt: skip
        self._lock = threading.Lock()
        self.kubeconfig = ""

    def __enter__(self) -> SandboxProcess:
        self._proc.start()
        if not self._conn.poll(START_TIMEOUT):
            self.close()
            raise BenchError(f"the sandbox did not start within {START_TIMEOUT:g} s")
        self.kubeconfig = self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def stored_at(self, resource_version: str) -> float | None:
        """When the sandbox stored `resource_version` (`time.time()`), None if forgotten."""
        return _ask(self._conn, self._lock, ("stored_at", [int(resource_version)]))[0]

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                with self._lock:
                    self._conn.send(("stop",))
            except OSError:
                pass
            self._proc.join(20)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


# --- when the satisfying change was stored ---------------------------------------------------


class NoticeWatch:
    """Watches the kinds the create waits on; `satisfied[(instance id, node)]` is when the
    sandbox stored the first version of that node's object that satisfied its successCondition
    (None when the sandbox had forgotten it), `seen[…]` when this watch received it."""

    def __init__(self, kubeconfig: str, create, sandbox: SandboxProcess) -> None:
        self.kubeconfig = kubeconfig
        self.create = create
        self.sandbox = sandbox
        self.satisfied: dict[tuple[str, str], float | None] = {}
        self.seen: dict[tuple[str, str], float] = {}  # when this watch received that change
        self.error: BaseException | None = None
        self._waits: dict[str, dict[tuple[str, str, str], tuple[str, str, str | None]]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Where each watch's client keeps what it discovered of the API (else the system's
        # temporary folder, where the client's default files would stay behind).
        self._discovery = tempfile.TemporaryDirectory(prefix="opsdeck-bench-discovery-")

    def start(self) -> None:
        for api_version, kind in sorted(self.create.kinds()):
            ready = threading.Event()
            thread = threading.Thread(
                target=self._follow, args=(api_version, kind, ready), daemon=True,
                name=f"bench-watch-{kind}",
            )  # fmt: skip
            thread.start()
            if not ready.wait(START_TIMEOUT):
                raise BenchError(f"the watch on {kind} did not start: {self.error!r}")
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(WATCH_TIMEOUT + 5)
        self._discovery.cleanup()

    def _follow(self, api_version: str, kind: str, ready: threading.Event) -> None:
        from deployments.kube import KubeDriver, WatchExpired, api_client_from_kubeconfig

        driver = KubeDriver(
            api_client_from_kubeconfig(self.kubeconfig),
            cache_file=f"{self._discovery.name}/{kind}.json",
        )
        try:
            version = None
            while not self._stop.is_set():
                if version is None:
                    items, version = driver.list_for_watch(api_version, kind)
                    for obj in items:
                        self._seen(obj)
                    ready.set()
                try:
                    for etype, obj in driver.watch_objects(
                        api_version, kind, resource_version=version, timeout=WATCH_TIMEOUT
                    ):
                        version = obj["metadata"]["resourceVersion"]
                        if etype in ("ADDED", "MODIFIED"):
                            self._seen(obj)
                except WatchExpired:
                    version = None
        except BaseException as exc:  # the figures would be wrong: the run reports it
            self.error = exc
        finally:
            driver.close()

    def _seen(self, obj: dict) -> None:
        from deployments.workflow import conditions

        meta = obj["metadata"]
        namespace = meta.get("namespace", "")
        wait = self._waits_in(namespace).get((obj["apiVersion"], obj["kind"], meta["name"]))
        if wait is None or (namespace, wait[0]) in self.satisfied:
            return
        node, success, failure = wait
        if conditions.evaluate(obj, success, failure) == conditions.SUCCEEDED:
            self.seen[(namespace, node)] = time.time()
            self.satisfied[(namespace, node)] = self.sandbox.stored_at(meta["resourceVersion"])

    def _waits_in(self, namespace: str) -> dict[tuple[str, str, str], tuple[str, str, str | None]]:
        """The objects the create of the instance `namespace` waits on, and their conditions."""
        if namespace not in self._waits:
            ctx = self.create.context(namespace)
            found = {}
            for step in self.create.waits:
                obj, success, failure = self.create.render(step, ctx, namespace)
                found[(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])] = (
                    step.node, success, failure,
                )  # fmt: skip
            self._waits[namespace] = found
        return self._waits[namespace]


# --- when the move that noticed it committed ---------------------------------------------------


def _listen(conn, server: dict[str, str], dbname: str) -> None:
    import psycopg

    committed: dict[str, float] = {}
    stages: dict[str, list[float]] = {}  # "woken <id>" / "claimed <id>": every time, in order
    params = {k: v for k, v in server.items() if v}
    with psycopg.connect(dbname=dbname, autocommit=True, **params) as db:
        db.execute(f"LISTEN {CHANNEL}")
        db.execute(f"LISTEN {STAGES}")
        conn.send("listening")
        while True:
            for notice in db.notifies(timeout=0.2):
                if notice.channel == CHANNEL:
                    committed.setdefault(notice.payload, time.time())
                else:
                    stages.setdefault(notice.payload, []).append(time.time())
            if conn.poll():
                message = conn.recv()
                if message[0] == "collect":
                    conn.send((dict(committed), stages))
                else:
                    return


class CommitListener:
    """A process listening for the trigger's NOTIFYs; `collect()` gives, per
    (operation id, node), when the move that made its task run Succeeded committed."""

    def __init__(self, db_settings: dict[str, Any]) -> None:
        from portal.scratch_databases import server_params

        self._conn, child = SPAWN.Pipe()
        self._proc = SPAWN.Process(
            target=_listen, args=(child, server_params(db_settings), db_settings["NAME"]),
            name="bench-listener", daemon=True,
        )  # fmt: skip
        self._lock = threading.Lock()

    def __enter__(self) -> CommitListener:
        self._proc.start()
        if not self._conn.poll(START_TIMEOUT):
            raise BenchError("the commit listener did not start")
        self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc.is_alive():
            with self._lock:
                self._conn.send(("stop",))
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()

    def collect(self) -> Commits:
        raw, stages = _ask(self._conn, self._lock, ("collect",))
        return Commits(
            succeeded={tuple(key.split(" ", 1)): at for key, at in raw.items()},
            woken={key.split(" ", 1)[1]: at for key, at in stages.items() if key[0] == "w"},
            claimed={key.split(" ", 1)[1]: at for key, at in stages.items() if key[0] == "c"},
        )


@dataclass
class Commits:
    """What `CommitListener` heard: when the move that made each (operation id, node)'s task
    run Succeeded committed, and every time each operation was woken or claimed."""

    succeeded: dict[tuple[str, str], float]
    woken: dict[str, list[float]]
    claimed: dict[str, list[float]]

    def stages(self, operation_id: str, node: str, stored: float, seen: float | None):
        """The delay from `stored` to the commit of the move that found it, split: to the
        watch delivering the change (`seen`), to the first wake-up after that, to the first claim
        after it, and the move to its commit; None for a stage that cannot be placed (the move
        that found it was not woken for it, say: a poll)."""
        committed = self.succeeded.get((operation_id, node))
        if committed is None:
            return None
        woken = _first_after(self.woken.get(operation_id, []), stored, committed)
        claimed = _first_after(self.claimed.get(operation_id, []), woken or stored, committed)
        return Stages(stored=stored, seen=seen, woken=woken, claimed=claimed, committed=committed)


def _first_after(times: list[float], start: float, end: float) -> float | None:
    return next((t for t in times if start <= t <= end), None)


@dataclass
class Stages:
    stored: float
    seen: float | None
    woken: float | None
    claimed: float | None
    committed: float
