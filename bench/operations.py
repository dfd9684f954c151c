"""`python -m bench.operations SPEC`: how fast Opsdeck runs a plan's creates, next to a bare
client script making the same calls, and how soon it notices the operator's status change.

The outer process creates a throwaway database and runs the measuring one on it
(`support.run_measuring`). That one starts, each in a process of its own:

- three sandbox clusters (`cell.SandboxProcess`): one with instant operators registered as a
  cell, one with instant operators for the baseline, one with the simulated operators at
  `--speed` registered as a second cell;
- `--workers` real `celery worker --pool solo` processes and the cell watcher
  (`manage.py watch_cells`), as the Procfile runs them, and `--workers` processes submitting
  the creates through `services.instance_create`, as web processes would (`Creator`), for
  tenants of TENANT_SIZE instances;
- `--workers` baseline processes: each runs the spec's create as a bare script (`plan.Create.run`:
  the executor's namespace prelude, the same rendered objects applied, each waited-on object
  read until its successCondition holds), no Django and no Celery.

Fair, as far as one machine allows: the baseline's clients are separate processes, as Opsdeck's
workers and submitters are, and every sandbox serves from its own process, so no client shares
the server's interpreter lock (threads in the server's process flattered the baseline by 4 to
18 %). Opsdeck's rate runs from the first submission to the last operation's end. Both sides
start warm (`--warmup` creates each, not counted), and their windows alternate — Opsdeck's
`--count` creates, then the baseline's — so that the machine's other load falls on both. The
ratio is the baseline's rate over Opsdeck's, per window; min, median and max are printed.
Before each of Opsdeck's windows the database is vacuumed and analyzed (`database_tended`), as
autovacuum keeps a database in service: without it (a server run with autovacuum off, as
some development machines are), the planner keeps choosing on statistics from when the tables
were empty, and reads thousands of rows where one would do.
Those windows run without the notice delay's instruments (the benchmark's own watch, and
triggers timing every move), which the baseline does not carry.

The notice delay is measured in windows of its own after those, on both cells: from the moment
the sandbox stored the change that first satisfied a waited-on object's successCondition to the
commit of the engine move that found it satisfied (see `cell`). The instant cell shows the
engine alone; the simulated cell, whose operators write status in several steps over seconds,
is the realistic figure the aims and `notice_p50_s`/`notice_p95_s` refer to.

`--cluster-latency MS` makes every sandbox wait MS milliseconds before it answers each API call
(its `latency_ms` fault), on both sides: the sandbox answers from memory, where an API server
writes each object to etcd before it answers, and every call either side makes waits as long.
Such a run's figures are kept under names ending in `_cluster_<MS>ms`, beside those of a run
without.

Every figure is also merged into `var/bench.json`. Figures, not pass/fail: the run fails only
when an operation does not succeed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import secrets
import subprocess
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import cell, cpu, plan
from .cell import SPAWN
from .support import (
    ROOT,
    BenchError,
    django_setup,
    figures_record,
    measure_or_run,
    percentile,
    spread,
)

TIMEOUT = 300.0  # wall-clock seconds one window may take before the benchmark fails
WARMUP = 20  # creates run (on both sides) before the measured ones, not counted
WORKER_START_TIMEOUT = 60.0
SPEED = 1.0  # the simulated cell's time factor: the operators' own pace
# Seconds the watches get after the last operation finished to deliver the last events.
WATCH_SETTLE = 1.0
AIM_RATIO = 1.5
AIM_P50 = 0.1  # seconds: a 50th of Argo's 5 s poll
AIM_P95 = 0.3
STEP_SUCCEEDED = re.compile(r"Task deployments\.tasks\.operation_step\[[^\]]+\] succeeded")
HOW = (
    "notice delay: from the sandbox storing the change that first satisfied the create's "
    "successCondition to the commit of the engine move that found it (a NOTIFY, delivered at "
    "commit)"
)


# --- the Opsdeck side ------------------------------------------------------------------------


CELERY_WORKER = [
    sys.executable, "-m", "celery", "--app", "portal", "worker",
    "--loglevel", "INFO", "--without-mingle", "--without-gossip",
]  # fmt: skip


class WorkerPool:
    """`celery worker --pool solo` processes on this process's database and queue, the mail
    worker that sends the emails of operations that ended, and the cell watcher (`watch_cells`)
    that wakes their operations, as the Procfile runs them."""

    def __init__(self, size: int, log_dir: Path) -> None:
        self.size = size
        self.log_dir = log_dir
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self) -> None:
        from django.conf import settings

        tag = secrets.token_hex(3)
        for i in range(self.size):
            self._start(
                f"worker-{i}",
                [*CELERY_WORKER, "--pool", "solo", "--hostname", f"bench{i}-{tag}@%h"],
                " ready.",
            )
        self._start(
            "mail",
            [
                *CELERY_WORKER,
                "--queues",
                settings.OPSDECK_MAIL_QUEUE,
                "--pool",
                "threads",
                "--concurrency",
                "4",
                "--hostname",
                f"benchmail-{tag}@%h",
            ],
            " ready.",
        )
        self._start("watcher", [sys.executable, "manage.py", "watch_cells"], "watching cell")

    @property
    def mail_pid(self) -> int:
        return self.procs[self.size][0].pid

    @property
    def watcher_pid(self) -> int:
        return self.procs[-1][0].pid

    def _start(self, name: str, command: list[str], ready: str) -> None:
        log = self.log_dir / f"{name}.log"
        with open(log, "w") as handle:
            proc = subprocess.Popen(  # noqa: S603 - our own interpreter and fixed arguments
                command,
                cwd=ROOT,
                env={**os.environ, "LOG_LEVEL": "INFO"},
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((proc, log))
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while ready not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{name} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def dead(self) -> str:
        """The last log lines of the processes that exited ("" while all run)."""
        return self.tail([(p, log) for p, log in self.procs if p.poll() is not None])

    def tail(self, procs: list | None = None, lines: int = 10) -> str:
        """The last log lines of `procs` (default: every process)."""
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


# Instances per tenant. A create's entitlement check sums the usage of all the tenant's instances
# (usage rules evaluated per instance), so one tenant holding the whole benchmark would measure
# that sum growing; customers hold a few instances each.
TENANT_SIZE = 10


class Creator:
    """Submits creates for the benchmark's tenants, TENANT_SIZE instances each, from `processes`
    processes of their own: web processes take requests side by side, as the baseline's
    clients run side by side."""

    def __init__(self, user, plan_row, tenants: list, processes: int) -> None:
        self.tenants = [tenant.pk for tenant in tenants]
        self.numbers = itertools.count()
        self.pool = ProcessPoolExecutor(
            processes, mp_context=SPAWN, initializer=_submitter_start,
            initargs=(user.pk, plan_row.pk),
        )  # fmt: skip

    def create(self, cell_row, count: int) -> list[str]:
        """Submit `count` creates on `cell_row`; their operations' ids."""
        jobs = [
            (self.tenants[n // TENANT_SIZE], cell_row.pk, n)
            for n in itertools.islice(self.numbers, count)
        ]
        return list(self.pool.map(_submit, jobs))

    def pids(self) -> list[int]:
        """The submitting processes (the executor keeps them by pid)."""
        return list(self.pool._processes or {})

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


_submitting: dict = {}  # a submitting process's actor, plan, tenants and cells


def _submitter_start(user_pk: int, plan_pk: int) -> None:
    django_setup()
    from accounts.audit import Actor
    from accounts.models import User
    from billing.models import Plan

    _submitting["actor"] = Actor(user=User.objects.get(pk=user_pk))
    _submitting["plan"] = Plan.objects.get(pk=plan_pk)


def _submit(job: tuple[int, int, int]) -> str:
    from accounts.models import Tenant
    from deployments import services
    from deployments.models import Cell

    tenant_pk, cell_pk, n = job
    if ("tenant", tenant_pk) not in _submitting:
        _submitting["tenant", tenant_pk] = Tenant.objects.get(pk=tenant_pk)
    if ("cell", cell_pk) not in _submitting:
        _submitting["cell", cell_pk] = Cell.objects.get(pk=cell_pk)
    operation = services.instance_create(
        actor=_submitting["actor"], tenant=_submitting["tenant", tenant_pk],
        plan=_submitting["plan"], name=f"bench-{n}", parameters={},
        request_id=uuid.uuid4().hex, cell=_submitting["cell", cell_pk],
    )  # fmt: skip
    return str(operation.pk)


def setup(spec_text: str, cells: dict[str, str], *, instances: int, processes: int):
    """The cells registered, the plan loaded, enough tenants subscribed to it for `instances`,
    and a `Creator` submitting from `processes` processes."""
    from accounts import services as accounts_services
    from accounts.audit import Actor
    from accounts.models import User
    from billing import services as billing_services
    from deployments import services

    registered = {}
    for name, kubeconfig in cells.items():
        registered[name] = services.cell_register(
            name=name,
            kubeconfig=kubeconfig,
            region="local",
            cloud="sandbox",
            backup_destination=plan.BACKUP_DESTINATION,
            backup_credentials=plan.BACKUP_CREDENTIALS,
        )
    loaded = services.plan_load(text=plan.raised_limit(spec_text, TENANT_SIZE)).plan
    user = User.objects.create_user(email="bench@opsdeck.invalid", password=None)
    actor = Actor(user=user)
    tenants = []
    for n in range(-(-instances // TENANT_SIZE)):
        tenant = accounts_services.tenant_create(actor=actor, name=f"Bench {n}")
        billing_services.subscribe(actor=actor, tenant=tenant, plan=loaded)
        tenants.append(tenant)
    return registered, Creator(user, loaded, tenants, processes)


# Seconds between the benchmark's looks at whether a window's operations finished: each look
# is PostgreSQL's work beside Opsdeck's (the baseline's side waits on its processes, not on
# the database). The window's end is the last operation's finished_at, whatever the look.
FINISHED_LOOK = 0.25


def wait_finished(operations: list, pool: WorkerPool, timeout: float) -> None:
    """Until no operation of `operations` is queued or running; BenchError if one failed."""
    from deployments.models import Operation

    active = [Operation.State.QUEUED, Operation.State.RUNNING]
    deadline = time.monotonic() + timeout
    while True:
        pending = Operation.objects.filter(pk__in=operations, state__in=active).count()
        if pending == 0:
            break
        dead = pool.dead()
        if dead:
            raise BenchError(f"a worker exited early:\n{dead}")
        if time.monotonic() > deadline:
            raise BenchError(
                f"{pending} of {len(operations)} operations still unfinished after {timeout:g} s;"
                f" last log lines:\n{pool.tail()}"
            )
        time.sleep(FINISHED_LOOK)
    failed = Operation.objects.filter(pk__in=operations).exclude(state=Operation.State.SUCCEEDED)
    if failed:
        first = "; ".join(f"{op.instance_id}: {op.state} {op.error}".strip() for op in failed[:3])
        raise BenchError(f"{failed.count()} of {len(operations)} did not succeed ({first})")


def database_tended() -> None:
    """What autovacuum does for a database in service, done at once: dead rows reclaimed and
    the planner's statistics made for the tables as they are now, not as they were when the
    benchmark began (empty). Outside the windows: neither side's time counts it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def opsdeck_window(
    creator: Creator, cell_row, count: int, pool: WorkerPool, timeout: float, meter=None
):
    """Creates per second for `count` creates, and their operations. Returns once the broker
    holds no more steps for the workers, so that no work of this window runs into the next one
    (a baseline window would pay for it). `meter` (a `cpu.CpuMeter`) measures the window from
    after the database is tended to then."""
    database_tended()
    if meter is not None:
        meter.begin()
    began = time.time()
    operations = creator.create(cell_row, count)
    wait_finished(operations, pool, timeout)
    rate = count / (opsdeck_finished(operations) - began)
    queue_drained(timeout)
    if meter is not None:
        meter.end()
    return rate, operations


def queue_drained(timeout: float) -> None:
    """Until the workers' queues on the broker are empty (every priority) three looks in a row:
    steps still sent for operations that finished (a late wake-up finds nothing to do, but its
    worker still spends time on it), and the emails of operations that ended."""
    from celery import current_app
    from django.conf import settings

    from portal.broker import queue_length

    deadline = time.monotonic() + timeout
    empty = 0
    while empty < 3:
        if time.monotonic() > deadline:
            raise BenchError(f"the queues still held tasks after {timeout:g} s")
        held = sum(
            queue_length(current_app, name)
            for name in (settings.CELERY_TASK_DEFAULT_QUEUE, settings.OPSDECK_MAIL_QUEUE)
        )
        empty = empty + 1 if held == 0 else 0
        time.sleep(0.1)


def opsdeck_finished(operations: list) -> float:
    """When the last of `operations` finished (`time.time()`)."""
    from django.db.models import Max

    from deployments.models import Operation

    finished = Operation.objects.filter(pk__in=operations).aggregate(last=Max("finished_at"))
    return finished["last"].timestamp()


def notice_delays(
    operations: list, create: plan.Create, watch: cell.NoticeWatch, commits: cell.Commits
) -> tuple[list[float], int, list[cell.Stages]]:
    """The notice delay of every waited-on task of `operations` (`NoticeWatch.satisfied` to
    the commit `CommitListener` heard), how many could not be measured, and each measured
    delay's stages."""
    from deployments.models import Operation

    delays, missed, stages = [], 0, []
    for pk, instance_id in Operation.objects.filter(pk__in=operations).values_list(
        "pk", "instance_id"
    ):
        for step in create.waits:
            stored = watch.satisfied.get((instance_id, step.node))
            found = None
            if stored is not None:
                seen = watch.seen.get((instance_id, step.node))
                found = commits.stages(str(pk), step.node, stored, seen)
            if found is None:
                missed += 1
            else:
                delays.append(found.committed - found.stored)
                stages.append(found)
    return delays, missed, stages


def stage_rows(stages: list[cell.Stages]) -> list[str]:
    """Where the notice delay goes: p50 and p95 of each stage, over the samples that have it.

    The watcher's own watch may deliver a change before the benchmark's does, so its stage can
    read below zero. An operation woken while a worker was moving it needs no new claim (the
    move goes on), so it has no "waiting for a worker" stage; one found with no wake-up at all
    was found by a move already under way, or by a poll."""
    parts = [
        ("the watch delivering the change", lambda s: s.seen and s.seen - s.stored),
        ("the watcher waking the operation", lambda s: s.seen and s.woken and s.woken - s.seen),
        ("the step waiting for a worker", lambda s: s.woken and s.claimed and s.claimed - s.woken),
        ("the move, to its commit", lambda s: s.claimed and s.committed - s.claimed),
    ]
    rows = []
    for label, part in parts:
        values = [v for v in (part(s) for s in stages) if v is not None]
        if values:
            rows.append(
                f"  {label:34} p50 {percentile(values, 50):6.3f} s  p95 "
                f"{percentile(values, 95):6.3f} s  ({len(values)} samples)"
            )
    unwoken = sum(1 for s in stages if s.woken is None)
    rows.append(f"  {'found without a wake-up':34} {unwoken} of {len(stages)} samples")
    return rows


# --- the baseline: the same calls from bare client processes -----------------------------------


def _baseline_client(conn, counter, kubeconfig: str, spec_text: str) -> None:
    import tempfile

    from deployments.kube import KubeDriver, api_client_from_kubeconfig

    create = plan.Create(spec_text)
    with tempfile.TemporaryDirectory(prefix="opsdeck-baseline-") as tmp:
        driver = KubeDriver(
            api_client_from_kubeconfig(kubeconfig), cache_file=str(Path(tmp) / "d.json")
        )
        conn.send("ready")
        try:
            while (message := conn.recv())[0] == "run":
                deadline = time.monotonic() + message[2]
                try:
                    while True:
                        with counter.get_lock():
                            n, counter.value = counter.value, counter.value + 1
                        if n >= message[1]:
                            break
                        create.run(driver, deadline=deadline)
                    conn.send(None)
                except Exception as exc:
                    conn.send(repr(exc))
        except (EOFError, KeyboardInterrupt):
            pass
        finally:
            driver.close()


class BaselinePool:
    """`size` client processes sharing the creates of each `run` through one counter."""

    def __init__(self, size: int, kubeconfig: str, spec_text: str) -> None:
        self.counter = SPAWN.Value("l", 0)
        self.clients = []
        for i in range(size):
            conn, child = SPAWN.Pipe()
            proc = SPAWN.Process(
                target=_baseline_client,
                args=(child, self.counter, kubeconfig, spec_text),
                name=f"bench-baseline-{i}",
                daemon=True,
            )
            self.clients.append((proc, conn))

    def __enter__(self) -> BaselinePool:
        for proc, _ in self.clients:
            proc.start()
        for _, conn in self.clients:
            if not conn.poll(WORKER_START_TIMEOUT):
                raise BenchError("a baseline client did not start")
            conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        for proc, conn in self.clients:
            if proc.is_alive():
                conn.send(("stop",))
        for proc, _ in self.clients:
            proc.join(10)
            if proc.is_alive():
                proc.kill()

    def run(self, count: int, timeout: float) -> float:
        """Creates per second of `count` creates shared by the clients."""
        self.counter.value = 0
        began = time.monotonic()
        for _, conn in self.clients:
            conn.send(("run", count, timeout))
        errors = [conn.recv() for _, conn in self.clients]
        elapsed = time.monotonic() - began
        if any(errors):
            raise BenchError(f"the baseline failed: {next(e for e in errors if e)}")
        return count / elapsed


# --- the measuring process --------------------------------------------------------------------


def cpu_meters(pool: WorkerPool, creator: Creator, baseline: BaselinePool, fast, bare):
    """Meters of each side's processes: Opsdeck's (its workers, mail worker, watcher,
    submitters, the cell's sandbox, PostgreSQL's backends for the bench's database, Redis) and
    the baseline's (its clients and their sandbox)."""
    from django.conf import settings

    workers = [proc.pid for proc, _ in pool.procs[: pool.size]]
    ours = cpu.CpuMeter(
        {
            "workers": lambda: workers,
            "mail": lambda: [pool.mail_pid],
            "watcher": lambda: [pool.watcher_pid],
            "submitters": creator.pids,
            "sandbox": lambda: [fast.pid],
            "PostgreSQL": cpu.postgres_backends(settings.DATABASES["default"]["NAME"]),
            "Redis": cpu.named("redis-server"),
        }
    )
    clients = [proc.pid for proc, _ in baseline.clients]
    theirs = cpu.CpuMeter({"clients": lambda: clients, "sandbox": lambda: [bare.pid]})
    return ours, theirs


@dataclass
class Windows:
    """What each window measured on one cell."""

    rates: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    delays: list[list[float]] = field(default_factory=list)
    missed: int = 0
    stages: list[cell.Stages] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [b / r for b, r in zip(self.baseline, self.rates, strict=True)]

    def all_delays(self) -> list[float]:
        return [d for window in self.delays for d in window]


def _row(label: str, values: list[float], unit: str, aim: str = "", digits: int = 2) -> str:
    low, mid, high = spread(values)
    return (
        f"{label:30} {low:8.{digits}f} {mid:8.{digits}f} {high:8.{digits}f} {unit:6}{aim}".rstrip()
    )


def _notice_rows(windows: Windows) -> list[str]:
    p50s = [percentile(w, 50) for w in windows.delays]
    p95s = [percentile(w, 95) for w in windows.delays]
    every = windows.all_delays()
    negative = sum(1 for d in every if d < 0)
    return [
        _row("notice delay p50", p50s, "s", f"aim: at most {AIM_P50:g} s", 3),
        _row("notice delay p95", p95s, "s", f"aim: at most {AIM_P95:g} s", 3),
        f"{'':30} all windows: p50 {percentile(every, 50):.3f} s, p95 "
        f"{percentile(every, 95):.3f} s over {len(every)} samples ({negative} negative, "
        f"{windows.missed} missed)",
    ]


def measure(
    *,
    spec: Path,
    count: int,
    sim_count: int,
    windows: int,
    workers: int,
    speed: float,
    timeout: float,
    warmup: int = WARMUP,
    cluster_latency_ms: int = 0,
) -> dict[str, float]:
    """The run the module docstring describes; prints the figures and returns them."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Sum

    from deployments.models import Operation

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        cursor.execute(cell.TRIGGER)
        cell.triggers_enable(cursor, False)
    spec_text = spec.read_text()
    create = plan.Create(spec_text)
    total = windows * (2 * count + sim_count) + warmup
    instant, simulated = Windows(), Windows()
    pool = WorkerPool(workers, Path(settings.VAR_DIR))
    with (
        cell.SandboxProcess(speed=SPEED, instant=True, latency_ms=cluster_latency_ms) as fast,
        cell.SandboxProcess(speed=SPEED, instant=True, latency_ms=cluster_latency_ms) as bare,
        cell.SandboxProcess(speed=speed, instant=False, latency_ms=cluster_latency_ms) as real,
        cell.CommitListener(settings.DATABASES["default"]) as listener,
        BaselinePool(workers, bare.kubeconfig, spec_text) as baseline,
    ):
        cells, creator = setup(
            spec_text,
            {"instant": fast.kubeconfig, "simulated": real.kubeconfig},
            instances=total,
            processes=workers,
        )
        watches = [cell.NoticeWatch(sb.kubeconfig, create, sb) for sb in (fast, real)]
        try:
            pool.start()
            # Warm up first (connections, caches, the first tasks' imports) on both sides.
            wait_finished(creator.create(cells["instant"], warmup), pool, timeout)
            baseline.run(warmup, timeout)
            tasks_before = pool.steps()
            ours, theirs = cpu_meters(pool, creator, baseline, fast, bare)
            # Throughput: Opsdeck as it runs anywhere, without the notice delay's instruments
            # (a watch of its own, triggers on every move), which the baseline does not carry.
            rate_windows = []
            for _ in range(windows):
                rate, operations = opsdeck_window(
                    creator, cells["instant"], count, pool, timeout, meter=ours
                )
                instant.rates.append(rate)
                theirs.begin()
                instant.baseline.append(baseline.run(count, timeout))
                theirs.end()
                rate_windows.append(operations)
            measured = [op for operations in rate_windows for op in operations]
            # The engine's CPU: its workers' and its watcher's, over its windows.
            cpu = ours.seconds["workers"] + ours.seconds["watcher"]
            tasks = pool.steps() - tasks_before
            moves = Operation.objects.filter(pk__in=measured).aggregate(n=Sum("moves"))["n"] or 0
            # Notice delays: windows of their own, with the instruments on.
            with connection.cursor() as cursor:
                cell.triggers_enable(cursor, True)
            for watch in watches:
                watch.start()
            instant_windows = []
            for _ in range(windows):
                _, operations = opsdeck_window(creator, cells["instant"], count, pool, timeout)
                instant_windows.append(operations)
            real_windows = []
            for _ in range(windows):
                rate, operations = opsdeck_window(
                    creator, cells["simulated"], sim_count, pool, timeout
                )
                simulated.rates.append(rate)
                real_windows.append(operations)
            time.sleep(WATCH_SETTLE)
            commits = listener.collect()
            simulated_ops = [op for operations in real_windows for op in operations]
            simulated_moves = (
                Operation.objects.filter(pk__in=simulated_ops).aggregate(n=Sum("moves"))["n"] or 0
            )
        finally:
            creator.close()
            pool.stop()
            for watch in watches:
                watch.stop()
            queue_delete(settings.CELERY_TASK_DEFAULT_QUEUE)
            queue_delete(settings.OPSDECK_MAIL_QUEUE)
        for watch in watches:
            if watch.error is not None:
                raise BenchError(f"the notice watch failed: {watch.error!r}")
    for found, watch, operation_windows in (
        (instant, watches[0], instant_windows),
        (simulated, watches[1], real_windows),
    ):
        for operations in operation_windows:
            delays, missed, stages = notice_delays(operations, create, watch, commits)
            found.delays.append(delays)
            found.missed += missed
            found.stages.extend(stages)

    cpu_per_move = cpu / max(moves, 1)
    print(
        f"Operations: {spec.name}'s create, {windows} windows of {count} creates each side, "
        f"{workers} worker processes (Opsdeck) and {workers} client processes (baseline)"
    )
    if cluster_latency_ms:
        print(f"every cluster call answered {cluster_latency_ms} ms later, on both sides")
    print(f"{'':30} {'min':>8} {'median':>8} {'max':>8}")
    print("instant operators:")
    for line in [
        _row("Opsdeck creates", instant.rates, "ops/s", digits=1),
        _row("baseline (bare client)", instant.baseline, "ops/s", digits=1),
        _row("Opsdeck vs baseline", instant.ratios, "x", f"aim: at most {AIM_RATIO:g}x"),
        *_notice_rows(instant),
    ]:
        print("  " + line)
    print(f"simulated operators at speed {speed:g}, {windows} windows of {sim_count} creates:")
    for line in [
        _row("Opsdeck creates", simulated.rates, "ops/s", digits=1),
        *_notice_rows(simulated),
    ]:
        print("  " + line)
    print(
        f"  where the simulated cell's notice delay goes (all windows; "
        f"{simulated_moves / max(len(simulated_ops), 1):.1f} moves per create):"
    )
    for line in stage_rows(simulated.stages):
        print("  " + line)
    print(
        f"engine CPU per move {cpu_per_move * 1000:.2f} ms ({moves} moves, "
        f"{moves / max(len(measured), 1):.1f} per create, {tasks} Celery tasks)"
    )
    opsdeck_cpu, baseline_cpu = ours.per(windows * count), theirs.per(windows * count)
    print(
        "CPU per create with instant operators, in ms (user + system; each process with the "
        "CEL and jq evaluator it starts):"
    )
    for side, found in (("Opsdeck", opsdeck_cpu), ("baseline", baseline_cpu)):
        parts = ", ".join(f"{name} {ms:.1f}" for name, ms in found.items())
        print(f"  {side:9} {sum(found.values()):6.1f}  ({parts})")
    print(HOW)
    low, mid, high = spread(instant.ratios)
    figures = {
        "engine_ratio": round(mid, 3),
        "engine_ratio_min": round(low, 3),
        "engine_ratio_max": round(high, 3),
        "engine_cpu_per_move_s": round(cpu_per_move, 5),
        "engine_creates_per_s": round(spread(instant.rates)[1], 2),
        "baseline_creates_per_s": round(spread(instant.baseline)[1], 2),
        "notice_p50_s": round(percentile(simulated.all_delays(), 50), 4),
        "notice_p95_s": round(percentile(simulated.all_delays(), 95), 4),
        "notice_instant_p50_s": round(percentile(instant.all_delays(), 50), 4),
        "notice_instant_p95_s": round(percentile(instant.all_delays(), 95), 4),
        "engine_cpu_per_create_ms": round(sum(opsdeck_cpu.values()), 1),
        "baseline_cpu_per_create_ms": round(sum(baseline_cpu.values()), 1),
    }
    if cluster_latency_ms:
        figures = {f"{name}_cluster_{cluster_latency_ms}ms": v for name, v in figures.items()}
    figures_record(figures)
    return figures


def queue_delete(queue: str) -> None:
    """Leave no bench queue behind on the broker."""
    from contextlib import suppress

    from celery import current_app

    # Declared first: a channel deletes only the bindings it knows of.
    with suppress(Exception), current_app.connection_for_write() as conn:
        bound = task_queue(queue, conn)
        bound.declare()
        bound.delete()


def task_queue(name: str, conn):
    """Celery's queue `name` bound to a channel of `conn`, declared as Celery declares it: bound
    to a direct exchange of the same name, with the app's maximum priority (RabbitMQ refuses a
    declaration whose arguments differ from the queue's)."""
    from celery import current_app
    from kombu import Exchange, Queue

    highest = current_app.conf.task_queue_max_priority
    return Queue(name, Exchange(name), routing_key=name, max_priority=highest)(conn.default_channel)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.operations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", type=Path, help="the plan spec whose create is measured")
    parser.add_argument(
        "--count",
        type=int,
        default=200,
        help="creates per window and side with instant operators (default 200)",
    )
    parser.add_argument(
        "--sim-count",
        type=int,
        default=40,
        help="creates per window with the simulated operators (default 40)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=WARMUP,
        help=f"creates each side runs first, not counted (default {WARMUP})",
    )
    parser.add_argument("--windows", type=int, default=3, help="windows (default 3)")
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes, and baseline client processes (default 2)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=SPEED,
        help=f"the simulated operators' time factor (default {SPEED:g}: their own pace)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help=f"seconds a window may take (default {TIMEOUT:g})",
    )
    parser.add_argument(
        "--cluster-latency",
        type=int,
        default=0,
        metavar="MS",
        help="milliseconds every sandbox waits before answering each API call, on both sides "
        "(default 0); the figures are kept under names ending in _cluster_<MS>ms",
    )
    # The measuring child process, run on the throwaway database.
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.count, args.sim_count, args.windows, args.workers) < 1 or args.timeout <= 0:
        parser.error("--count, --sim-count, --windows, --workers and --timeout must be positive")
    if args.cluster_latency < 0:
        parser.error("--cluster-latency cannot be negative")
    measure_or_run(
        "bench.operations",
        inner=args.inner,
        argv=argv,
        measure=lambda: measure(
            spec=args.spec.resolve(),
            count=args.count,
            sim_count=args.sim_count,
            windows=args.windows,
            workers=args.workers,
            speed=args.speed,
            timeout=args.timeout,
            warmup=args.warmup,
            cluster_latency_ms=args.cluster_latency,
        ),
    )


if __name__ == "__main__":
    main()
