"""Stripe's webhooks: `POST /billing/stripe/webhook/`.

The signature is verified on the raw body (400 and nothing stored when it fails). Each event is
stored once, by id, then handed to its handler; a replay of a processed event changes nothing.
A handler that fails leaves the event stored with its error and answers 500, so Stripe sends
it again and the handler runs again; one whose object Stripe no longer holds (404) is done
with, since every delivery would fail the same way. A signed body that is not an event is
answered 400, as a bad signature is. Delivery is unordered and an event's object is a copy
from when it was sent, so handlers act on the object as Stripe holds it now, fetched again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing import stripe_sync
from billing.models import Invoice, StripeEvent
from billing.stripe_gateway import BadWebhook, StripeGateway, StripeRefused, gateway

log = logging.getLogger(__name__)


def _object_id(event: StripeEvent) -> str:
    return event.payload["data"]["object"]["id"]


def checkout_session_completed(event: StripeEvent, gw: StripeGateway) -> None:
    session = gw.checkout_session(_object_id(event))
    stripe_sync.checkout_completed(session)
    if getattr(session, "subscription", None):
        stripe_sync.subscription_mirror(gw.subscription(session.subscription), gw)


def subscription_changed(event: StripeEvent, gw: StripeGateway) -> None:
    stripe_sync.subscription_mirror(gw.subscription(_object_id(event)), gw)


def _invoice_mirrored(invoice_id: str, gw: StripeGateway) -> Invoice | None:
    """The invoice as Stripe holds it now, with its subscription first, whose status a payment
    moves (a failed one makes it past due) whether or not its own event has arrived yet: and
    which the invoice is ours by (an invoice coming before the checkout's event that linked
    its subscription to ours was taken for a stranger's, and never shown). None for a
    stranger's."""
    invoice = gw.invoice(invoice_id)
    subscription_id = stripe_sync.invoice_values(invoice)["stripe_subscription_id"]
    if subscription_id:
        stripe_sync.subscription_mirror(gw.subscription(subscription_id), gw)
    return stripe_sync.invoice_mirror(invoice, gw.invoice_lines(invoice))


def invoice_changed(event: StripeEvent, gw: StripeGateway) -> None:
    _invoice_mirrored(_object_id(event), gw)


def credit_note_changed(event: StripeEvent, gw: StripeGateway) -> None:
    """A credit note issued, changed or voided in Stripe: its invoice first (a credit note may
    come before the invoice's own events, and makes an invoice it covers whole paid), then
    the credit note, both as Stripe holds them now. One of a stranger's invoice is ignored."""
    credit_note = gw.credit_note(_object_id(event))
    invoice = _invoice_mirrored(stripe_sync.stripe_id(credit_note, "invoice"), gw)
    if invoice is None:
        log.info("stripe credit note %s is not of one of our invoices", credit_note.id)
        return
    stripe_sync.credit_note_mirror(invoice, credit_note.id, gw)


def charge_refunded(event: StripeEvent, gw: StripeGateway) -> None:
    """A payment refunded in Stripe (with a credit note or without): what it refunded of each
    invoice it paid. A charge paying none of ours (another sale of the Stripe account) is
    ignored. A credit note's refund is its invoice's; Stripe does not say which invoice
    another refund of a payment that paid several is for: it is counted against them in the
    order Stripe lists their payments, each at most what it paid less what its credit notes
    refunded or credited, so it is counted once in all (`stripe_sync.charge_refund_parts`)."""
    charge = gw.charge(_object_id(event))
    intent = stripe_sync.stripe_id(charge, "payment_intent")
    paid = gw.invoices_paid_by(intent) if intent else []
    for invoice_id, _ in paid:
        invoice = _invoice_mirrored(invoice_id, gw)
        if invoice is not None:
            stripe_sync.charge_refunds_mirror(invoice, charge.id, gw, paid=paid)


def invoice_deleted(event: StripeEvent, gw: StripeGateway) -> None:
    """A draft deleted in Stripe (only a draft can be): never to be owed, it goes here too."""
    stripe_sync.invoice_draft_deleted(_object_id(event))


Handler = Callable[[StripeEvent, StripeGateway], None]

HANDLERS: dict[str, Handler] = {
    "checkout.session.completed": checkout_session_completed,
    "customer.subscription.created": subscription_changed,
    "customer.subscription.updated": subscription_changed,
    "customer.subscription.deleted": subscription_changed,
    "invoice.created": invoice_changed,
    "invoice.finalized": invoice_changed,
    "invoice.paid": invoice_changed,
    "invoice.payment_failed": invoice_changed,
    # The customer's bank asks them to confirm the payment: the invoice shows where to.
    "invoice.payment_action_required": invoice_changed,
    # Voided in Stripe's dashboard (nothing is owed), written off (it may still be paid), or
    # changed there otherwise.
    "invoice.voided": invoice_changed,
    "invoice.marked_uncollectible": invoice_changed,
    "invoice.updated": invoice_changed,
    "invoice.deleted": invoice_deleted,
    # Part or all of an invoice taken back in Stripe's dashboard: a credit note, a refund.
    "credit_note.created": credit_note_changed,
    "credit_note.updated": credit_note_changed,
    "credit_note.voided": credit_note_changed,
    "charge.refunded": charge_refunded,
}


_ID_MOST = StripeEvent._meta.get_field("event_id").max_length
_TYPE_MOST = StripeEvent._meta.get_field("type").max_length


def event_malformed(payload: Any) -> str:
    """What keeps a verified body from being stored as an event ("" when nothing does): an
    event is an object with an `id` and a `type` (text that fits, without a NUL) and the time
    it was `created` (seconds since the epoch). Stripe sends none other; a body that is not one
    is answered 400, as a bad signature is, and nothing is stored."""
    if not isinstance(payload, dict):
        return "the body is not a JSON object"
    for key, most in (("id", _ID_MOST), ("type", _TYPE_MOST)):
        value = payload.get(key)
        if not isinstance(value, str) or not 0 < len(value) <= most or "\x00" in value:
            return f"its {key} is not text of 1 to {most} characters"
    created = payload.get("created")
    if isinstance(created, bool) or not isinstance(created, int):
        return "its created is not a number of seconds"
    try:
        datetime.fromtimestamp(created, UTC)
    except (OverflowError, OSError, ValueError):
        return "its created is out of range"
    return ""


def _storable(value: Any) -> Any:
    """`value` as PostgreSQL's jsonb takes it: text without NUL characters or lone surrogates
    (which JSON may escape and jsonb refuses; handlers read Stripe's objects again, by id)."""
    if isinstance(value, str):
        return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_storable(item) for item in value]
    if isinstance(value, dict):
        return {_storable(key): _storable(item) for key, item in value.items()}
    return value


