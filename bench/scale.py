"""`python -m bench.scale SPEC [--instances 2000] [--cells 2] [--concurrent 200]`: Opsdeck
managing a fleet across several cells.

The outer process creates a throwaway database and runs the measuring one on it
(`support.run_measuring`). That one starts `--cells` sandbox clusters, each in a process of its
own with instant operators (the fleet measures the engine and the cell watcher, not the
simulation), registers them as cells, and starts `--workers` Celery workers and the cell watcher
(`manage.py watch_cells`), as the Procfile runs them. Then:

1. the fleet: `--instances` creates, spread over the cells and over tenants of
   `operations.TENANT_SIZE` instances, submitted at once and run to the end (its throughput
   is printed, not aimed at);
2. the measured load, once the database is vacuumed and analyzed as autovacuum would keep
   it (`operations.database_tended`): `--concurrent` more creates submitted at once beside the
   fleet — the create being the one verb every plan has — with their throughput and their
   notice delay (from the sandbox storing the change that satisfied the successCondition to
   the commit of the move that found it, as in `bench.operations`);
3. the watcher's resident memory (RSS), sampled every second: after the fleet, and the largest;
4. one round of beat's tasks that read every instance every 30 s (`fleet_rounds`): their time,
   CPU and the instance rows they wrote.

`--instances 40 --concurrent 10` makes it a smoke test. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from . import cell, plan
from .operations import (
    WATCH_SETTLE,
    WorkerPool,
    database_tended,
    notice_delays,
    opsdeck_finished,
    queue_delete,
    setup,
    stage_rows,
    wait_finished,
)
from .support import BenchError, figures_record, measure_or_run, percentile, row_updates

TIMEOUT = 1800.0
AIM_P50, AIM_P95 = 0.1, 0.3


class MemorySampler(threading.Thread):
    """The resident memory of one process, every second; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        import psutil

        super().__init__(name="bench-rss", daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.stopping = threading.Event()

    def now(self) -> int:
        rss = self.process.memory_info().rss
        self.peak = max(self.peak, rss)
        return rss

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.now()


def _submit(creator, cells: list, count: int) -> list:
    """`count` creates, shared out over the cells."""
    shares = [count // len(cells) + (i < count % len(cells)) for i in range(len(cells))]
    return [
        op for row, share in zip(cells, shares, strict=True) for op in creator.create(row, share)
    ]


def measure(*, spec: Path, instances: int, cells: int, concurrent: int, workers: int) -> None:
    """The run the module docstring describes; prints the figures."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        cursor.execute(cell.TRIGGER)
    spec_text = spec.read_text()
    create = plan.Create(spec_text)
    pool = WorkerPool(workers, Path(settings.VAR_DIR))
    with ExitStack() as stack:
        sandboxes = [
            stack.enter_context(cell.SandboxProcess(speed=1.0, instant=True)) for _ in range(cells)
        ]
        listener = stack.enter_context(cell.CommitListener(settings.DATABASES["default"]))
        registered, creator = setup(
            spec_text,
            {f"cell-{i}": sb.kubeconfig for i, sb in enumerate(sandboxes)},
            instances=instances + concurrent,
            processes=workers,
        )
        rows = list(registered.values())
        watches = [cell.NoticeWatch(sb.kubeconfig, create, sb) for sb in sandboxes]
        try:
            for watch in watches:
                watch.start()
            pool.start()
            memory = MemorySampler(pool.watcher_pid)
            memory.start()
            began = time.time()
            wait_finished(_submit(creator, rows, instances), pool, TIMEOUT)
            fleet_seconds = time.time() - began
            after_fleet = memory.now()
            database_tended()  # statistics for the fleet's tables, as autovacuum would make
            began = time.time()
            operations = _submit(creator, rows, concurrent)
            wait_finished(operations, pool, TIMEOUT)
            rate = concurrent / (opsdeck_finished(operations) - began)
            time.sleep(WATCH_SETTLE)
            commits = listener.collect()
            memory.stopping.set()
            rounds = fleet_rounds(sandboxes)
        finally:
            creator.close()
            pool.stop()
            for watch in watches:
                watch.stop()
            queue_delete(settings.CELERY_TASK_DEFAULT_QUEUE)
            queue_delete(settings.OPSDECK_MAIL_QUEUE)
    delays, stages = [], []
    for watch in watches:
        if watch.error is not None:
            raise BenchError(f"the notice watch failed: {watch.error!r}")
        cell_delays, _, cell_stages = notice_delays(operations, create, watch, commits)
        delays += cell_delays
        stages += cell_stages
    # Each operation ran in one cell: another cell's watch misses each of its waits.
    missed = len(operations) * len(create.waits) - len(delays)
    negative = sum(1 for d in delays if d < 0)
    p50, p95 = percentile(delays, 50), percentile(delays, 95)
    mib = 1024 * 1024
    print(
        f"Scale: {spec.name}, {instances} instances across {cells} cells (instant operators), "
        f"then {concurrent} concurrent creates; {workers} worker processes, 1 cell watcher"
    )
    print(f"{'fleet created':30} {fleet_seconds:8.1f} s    ({instances / fleet_seconds:.1f} ops/s)")
    print(f"{'concurrent creates':30} {rate:8.1f} ops/s")
    print(f"{'notice delay p50':30} {p50:8.3f} s    aim: at most {AIM_P50:g} s")
    print(f"{'notice delay p95':30} {p95:8.3f} s    aim: at most {AIM_P95:g} s")
    print(f"{'':30} over {len(delays)} samples ({negative} negative, {missed} missed)")
    for line in stage_rows(stages):
        print(line)
    print(f"{'watcher memory (RSS)':30} {after_fleet / mib:8.1f} MiB after the fleet, peak "
          f"{memory.peak / mib:.1f} MiB")  # fmt: skip
    print("one round of beat's fleet-wide tasks over the fleet, in one process:")
    for name, seconds, cpu, cells_cpu, written in rounds:
        print(
            f"  {name:28} {seconds:6.2f} s, {cpu:5.2f} s CPU here, {cells_cpu:5.2f} s CPU in "
            f"the cells' API servers, {written:,} instance rows written"
        )
    figures_record(
        {
            "scale_instances": instances,
            "scale_fleet_creates_per_s": round(instances / fleet_seconds, 2),
            "scale_creates_per_s": round(rate, 2),
            "scale_notice_p50_s": round(p50, 4),
            "scale_notice_p95_s": round(p95, 4),
            "scale_watcher_rss_mib": round(memory.peak / mib, 1),
            "scale_status_round_s": round(rounds[0][1], 3),
            "scale_status_round_rows_written": rounds[0][4],
            "scale_status_next_round_s": round(rounds[1][1], 3),
        }
    )


def fleet_rounds(sandboxes) -> list[tuple[str, float, float, float, int]]:
    """One round of each of beat's tasks that read every instance of the fleet every 30 s —
    the status sync's safety net beside the cell watcher (`status.instances_observe`, twice:
    its first round reads every cell, the next only what no watcher streams), and the health
    assessment (`health.instances_assess`) — run here: each one's name, wall seconds,
    CPU seconds in this process and in the cells' API servers, and the instance rows it wrote
    (PostgreSQL's count, in its transaction)."""
    import psutil
    from django.db import transaction

    from deployments import health, status
    from deployments.models import Instance

    servers = [psutil.Process(sandbox.pid) for sandbox in sandboxes]

    def servers_cpu() -> float:
        return sum(sum(server.cpu_times()[:2]) for server in servers)

    found = []
    for name, task in (
        ("status (instances_observe)", status.instances_observe),
        # 30 s later, as beat runs it: what the cell watcher streams is not read again yet.
        ("status, its next round", status.instances_observe),
        ("health (instances_assess)", health.instances_assess),
    ):
        with transaction.atomic():
            before, cells_before = row_updates(Instance)[0], servers_cpu()
            began, cpu = time.perf_counter(), time.process_time()
            task()
            seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
            found.append(
                (
                    name,
                    seconds,
                    cpu,
                    servers_cpu() - cells_before,
                    row_updates(Instance)[0] - before,
                )
            )
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", type=Path, help="the plan spec whose instances make the fleet")
    parser.add_argument("--instances", type=int, default=2000, help="the fleet (default 2000)")
    parser.add_argument("--cells", type=int, default=2, help="cells (default 2)")
    parser.add_argument(
        "--concurrent", type=int, default=200, help="creates measured at once (default 200)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    # The measuring child process, run on the throwaway database.
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.instances, args.cells, args.concurrent, args.workers) < 1:
        parser.error("--instances, --cells, --concurrent and --workers must be positive")
    measure_or_run(
        "bench.scale",
        inner=args.inner,
        argv=argv,
        measure=lambda: measure(
            spec=args.spec.resolve(),
            instances=args.instances,
            cells=args.cells,
            concurrent=args.concurrent,
            workers=args.workers,
        ),
    )


if __name__ == "__main__":
    main()
