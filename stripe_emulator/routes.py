"""Which function answers which request: Stripe's API paths, and the pages the emulator hosts."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import (
    catalog,
    credit_notes,
    events,
    invoices,
    metering,
    pages,
    payments,
    sessions,
    subscriptions,
    tax_ids,
)
from .errors import StripeError, no_such
from .state import State


@dataclass(frozen=True)
class Route:
    """A method and a path template (`/v1/customers/{id}`) bound to a handler."""

    method: str
    pattern: re.Pattern[str]
    handler: Callable[..., Any]


def route(method: str, template: str, handler: Callable[..., Any]) -> Route:
    """A Route; each `{name}` in the template is one path segment passed to the handler."""
    regex = re.sub(r"\{\w+\}", "([^/]+)", template)
    return Route(method, re.compile(f"^{regex}$"), handler)


def resolve(
    routes: list[Route], method: str, path: str
) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """The handler and path arguments for a request, or Stripe's 404 for an unknown URL."""
    for candidate in routes:
        match = candidate.pattern.match(path)
        if match and candidate.method == method:
            return candidate.handler, match.groups()
    raise StripeError(404, f"Unrecognized request URL ({method}: {path}).")


API: list[Route] = [
    route("POST", "/v1/customers", catalog.customer_create),
    route("GET", "/v1/customers", catalog.customer_list),
    route("GET", "/v1/customers/{id}", catalog.customer_retrieve),
    route("POST", "/v1/customers/{id}/tax_ids", tax_ids.tax_id_create),
    route("GET", "/v1/customers/{id}/tax_ids", tax_ids.tax_id_list),
    route("GET", "/v1/customers/{id}/tax_ids/{tax_id}", tax_ids.tax_id_retrieve),
    route("DELETE", "/v1/customers/{id}/tax_ids/{tax_id}", tax_ids.tax_id_delete),
    route("POST", "/v1/customers/{id}", catalog.customer_update),
    route("POST", "/v1/products", catalog.product_create),
    route("GET", "/v1/products", catalog.product_list),
    route("GET", "/v1/products/{id}", catalog.product_retrieve),
    route("POST", "/v1/prices", catalog.price_create),
    route("GET", "/v1/prices", catalog.price_list),
    route("GET", "/v1/prices/{id}", catalog.price_retrieve),
    route("POST", "/v1/billing/meters", metering.meter_create),
    route("GET", "/v1/billing/meters", metering.meter_list),
    route("GET", "/v1/billing/meters/{id}", metering.meter_retrieve),
    route("POST", "/v1/billing/meters/{id}", metering.meter_update),
    route(
        "POST",
        "/v1/billing/meters/{id}/deactivate",
        functools.partial(metering.meter_set_status, status="inactive"),
    ),
    route(
        "POST",
        "/v1/billing/meters/{id}/reactivate",
        functools.partial(metering.meter_set_status, status="active"),
    ),
    route("GET", "/v1/billing/meters/{id}/event_summaries", metering.meter_event_summaries),
    route("POST", "/v1/billing/meter_events", metering.meter_event_create),
    route("POST", "/v1/billing/meter_event_adjustments", metering.meter_event_adjustment_create),
    route("POST", "/v1/checkout/sessions", sessions.checkout_session_create),
    route("GET", "/v1/checkout/sessions", sessions.checkout_session_list),
    route("GET", "/v1/checkout/sessions/{id}", sessions.checkout_session_retrieve),
    route("POST", "/v1/checkout/sessions/{id}/expire", sessions.checkout_session_expire),
    route("POST", "/v1/billing_portal/sessions", sessions.portal_session_create),
    route("GET", "/v1/subscriptions", subscriptions.subscription_list),
    route("GET", "/v1/subscriptions/{id}", subscriptions.subscription_retrieve),
    route("POST", "/v1/subscriptions/{id}", subscriptions.subscription_update),
    route("DELETE", "/v1/subscriptions/{id}", subscriptions.subscription_cancel),
    route("GET", "/v1/invoices", invoices.invoice_list),
    route("GET", "/v1/invoices/{id}", invoices.invoice_retrieve),
    route("GET", "/v1/invoices/{id}/lines", invoices.invoice_lines),
    route("GET", "/v1/invoice_payments", payments.invoice_payment_list),
    route("GET", "/v1/invoice_payments/{id}", payments.invoice_payment_retrieve),
    route("GET", "/v1/charges/{id}", payments.charge_retrieve),
    route("POST", "/v1/refunds", payments.refund_create),
    route("GET", "/v1/refunds", payments.refund_list),
    route("POST", "/v1/credit_notes", credit_notes.credit_note_create),
    route("GET", "/v1/credit_notes", credit_notes.credit_note_list),
    route("GET", "/v1/credit_notes/{id}", credit_notes.credit_note_retrieve),
    route("POST", "/v1/credit_notes/{id}", credit_notes.credit_note_update),
    route("POST", "/v1/credit_notes/{id}/void", credit_notes.credit_note_void),
    route("GET", "/v1/events", events.event_list),
    route("GET", "/v1/events/{id}", events.event_retrieve),
]


