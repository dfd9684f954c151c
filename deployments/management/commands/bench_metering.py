"""`manage.py bench_metering [--count 10000]`: the metering benchmark."""

import argparse

from django.core.management.base import BaseCommand, CommandError

from deployments import metering_bench
from deployments.bench import BenchError


class Command(BaseCommand):
    help = (
        "Create --count instances in a database of its own (created and dropped here), meter "
        "one hour of them and time a hand-written INSERT … SELECT of the same rows; print both "
        "and the ratio. Figures, not pass/fail."
    )

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=10_000, help="instances (default 10000)")
        # The measuring child process, run on the bench database.
        parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args, **options):
        count = options["count"]
        if count < 1:
            raise CommandError("--count must be positive.")
        try:
            if options["inner"]:
                metering_bench.measure(count=count, out=self._line)
            else:
                metering_bench.run(count=count)
        except BenchError as exc:
            raise CommandError(str(exc)) from exc

    def _line(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()
