"""Billing periods: calendar months in UTC.

There is no stored period yet: a period closes when the next month begins. When invoicing
stores its periods (a `BillingPeriod` with a closed flag), `is_closed` asks that table instead;
its callers stay as they are.
"""

from datetime import UTC, datetime

from django.utils import timezone


def current_start(now: datetime | None = None) -> datetime:
    """The start of the billing period running at `now` (the first of its month, 00:00 UTC)."""
    now = (now or timezone.now()).astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def is_closed(at: datetime, *, now: datetime | None = None) -> bool:
    """Whether the period holding `at` is closed: it lies before the current period."""
    return at < current_start(now)
