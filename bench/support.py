"""What the benchmarks share: Django set up outside `manage.py`, a throwaway database around a
measuring child process, the machine-readable figures, and percentiles."""

from __future__ import annotations

import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from portal import scratch_databases

ROOT = Path(__file__).resolve().parent.parent
# Where `make bench` keeps a machine-readable copy of every figure. The outer process names it
# for the measuring one, which runs on a var/ of its own.
FIGURES_FILE_VARIABLE = "OPSDECK_BENCH_FIGURES"


class BenchError(Exception):
    """The benchmark could not run or what it measured did not all succeed."""


def django_setup() -> None:
    """Django with the project's settings, as `manage.py` would set it up."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()


# --- a database of its own around the measuring process ---------------------------------------


@contextmanager
def throwaway_database() -> Iterator[dict[str, str]]:
    """A fresh PostgreSQL database `opsdeck_bench_<random>` on the configured server, migrated
    (a copy of `portal.scratch_databases`' template), dropped at the end even on failure (the
    development database is never used); yields the environment a measuring child process runs
    with: that database, a Celery queue and a cache prefix of its own, production settings with
    keys of its own and a var/ of its own."""
    from django.conf import settings

    run_id = secrets.token_hex(4)
    name = f"opsdeck_bench_{run_id}"
    db = settings.DATABASES["default"]
    _database_create(db, name)
    try:
        with tempfile.TemporaryDirectory(prefix="opsdeck-bench-") as var_dir:
            yield {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "portal.settings",
                "DATABASE_URL": scratch_databases.url(db, name),
                "CELERY_QUEUE": f"opsdeck-bench-{run_id}",
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
                "CACHE_URL": settings.CACHE_URL,
                "CACHE_KEY_PREFIX": f"opsdeck-bench-{run_id}",
                "DEBUG": "0",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "OPSDECK_ENCRYPTION_KEYS": _fernet_key(),
                "OPSDECK_VAR_DIR": var_dir,
                FIGURES_FILE_VARIABLE: str(Path(settings.VAR_DIR) / "bench.json"),
                "LOG_LEVEL": "WARNING",
            }
    finally:
        scratch_databases.database_drop(db, name)


def measure_or_run(
    module: str, *, inner: bool, argv: list[str] | None, measure: Callable[[], object]
) -> None:
    """A benchmark's `main`, once its arguments are read: the measuring child (`--inner`) runs
    `measure`; the outer process runs that child on a throwaway database (`run_measuring`). A
    BenchError ends the program with its message."""
    django_setup()
    try:
        if inner:
            measure()
        else:
            run_measuring(module, sys.argv[1:] if argv is None else argv)
    except BenchError as exc:
        sys.exit(f"{module}: {exc}")


def run_measuring(module: str, args: list[str]) -> None:
    """Run `python -m <module> --inner <args>` on a throwaway database; BenchError when it
    fails (its own output says why)."""
    with throwaway_database() as env:
        command = [sys.executable, "-m", module, "--inner", *args]
        child = subprocess.Popen(command, cwd=ROOT, env=env)  # noqa: S603
        try:
            code = child.wait()
        except BaseException:
            # Ctrl-C reached the child as well (one process group): let it stop its workers
            # and its sandboxes before the database goes.
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise
    if code != 0:
        raise BenchError(f"the benchmark failed (exit status {code}); see above")


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def _database_create(db: dict[str, Any], name: str) -> None:
    """The database `name`, copied from the migrated template (`portal.scratch_databases`):
    the measuring process's own `migrate` then finds nothing to do."""
    try:
        scratch_databases.database_copy(db, name)
    except scratch_databases.ScratchDatabaseError as exc:
        raise BenchError(f"cannot create the database {name}: {exc}") from exc


# --- figures ---------------------------------------------------------------------------------


def figures_record(figures: dict[str, float], path: str | None = None) -> None:
    """Merge `figures` into the JSON file at `path` (default: the one the outer process named;
    nowhere when it named none); other benchmarks' figures stay."""
    path = path if path is not None else os.environ.get(FIGURES_FILE_VARIABLE, "")
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


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (NaN when there are no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def spread(values: list[float]) -> tuple[float, float, float]:
    """The smallest, the median and the largest of `values` (NaNs when there are none)."""
    if not values:
        return math.nan, math.nan, math.nan
    return min(values), statistics.median(values), max(values)


# --- what a transaction's statements read and updated ---------------------------------------


def rows_read(model) -> int:
    """The index entries and rows that this connection's scans of `model`'s table read and has
    not yet sent to PostgreSQL's statistics: read in the transaction that made the scans, the
    difference from a reading before them is what they read."""
    from django.db import connection

    with connection.cursor() as cursor:
        # Returned by a table: its rows read by sequential scans; by an index: its entries.
        cursor.execute(
            """
            SELECT sum(pg_stat_get_xact_tuples_returned(r))
              FROM (SELECT %s::regclass::oid UNION ALL
                    SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass) AS read (r)
            """,
            [model._meta.db_table] * 2,
        )
        return cursor.fetchone()[0] or 0


def row_updates(model) -> tuple[int, int]:
    """The updates of `model`'s rows this connection made and has not yet sent to PostgreSQL's
    statistics (those of the transaction in progress among them), and how many of them were
    made in the row's page (HOT: no new entry in any of the table's indexes)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_updated(%s::regclass),"
            " pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
            [model._meta.db_table] * 2,
        )
        return cursor.fetchone()
