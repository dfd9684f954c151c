"""The one place Opsdeck talks to Stripe: a `StripeGateway` around one `stripe.StripeClient`.

Every POST carries an `Idempotency-Key` derived from our own row (`opsdeck-customer-<tenant>`,
`opsdeck-meter-<dimension>`, …), so a retried task never creates an object twice. The SDK's own
network retries are off: the outbox retries with its own identifiers and back-off.
`gateway()` is None when `STRIPE_API_KEY` is unset: billing then stays local.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import stripe
from django.conf import settings

TIMEOUT = 20.0  # seconds for one request: a hanging Stripe must not hold a worker for long

# Stripe's answer to an identifier it already accepted (a 400 without a code).
_DUPLICATE_IDENTIFIER = "An event already exists with identifier"


class StripeFailure(Exception):
    """A call that did not do what was asked; `str()` is a readable reason."""

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, said: str = ""
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.said = said or message  # Stripe's own words, for the people who made the request


class StripeRetryable(StripeFailure):
    """No answer, a 5xx, a 429, or a key or permission to fix: the same call may work later."""


class StripeRefused(StripeFailure):
    """Stripe refused the request itself (a 4xx such as a bad parameter): it will again."""

    @property
    def gone(self) -> bool:
        """Whether Stripe says the object asked for is gone (404): not when it names one in the
        other mode (a test key asking for a live object, or the reverse), which goes on."""
        return self.status == 404 and "similar object exists" not in str(self)


class BadWebhook(Exception):
    """A webhook whose signature does not verify, or whose body is not an event."""


def classify(exc: stripe.StripeError) -> StripeFailure:
    """What a Stripe error means for the caller."""
    status = exc.http_status
    message = f"{f'{status} ' if status else ''}{type(exc).__name__}: {exc.user_message or exc}"
    kind = StripeRefused if isinstance(exc, stripe.InvalidRequestError) else StripeRetryable
    return kind(message[:2000], status=status, code=exc.code, said=(exc.user_message or "")[:2000])


P = ParamSpec("P")
R = TypeVar("R")


def _translated(call: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(call)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except stripe.StripeError as exc:
            raise classify(exc) from exc

    return wrapper


def _digest(params: dict[str, Any]) -> str:
    """A short digest of a request's parameters, for an idempotency key that covers them."""
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


