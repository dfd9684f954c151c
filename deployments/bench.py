"""`manage.py bench_operations`: how fast the engine runs create operations, next to a baseline.

`run()` (the command) creates a fresh PostgreSQL database `opsdeck_bench_<random>` on the
configured server, runs `measure()` in a child process (`bench_operations --inner`) whose
settings point at that database and at a Celery queue of its own (`CELERY_QUEUE`), and drops
the database at the end, even on failure: the development database is never used.

`measure()` starts an in-process sandbox cluster with an instantly-ready simulated operator,
registers it as the default cell, loads the CloudNativePG plan (its instance limit raised),
starts `--workers` real `celery worker --pool solo` processes, runs WARMUP creates that are not
counted, then creates `--count` instances through `services.instance_create` and waits until
every create finished. Meanwhile a watch on
Clusters records when each Cluster's status first satisfied the create's successCondition,
which the engine's `finished_at` of the `main.cluster` task is compared with. Then the baseline,
`baseline()`: plain `KubeDriver` calls from as many threads as there were workers, no Django and
no Celery, making the same calls for the same objects on a fresh sandbox (after a warm-up of
its own).

The operator is `InstantOperator` unless `--operator cnpg` asks for the sandbox's CloudNativePG
simulation at speed 100000: that one resyncs every object of every Cluster in each round (a few
milliseconds per Cluster), so with a hundred Clusters it takes a good part of a second to make a
new one healthy, and both runs measure the simulation more than the engine.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from deployments import executor
from deployments.kube import KubeDriver, api_client_from_kubeconfig
from deployments.schedules import plan_retention_days
from deployments.spec import load_spec, validate_parameters
from deployments.spec.model import PlanSpec
from deployments.workflow.engine import OPERATION_LABEL
from deployments.workflow.render import render_manifest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "postgres-cnpg.yaml"

SPEED = 100_000.0  # the sandbox's time factor: a Cluster is healthy within a millisecond
TIMEOUT = 300.0  # wall-clock seconds the creates may take before the benchmark fails
WARMUP = 20  # creates run (on both sides) before the measured ones, not counted
WORKER_START_TIMEOUT = 60.0
BASELINE_POLL = 0.05  # seconds between two reads of a Cluster that is not healthy yet
HEALTHY = "Cluster in healthy state"
STEP_SUCCEEDED = re.compile(r"Task deployments\.tasks\.operation_step\[[^\]]+\] succeeded")
OPERATOR_NAMESPACE = "cnpg-system"  # the Cell model's default
BACKUP_CREDENTIALS = {"ACCESS_KEY_ID": "bench", "ACCESS_SECRET_KEY": "bench-secret"}
BACKUP_DESTINATION = "s3://bench/opsdeck"
TENANT_SLUG = "bench"
AIM_RATIO = 2.0
AIM_P50 = 0.1  # seconds: a 50th of Argo's 5 s poll
AIM_P95 = 0.3
OPERATORS = ("instant", "cnpg")


class BenchError(Exception):
    """The benchmark could not run or its operations did not all succeed."""


# --- the command: a database of its own around the measuring process -----------------------


def run(*, count: int, workers: int, timeout: float = TIMEOUT, operator: str = "instant") -> None:
    """Create the bench database, measure in a child process on it, drop it (always)."""
    from django.conf import settings

    run_id = secrets.token_hex(4)
    name = f"opsdeck_bench_{run_id}"
    db = settings.DATABASES["default"]
    _database_create(db, name)
    try:
        with tempfile.TemporaryDirectory(prefix="opsdeck-bench-") as var_dir:
            env = {
                **os.environ,
                "DATABASE_URL": _database_url(db, name),
                "CELERY_QUEUE": f"opsdeck-bench-{run_id}",
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
                "CACHE_URL": settings.CACHE_URL,
                "CACHE_KEY_PREFIX": f"opsdeck-bench-{run_id}",
                # Production settings with keys of its own: nothing in var/ is read or written.
                "DEBUG": "0",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "OPSDECK_ENCRYPTION_KEYS": _fernet_key(),
                "OPSDECK_VAR_DIR": var_dir,
                FIGURES_FILE_VARIABLE: str(Path(settings.VAR_DIR) / "bench.json"),
                "LOG_LEVEL": "WARNING",
            }
            command = [sys.executable, str(ROOT / "manage.py"), "bench_operations", "--inner",
                       "--count", str(count), "--workers", str(workers),
                       "--timeout", str(timeout), "--operator", operator]  # fmt: skip
            child = subprocess.Popen(command, cwd=ROOT, env=env)  # noqa: S603
            try:
                code = child.wait()
            except BaseException:
                # Ctrl-C reached the child as well (one process group): let it stop its
                # workers and its sandbox before the database goes.
                try:
                    child.wait(60)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                raise
            if code != 0:
                raise BenchError(f"the benchmark failed (exit status {code}); see above")
    finally:
        _database_drop(db, name)


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def _server(db: dict[str, Any]) -> dict[str, Any]:
    host = db.get("HOST") or (db.get("OPTIONS") or {}).get("host", "")
    return {"host": host, "port": str(db.get("PORT") or ""), "user": db.get("USER") or "",
            "password": db.get("PASSWORD") or ""}  # fmt: skip


def _maintenance(db: dict[str, Any]):
    import psycopg

    params = {k: v for k, v in _server(db).items() if v}
    try:
        return psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params)
    except psycopg.OperationalError as exc:
        raise BenchError(f"cannot reach the PostgreSQL server: {str(exc).strip()}") from exc


def _database_create(db: dict[str, Any], name: str) -> None:
    from psycopg import sql

    with _maintenance(db) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except Exception as exc:
            raise BenchError(f"cannot create the database {name}: {str(exc).strip()}") from exc


def _database_drop(db: dict[str, Any], name: str) -> None:
    from psycopg import sql

    with _maintenance(db) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _database_url(db: dict[str, Any], name: str) -> str:
    server = _server(db)
    user = quote(server["user"], safe="")
    if server["password"]:
        user += ":" + quote(server["password"], safe="")
    if server["host"].startswith("/"):
        return f"postgres://{user}@/{name}?host={quote(server['host'], safe='/')}"
    return f"postgres://{user}@{server['host'] or 'localhost'}:{server['port'] or 5432}/{name}"


# --- the measuring process --------------------------------------------------------------------


@dataclass
class Figures:
    count: int
    workers: int
    operator: str
    opsdeck_rate: float
    baseline_rate: float
    cpu_per_step: float  # seconds
    steps: int  # engine moves
    tasks: int  # Celery tasks (one may chain several moves)
    delays: list[float] = field(default_factory=list)  # seconds, one per instance
    unseen: int = 0  # instances whose healthy status the watch did not see

    def machine_readable(self) -> dict[str, float]:
        """The figures under `var/bench.json`'s keys."""
        return {
            "engine_ratio": round(self.baseline_rate / self.opsdeck_rate, 3),
            "engine_cpu_per_move_s": round(self.cpu_per_step, 5),
            "notice_p50_s": round(percentile(self.delays, 50), 4),
            "notice_p95_s": round(percentile(self.delays, 95), 4),
        }

    def lines(self) -> list[str]:
        ratio = self.baseline_rate / self.opsdeck_rate
        p50, p95 = percentile(self.delays, 50), percentile(self.delays, 95)
        lines = [
            f"{self.count} creates, {self.workers} worker process(es), operator: "
            + ("instant" if self.operator == "instant" else f"CNPG simulation, speed {SPEED:g}"),
            f"{'Opsdeck creates':28} {self.opsdeck_rate:9.1f} ops/s",
            f"{'baseline (bare client)':28} {self.baseline_rate:9.1f} ops/s",
            f"{'Opsdeck vs baseline':28} {ratio:9.2f}x  (time per operation; "
            f"aim: at most {AIM_RATIO:g}x)",
            f"{'engine CPU per move':28} {self.cpu_per_step * 1000:9.2f} ms  "
            f"({self.steps} moves, {self.steps / self.count:.1f} per operation, "
            f"{self.tasks} Celery tasks)",
            f"{'notice delay p50':28} {p50:9.3f} s   (aim: p50 under {AIM_P50:g} s; "
            "Argo polls every 5 s)",
            f"{'notice delay p95':28} {p95:9.3f} s   (aim: p95 under {AIM_P95:g} s; the cell "
            "watcher wakes operations)",
        ]
        if self.unseen:
            lines.append(f"({self.unseen} instances had no healthy status in the watch)")
        return lines


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (NaN when there are no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def measure(
    *, count: int, workers: int, timeout: float, out: Callable[[str], None], operator: str
) -> Figures:
    """The Opsdeck run and the baseline (see the module docstring); prints the figures."""
    import yaml
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    spec_text = _plan_text(count + WARMUP)
    with sandbox_cluster(operator) as sandbox:
        kubeconfig = yaml.safe_dump(sandbox.kubeconfig())
        rate, cpu, steps, tasks, delays, unseen = _opsdeck(
            kubeconfig, spec_text, count, workers, timeout
        )
    with sandbox_cluster(operator) as sandbox:
        kubeconfig, spec = yaml.safe_dump(sandbox.kubeconfig()), load_spec(spec_text)
        baseline(kubeconfig, spec, count=WARMUP, threads=workers, timeout=timeout)
        base_rate = baseline(kubeconfig, spec, count=count, threads=workers, timeout=timeout)
    figures = Figures(
        count, workers, operator, rate, base_rate, cpu / max(steps, 1), steps, tasks, delays,
        unseen,
    )  # fmt: skip
    for line in figures.lines():
        out(line)
    figures_record(os.environ.get(FIGURES_FILE_VARIABLE, ""), figures.machine_readable())
    return figures


# Where `make bench` keeps a machine-readable copy of every figure (the outer process names it:
# the measuring one runs on a var/ of its own).
FIGURES_FILE_VARIABLE = "OPSDECK_BENCH_FIGURES"


def figures_record(path: str, figures: dict[str, float]) -> None:
    """Merge `figures` into the JSON file at `path` (other benchmarks' figures stay)."""
    if not path:
        return
    target = Path(path)
    try:
        kept = json.loads(target.read_text())
    except (OSError, ValueError):
        kept = {}
    kept.update(figures)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".json.partial")
    partial.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
    partial.replace(target)


