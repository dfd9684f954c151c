"""Six-field cron schedules of ScheduledBackup (seconds first)."""

from __future__ import annotations

import datetime as dt

import pytest

from sandbox.operators.cron import CronError, next_time

T0 = dt.datetime(2026, 3, 14, 15, 9, 26, tzinfo=dt.UTC)  # a Saturday


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("0 0 0 * * *", dt.datetime(2026, 3, 15, 0, 0, 0, tzinfo=dt.UTC)),
        ("@daily", dt.datetime(2026, 3, 15, 0, 0, 0, tzinfo=dt.UTC)),
        ("* * * * * *", dt.datetime(2026, 3, 14, 15, 9, 27, tzinfo=dt.UTC)),
        ("*/15 * * * * *", dt.datetime(2026, 3, 14, 15, 9, 30, tzinfo=dt.UTC)),
        ("0 30 2 * * 1", dt.datetime(2026, 3, 16, 2, 30, 0, tzinfo=dt.UTC)),
        ("0 0 12 1 * *", dt.datetime(2026, 4, 1, 12, 0, 0, tzinfo=dt.UTC)),
        ("@hourly", dt.datetime(2026, 3, 14, 16, 0, 0, tzinfo=dt.UTC)),
        ("@every 1h", dt.datetime(2026, 3, 14, 16, 9, 26, tzinfo=dt.UTC)),
    ],
)
def test_next_time(schedule, expected):
    assert next_time(schedule, T0) == expected


@pytest.mark.parametrize("schedule", ["0 0 * * *", "61 * * * * *", "a b c d e f", "@every 0s"])
def test_bad_schedules_are_refused(schedule):
    with pytest.raises(CronError):
        next_time(schedule, T0)