class StripeGateway:
    """What billing asks of Stripe, each call one request; answers are SDK objects, failures
    `StripeRetryable` or `StripeRefused`."""

    def __init__(
        self,
        api_key: str,
        *,
        api_version: str,
        api_base: str = "",
        webhook_secret: str = "",
        timeout: float = TIMEOUT,
    ) -> None:
        base_addresses: Any = (
            {"api": api_base, "meter_events": api_base, "files": api_base} if api_base else None
        )
        self.webhook_secret = webhook_secret
        self.client = stripe.StripeClient(
            api_key,
            stripe_version=api_version,
            base_addresses=base_addresses,
            max_network_retries=0,
            http_client=stripe.new_default_http_client(timeout=timeout),
        )

    # --- customers -------------------------------------------------------------------------

    @_translated
    def customer_create(self, *, tenant_id: int, name: str, email: str = "") -> Any:
        params: dict[str, Any] = {"name": name, "metadata": {"opsdeck_tenant": str(tenant_id)}}
        if email:
            params["email"] = email
        # The key covers what is asked: asked again after a lost answer by another member (their
        # address) or after a rename, Stripe makes a customer rather than refusing a reused key.
        return self.client.v1.customers.create(
            params, {"idempotency_key": f"opsdeck-customer-{tenant_id}-{_digest(params)}"}
        )

    @_translated
    def customer_details_set(
        self, customer_id: str, *, name: str, email: str, address: dict[str, str] | None, key: str
    ) -> Any:
        """Put a customer's name, email and address (None: none) to these; `key` names the
        change (the details' version and attempt)."""
        return self.client.v1.customers.update(
            customer_id,
            {"name": name, "email": email, "address": address if address is not None else ""},
            {"idempotency_key": key},
        )

    @_translated
    def customer_name_set(self, customer_id: str, *, name: str, key: str) -> Any:
        """Put a customer's name to `name` (what a tenant without billing details is billed
        under); `key` names the attempt."""
        return self.client.v1.customers.update(
            customer_id, {"name": name}, {"idempotency_key": key}
        )

    @_translated
    def customer_tax_ids(self, customer_id: str) -> list[Any]:
        return list(
            self.client.v1.customers.tax_ids.list(customer_id, {"limit": 100}).auto_paging_iter()
        )

    @_translated
    def customer_tax_id_create(self, customer_id: str, *, type_: str, value: str, key: str) -> Any:
        return self.client.v1.customers.tax_ids.create(
            customer_id,
            {"type": type_, "value": value},
            {"idempotency_key": key},
        )

    @_translated
    def customer_tax_id_delete(self, customer_id: str, tax_id: str) -> None:
        """Remove a tax ID from the customer; one already gone counts as removed."""
        try:
            self.client.v1.customers.tax_ids.delete(customer_id, tax_id)
        except stripe.InvalidRequestError as exc:
            if exc.http_status != 404:
                raise

    # --- catalog ---------------------------------------------------------------------------

    @_translated
    def meters(self) -> list[Any]:
        return list(self.client.v1.billing.meters.list({"limit": 100}).auto_paging_iter())

    @_translated
    def meter_create(self, *, event_name: str, display_name: str) -> Any:
        return self.client.v1.billing.meters.create(
            {
                "display_name": display_name,
                "event_name": event_name,
                "default_aggregation": {"formula": "sum"},
                "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
                "value_settings": {"event_payload_key": "value"},
            },
            {"idempotency_key": f"opsdeck-meter-{event_name}"},
        )

    @_translated
    def product(self, product_id: str) -> Any | None:
        try:
            return self.client.v1.products.retrieve(product_id)
        except stripe.InvalidRequestError as exc:
            if exc.http_status == 404:
                return None
            raise

    @_translated
    def product_create(self, *, product_id: str, name: str, plan_key: str) -> Any:
        # Our own id, so a lost answer is found again by id.
        return self.client.v1.products.create(
            {"id": product_id, "name": name, "metadata": {"opsdeck_plan": plan_key}},
            {"idempotency_key": f"opsdeck-product-{plan_key}"},
        )

    @_translated
    def price_by_lookup_key(self, lookup_key: str) -> Any | None:
        found = self.client.v1.prices.list({"lookup_keys": [lookup_key], "limit": 1})
        return found.data[0] if found.data else None

    @_translated
    def metered_price_create(
        self,
        *,
        lookup_key: str,
        product_id: str,
        meter_id: str,
        currency: str,
        unit_amount_decimal: str,
        nickname: str,
        replacing: str | None = None,
    ) -> Any:
        """A metered price that takes `lookup_key` over. The key names the price it replaces
        (`replacing`, which holds the lookup key now): a retry makes it once, and a price that
        goes back to an earlier amount within a day is a new price, not Stripe's replay of the
        first (whose answer leaves the lookup key where it is)."""
        return self.client.v1.prices.create(
            {
                "currency": currency,
                "product": product_id,
                "unit_amount_decimal": unit_amount_decimal,
                "recurring": {"interval": "month", "usage_type": "metered", "meter": meter_id},
                "lookup_key": lookup_key,
                # A changed amount is a new price that takes the key over (prices are immutable).
                "transfer_lookup_key": True,
                "nickname": nickname,
            },
            {
                "idempotency_key": f"{lookup_key}-{unit_amount_decimal}-{meter_id}"
                f"-{replacing or 'first'}"
            },
        )

    # --- meter events ----------------------------------------------------------------------

    @_translated
    def meter_event_send(
        self,
        *,
        event_name: str,
        customer_id: str,
        value: str,
        identifier: str,
        timestamp: int,
        attempt: int,
    ) -> bool:
        """Send one meter event; False when Stripe already holds one with this identifier."""
        try:
            self.client.v1.billing.meter_events.create(
                {
                    "event_name": event_name,
                    "payload": {"stripe_customer_id": customer_id, "value": value},
                    "identifier": identifier,
                    "timestamp": timestamp,
                },
                # The identifier is what de-duplicates; a key per attempt, because Stripe
                # replays a first answer for a key even when it was a 500.
                {"idempotency_key": f"{identifier}-{attempt}"},
            )
        except stripe.InvalidRequestError as exc:
            if exc.param == "identifier" and _DUPLICATE_IDENTIFIER in (exc.user_message or ""):
                return False
            raise
        return True

    @_translated
    def meter_total(self, *, meter_id: str, customer_id: str, start: int, end: int) -> int:
        """The meter's aggregated value for one customer from `start` to `end` (epoch seconds
        on hour boundaries). Our values are whole numbers, so Stripe's float sum is exact."""
        summaries = self.client.v1.billing.meters.event_summaries.list(
            meter_id, {"customer": customer_id, "start_time": start, "end_time": end}
        )
        return round(sum(s.aggregated_value for s in summaries.data))

    # --- subscriptions, invoices, webhooks -------------------------------------------------

    @_translated
    def subscription(self, subscription_id: str) -> Any:
        """The subscription as Stripe holds it now."""
        return self.client.v1.subscriptions.retrieve(subscription_id)

    @_translated
    def subscription_item_price_set(
        self, subscription_id: str, *, item_id: str, price_id: str
    ) -> Any:
        """Move one item of a subscription to another price: a metered item's usage is billed
        at the price it holds when its period is invoiced, so nothing is prorated. (A price
        is never moved to twice: each change of a plan's price is a new Stripe price.)"""
        return self.client.v1.subscriptions.update(
            subscription_id,
            {"items": [{"id": item_id, "price": price_id}], "proration_behavior": "none"},
            {"idempotency_key": f"opsdeck-item-{item_id}-{price_id}"},
        )

    @_translated
    def subscription_item_add(self, subscription_id: str, *, price_id: str, for_: str) -> Any:
        """Add an item on the price for our price row `for_` (a `Price`'s id, or "kept" and a
        `PastPrice`'s): two additions at once add it once, and a dimension a plan priced again
        after dropping it (a new row) is added again."""
        return self.client.v1.subscriptions.update(
            subscription_id,
            {"items": [{"price": price_id}], "proration_behavior": "none"},
            {"idempotency_key": f"opsdeck-item-{subscription_id}-{price_id}-{for_}"},
        )

    @_translated
    def subscription_cancel_at_period_end(self, subscription_id: str, *, for_: int) -> Any:
        """End a subscription when its period ends: the usage so far is invoiced then. The
        key names our subscription `for_` too: a Stripe subscription resumed by a later one of
        ours is cancelled again by a request of its own, not a replay of the first."""
        return self.client.v1.subscriptions.update(
            subscription_id,
            {"cancel_at_period_end": True},
            {"idempotency_key": f"opsdeck-cancel-{subscription_id}-{for_}"},
        )

    @_translated
    def subscription_item_remove(self, subscription_id: str, *, item_id: str) -> Any:
        """Take an item off a subscription (its price is no longer the plan's)."""
        return self.client.v1.subscriptions.update(
            subscription_id,
            {"items": [{"id": item_id, "deleted": True}], "proration_behavior": "none"},
            {"idempotency_key": f"opsdeck-item-{item_id}-removed"},
        )

    @_translated
    def subscription_keep(self, subscription_id: str, *, for_: int) -> Any:
        """Undo `subscription_cancel_at_period_end`: the subscription goes on past its period
        (for our subscription `for_`, which takes it over)."""
        return self.client.v1.subscriptions.update(
            subscription_id,
            {"cancel_at_period_end": False},
            {"idempotency_key": f"opsdeck-keep-{subscription_id}-{for_}"},
        )

    @_translated
    def subscription_cancel_now(self, subscription_id: str, *, why: str) -> Any:
        """End a subscription at once (Stripe makes no final invoice)."""
        return self.client.v1.subscriptions.cancel(
            subscription_id,
            {"cancellation_details": {"comment": why}},
            {"idempotency_key": f"opsdeck-cancel-now-{subscription_id}"},
        )

    @_translated
    def invoice(self, invoice_id: str) -> Any:
        """The invoice as Stripe holds it now."""
        return self.client.v1.invoices.retrieve(invoice_id)

    @_translated
    def invoice_lines(self, invoice: Any) -> list[Any]:
        """All lines of an invoice just fetched: those it embeds, or, when it embeds only the
        first page of them, every page."""
        if not invoice.lines.has_more:
            return list(invoice.lines.data)
        pages = self.client.v1.invoices.line_items.list(invoice.id, {"limit": 100})
        return list(pages.auto_paging_iter())

    @_translated
    def credit_note(self, credit_note_id: str) -> Any:
        """The credit note as Stripe holds it now."""
        return self.client.v1.credit_notes.retrieve(credit_note_id)

    @_translated
    def credit_notes(self, invoice_id: str) -> list[Any]:
        """Every credit note of an invoice, as Stripe holds them now."""
        pages = self.client.v1.credit_notes.list({"invoice": invoice_id, "limit": 100})
        return list(pages.auto_paging_iter())

    @_translated
    def charge(self, charge_id: str) -> Any:
        """The charge as Stripe holds it now."""
        return self.client.v1.charges.retrieve(charge_id)

    @_translated
    def charge_refunds(self, charge_id: str) -> list[Any]:
        """Every refund of a charge, as Stripe holds them now (a charge lists them only when
        expanded, which Stripe advises against)."""
        pages = self.client.v1.refunds.list({"charge": charge_id, "limit": 100})
        return list(pages.auto_paging_iter())

    @_translated
    def invoices_paid_by(self, payment_intent_id: str) -> list[tuple[str, int]]:
        """The invoices a payment intent paid, as (invoice id, amount it paid of it in the
        currency's smallest unit), in the order Stripe lists their payments (a charge names no
        invoice since API version 2025-03-31.basil: its invoice payment does; one payment may
        pay several invoices)."""
        payments = self.client.v1.invoice_payments.list(
            {"payment": {"type": "payment_intent", "payment_intent": payment_intent_id}}
        )
        return [
            (payment.invoice, int(payment.amount_paid or 0))
            for payment in payments.auto_paging_iter()
            if payment.status == "paid"
        ]

    @_translated
    def checkout_session(self, session_id: str) -> Any:
        return self.client.v1.checkout.sessions.retrieve(session_id)

    @_translated
    def checkout_session_create(
        self,
        *,
        subscription_id: int,
        page: int,
        customer_id: str,
        tenant_id: int,
        price_ids: list[str],
        success_url: str,
        cancel_url: str,
    ) -> Any:
        """A hosted Checkout page subscribing the customer to metered prices (no quantity) for
        a subscription of ours, the `page`-th made for it (counted from 0). The idempotency key
        covers which page it is and what it asks for, so a request sent twice makes one page,
        one made after the one before expired is a new page (not that one, replayed), and one
        asking for other prices or return addresses (the catalog synced again, the portal
        reached by another address) is not refused for reusing a key."""
        params = {
            "mode": "subscription",
            "customer": customer_id,
            "client_reference_id": str(tenant_id),
            "line_items": [{"price": price_id} for price_id in price_ids],
            "success_url": success_url,
            "cancel_url": cancel_url,
            # The prices it asks for: a page made before they changed is not offered again.
            "metadata": {
                "opsdeck_subscription": str(subscription_id),
                "opsdeck_prices": " ".join(price_ids),
            },
            "subscription_data": {
                # The Stripe subscription names ours too, whichever event arrives first.
                "metadata": {"opsdeck_subscription": str(subscription_id)},
                # Its periods are Opsdeck's: calendar months in UTC (Stripe's run a month from
                # the day it starts), so an invoice of Stripe's bills the month the Billing
                # page shows.
                "billing_cycle_anchor_config": {
                    "day_of_month": 1,
                    "hour": 0,
                    "minute": 0,
                    "second": 0,
                },
            },
        }
        return self.client.v1.checkout.sessions.create(
            params,
            {"idempotency_key": f"opsdeck-checkout-{subscription_id}-{page}-{_digest(params)}"},
        )

    @_translated
    def checkout_session_open(self, *, customer_id: str, subscription_id: int) -> Any | None:
        """The customer's Checkout page for a subscription of ours still open to payment, if
        Stripe holds one."""
        sessions = self.client.v1.checkout.sessions.list(
            {"customer": customer_id, "status": "open", "limit": 100}
        )
        return next(
            (
                session
                for session in sessions.auto_paging_iter()
                if session.metadata
                and session.metadata.to_dict().get("opsdeck_subscription") == str(subscription_id)
            ),
            None,
        )

    @_translated
    def checkout_session_expire(self, session_id: str) -> Any:
        """A Checkout page that can no longer be paid."""
        return self.client.v1.checkout.sessions.expire(session_id)

    @_translated
    def billing_portal_session_create(self, *, customer_id: str, return_url: str) -> Any:
        """Stripe's customer portal (payment methods, invoices) for one visit."""
        return self.client.v1.billing_portal.sessions.create(
            {"customer": customer_id, "return_url": return_url}
        )

    def webhook_event(self, body: bytes, signature: str) -> stripe.Event:
        """The event in a webhook's raw body, once its signature is verified (Stripe's default
        tolerance); `BadWebhook` otherwise."""
        if not self.webhook_secret:
            raise BadWebhook("STRIPE_WEBHOOK_SECRET is not set: no webhook can be verified.")
        try:
            return stripe.Webhook.construct_event(body, signature, self.webhook_secret)
        except (ValueError, stripe.SignatureVerificationError) as exc:
            raise BadWebhook(str(exc)) from exc
        except (AttributeError, TypeError) as exc:  # signed, but JSON that is no object
            raise BadWebhook(f"The body is not an event: {exc}") from exc