def sandbox_cluster(operator: str):
    """A sandbox cluster (not started) whose Clusters get healthy at once."""
    from sandbox.api import Sandbox

    if operator == "cnpg":
        return Sandbox(speed=SPEED)
    sandbox = Sandbox(operators=False)
    sandbox.controllers.append(InstantOperator(sandbox))
    return sandbox


class InstantOperator:
    """A sandbox controller standing in for CloudNativePG: a Cluster not yet healthy for its
    spec is given a healthy status with every instance ready in the next round; nothing else
    is created. A round only reads the stored Clusters (no copies) and writes the new ones."""

    name = "instant-cnpg"

    def __init__(self, sandbox) -> None:
        from sandbox.core import Ctx

        self.core = sandbox.core
        self.ctx = Ctx(field_manager="bench-operator", field_validation="Ignore")

    def next_due(self) -> float | None:
        return None

    def busy(self) -> bool:
        return False

    def reconcile(self) -> bool:
        from sandbox.errors import ApiError

        rt = self.core.resolve("postgresql.cnpg.io", "v1", "clusters")
        if rt is None:
            return False
        changed = False
        with self.core.lock:
            waiting = [
                obj
                for obj in self.core.store.objects.get(rt.key, {}).values()
                if not healthy(obj) and not obj["metadata"].get("deletionTimestamp")
            ]
            for obj in waiting:
                meta, spec = obj["metadata"], obj.get("spec") or {}
                want, name = int(spec.get("instances", 1)), meta["name"]
                body = copy.deepcopy(obj)
                body["status"] = {
                    **(obj.get("status") or {}),
                    "phase": HEALTHY,
                    "instances": want,
                    "readyInstances": want,
                    "currentPrimary": f"{name}-1",
                    "targetPrimary": f"{name}-1",
                    "writeService": f"{name}-rw",
                    "readService": f"{name}-r",
                    "image": spec.get("imageName", ""),
                }
                try:
                    self.core.update(rt, meta["namespace"], name, body, self.ctx, "status")
                except ApiError:
                    continue  # a client wrote it meanwhile: the next round sees the new one
                changed = True
        return changed


