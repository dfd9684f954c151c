from dataclasses import asdict

from celery import shared_task

from billing import invoicing, meter_events, services, stripe_sync
from billing.models import Subscription
from billing.stripe_gateway import StripeFailure, gateway


@shared_task
def subscription_notify(subscription_pk: int, event: str) -> None:
    """Mail the tenant's owners and billing members what happened to its subscription (a
    message queued before a change wrote its email itself, `services._notify`)."""
    subscription = (
        Subscription.objects.select_related("tenant", "plan").filter(pk=subscription_pk).first()
    )
    if subscription is not None:
        services.subscription_email_send(subscription=subscription, event=event)


@shared_task
def subscriptions_suspend_overdue() -> int:
    """Suspend past-due subscriptions beyond their grace period (run hourly by beat)."""
    return services.subscriptions_suspend_overdue()


@shared_task
def meter_events_flush() -> dict:
    """Queue new usage for Stripe and send what is due (run every minute by beat; nothing
    happens while Stripe is not configured)."""
    added = meter_events.enqueue()
    flushed = asdict(meter_events.flush())
    return {"enqueued": added, **{k: v for k, v in flushed.items() if k != "errors"}}


@shared_task
def subscriptions_reconcile() -> int:
    """Bring subscriptions to what Stripe holds, whatever webhook was lost (run hourly by beat;
    nothing happens while Stripe is not configured)."""
    return stripe_sync.subscriptions_reconcile()


@shared_task
def billing_details_push_due() -> int:
    """Send Stripe the billing details it does not hold yet (run every minute by beat; nothing
    happens while Stripe is not configured)."""
    return stripe_sync.billing_details_push_due()


@shared_task
def billing_details_push(tenant_pk: int) -> bool:
    """Send the tenant's Stripe customer the billing details, or the name, it does not hold
    yet (after a change committed); a failure is recorded, and beat tries again."""
    gw = gateway()
    if gw is None:
        return False
    try:
        return stripe_sync.billing_details_push(gw, tenant_pk)
    except StripeFailure:
        return False


@shared_task
def billing_period_close() -> str:
    """Close each month that has ended into draft invoices once all of its hours are metered
    (run hourly by beat: early in a month it waits for the last hours' metering; then it finds
    the period closed and does nothing)."""
    return "; ".join(
        f"closed {closed.period}: {len(closed.invoices)} invoice(s)"
        for closed in invoicing.period_close_due()
    )