@dataclass
class Page:
    """A hosted page's answer: HTML, a PDF, or a redirect (status 303 with a Location)."""

    status: int
    content_type: str
    body: bytes
    location: str | None = None


def _html(text: str) -> Page:
    return Page(200, "text/html; charset=utf-8", text.encode())


def checkout_show(state: State, session_id: str) -> Page:
    """GET /c/pay/{id}: the Pay button, or where a completed session leads."""
    session = state.get("checkout.session", session_id, label="checkout.session")
    if session["status"] == "complete":
        return _after_checkout(session)
    if session["status"] == "expired":
        return _html(pages.checkout_expired_page())
    return _html(
        pages.checkout_page(session, state.get("checkout.line_items", session_id)["items"])
    )


def checkout_pay(state: State, session_id: str) -> Page:
    """POST /c/pay/{id}: complete the session, then go to its success_url (an expired one
    can no longer be paid)."""
    session = sessions.checkout_session_complete(state, session_id)
    if session["status"] == "expired":
        return _html(pages.checkout_expired_page())
    return _after_checkout(session)


def _after_checkout(session: dict[str, Any]) -> Page:
    success_url = session["success_url"]
    if not success_url:
        return _html(pages.checkout_done_page(session))
    # Stripe fills in the template variable {CHECKOUT_SESSION_ID}.
    location = success_url.replace("{CHECKOUT_SESSION_ID}", session["id"])
    return Page(303, "text/plain; charset=utf-8", b"", location)


def portal_show(state: State, session_id: str) -> Page:
    """GET /p/session/{id}: the customer's subscriptions and the way back."""
    session = state.get("billing_portal.session", session_id, label="billing_portal.session")
    owned = [s for s in state.all("subscription") if s["customer"] == session["customer"]]
    return _html(pages.portal_page(session, owned))


def invoice_show(state: State, invoice_id: str) -> Page:
    """GET /i/{id}: a finalized invoice's hosted page."""
    return _html(pages.invoice_page(_finalized(state, invoice_id)))


def invoice_pdf(state: State, invoice_id: str) -> Page:
    """GET /i/{id}/pdf: the same as a PDF."""
    return Page(200, "application/pdf", pages.invoice_pdf(_finalized(state, invoice_id)))


def _finalized(state: State, invoice_id: str) -> dict[str, Any]:
    invoice = state.get("invoice", invoice_id)
    if invoice["status"] == "draft":
        raise no_such("invoice", invoice_id)  # a draft has no hosted page yet
    return invoice


def credit_note_pdf(state: State, credit_note_id: str) -> Page:
    """GET /cn/{id}/pdf: a credit note's PDF."""
    credit_note = state.get("credit_note", credit_note_id, label="credit_note")
    return Page(200, "application/pdf", pages.text_pdf(pages.credit_note_text(credit_note)))


PAGES: list[Route] = [
    route("GET", "/c/pay/{id}", checkout_show),
    route("POST", "/c/pay/{id}", checkout_pay),
    route("GET", "/p/session/{id}", portal_show),
    route("GET", "/i/{id}", invoice_show),
    route("GET", "/i/{id}/pdf", invoice_pdf),
    route("GET", "/cn/{id}/pdf", credit_note_pdf),
]
