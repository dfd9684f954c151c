"""Six-field cron schedules (seconds first), as CloudNativePG's ScheduledBackup reads them."""

from __future__ import annotations

import datetime as dt
import re

_RANGES = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]
_MACROS = {
    "@yearly": "0 0 0 1 1 *",
    "@annually": "0 0 0 1 1 *",
    "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0",
    "@daily": "0 0 0 * * *",
    "@midnight": "0 0 0 * * *",
    "@hourly": "0 0 * * * *",
}


class CronError(ValueError):
    """A schedule that cannot be parsed."""


def _field(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            step = int(step_text)
        if part in ("*", "?"):
            start, end = low, high
        elif "-" in part:
            a, b = part.split("-", 1)
            start, end = int(a), int(b)
        else:
            start = int(part)
            end = high if step > 1 else start
        if start < low or end > high or start > end or step < 1:
            raise CronError(f"value out of range in {text!r}")
        values.update(range(start, end + 1, step))
    return values


def _every(text: str) -> dt.timedelta:
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms)", text):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[unit]
    if total <= 0:
        raise CronError(f"invalid @every duration {text!r}")
    return dt.timedelta(seconds=total)


def next_time(schedule: str, after: dt.datetime) -> dt.datetime:
    """The first time strictly after `after` that the schedule fires (UTC)."""
    schedule = schedule.strip()
    if schedule.startswith("@every "):
        return after + _every(schedule[len("@every ") :])
    schedule = _MACROS.get(schedule, schedule)
    parts = schedule.split()
    if len(parts) != 6:
        raise CronError(f"expected exactly 6 fields, found {len(parts)}: {schedule!r}")
    try:
        sec, minute, hour, dom, month, dow = (
            _field(p, lo, hi) for p, (lo, hi) in zip(parts, _RANGES, strict=True)
        )
    except ValueError as exc:
        raise CronError(str(exc)) from None
    t = after.replace(microsecond=0) + dt.timedelta(seconds=1)
    limit = after + dt.timedelta(days=366 * 5)
    while t < limit:
        if t.month not in month:
            t = (t.replace(day=1, hour=0, minute=0, second=0) + dt.timedelta(days=32)).replace(
                day=1
            )
            continue
        if t.day not in dom or (t.weekday() + 1) % 7 not in dow:
            t = t.replace(hour=0, minute=0, second=0) + dt.timedelta(days=1)
            continue
        if t.hour not in hour:
            t = t.replace(minute=0, second=0) + dt.timedelta(hours=1)
            continue
        if t.minute not in minute:
            t = t.replace(second=0) + dt.timedelta(minutes=1)
            continue
        if t.second not in sec:
            t += dt.timedelta(seconds=1)
            continue
        return t
    raise CronError(f"schedule {schedule!r} never fires")