def event_record(payload: dict) -> StripeEvent:
    """The stored event (`payload`: one `event_malformed` passes), created on its first
    delivery."""
    stored, _ = StripeEvent.objects.get_or_create(
        event_id=payload["id"],
        defaults={
            "type": payload["type"],
            "created": datetime.fromtimestamp(payload["created"], UTC),
            "payload": _storable(payload),
        },
    )
    return stored


def _gone(exc: Exception) -> bool:
    """Whether a handler failed because Stripe no longer holds the object its event names (a
    draft invoice deleted, say): delivered again, it would fail the same way for days."""
    return isinstance(exc, StripeRefused) and exc.status == 404


def event_process(event_id: str, gw: StripeGateway) -> bool:
    """Run the event's handler unless it already ran; False when the handler failed (its error
    is stored). Concurrent deliveries of one event wait for each other on its row."""
    with transaction.atomic():
        event = StripeEvent.objects.select_for_update().get(event_id=event_id)
        if event.processed_at is not None:
            return True
        handler = HANDLERS.get(event.type)
        try:
            with transaction.atomic():
                if handler is not None:
                    handler(event, gw)
        except Exception as exc:  # any failure: stored, answered 500, retried by Stripe
            if not _gone(exc):
                log.exception("stripe event %s (%s) failed", event.event_id, event.type)
                event.error = f"{type(exc).__name__}: {exc}"[:2000]
                event.save(update_fields=["error"])
                return False
            log.info("stripe event %s (%s): its object is gone: %s", event.event_id, event.type,
                     exc)  # fmt: skip
        event.processed_at = timezone.now()
        event.error = ""
        event.save(update_fields=["processed_at", "error"])
        return True


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> HttpResponse:
    gw = gateway()
    if gw is None:
        raise Http404("Stripe is not configured.")
    body = request.body
    try:
        gw.webhook_event(body, request.headers.get("Stripe-Signature", ""))  # verified
    except BadWebhook as exc:
        log.warning("stripe webhook refused: %s", exc)
        return HttpResponse("Bad signature or payload.", status=400, content_type="text/plain")
    payload = json.loads(body)  # valid JSON: its signature was checked on it
    if problem := event_malformed(payload):
        log.warning("stripe webhook refused: signed, but %s", problem)
        return HttpResponse(f"Not an event: {problem}.", status=400, content_type="text/plain")
    stored = event_record(payload)
    if not event_process(stored.event_id, gw):
        return HttpResponse("Handler failed; send again.", status=500, content_type="text/plain")
    return HttpResponse("ok", content_type="text/plain")