def stripe_bills() -> bool:
    """Whether Stripe bills tenants (`STRIPE_API_KEY` is set): subscriptions start when paid."""
    return bool(settings.STRIPE_API_KEY)


# Stripe's hosted pages the portal sends a browser on to: Checkout (subscribing) and the
# customer portal (managing the payment method).
STRIPE_PAGES = ["https://checkout.stripe.com", "https://billing.stripe.com"]


def stripe_page_origins() -> list[str]:
    """Where Stripe's Checkout and customer portal pages are served: Stripe's own addresses,
    the configured Stripe-compatible server's (`STRIPE_API_BASE`, the emulator), or none
    while billing stays local."""
    if not settings.STRIPE_API_KEY:
        return []
    if settings.STRIPE_API_BASE:
        base = urlsplit(settings.STRIPE_API_BASE)
        return [f"{base.scheme}://{base.netloc}"]
    return STRIPE_PAGES


def gateway() -> StripeGateway | None:
    """The gateway as configured, or None when billing stays local (no `STRIPE_API_KEY`)."""
    if not settings.STRIPE_API_KEY:
        return None
    return StripeGateway(
        settings.STRIPE_API_KEY,
        api_version=settings.STRIPE_API_VERSION,
        api_base=settings.STRIPE_API_BASE,
        webhook_secret=settings.STRIPE_WEBHOOK_SECRET,
    )
