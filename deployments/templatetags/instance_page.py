"""Small helpers for the instance page's templates."""

import json
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
def sentence(words: str) -> str:
    """`words` ending a sentence: with its full stop, unless they end with their own (an
    engine error's "… of 3600 s." would read "s.." with the template's)."""
    words = str(words).rstrip()
    return words if words.endswith((".", "!", "?", "…")) else f"{words}."


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
