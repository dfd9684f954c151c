"""Run one call from several threads at once, each on its own database connection."""

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction


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


def beside_a_lock(lock: Callable[[], Any], write: Callable[[], Any], act: Callable[[], Any]):
    """Two threads, each on its own connection: one opens a transaction, `lock`s rows, waits
    until the other — running `act` once the rows are locked — waits for a lock, then `write`s
    and commits. Their outcomes as (what the first got: "committed" or its exception, what
    `act` returned or raised): a deadlock between the two shows as an exception."""
    locked, results = threading.Event(), {}

    def hold() -> None:
        try:
            with transaction.atomic():
                lock()
                locked.set()
                deadline = time.monotonic() + 10
                while not someone_waits_for_a_lock() and time.monotonic() < deadline:
                    time.sleep(0.05)
                write()
            results["held"] = "committed"
        except Exception as exc:  # the caller asserts on what each got
            results["held"] = exc
        finally:
            locked.set()
            connection.close()

    def run() -> None:
        locked.wait(10)
        try:
            results["act"] = act()
        except Exception as exc:  # the caller asserts on what each got
            results["act"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=hold), threading.Thread(target=run)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results.get("held"), results.get("act")


def someone_waits_for_a_lock() -> bool:
    """Whether a connection to this test database waits for a lock now. By the connection's
    database, not the lock's: a wait for a row another transaction holds is a wait for that
    transaction's id, a lock of no database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


def beside_a_held_write(relay, held: Callable[[], Any], meanwhile: Callable[[], Any]):
    """Run `held` in a thread of its own (on its own connection) until the relay holds the
    write it waits for (`relay.hold`, called first), then `meanwhile` here; the write goes on
    once `meanwhile` returned. What each returned, once `held` ended; what either raised is
    raised."""
    results: dict[str, Any] = {}

    def run() -> None:
        try:
            results["held"] = held()
        except Exception as exc:  # raised in the caller's thread
            results["raised"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        if not relay.holding.wait(30):
            raise AssertionError("the write to hold was not made")
        got = meanwhile()
    finally:
        relay.release()
        thread.join(60)
    if "raised" in results:
        raise results["raised"]
    return results["held"], got
