"""What the benchmark smoke tests share: running one benchmark as `make bench` does.

The smoke tests are a module each: they run first (tests/conftest.py), side by side rather
than one after another on one test process."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = "specs/postgres-cnpg.yaml"


def run(tmp_path, *command, timeout=300):
    """Run `python -m COMMAND` with its figures kept in `tmp_path`; its output and figures."""
    result = subprocess.run(  # noqa: S603 - our own interpreter and modules
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env={**os.environ, "OPSDECK_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, json.loads((tmp_path / "bench.json").read_text())
