"""`python manage.py watch_cells`: wake operations on the changes of the objects they wait on.

Runs until SIGTERM or Ctrl-C. Any number may run: each cell is watched by one of them at a time
(a lease per cell; see `deployments.watcher`), and another takes a cell over within seconds of
its watcher's death.
"""

import signal
import threading

from django.core.management.base import BaseCommand

from deployments.watcher import LEASE_TTL, CellWatcher


class Command(BaseCommand):
    help = (
        "Watch every cell's objects (one watch per kind the plans make) and wake the "
        "operations waiting on them; one process per cell at a time, by lease."
    )

    def handle(self, *args, **options):
        stopping = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stopping.set())
        watcher = CellWatcher(stopping=stopping)
        self.stdout.write(
            f"watch_cells: {watcher.holder}; a cell whose watcher stops is taken over within "
            f"{LEASE_TTL.total_seconds():.0f} s"
        )
        watcher.run()
