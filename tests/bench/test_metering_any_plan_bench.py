"""The metering benchmark's baseline is written from any plan's usage rules, not one plan's
(a smoke test, a module of its own: without a database it runs at the end of `make test`, and
apart from the other metering smoke test it runs beside it rather than after it)."""

from tests.bench.support import run


def test_the_metering_benchmark_writes_its_baseline_from_any_plan(tmp_path):
    out, _ = run(tmp_path, "bench.metering", "specs/valkey.yaml", "--count", "20")

    assert "metering one hour of 20 instances" in out
