"""`manage.py bench_operations [--count 200] [--workers 2]`: the operations benchmark."""

import argparse

from django.core.management.base import BaseCommand, CommandError

from deployments import bench


class Command(BaseCommand):
    help = (
        "Create --count instances on an in-process sandbox cluster with instantly-ready "
        "operators, run by --workers real Celery worker processes, on a database and a queue "
        "of its own (created and dropped here); print operations per second, engine CPU per "
        "task step, the delay between the operator writing a healthy status and the engine "
        "noticing it (p50, p95), and the rate of a bare script making the same Kubernetes "
        "calls with as many threads. Figures, not pass/fail."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=200, help="creates (default 200)")
        parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
        parser.add_argument(
            "--timeout",
            type=float,
            default=bench.TIMEOUT,
            help=f"seconds the creates may take before the run fails (default {bench.TIMEOUT:g})",
        )
        parser.add_argument(
            "--operator",
            choices=bench.OPERATORS,
            default="instant",
            help="instant: Clusters are healthy as soon as they are written (default); cnpg: "
            f"the sandbox's CloudNativePG simulation at speed {bench.SPEED:g}",
        )
        # The measuring child process, run on the bench database and queue.
        parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args, **options):
        count, workers, timeout = options["count"], options["workers"], options["timeout"]
        operator = options["operator"]
        if count < 1 or workers < 1 or timeout <= 0:
            raise CommandError("--count, --workers and --timeout must be positive.")
        try:
            if options["inner"]:
                bench.measure(
                    count=count, workers=workers, timeout=timeout, out=self._line, operator=operator
                )
            else:
                bench.run(count=count, workers=workers, timeout=timeout, operator=operator)
        except bench.BenchError as exc:
            raise CommandError(str(exc)) from exc

    def _line(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()
