"""The admin lists benchmark runs end to end on a small fleet, prints every list with what its
page read, and keeps its figures in bench.json (a smoke test: the figures themselves are
`make bench`'s business, not pass/fail)."""

from tests.bench.support import SPEC, run


def test_the_admin_lists_benchmark_prints_every_list_with_the_rows_its_page_read(tmp_path):
    out, recorded = run(tmp_path, "bench.admin_lists", SPEC, "--scale", "0.001", "--rounds", "1")

    assert "the admin's lists with 10 instances, 100 operations, 1,000 audit events" in out
    for listed in ("accounts / audit events", "deployments / operations", "billing / usage records",
                   "billing / meter events", "deployments / instances"):  # fmt: skip
        assert listed in out, listed
    assert recorded["admin_list_slowest_ms"] > 0
    # A page of usage records counts the 2,000 (fewer than OPSDECK_ADMIN_ESTIMATE_ABOVE) and
    # reads a page of them: not the table again for its filters, dates or order.
    usage = next(line for line in out.splitlines() if "billing / usage records" in line).split()
    rows, read = (int(figure.replace(",", "")) for figure in usage[4:6])
    assert rows == 2000 and rows < read < 1.5 * rows, usage
