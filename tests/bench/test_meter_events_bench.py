"""The meter events benchmark runs end to end with a tiny count on a database of its own, and
keeps its figure in bench.json (a smoke test: the figure itself is `make bench`'s business)."""

from tests.bench.support import run


def test_the_meter_events_benchmark_flushes_every_event_and_prints_the_ratio(tmp_path):
    # The bench itself fails unless every usage record was enqueued and sent.
    out, recorded = run(tmp_path, "bench.meter_events", "--count", "100")

    assert "100 meter events to the Stripe emulator" in out
    for figure in ("Opsdeck flush", "baseline (bare SDK loop)", "Opsdeck vs baseline"):
        assert figure in out
    assert recorded["meter_events_ratio"] > 0
