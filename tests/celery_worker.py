"""A real Celery worker in this process (a pool of threads) on this run's queues (operations'
and beat's, and the mail queue, unless told which), consuming from the real broker — and
closing, when it stops, the database connections its threads kept.

Workers keep their connections from task to task (`portal.celery`); a worker process closes
them as it exits, but a thread pool's threads end without closing theirs, and a connection left
open keeps the test database from being dropped.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db.backends.signals import connection_created

from portal.broker import queue_forget
from portal.celery import app


@contextmanager
def threads_worker(concurrency: int, queues: list[str] | None = None) -> Iterator[None]:
    """On both of the run's queues unless `queues` names them; then the mail queue starts
    empty: what earlier tests left on it (a browser test's sign-up, say) is not this test's."""
    if queues is None:
        queues = [settings.CELERY_TASK_DEFAULT_QUEUE, settings.OPSDECK_MAIL_QUEUE]
        queue_forget(app, settings.OPSDECK_MAIL_QUEUE)
    opened = []

    def remember(sender, connection, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection)

    connection_created.connect(remember, weak=False)
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=concurrency,
            perform_ping_check=False,
            queues=queues,
        ):
            yield
    finally:
        connection_created.disconnect(remember)
        for wrapper in opened:
            if wrapper.connection is not None:  # not closed by its own thread
                wrapper.connection.close()
