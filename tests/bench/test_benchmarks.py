"""Each benchmark runs end to end with tiny counts, prints every figure beside its aim and keeps
a machine-readable copy in bench.json (smoke tests: the figures themselves are `make bench`'s
business, not pass/fail)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = "specs/postgres-cnpg.yaml"


def run(tmp_path, *command, timeout=300):
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


def test_the_operations_benchmark_prints_ratio_and_notice_delays_per_window(tmp_path):
    out, recorded = run(
        tmp_path, "bench.operations", SPEC, "--count", "3", "--sim-count", "2", "--windows",
        "2", "--warmup", "1", "--workers", "1", "--speed", "10",
    )  # fmt: skip

    lines = [line.strip() for line in out.splitlines()]
    for figure in ("Opsdeck creates", "baseline (bare client)", "Opsdeck vs baseline"):
        assert any(line.startswith(figure) for line in lines), (figure, out)
    assert "aim: at most 1.5x" in out
    # Notice delays for both operators, min/median/max over the windows, beside their aims.
    assert sum(line.startswith("notice delay p50") for line in lines) == 2, out
    assert "aim: at most 0.1 s" in out and "aim: at most 0.3 s" in out
    assert "simulated operators at speed 10" in out
    # Every sample was measured, none negative: from the store time to the commit.
    assert out.count("0 negative, 0 missed") == 2, out
    assert "from the sandbox storing the change" in out
    assert {"engine_ratio", "notice_p50_s", "notice_p95_s"} <= recorded.keys()
    assert recorded["engine_ratio"] > 0
    assert 0 < recorded["notice_p50_s"] <= recorded["notice_p95_s"]


def test_the_metering_benchmark_prints_both_figures_for_the_same_rows(tmp_path):
    # The bench itself fails when metering and its baseline did not record the same rows.
    out, recorded = run(tmp_path, "bench.metering", SPEC, "--count", "30")

    assert "metering one hour of 30 instances (138 usage records)" in out
    for figure in ("Opsdeck meter_hour", "baseline (INSERT … SELECT)", "Opsdeck vs baseline"):
        assert figure in out
    assert recorded["metering_ratio"] > 0


def test_the_metering_benchmark_writes_its_baseline_from_any_plan(tmp_path):
    out, _ = run(tmp_path, "bench.metering", "specs/valkey.yaml", "--count", "20")

    assert "metering one hour of 20 instances" in out


def test_the_evaluator_benchmark_measures_the_create_conditions_of_the_spec(tmp_path):
    out, recorded = run(tmp_path, "bench.evaluator", SPEC)

    assert "Bounded CEL/jq evaluation over a Cluster of" in out
    for figure in ("one CEL condition alone", "a move's 2 CEL condition(s)", "a jq output"):
        assert figure in out
    assert "evaluator_cel_overhead_us" in recorded


def test_the_scale_run_scaled_down_prints_throughput_notice_delay_and_watcher_memory(tmp_path):
    out, recorded = run(
        tmp_path, "bench.scale", SPEC, "--instances", "6", "--concurrent", "4", "--workers", "1"
    )

    assert "6 instances across 2 cells" in out
    for figure in ("fleet created", "concurrent creates", "notice delay p50", "notice delay p95"):
        assert figure in out
    assert "0 negative, 0 missed" in out
    assert "watcher memory (RSS)" in out
    assert recorded["scale_watcher_rss_mib"] > 0
