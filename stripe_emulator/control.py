"""The control API under /_emulator/ (a path Stripe never uses): JSON in, JSON out, no key.

Each endpoint is one StripeEmulator helper; README.md lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .routes import Route, route

if TYPE_CHECKING:
    from .api import StripeEmulator


def _reset(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    emulator.reset()
    return {"reset": True}


def _faults(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return {"faults": emulator.faults()}


def _add_fault(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return emulator.add_fault(**body)


def _clear_faults(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    emulator.clear_faults()
    return {"faults": []}


def _webhook(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return {"webhook": emulator.webhook()}


def _set_webhook(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    emulator.set_webhook(**body)
    return {"webhook": emulator.webhook()}


def _clear_webhook(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    emulator.clear_webhook()
    return {"webhook": None}


def _meter_events(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return {"meter_events": emulator.meter_events(body.get("event_name"))}


def _requests(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return {"requests": emulator.requests()}


def _events(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return {"events": emulator.events(body.get("type"))}


def _deliver(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    ids = body.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError('deliver takes {"ids": ["evt_...", ...]}')
    return {"deliveries": emulator.deliver(ids)}


def _replay(emulator: StripeEmulator, body: dict[str, Any], event_id: str) -> Any:
    return emulator.replay(event_id)


def _deliveries(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    return {"deliveries": emulator.deliveries()}


def _advance_clock(emulator: StripeEmulator, body: dict[str, Any]) -> Any:
    seconds = body.get("seconds")
    if not isinstance(seconds, int):
        raise ValueError('clock takes {"seconds": N}')
    return {"now": emulator.advance_clock(seconds)}


def _complete_checkout(emulator: StripeEmulator, body: dict[str, Any], session_id: str) -> Any:
    return emulator.complete_checkout(session_id)


def _pause(emulator: StripeEmulator, body: dict[str, Any], subscription_id: str) -> Any:
    return emulator.pause_subscription(subscription_id)


def _close_period(emulator: StripeEmulator, body: dict[str, Any], subscription_id: str) -> Any:
    return emulator.close_period(subscription_id)


def _finalize(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.finalize_invoice(invoice_id)


def _pay(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.pay_invoice(invoice_id)


def _fail(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.fail_invoice(invoice_id)


def _void(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.void_invoice(invoice_id)


def _delete_draft(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.delete_draft(invoice_id)


def _refund(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.refund_invoice(invoice_id, body.get("amount"))


def _credit_note(emulator: StripeEmulator, body: dict[str, Any], invoice_id: str) -> Any:
    return emulator.create_credit_note(invoice_id, **body)


def _void_credit_note(emulator: StripeEmulator, body: dict[str, Any], credit_note_id: str) -> Any:
    return emulator.void_credit_note(credit_note_id)


CONTROL: list[Route] = [
    route("POST", "/_emulator/reset", _reset),
    route("GET", "/_emulator/faults", _faults),
    route("POST", "/_emulator/faults", _add_fault),
    route("DELETE", "/_emulator/faults", _clear_faults),
    route("GET", "/_emulator/webhook", _webhook),
    route("PUT", "/_emulator/webhook", _set_webhook),
    route("DELETE", "/_emulator/webhook", _clear_webhook),
    route("GET", "/_emulator/meter_events", _meter_events),
    route("GET", "/_emulator/requests", _requests),
    route("GET", "/_emulator/events", _events),
    route("POST", "/_emulator/events/deliver", _deliver),
    route("POST", "/_emulator/events/{id}/replay", _replay),
    route("GET", "/_emulator/deliveries", _deliveries),
    route("POST", "/_emulator/clock", _advance_clock),
    route("POST", "/_emulator/checkout/sessions/{id}/complete", _complete_checkout),
    route("POST", "/_emulator/subscriptions/{id}/close_period", _close_period),
    route("POST", "/_emulator/subscriptions/{id}/pause", _pause),
    route("POST", "/_emulator/invoices/{id}/finalize", _finalize),
    route("POST", "/_emulator/invoices/{id}/pay", _pay),
    route("POST", "/_emulator/invoices/{id}/fail", _fail),
    route("POST", "/_emulator/invoices/{id}/void", _void),
    route("POST", "/_emulator/invoices/{id}/delete", _delete_draft),
    route("POST", "/_emulator/invoices/{id}/refund", _refund),
    route("POST", "/_emulator/invoices/{id}/credit_notes", _credit_note),
    route("POST", "/_emulator/credit_notes/{id}/void", _void_credit_note),
]
