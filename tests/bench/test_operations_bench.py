"""The operations benchmark runs end to end with tiny counts, prints every figure beside its aim
and keeps a machine-readable copy in bench.json (a smoke test: the figures themselves are
`make bench`'s business, not pass/fail)."""

from tests.bench.support import SPEC, run


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


def test_a_run_with_a_cluster_latency_makes_every_call_wait_and_keeps_its_figures_apart(tmp_path):
    """`--cluster-latency 50`: every call of a create waits 50 ms on both sides (one client
    makes fewer creates a second than five calls so slowed allow: the namespace's objects, the
    Secret, the Cluster and its read back are more), and the figures are kept under names of
    their own, not in place of a plain run's."""
    out, recorded = run(
        tmp_path, "bench.operations", SPEC, "--count", "3", "--sim-count", "1", "--windows",
        "1", "--warmup", "1", "--workers", "1", "--speed", "10", "--cluster-latency", "50",
    )  # fmt: skip

    assert "every cluster call answered 50 ms later, on both sides" in out
    assert "engine_ratio" not in recorded and recorded["engine_ratio_cluster_50ms"] > 0
    assert recorded["baseline_creates_per_s_cluster_50ms"] < 1 / (5 * 0.050)
