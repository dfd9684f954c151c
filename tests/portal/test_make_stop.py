"""`make stop` stops what `make run` left running, and nothing else: run with a var directory
of its own (OPSDECK_VAR_DIR), as every script of `make stop` reads it, so that it never touches
a `make run` of this checkout."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A process as `scripts/run.sh` leaves it: its command line names honcho, and it stops on
# Ctrl-C (SIGINT), as honcho does, stopping the Procfile's processes.
HONCHO_LIKE = [sys.executable, "-c", "import time; time.sleep(120)", "honcho", "start"]
NOT_HONCHO = [sys.executable, "-c", "import time; time.sleep(120)"]


def _make_stop(var: Path) -> None:
    subprocess.run(
        ["make", "--no-print-directory", "stop"],  # noqa: S607 - make, as a user types it
        cwd=ROOT,
        env={**os.environ, "OPSDECK_VAR_DIR": str(var)},
        check=True,
        timeout=60,
        capture_output=True,
    )


def test_make_stop_stops_a_make_run_left_in_the_background(tmp_path):
    running = subprocess.Popen(HONCHO_LIKE)  # noqa: S603 - fixed arguments
    (tmp_path / "honcho.pid").write_text(f"{running.pid}\n")

    _make_stop(tmp_path)

    assert running.poll() is not None  # make stop returned once it had exited


def test_make_stop_leaves_alone_a_process_that_took_a_stale_pid(tmp_path):
    other = subprocess.Popen(NOT_HONCHO)  # noqa: S603 - fixed arguments
    (tmp_path / "honcho.pid").write_text(f"{other.pid}\n")
    try:
        _make_stop(tmp_path)

        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
