"""The scale run goes end to end with tiny counts, prints every figure beside its aim
and keeps a machine-readable copy in bench.json (a smoke test: the figures themselves are
`make bench`'s business, not pass/fail)."""

from tests.bench.support import SPEC, run


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
