"""When a backup schedule's slots fall: every N hours, or at the times of a cron expression.

Plain values in, plain values out: the services claim the slots, this module only counts them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from celery.schedules import crontab

DEFAULT_PERIOD_HOURS = 24  # a plan whose spec says nothing about backups
DEFAULT_RETENTION_DAYS = 30
CRON_HELP = "Five fields, in UTC: minute hour day-of-month month day-of-week, e.g. 0 3 * * *."


def plan_period_hours(backup_configuration: dict | None) -> int:
    """A plan's default interval between backups (its `backupPeriodInHours`)."""
    return (backup_configuration or {}).get("backupPeriodInHours") or DEFAULT_PERIOD_HOURS


def plan_retention_days(backup_configuration: dict | None) -> int:
    """A plan's default retention of backups (its `backupRetentionInDays`)."""
    return (backup_configuration or {}).get("backupRetentionInDays") or DEFAULT_RETENTION_DAYS


def cron_parse(expression: str) -> crontab:
    """The schedule of a five-field cron expression (UTC); ValueError with a readable reason."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"Give five fields, not {len(fields)}. {CRON_HELP}")
    minute, hour, day_of_month, month, day_of_week = fields
    try:
        return crontab(
            minute=minute,
            hour=hour,
            day_of_month=day_of_month,
            month_of_year=month,
            day_of_week=day_of_week,
        )
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ValueError(f"Not a valid cron expression ({exc}). {CRON_HELP}") from exc


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
    following = slot_after(after=slot, interval_hours=interval_hours, cron=cron)
    if following > now:
        return following
    if cron:
        return slot_after(after=now, interval_hours=None, cron=cron)
    step = timedelta(hours=interval_hours or DEFAULT_PERIOD_HOURS)
    missed = (now - following) // step + 1
    return following + missed * step
