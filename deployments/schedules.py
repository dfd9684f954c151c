"""When a backup schedule's slots fall: every N hours, or at the times of a cron expression.

Plain values in, plain values out: the services claim the slots, this module only counts them.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from celery.schedules import ParseException, crontab, crontab_parser

DEFAULT_PERIOD_HOURS = 24  # a plan whose spec says nothing about backups
DEFAULT_RETENTION_DAYS = 30
CRON_HELP = "Five fields, in UTC: minute hour day-of-month month day-of-week, e.g. 0 3 * * *."


def plan_period_hours(backup_configuration: dict | None) -> int:
    """A plan's default interval between backups (its `backupPeriodInHours`)."""
    return (backup_configuration or {}).get("backupPeriodInHours") or DEFAULT_PERIOD_HOURS


def plan_retention_days(backup_configuration: dict | None) -> int:
    """A plan's default retention of backups (its `backupRetentionInDays`)."""
    return (backup_configuration or {}).get("backupRetentionInDays") or DEFAULT_RETENTION_DAYS


# Each field of a cron expression: its name, and the values it takes. A day of the week is 0 to
# 7, Sunday both 0 and 7, as cron reads it (crontab takes 0 to 6: 7 is given to it as 0).
_CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)

_CRON_TEXT = re.compile(r"[0-9A-Za-z*,/-]+")
# The names cron takes, in its two fields that take them: jan-mar, mon-fri.
_CRON_NAMES = {
    "month": frozenset(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    ),
    "day-of-week": frozenset(["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
}

_CRON_NAMES_SAID = {"month": " or jan to dec", "day-of-week": " or sun to sat"}


def _cron_text(name: str, field: str) -> bool:
    """Whether a field is written in cron's characters, its words names of that field."""
    words = re.findall(r"[A-Za-z]+", field)
    names = _CRON_NAMES.get(name, frozenset())
    return bool(_CRON_TEXT.fullmatch(field)) and all(w.lower() in names for w in words)


def cron_check(expression: str) -> None:
    """ValueError, with a reason a person can act on, unless the expression is one a
    schedule may be given: valid, and falling due at most once an hour (a backup a minute was
    accepted, each billed as backup storage)."""
    if len(cron_parse(expression, strict=True).minute) > 1:
        raise ValueError(
            "At most one backup an hour: give the minute as one number (0 3 * * * is 03:00 "
            "every day)."
        )
    _, _, day_of_month, _, day_of_week = expression.split()
    if day_of_month != "*" and day_of_week != "*":
        # Cron takes either day, the schedule would take only days that are both: refused
        # rather than read two ways.
        raise ValueError(
            "Give a day of the month or a day of the week, not both (0 3 1 * * is the 1st of "
            "every month, 0 3 * * 1 every Monday)."
        )


def cron_parse(expression: str, *, strict: bool = False) -> crontab:
    """The schedule of a five-field cron expression (UTC); ValueError with a reason a person
    can act on. `strict` (an expression given now, `cron_check`): in cron's own characters
    only; one stored before that was refused is still read as it was then."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"Give five fields, not {len(fields)}. {CRON_HELP}")
    values = []
    for (name, low, high), field in zip(_CRON_FIELDS, fields, strict=True):
        try:
            # Cron's own characters alone: int() also reads "+5", "1_5" and digits other
            # than 0-9 (Arabic-Indic, full-width), and crontab any name in any field.
            if strict and not _cron_text(name, field):
                raise ValueError(field)
            values.append(crontab_parser(high - low + 1, low).parse(field))  # as crontab reads it
        except (ParseException, ValueError, TypeError, KeyError, IndexError):
            names = _CRON_NAMES_SAID.get(name, "")
            raise ValueError(
                f'The {name} field "{field}" is not valid: use numbers from {low} to {high}'
                f"{names}, *, a range (1-5), a list (1,15) or a step (*/2). {CRON_HELP}"
            ) from None
    minute, hour, day_of_month, month, day_of_week = fields
    if day_of_week != "*":
        day_of_week = ",".join(str(day) for day in sorted({day % 7 for day in values[-1]}))
    try:
        return crontab(
            minute=minute,
            hour=hour,
            day_of_month=day_of_month,
            month_of_year=month,
            day_of_week=day_of_week,
        )
    except (ParseException, ValueError, TypeError, KeyError, IndexError):
        raise ValueError(
            "This expression never falls due: no month has the day it names."
        ) from None


def slot_after(*, after: datetime, interval_hours: int | None, cron: str) -> datetime:
    """The first slot strictly after `after`: `after` plus the interval, or the cron's next time."""
    if cron:
        schedule = cron_parse(cron)
        schedule.nowfun = lambda: after
        return (after + schedule.remaining_estimate(after)).replace(microsecond=0)
    return after + timedelta(hours=interval_hours or DEFAULT_PERIOD_HOURS)


def slot_next(*, slot: datetime, now: datetime, interval_hours: int | None, cron: str) -> datetime:
    """The slot after `slot` that is still to come at `now`: slots missed while nothing ran
    (beat down, the schedule claimed late) are not made up."""
    # At most one slot an hour, whatever a cron stored before that was refused says.
    since = slot + timedelta(hours=1) - timedelta(seconds=1) if cron else slot
    following = slot_after(after=since, interval_hours=interval_hours, cron=cron)
    if following > now:
        return following
    if cron:
        return slot_after(after=max(now, since), interval_hours=None, cron=cron)
    step = timedelta(hours=interval_hours or DEFAULT_PERIOD_HOURS)
    missed = (now - following) // step + 1
    return following + missed * step
