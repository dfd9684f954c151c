"""Small helpers for the instance page's templates."""

import json
import uuid
from datetime import datetime, timedelta

from django import template
from django.conf import settings
from django.template.defaultfilters import pluralize
from django.utils import timezone

from accounts.templatetags.times import NB, rounded

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
    """How long from `start` to `end` (or now), as "42 s", "3 min 5 s" or "2 h 10 min", each
    number held to its unit by a no-break space (a narrow line never ends between "4" and "s",
    as `relative`'s words do not)."""
    if start is None:
        return ""
    seconds = max(int(((end or timezone.now()) - start).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}{NB}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}{NB}min {seconds}{NB}s" if seconds else f"{minutes}{NB}min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}{NB}h {minutes}{NB}min" if minutes else f"{hours}{NB}h"


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


@register.simple_tag
def degraded_after() -> str:
    """How long a running instance fails its health check before it is marked Degraded
    (`OPSDECK_DEGRADED_AFTER`), as "2 minutes"."""
    seconds = settings.OPSDECK_DEGRADED_AFTER
    return rounded(seconds) if seconds >= 60 else f"{seconds}{NB}second{pluralize(seconds)}"


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
