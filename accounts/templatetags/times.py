"""Times as the portal says them, on every page alike: `relative` ("3 minutes ago", "in 29
days"), rounded to the nearest whole unit, and its `<time>` element (`includes/time.html`)."""

import math
from datetime import datetime

from django import template
from django.template.defaultfilters import pluralize
from django.utils import timezone

register = template.Library()

NB = "\N{NO-BREAK SPACE}"  # between a number and its unit

# Each unit: its name, its length in seconds, and how many of it make the next. No weeks:
# retentions and schedules are set in days, and "in 14 days" reads as the 14 days set.
_UNITS = [
    ("minute", 60, 60),
    ("hour", 3600, 24),
    ("day", 86400, 30),
    ("month", 30 * 86400, 12),
    ("year", 365 * 86400, None),
]


def rounded(seconds: float) -> str:
    """`seconds` (a minute or more) in the largest unit it reaches, to the nearest whole one:
    a backup kept 7 days, read a second after it was taken, is "7 days" away, not "6 days"."""
    unit = max(i for i, (_, length, _) in enumerate(_UNITS) if seconds >= length)
    name, length, per_next = _UNITS[unit]
    count = math.floor(seconds / length + 0.5)
    if per_next and count >= per_next:  # 23 h 50 min is "1 day", not "24 hours"
        name, length, _ = _UNITS[unit + 1]
        count = math.floor(seconds / length + 0.5)
    return f"{count}{NB}{name}{pluralize(count)}"


@register.filter
def relative(moment: datetime | None) -> str:
    """A time as a person says it: "just now", "3 hours ago", "in 29 days", "in under a
    minute"."""
    if moment is None:
        return ""
    seconds = (moment - timezone.now()).total_seconds()
    if seconds >= 60:
        return f"in {rounded(seconds)}"
    if seconds > 0:  # an expiry 30 s away has not happened "just now"
        return "in under a minute"
    if seconds > -60:
        return "just now"
    return f"{rounded(-seconds)} ago"
