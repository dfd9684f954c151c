"""Run one call from several threads at once, each on its own database connection."""

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def race(call: Callable[[], Any], times: int = 4) -> list[Any]:
    """Start `times` threads that call `call` together; their results or exceptions."""
    barrier = threading.Barrier(times)
    results: list[Any] = [None] * times

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # the caller asserts on what each thread got
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def someone_waits_for_a_lock() -> bool:
    """Whether a connection to this test database waits for a row lock now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0] > 0
