"""The metering benchmark runs end to end with tiny counts, prints every figure beside its aim
and keeps a machine-readable copy in bench.json (a smoke test: the figures themselves are
`make bench`'s business, not pass/fail)."""

from tests.bench.support import SPEC, run


def test_the_metering_benchmark_prints_both_figures_for_the_same_rows(tmp_path):
    # The bench itself fails when metering and its baseline did not record the same rows.
    out, recorded = run(tmp_path, "bench.metering", SPEC, "--count", "30")

    assert "metering one hour of 30 instances (138 usage records)" in out
    for figure in ("Opsdeck meter_hour", "baseline (INSERT … SELECT)", "Opsdeck vs baseline"):
        assert figure in out
    assert recorded["metering_ratio"] > 0