def _plan_text(count: int) -> str:
    text, found = re.subn(
        r"^maxNumberOfInstancesAllowed:.*$",
        f"maxNumberOfInstancesAllowed: {max(count, 1)}",
        SPEC.read_text(),
        flags=re.MULTILINE,
    )
    if not found:
        raise BenchError(f"{SPEC} has no maxNumberOfInstancesAllowed to raise")
    return text


def _opsdeck(kubeconfig: str, spec_text: str, count: int, workers: int, timeout: float):
    from django.conf import settings
    from django.db.models import Sum

    from accounts import services as accounts_services
    from accounts.audit import Actor
    from accounts.models import User
    from billing import services as billing_services
    from deployments import services
    from deployments.models import Operation, TaskRun

    services.cell_register(
        name="bench", kubeconfig=kubeconfig, region="local", cloud="sandbox",
        backup_destination=BACKUP_DESTINATION, backup_credentials=BACKUP_CREDENTIALS,
        make_default=True,
    )  # fmt: skip
    plan = services.plan_load(text=spec_text).plan
    user = User.objects.create_user(email="bench@opsdeck.invalid", password=None)
    tenant = accounts_services.tenant_create(actor=Actor(user=user), name="Bench")
    actor = Actor(user=user)
    billing_services.subscribe(actor=actor, tenant=tenant, plan=plan)

    watch = ClusterWatch(kubeconfig)
    pool = WorkerPool(workers, Path(settings.VAR_DIR))

    def create(i: int):
        return services.instance_create(
            actor=actor, tenant=tenant, plan=plan, name=f"bench-{i}", parameters={},
            request_id=uuid.uuid4().hex,
        ).pk  # fmt: skip

    try:
        watch.start()
        pool.start()
        # Warm up first (connections, caches, the first tasks' imports), as the baseline does.
        _wait_finished([create(i) for i in range(WARMUP)], pool, timeout)
        tasks_before = pool.steps()
        cpu_before = pool.cpu_seconds()
        began = time.time()
        operations = [create(WARMUP + i) for i in range(count)]
        _wait_finished(operations, pool, timeout)
        cpu = pool.cpu_seconds() - cpu_before
    finally:
        pool.stop()
        watch.stop()
        _queue_delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    tasks = pool.steps() - tasks_before
    steps = Operation.objects.filter(pk__in=operations).aggregate(n=Sum("moves"))["n"] or 0

    ops = list(Operation.objects.filter(pk__in=operations).select_related("instance"))
    failed = [op for op in ops if op.state != Operation.State.SUCCEEDED]
    if failed:
        first = "; ".join(f"{op.instance_id}: {op.state} {op.error}".strip() for op in failed[:3])
        raise BenchError(f"{len(failed)} of {count} creates did not succeed ({first})")
    finished = max(op.finished_at for op in ops).timestamp()
    rate = count / (finished - began)

    noticed = {
        run.operation.instance_id: run.finished_at.timestamp()
        for run in TaskRun.objects.filter(operation_id__in=operations, node="main.cluster")
        .select_related("operation")
        .order_by("attempt")
    }
    written = watch.healthy_at
    delays = [noticed[i] - written[i] for i in noticed if i in written]
    return rate, cpu, steps, tasks, delays, count - len(delays)


