"""Billing periods: calendar months in UTC.

For an override, a period counts as closed as soon as the next month begins, even before
`close_billing_period` has closed its `BillingPeriod` (the stricter rule: an override can never
reach an hour that may already be metered and invoiced).
"""

from datetime import UTC, datetime, timedelta

from django.utils import timezone


def current_start(now: datetime | None = None) -> datetime:
    """The start of the billing period running at `now` (the first of its month, 00:00 UTC)."""
    now = (now or timezone.now()).astimezone(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_start(now: datetime | None = None) -> datetime:
    """The start of the billing period after the one running at `now` (the first of the next
    month, 00:00 UTC)."""
    return (current_start(now) + timedelta(days=32)).replace(day=1)


def is_closed(at: datetime, *, now: datetime | None = None) -> bool:
    """Whether the period holding `at` is closed: it lies before the current period."""
    return at < current_start(now)
