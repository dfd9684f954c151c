"""`manage.py bench_operations` runs end to end and prints every figure (a smoke test: the
figures themselves are `make bench`'s business, not pass/fail)."""

import json
import os
import subprocess
import sys

from tests.deployments.conftest import ROOT

FIGURES = [
    "Opsdeck creates",
    "baseline (bare client)",
    "Opsdeck vs baseline",
    "engine CPU per move",
    "notice delay p50",
    "notice delay p95",
]


def test_the_operations_benchmark_prints_every_figure(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "bench_operations", "--count", "3", "--workers", "1"],
        cwd=ROOT, env={**os.environ, "OPSDECK_VAR_DIR": str(tmp_path)}, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for figure in FIGURES:
        assert any(line.startswith(figure) for line in lines), (figure, result.stdout)
    assert "aim: at most 2x" in result.stdout
    assert "aim: p50 under 0.1 s" in result.stdout and "aim: p95 under 0.3 s" in result.stdout
    # And a machine-readable copy in var/bench.json.
    recorded = json.loads((tmp_path / "bench.json").read_text())
    assert {"engine_ratio", "notice_p50_s", "notice_p95_s"} <= recorded.keys()
    assert recorded["engine_ratio"] > 0
