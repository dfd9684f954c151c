from dataclasses import asdict

from celery import shared_task

from billing import meter_events


@shared_task
def meter_events_flush() -> dict:
    """Queue new usage for Stripe and send what is due (run every minute by beat; nothing
    happens while Stripe is not configured)."""
    added = meter_events.enqueue()
    flushed = asdict(meter_events.flush())
    return {"enqueued": added, **{k: v for k, v in flushed.items() if k != "errors"}}
