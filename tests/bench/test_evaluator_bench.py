"""The evaluator benchmark runs end to end with tiny counts, prints every figure beside its aim
and keeps a machine-readable copy in bench.json (a smoke test: the figures themselves are
`make bench`'s business, not pass/fail)."""

from tests.bench.support import SPEC, run


def test_the_evaluator_benchmark_measures_the_create_conditions_of_the_spec(tmp_path):
    out, recorded = run(tmp_path, "bench.evaluator", SPEC, "--rounds", "20")

    assert "Bounded CEL/jq evaluation over a Cluster of" in out
    for figure in ("one CEL condition alone", "a move's 2 CEL condition(s)", "a jq output"):
        assert figure in out
    assert "evaluator_cel_overhead_us" in recorded
