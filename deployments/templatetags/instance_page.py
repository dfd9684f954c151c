"""Small helpers for the instance page's templates."""

import json
import math
import uuid
from datetime import datetime, timedelta

from django import template
from django.conf import settings
from django.template.defaultfilters import pluralize
from django.utils import timezone

register = template.Library()


@register.simple_tag
def new_request_id() -> str:
    """A fresh request id for one form: submitting it twice makes one operation."""
    return uuid.uuid4().hex


@register.filter
def lookup(mapping: dict | None, key: str):
    """`mapping[key]`, or "" when there is none (templates cannot index by a variable)."""
    return (mapping or {}).get(key, "")


_NB = "\N{NO-BREAK SPACE}"  # between a number and its unit


@register.filter
def duration(start: datetime | None, end: datetime | None = None) -> str:
    """How long from `start` to `end` (or now), as "42 s", "3 min 5 s" or "2 h 10 min", each
    number held to its unit by a no-break space (a narrow line never ends between "4" and "s",
    as `relative`'s words do not)."""
    if start is None:
        return ""
    seconds = max(int(((end or timezone.now()) - start).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}{_NB}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}{_NB}min {seconds}{_NB}s" if seconds else f"{minutes}{_NB}min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}{_NB}h {minutes}{_NB}min" if minutes else f"{hours}{_NB}h"


@register.filter
def running_for(start: datetime | None) -> str:
    """How long something still under way has run, to the minute: "under a minute", "3 min",
    "2 h 10 min". A timeline that follows it then changes once a minute, not at each poll."""
    if start is None:
        return ""
    seconds = max(int((timezone.now() - start).total_seconds()), 0)
    if seconds < 60:
        return "under a minute"
    return duration(start, start + timedelta(seconds=seconds - seconds % 60))


@register.filter
def sentence(words: str) -> str:
    """`words` ending a sentence: with its full stop, unless they end with their own (an
    engine error's "… of 3600 s." would read "s.." with the template's)."""
    words = str(words).rstrip()
    return words if words.endswith((".", "!", "?", "…")) else f"{words}."


# Each unit: its name, its length in seconds, and how many of it make the next. No weeks:
# retentions and schedules are set in days, and "in 14 days" reads as the 14 days set.
_UNITS = [
    ("minute", 60, 60),
    ("hour", 3600, 24),
    ("day", 86400, 30),
    ("month", 30 * 86400, 12),
    ("year", 365 * 86400, None),
]


def _rounded(seconds: float) -> str:
    """`seconds` (a minute or more) in the largest unit it reaches, to the nearest whole one:
    a backup kept 7 days, read a second after it was taken, is "7 days" away, not "6 days"."""
    unit = max(i for i, (_, length, _) in enumerate(_UNITS) if seconds >= length)
    name, length, per_next = _UNITS[unit]
    count = math.floor(seconds / length + 0.5)
    if per_next and count >= per_next:  # 23 h 50 min is "1 day", not "24 hours"
        name, length, _ = _UNITS[unit + 1]
        count = math.floor(seconds / length + 0.5)
    return f"{count}{_NB}{name}{pluralize(count)}"


@register.filter
def relative(moment: datetime | None) -> str:
    """A time as a person says it: "just now", "3 hours ago", "in 29 days", "in under a
    minute"."""
    if moment is None:
        return ""
    seconds = (moment - timezone.now()).total_seconds()
    if seconds >= 60:
        return f"in {_rounded(seconds)}"
    if seconds > 0:  # an expiry 30 s away has not happened "just now"
        return "in under a minute"
    if seconds > -60:
        return "just now"
    return f"{_rounded(-seconds)} ago"


@register.simple_tag
def degraded_after() -> str:
    """How long a running instance fails its health check before it is marked Degraded
    (`OPSDECK_DEGRADED_AFTER`), as "2 minutes"."""
    seconds = settings.OPSDECK_DEGRADED_AFTER
    return _rounded(seconds) if seconds >= 60 else f"{seconds}{_NB}second{pluralize(seconds)}"


@register.filter
def values_said(values: dict | None, labels: dict[str, str]) -> str:
    """Values an action was given, as the Activity tab says them: "Servers: 4, Policy:
    volatile-ttl", each parameter by its form's name."""
    said = []
    for key, value in (values or {}).items():
        if isinstance(value, bool):
            shown = "yes" if value else "no"
        elif isinstance(value, dict | list):  # a JSON parameter's, as its form field holds it
            shown = json.dumps(value, sort_keys=True, ensure_ascii=False)
        else:
            shown = value
        said.append(f"{labels.get(key, key)}: {shown}")
    return ", ".join(said)
