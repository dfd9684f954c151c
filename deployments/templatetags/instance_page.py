"""Small helpers for the instance page's templates."""

import uuid
from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

register = template.Library()


@register.simple_tag
def new_request_id() -> str:
    """A fresh request id for one form: submitting it twice makes one operation."""
    return uuid.uuid4().hex


@register.filter
def lookup(mapping: dict | None, key: str):
    """`mapping[key]`, or "" when there is none (templates cannot index by a variable)."""
    return (mapping or {}).get(key, "")


@register.filter
def duration(start: datetime | None, end: datetime | None = None) -> str:
    """How long from `start` to `end` (or now), as "42 s", "3 min 5 s" or "2 h 10 min"."""
    if start is None:
        return ""
    seconds = max(int(((end or timezone.now()) - start).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@register.filter
def relative(moment: datetime | None) -> str:
    """A time as a person says it: "just now", "3 hours ago", "in 29 days"."""
    if moment is None:
        return ""
    now = timezone.now()
    if abs((now - moment).total_seconds()) < 60:
        return "just now"
    if moment > now:
        return f"in {timeuntil(moment, now, depth=1)}"
    return f"{timesince(moment, now, depth=1)} ago"