def _wait_finished(operations: list, pool: WorkerPool, timeout: float) -> None:
    from deployments.models import Operation

    active = [Operation.State.QUEUED, Operation.State.RUNNING]
    deadline = time.monotonic() + timeout
    while True:
        pending = Operation.objects.filter(pk__in=operations, state__in=active).count()
        if pending == 0:
            return
        dead = pool.dead()
        if dead:
            raise BenchError(f"a worker exited early:\n{dead}")
        if time.monotonic() > deadline:
            raise BenchError(
                f"{pending} of {len(operations)} creates still unfinished after {timeout:g} s; "
                f"last worker log lines:\n{pool.tail()}"
            )
        time.sleep(0.1)


def _queue_delete(queue: str) -> None:
    """Leave no bench queue behind on the broker."""
    from celery import current_app
    from kombu import Exchange, Queue

    # Declared first: a channel deletes only the bindings it knows of. Celery's default queue
    # is bound to a direct exchange of the same name.
    with suppress(Exception), current_app.connection_for_write() as conn:
        bound = Queue(queue, Exchange(queue), routing_key=queue)(conn.default_channel)
        bound.declare()
        bound.delete()


class WorkerPool:
    """`celery worker --pool solo` processes on this process's database and queue, and the cell
    watcher (`watch_cells`) that wakes their operations, as the Procfile runs them."""

    def __init__(self, size: int, log_dir: Path) -> None:
        self.size = size
        self.log_dir = log_dir
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self) -> None:
        tag = secrets.token_hex(3)
        for i in range(self.size):
            log = self.log_dir / f"worker-{i}.log"
            with open(log, "w") as handle:
                proc = subprocess.Popen(  # noqa: S603 - our own interpreter and fixed arguments
                    [sys.executable, "-m", "celery", "--app", "portal", "worker", "--pool", "solo",
                     "--loglevel", "INFO", "--without-mingle", "--without-gossip",
                     "--hostname", f"bench{i}-{tag}@%h"],
                    cwd=ROOT, env={**os.environ, "LOG_LEVEL": "INFO"}, stdout=handle,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            self.procs.append((proc, log))
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        for proc, log in self.procs:
            while " ready." not in log.read_text():
                if proc.poll() is not None:
                    raise BenchError(f"a worker did not start:\n{log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise BenchError(f"the workers were not ready after {WORKER_START_TIMEOUT:g} s")
                time.sleep(0.1)
        self._watcher_start()

    def _watcher_start(self) -> None:
        log = self.log_dir / "watcher.log"
        with open(log, "w") as handle:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "watch_cells"],
                cwd=ROOT, env={**os.environ, "LOG_LEVEL": "INFO"}, stdout=handle,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs.append((proc, log))
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while "watching cell" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the cell watcher did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def cpu_seconds(self) -> float:
        """User and system CPU time the workers and the watcher (and children) used so far."""
        import psutil

        total = 0.0
        for proc, _ in self.procs:
            t = psutil.Process(proc.pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def dead(self) -> str:
        """The last log lines of the workers that exited ("" while all run)."""
        return self.tail([(p, log) for p, log in self.procs if p.poll() is not None])

    def tail(self, procs: list | None = None, lines: int = 10) -> str:
        """The last log lines of `procs` (default: every worker)."""
        chosen = self.procs if procs is None else procs
        return "\n".join("\n".join(log.read_text().splitlines()[-lines:]) for _, log in chosen)

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()  # a warm shutdown: the task in hand finishes first
        for proc, _ in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def steps(self) -> int:
        """Task steps the workers executed, from their INFO log lines."""
        return sum(len(STEP_SUCCEEDED.findall(log.read_text())) for _, log in self.procs)


def healthy(cluster: dict[str, Any]) -> bool:
    """The create's successCondition: healthy, with every requested instance ready."""
    status = cluster.get("status") or {}
    spec = cluster.get("spec") or {}
    return status.get("phase") == HEALTHY and status.get("readyInstances") == spec.get("instances")


class ClusterWatch:
    """Watches every Cluster; `healthy_at[name]` is when its status first satisfied `healthy`
    (the wall-clock time the event was received)."""

    def __init__(self, kubeconfig: str) -> None:
        self.api = api_client_from_kubeconfig(kubeconfig)
        self.healthy_at: dict[str, float] = {}
        self._watch: Any = None
        self._thread: threading.Thread | None = None
        self.error: Exception | None = None

    def start(self) -> None:
        from kubernetes import client, watch

        objects = client.CustomObjectsApi(self.api)
        listed = objects.list_cluster_custom_object("postgresql.cnpg.io", "v1", "clusters")
        version = listed["metadata"]["resourceVersion"]
        self._watch = watch.Watch()

        def follow() -> None:
            try:
                for event in self._watch.stream(
                    objects.list_cluster_custom_object, "postgresql.cnpg.io", "v1", "clusters",
                    resource_version=version, allow_watch_bookmarks=False,
                ):  # fmt: skip
                    received = time.time()
                    obj = event["object"]
                    name = obj["metadata"]["name"]
                    if name not in self.healthy_at and healthy(obj):
                        self.healthy_at[name] = received
            except Exception as exc:  # the server went away at the end, or a real failure
                self.error = exc

        self._thread = threading.Thread(target=follow, name="bench-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        with suppress(Exception):
            self.api.rest_client.pool_manager.clear()  # ends the stream in flight
        if self._thread is not None:
            self._thread.join(5)
        self.api.close()


# --- the baseline: the same calls from a bare script ------------------------------------------


def baseline(
    kubeconfig: str, spec: PlanSpec, *, count: int, threads: int, timeout: float = TIMEOUT
) -> float:
    """Creates per second of a bare script: `count` instances from `threads` threads, each
    preparing the namespace as the runner does, applying the owner Secret and the Cluster the
    create workflow renders, then reading the Cluster until it is healthy. No Django, no Celery.
    """
    verb = spec.main.verbs["create"]
    numbers = itertools.count()
    errors: list[BaseException] = []
    deadline = time.monotonic() + timeout

    def work() -> None:
        with tempfile.TemporaryDirectory(prefix="opsdeck-baseline-") as tmp:
            driver = KubeDriver(
                api_client_from_kubeconfig(kubeconfig), cache_file=str(Path(tmp) / "d.json")
            )
            try:
                while not errors and next(numbers) < count:
                    _baseline_create(driver, spec, verb, deadline)
            except BaseException as exc:
                errors.append(exc)
            finally:
                driver.close()

    began = time.monotonic()
    pool = [threading.Thread(target=work, name=f"baseline-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - began
    if errors:
        raise BenchError(f"the baseline failed: {errors[0]!r}") from errors[0]
    return count / elapsed


def _baseline_create(driver: KubeDriver, spec: PlanSpec, verb, deadline: float) -> None:
    from deployments.spectest import new_instance_id

    instance_id = new_instance_id()
    operation_id = str(uuid.uuid4())
    values = validate_parameters(spec.main.parameters, {})
    # The same namespace and variables as the runner's (the executor's), then bare calls.
    where = executor.Placement(
        instance_id=instance_id, tenant_slug=TENANT_SLUG, tenant_name="Bench", region="local",
        cloud="sandbox", backup_destination=BACKUP_DESTINATION,
        operator_namespace=OPERATOR_NAMESPACE, backup_credentials=dict(BACKUP_CREDENTIALS),
    )  # fmt: skip
    for _ in executor.prelude(driver, executor.namespace_objects(spec, where)):
        pass
    ctx = executor.run_context(
        spec, verb, where, values=values, operation_id=operation_id, started_at=None,
        retention_days=plan_retention_days(spec.main.backup),
    )  # fmt: skip
    objects = []
    for name in ("credentials", "cluster"):
        obj = render_manifest(verb.workflow.templates[name].resource.manifest, ctx)
        obj["metadata"]["namespace"] = instance_id
        obj["metadata"].setdefault("labels", {})[OPERATION_LABEL] = operation_id
        driver.apply(obj)
        objects.append(obj)
    while not healthy(driver.get(objects[-1]) or {}):
        if time.monotonic() > deadline:
            raise BenchError(f"the baseline's Cluster {instance_id} never became healthy")
        time.sleep(BASELINE_POLL)
