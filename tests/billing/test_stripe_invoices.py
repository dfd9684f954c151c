"""Invoices with Stripe: Stripe's invoices are mirrored from its webhooks and shown as Opsdeck's
are; a closed period drafts locally only what Stripe could not take."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts.audit import Actor
from accounts.models import AuditEvent
from accounts.services import tenant_delete_blockers
from billing import invoicing, meter_events, reports, services, stripe_sync, usage
from billing.models import Invoice, MeteredHour, MeterEvent, Subscription
from billing.team_views import BILLING_TEAM
from stripe_emulator import sign
from tests.billing.conftest import WEBHOOK_SECRET
from tests.concurrency import race
from tests.conftest import mail_forget

pytestmark = pytest.mark.unsubscribed

WEBHOOK = "/billing/stripe/webhook/"


def _deliver(client, event: dict, status: int = 200):
    body = json.dumps(event).encode()
    response = client.post(
        WEBHOOK, body, content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body, WEBHOOK_SECRET, int(time.time())),
    )  # fmt: skip
    assert response.status_code == status, response.content
    return response


@pytest.fixture
def subscription(client, owner_client, tenant, gw, priced_plan, customer, emulator):
    """The tenant subscribed to the priced plan through Checkout; Stripe's webhook delivered."""
    stripe_sync.catalog_sync(gw)
    response = owner_client.post(
        f"/t/{tenant.slug}/billing/subscribe/{priced_plan.key}/", {"request_id": "sub-1"}
    )
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    emulator.complete_checkout(session_id)
    _deliver(client, emulator.events("checkout.session.completed")[-1])
    subscribed = Subscription.objects.get(tenant=tenant, plan=priced_plan)
    assert subscribed.status == "active"
    return subscribed


def _this_hour():
    return timezone.now().replace(minute=0, second=0, microsecond=0)


def _metered_and_invoiced(emulator, record_usage, subscription) -> dict:
    """2.5 core-hours this hour, sent to Stripe's meter; Stripe closes the period."""
    record_usage(_this_hour(), ("inst-a", "cpu", "2.5"))
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    return emulator.close_period(subscription.stripe_subscription_id)


def test_a_stripe_invoice_is_mirrored_and_shown_once_stripe_finalizes_it(
    client, owner_client, tenant, subscription, emulator, gw, record_usage
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    billing_page = f"/t/{tenant.slug}/billing/"

    _deliver(client, emulator.events("invoice.created")[-1])

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert (stored.source, stored.status, stored.plan, stored.tenant) == (
        "stripe", "draft", subscription.plan, tenant,
    )  # fmt: skip
    assert stored.period == f"{_this_hour():%Y-%m}"
    lines = {line.dimension: line for line in stored.lines.all()}
    assert lines.keys() == {"cpu", "storage"}  # as Stripe bills them, unused ones too
    line = lines["cpu"]
    assert lines["storage"].quantity == 0 and lines["storage"].amount == 0
    # 2,500,000 millionths of a core-hour at 0.000005 cents: 12.5 cents, rounded half up.
    assert (line.dimension, line.unit, line.quantity) == ("cpu", "core", Decimal("2.5"))
    assert line.unit_price == Decimal("0.05") and line.amount == Decimal("0.13")
    assert stored.total == Decimal("0.13")
    assert "invoice-list" not in owner_client.get(billing_page).content.decode()  # a draft

    emulator.finalize_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.finalized")[-1])

    stored.refresh_from_db()
    number = gw.invoice(invoice["id"]).number
    assert stored.status == "open" and stored.number == number
    assert stored.hosted_invoice_url == f"{emulator.url}/i/{invoice['id']}"
    page = owner_client.get(billing_page).content.decode()
    assert number in page and "0.13 USD" in page
    detail = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{stored.pk}/").content.decode()
    assert f'href="{stored.hosted_invoice_url}"' in detail and "Pay or view on Stripe" in detail
    assert "2.5 core-hours" in detail and "<th>Deployment</th>" not in detail  # per price

    emulator.pay_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.paid")[-1])

    stored.refresh_from_db()
    assert stored.status == "paid" and stored.paid_at is not None
    paid = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{stored.pk}/").content.decode()
    assert ">View on Stripe</a>" in paid and "Pay or view" not in paid  # nothing left to pay
    assert list(
        AuditEvent.objects.filter(target_type="invoice", target_id=str(stored.pk))
        .order_by("pk")
        .values_list("action", "actor_kind")
    ) == [("invoice.stripe_open", "system"), ("invoice.stripe_paid", "system")]


def test_staff_leave_a_stripe_invoice_to_stripe(
    client, make_user, subscription, emulator, record_usage
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    _deliver(client, emulator.events("invoice.created")[-1])
    stored = Invoice.objects.get()
    finance = make_user("finance@opsdeck.example", is_staff=True)
    finance.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    client.force_login(finance)

    page = client.get(f"/billing-team/invoices/{stored.pk}/").content.decode()
    assert "Stripe issues this invoice" in page and ">Finalize<" not in page
    with pytest.raises(ValidationError, match="issued by Stripe"):
        invoicing.invoice_finalize(actor=Actor(user=finance, staff=True), invoice=stored)
    response = client.post(f"/billing-team/invoices/{stored.pk}/finalize/", follow=True)
    assert "issued by Stripe" in response.content.decode()
    stored.refresh_from_db()
    assert stored.status == "draft" and stored.number is None
    assert emulator.events("invoice.finalized") == [] and invoice["status"] == "draft"


def test_deliveries_in_any_order_leave_the_newest_invoice(
    client, subscription, emulator, record_usage
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    emulator.pay_invoice(invoice["id"])

    _deliver(client, emulator.events("invoice.paid")[-1])
    _deliver(client, emulator.events("invoice.created")[-1])
    _deliver(client, emulator.events("invoice.finalized")[-1])

    stored = Invoice.objects.get()
    assert stored.status == "paid" and stored.number and stored.lines.count() == 2


def test_an_older_copy_never_moves_an_invoice_back(
    client, subscription, emulator, gw, record_usage
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    draft = gw.invoice(invoice["id"])  # fetched before finalizing
    emulator.finalize_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.finalized")[-1])

    stripe_sync.invoice_mirror(draft, list(draft.lines.data))

    assert Invoice.objects.get().status == "open"


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_about_one_invoice_store_it_once(
    subscription, emulator, gw, record_usage
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    fetched = gw.invoice(invoice["id"])
    lines = gw.invoice_lines(fetched)

    results = race(lambda: stripe_sync.invoice_mirror(fetched, lines))

    assert all(isinstance(r, Invoice) for r in results), results
    stored = Invoice.objects.get()
    assert stored.lines.count() == 2 and stored.status == "open"
    assert AuditEvent.objects.filter(action="invoice.stripe_open").count() == 1


def test_a_failed_payment_alone_makes_the_subscription_past_due(
    client, subscription, emulator, record_usage, settings, django_capture_on_commit_callbacks
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    emulator.fail_invoice(invoice["id"])
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the mail is sent in-process, after commit
    mail_forget()

    # The subscription's own event is late: the invoice's is enough.
    with django_capture_on_commit_callbacks(execute=True):
        _deliver(client, emulator.events("invoice.payment_failed")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "past_due"
    assert Invoice.objects.get().status == "open"
    # The email said "past due" and no more: what to do about it.
    [sent] = mail.outbox
    body = " ".join(sent.body.split())
    assert "is past due: Stripe could not take the payment of" in body, body
    assert 'choose "Pay or view on Stripe"), or give another card with "Manage payment' in body


@pytest.mark.django_db(transaction=True)
def test_a_declined_renewal_handled_while_the_customer_pays_does_not_leave_it_past_due(
    stripe_relay, subscription, emulator, gw, tenant, owner_client
):
    """The card is declined at renewal; the worker handling `invoice.payment_failed` reads the
    subscription (past due) and Stripe's answer is slow to reach it. Meanwhile the customer
    pays, and another worker handles `invoice.paid` and `customer.subscription.updated`
    (active). The slow worker then goes on: ours must not end past due while Stripe holds it
    active."""
    invoice = emulator.close_period(subscription.stripe_subscription_id)
    emulator.finalize_invoice(invoice["id"])
    emulator.fail_invoice(invoice["id"])
    failed = emulator.events("invoice.payment_failed")[-1]
    stripe_relay.hold(rf"^/v1/subscriptions/{subscription.stripe_subscription_id}\b")
    slow = {}

    def first_worker():
        try:
            slow["status"] = _deliver(Client(), failed).status_code
        except Exception as exc:  # asserted on below
            slow["status"] = exc
        finally:
            connection.close()

    worker = threading.Thread(target=first_worker)
    worker.start()
    assert stripe_relay.holding.wait(20), "the first worker never read the subscription"

    emulator.pay_invoice(invoice["id"])  # Stripe: active again
    _deliver(Client(), emulator.events("invoice.paid")[-1])
    _deliver(Client(), emulator.events("customer.subscription.updated")[-1])
    stripe_relay.release()
    worker.join(30)

    assert slow.get("status") == 200, slow
    assert gw.subscription(subscription.stripe_subscription_id).status == "active"
    subscription.refresh_from_db()
    assert subscription.status == "active" and subscription.past_due_since is None
    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "Payment is past due" not in page


def _said(page: str, start: str) -> str:
    """The page's text from `start` on, as a reader sees it."""
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    return text[text.index(start) :]


@pytest.mark.parametrize("by", ["the system", "staff"])
def test_suspended_for_an_unpaid_stripe_invoice_the_page_says_paying_it_reactivates(
    client, owner_client, tenant, subscription, emulator, priced_plan, record_usage, make_user,
    by, django_capture_on_commit_callbacks, settings,
):  # fmt: skip
    """The card is declined at renewal and the grace period passes: Opsdeck suspends the
    subscription. Paying the invoice on Stripe reactivates it by itself (Stripe's webhook), so
    the page says so rather than to ask the platform team; a staff suspension is theirs to
    lift whatever is paid."""
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    emulator.fail_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.payment_failed")[-1])
    if by == "staff":
        staff = Actor(user=make_user("staff@example.com", is_staff=True), staff=True)
        services.subscription_suspend(actor=staff, subscription=subscription, reason="abuse")
    else:
        later = timezone.now() + timedelta(days=priced_plan.grace_days + 1)
        settings.CELERY_TASK_ALWAYS_EAGER = True  # the mail is sent in-process, after commit
        mail_forget()
        with django_capture_on_commit_callbacks(execute=True):
            assert services.subscriptions_suspend_overdue(now=later) == 1
    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert stored.status == "open"
    if by == "the system":  # the email said as little as "suspended"
        [sent] = mail.outbox
        body = " ".join(sent.body.split())
        assert f"is suspended because invoice {stored.number} is unpaid." in body, body
        assert "Paying it on Stripe reactivates the subscription by itself" in body, body

    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    said = _said(page, "This subscription is suspended")[:600]

    if by == "staff":
        assert "Contact the platform team to reactivate it." in said, said
        return
    assert "Contact the platform team" not in said, said
    assert f"because invoice {stored.number} is unpaid" in said, said
    assert "Paying it on Stripe reactivates the subscription" in said, said
    assert f'href="/t/{tenant.slug}/billing/invoices/{stored.pk}/"' in page
    # And so it does: paid, it is active again, without the platform team.
    emulator.pay_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.paid")[-1])
    subscription.refresh_from_db()
    assert subscription.status == "active"


def test_a_payment_waiting_for_the_customers_confirmation_shows_the_invoice_to_pay(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    # Stripe's event when the card's bank asks the customer to confirm (3-D Secure): alone,
    # the others late. The emulator never needs it; it is sent as Stripe sends it.
    finalized = emulator.events("invoice.finalized")[-1]
    _deliver(client, {**finalized, "id": "evt_action", "type": "invoice.payment_action_required"})

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert stored.status == "open"
    detail = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{stored.pk}/").content.decode()
    assert "Pay or view on Stripe" in detail


@pytest.mark.parametrize("delivered", ["invoice.voided", "invoice.updated"])
def test_an_invoice_voided_in_stripe_is_void_here_and_owed_no_more(
    client, owner_client, tenant, subscription, emulator, record_usage, delivered
):
    """Voided in Stripe's dashboard, an invoice stayed Open on the Billing page, with its "Pay
    or view on Stripe" link, and the organization could not be deleted "until it is paid":
    Stripe's events of it were stored and nothing was done with them."""

    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.finalized")[-1])
    emulator.void_invoice(invoice["id"])

    _deliver(client, emulator.events(delivered)[-1])  # either alone: the other is late

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert stored.status == "void"
    assert not [b for b in tenant_delete_blockers(tenant) if "unpaid" in b]
    detail = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{stored.pk}/").content.decode()
    assert "Pay or view on Stripe" not in detail


def test_usage_not_yet_sent_when_stripe_ends_the_subscription_is_billed_locally(
    client, subscription, emulator, gw, record_usage
):
    record_usage(_this_hour(), ("inst-a", "cpu", "2.5"))
    assert meter_events.enqueue() == 1  # waiting to be sent

    gw.client.v1.subscriptions.cancel(subscription.stripe_subscription_id)  # e.g. unpaid
    _deliver(client, emulator.events("customer.subscription.deleted")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "cancelled"
    assert meter_events.flush().sent == 0  # no Stripe invoice would bill it
    (row,) = meter_events.adjustments()
    assert row.usage_record.quantity == Decimal("2.5")  # on Opsdeck's invoice instead


def test_an_invoice_with_more_lines_than_stripe_embeds_is_read_in_full(gw, emulator, monkeypatch):
    """Stripe embeds an invoice's first lines only (`has_more`): the rest are listed."""
    customer = gw.client.v1.customers.create({"name": "Many lines"})
    meter = gw.client.v1.billing.meters.create(
        {
            "display_name": "m",
            "event_name": "many",
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    prices = [
        gw.client.v1.prices.create(
            {
                "currency": "usd",
                "unit_amount_decimal": "1",
                "product_data": {"name": f"p{i}"},
                "recurring": {"interval": "month", "usage_type": "metered", "meter": meter.id},
            }
        ).id
        for i in range(12)
    ]
    session = gw.client.v1.checkout.sessions.create(
        {
            "mode": "subscription",
            "customer": customer.id,
            "line_items": [{"price": p} for p in prices],
            "success_url": "https://opsdeck.test/done",
            "cancel_url": "https://opsdeck.test/",
        }
    )
    emulator.complete_checkout(session.id)
    subscription_id = gw.client.v1.checkout.sessions.retrieve(session.id).subscription
    invoice = emulator.close_period(subscription_id)
    fetched = gw.invoice(invoice["id"])
    fetched.lines.has_more = True  # as Stripe sends an invoice of more than ten lines
    fetched.lines.data = fetched.lines.data[:10]

    assert len(gw.invoice_lines(fetched)) == 12


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://invoice.stripe.com/i/acct_1/test_x", True),
        ("http://127.0.0.1:12111/i/in_1", True),
        ("javascript:alert(1)", False),
        ("data:text/html,<script>alert(1)</script>", False),
        ("//evil.example/x", False),
        ("https:///no-host", False),
        (None, False),
        ("https://x.example/" + "a" * 1000, False),
    ],
)
def test_only_http_addresses_from_stripe_become_links(url, kept):
    assert stripe_sync.link_safe(url) == (url if kept else "")


def test_closing_a_period_leaves_to_stripe_what_its_meters_took(
    tenant, subscription, customer, emulator, record_usage
):
    """Usage sent to Stripe before it finalized the month's invoice is on that invoice; an hour
    older than Stripe's meters accept becomes a local draft of adjustment lines; nothing is
    billed twice."""
    now = timezone.now()
    key, start, end = _stripe_bills_since_last_month(customer, subscription)
    record_usage(end - usage.HOUR, ("inst-a", "cpu", "2"))  # sent as the month ends
    meter_events.enqueue()
    MeterEvent.objects.update(next_attempt_at=end)
    assert meter_events.flush(now=end + timedelta(minutes=5)).sent == 1
    record_usage(start, ("inst-a", "cpu", "4"))  # metered late
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + usage.HOUR * i) for i in range((end - start) // usage.HOUR)],
        ignore_conflicts=True,
    )
    meter_events.enqueue()
    # Sent 36 days or more after the month began: its first hour is too old for Stripe by then.
    flushed = meter_events.flush(now=max(timezone.now(), start + timedelta(days=36)))
    assert (flushed.sent, flushed.adjusted) == (0, 1)

    closed = invoicing.period_close(key, now=now)

    (draft,) = closed.invoices
    assert draft.source == "local" and draft.total == Decimal("0.20")  # 4 core-hours at 0.05
    (line,) = draft.lines.all()
    assert (line.quantity, line.adjustment_of) == (Decimal("4"), key)
    assert MeterEvent.objects.get(usage_record__hour=start).status == "adjusted"


def _metered(start, end):
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + usage.HOUR * i) for i in range((end - start) // usage.HOUR)],
        ignore_conflicts=True,
    )


def test_usage_stripe_could_not_take_until_after_its_month_closed_is_billed_the_next_month(
    tenant, subscription, customer, emulator, record_usage
):
    """Sent to Stripe's meters in vain until its month was closed (an outage, then a retry by
    staff too late for Stripe): it goes on the next month's invoice, as an adjustment of its
    own month, rather than on none."""
    now = timezone.now()
    this_month = usage.period_key(now)
    start, end = usage.period_bounds(
        usage.period_key(usage.period_bounds(this_month)[0] - usage.HOUR)
    )
    last_month = usage.period_key(start)
    customer.created_at = start - timedelta(days=1)
    customer.save(update_fields=["created_at"])
    Subscription.objects.filter(pk=subscription.pk).update(
        created_at=customer.created_at, stripe_started_at=customer.created_at
    )
    record_usage(start, ("inst-a", "cpu", "4"))
    _metered(start, end)
    meter_events.enqueue()
    MeterEvent.objects.update(status=MeterEvent.Status.DEAD)  # every try failed
    closed = invoicing.period_close(last_month, now=now)
    assert closed.invoices == []  # it waited for Stripe

    MeterEvent.objects.update(status=MeterEvent.Status.PENDING, check_first=True)  # retried
    # Past Stripe's 35 days for the hour, and not before the row is due (it was made after `now`).
    flushed = meter_events.flush(now=max(timezone.now(), start + timedelta(days=36)))
    assert flushed.adjusted == 1
    this_start, this_end = usage.period_bounds(this_month)
    _metered(this_start, this_end)
    (draft,) = invoicing.period_close(this_month, now=this_end).invoices

    assert draft.source == "local" and draft.total == Decimal("0.20")  # 4 core-hours at 0.05
    (line,) = draft.lines.all()
    assert (line.quantity, line.adjustment_of) == (Decimal("4"), last_month)


@pytest.mark.parametrize(("gib_hours", "price"), [("7300000", "0.10"), ("7300000", "0.05")])
def test_the_billing_page_says_what_stripes_invoice_charges_for_a_monthly_price(
    client, tenant, subscription, gw, emulator, record_usage, priced_plan, gib_hours, price
):
    """10 TiB kept a month (7,300,000 GiB-hours) at a price per GiB-month: Stripe's price per
    millionth of a GiB-hour has 12 decimal places, so it charges a few cents off the exact
    figure, and the page says what Stripe charges."""
    from billing.models import Price

    Price.objects.filter(plan=priced_plan, dimension="storage").update(unit_price=Decimal(price))
    stripe_sync.catalog_sync(gw)  # the price as the plan now says
    record_usage(_this_hour(), ("inst-a", "storage", gib_hours))
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    (shown,) = reports.period_cost(tenant, usage.period_key(timezone.now())).currencies

    invoice = emulator.close_period(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("invoice.created")[-1])

    charged = Invoice.objects.get(stripe_invoice_id=invoice["id"]).total
    assert abs(charged - Decimal(price) * 10_000) <= Decimal("0.04")  # half a cent a million
    assert shown.total == charged


def test_usage_sent_before_stripe_finalizes_the_months_invoice_is_on_it(
    client, subscription, emulator, record_usage
):
    """The month's last hour is metered after the month ended, within Stripe's finalization
    grace period: Stripe updates its draft with it when it finalizes it."""
    invoice = emulator.close_period(subscription.stripe_subscription_id)  # a draft, at $0
    record_usage(_this_hour(), ("inst-a", "cpu", "100"))
    meter_events.enqueue()
    assert meter_events.flush().sent == 1

    emulator.finalize_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.finalized")[-1])

    assert Invoice.objects.get(stripe_invoice_id=invoice["id"]).total == Decimal("5.00")


@pytest.mark.parametrize(("after_the_month", "billed_by"), [(45, "stripe"), (55, "opsdeck")])
def test_usage_of_a_month_stripe_has_invoiced_is_billed_by_opsdeck(
    settings, tenant, subscription, customer, record_usage, after_the_month, billed_by
):
    """A worker (or Stripe) down at the month's end: its last hours reach the meter only once
    Stripe has finalized the month's invoice, which would leave them on no invoice."""
    settings.STRIPE_FINALIZATION_GRACE_MINUTES = 60
    key = usage.period_key(timezone.now())
    start, end = usage.period_bounds(key)
    record_usage(_this_hour(), ("inst-a", "cpu", "100"))
    meter_events.enqueue()

    flushed = meter_events.flush(now=end + timedelta(minutes=after_the_month))

    if billed_by == "stripe":
        assert (flushed.sent, flushed.adjusted) == (1, 0)
        return
    assert (flushed.sent, flushed.adjusted) == (0, 1)
    assert (
        MeterEvent.objects.get().last_error == "Stripe has invoiced its month: a local adjustment."
    )
    customer.created_at = start - timedelta(days=1)
    customer.save(update_fields=["created_at"])
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + usage.HOUR * i) for i in range((end - start) // usage.HOUR)],
        ignore_conflicts=True,
    )
    (draft,) = invoicing.period_close(key, now=end + timedelta(hours=2)).invoices
    assert draft.source == "local" and draft.total == Decimal("5.00")  # 100 core-hours at 0.05


def test_an_hour_metered_after_its_month_closed_is_billed_once_with_the_month_it_was_metered_in(
    settings, tenant, subscription, customer, record_usage
):
    """Last month closed; then one of its hours is metered (`meter_usage --backfill-from`). It
    is billed with this month, as late usage, and its cost is counted this month. It went to
    Stripe's meter too, stamped in last month, and Stripe, its invoice for last month still a
    draft, billed it there: this month's cost counted 5.00 that no invoice of this month
    holds."""
    settings.STRIPE_FINALIZATION_GRACE_MINUTES = 60
    key, start, end = _stripe_bills_since_last_month(customer, subscription)
    this_month = usage.period_key(end)
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + usage.HOUR * i) for i in range((end - start) // usage.HOUR)],
        ignore_conflicts=True,
    )
    assert not invoicing.period_close(key, now=end + timedelta(minutes=10)).invoices

    record_usage(end - usage.HOUR, ("inst-a", "cpu", "100"))
    meter_events.enqueue()
    MeterEvent.objects.update(next_attempt_at=end)  # due within Stripe's grace period
    flushed = meter_events.flush(now=end + timedelta(minutes=20))

    assert (flushed.sent, flushed.adjusted) == (0, 0)
    assert not MeterEvent.objects.exists()
    (currency,) = reports.period_cost(tenant, this_month).currencies
    assert currency.total == Decimal("5.00")  # 100 core-hours at 0.05
    # This month closes: its Opsdeck invoice bills the hour, saying the month it was used in.
    this_start, this_end = usage.period_bounds(this_month)
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=this_start + usage.HOUR * i)
         for i in range((this_end - this_start) // usage.HOUR)],
        ignore_conflicts=True,
    )  # fmt: skip
    (draft,) = invoicing.period_close(this_month, now=this_end + timedelta(hours=2)).invoices
    (line,) = draft.lines.all()
    assert (draft.total, line.adjustment_of) == (Decimal("5.00"), key)


def _stripe_bills_since_last_month(customer, subscription):
    """Stripe has billed the tenant since before last month began: last month's key, start
    and end."""
    key = usage.period_key(usage.period_bounds(usage.period_key(timezone.now()))[0] - usage.HOUR)
    start, end = usage.period_bounds(key)
    customer.created_at = start - timedelta(days=1)
    customer.save(update_fields=["created_at"])
    Subscription.objects.filter(pk=subscription.pk).update(
        created_at=customer.created_at, stripe_started_at=customer.created_at
    )
    return key, start, end


def _chart_total(page: str) -> Decimal:
    data = re.search(
        r'<script id="invoice-daily-cost-data" type="application/json">(.*?)</script>',
        page,
        re.S,
    )
    assert data, "the invoice page draws no chart"
    chart = json.loads(data.group(1))
    return sum((Decimal(value) for _, values in chart["rows"] for value in values), Decimal(0))


def test_the_chart_of_an_adjustment_invoice_adds_up_to_that_invoice_not_stripes_usage(
    owner_client, tenant, subscription, customer, emulator, record_usage, make_user
):
    """A tenant billed by Stripe gets a local invoice for the hour Stripe could not take
    (0.20 USD). Its page charted the month's whole usage of the plan (0.30 USD: the hour on
    Stripe's invoice too), next to a total of 0.20: it charts what the invoice bills."""
    now = timezone.now()
    key, start, end = _stripe_bills_since_last_month(customer, subscription)
    record_usage(end - usage.HOUR, ("inst-a", "cpu", "2"))  # on Stripe's invoice
    meter_events.enqueue()
    MeterEvent.objects.update(next_attempt_at=end)
    assert meter_events.flush(now=end + timedelta(minutes=5)).sent == 1
    record_usage(start, ("inst-a", "cpu", "4"))  # metered late: too old for Stripe
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + usage.HOUR * i) for i in range((end - start) // usage.HOUR)],
        ignore_conflicts=True,
    )
    meter_events.enqueue()
    assert meter_events.flush(now=max(timezone.now(), start + timedelta(days=36))).adjusted == 1
    (draft,) = invoicing.period_close(key, now=now).invoices
    staff = make_user("finance@opsdeck.example", is_staff=True)
    invoice = invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)
    assert invoice.total == Decimal("0.20")

    page = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/").content.decode()

    assert "0.20 USD" in page
    assert _chart_total(page) == invoice.total


@pytest.mark.unsubscribed
def test_usage_invoiced_locally_at_a_close_is_not_billed_again_once_its_meter_exists(
    tenant, gw, customer, priced_plan
):
    """A dimension a plan priced after its catalog was synced is billed on Opsdeck's invoice
    when the month closes. Once its meter was made (`stripe_sync_catalog`), the outbox took
    those records too: Stripe had invoiced the month, so they moved into the open month as
    late usage, and were billed a second time (5.00 here)."""
    from billing.models import InvoiceLine, Price, UsageRecord
    from billing.usage import UsageRow

    stripe_sync.catalog_sync(gw)  # meters and prices for cpu and storage
    # The plan now prices memory too (its change took effect); the catalog is not synced yet.
    Price.objects.create(
        plan=priced_plan, dimension="memory", unit="GiB", unit_price=Decimal("0.005")
    )
    now = timezone.now()
    last_month = usage.period_key(
        usage.period_bounds(usage.period_key(now))[0] - timedelta(hours=1)
    )
    start, end = usage.period_bounds(last_month)
    type(customer).objects.filter(pk=customer.pk).update(created_at=start - timedelta(days=1))
    subscription = Subscription.objects.create(
        tenant=tenant, plan=priced_plan, status="active", stripe_subscription_id="sub_review_c",
        stripe_customer_id=customer.customer_id, current_period_start=start,
    )  # fmt: skip
    Subscription.objects.filter(pk=subscription.pk).update(
        created_at=start - timedelta(days=1), stripe_started_at=start - timedelta(days=1)
    )
    hour = start + timedelta(days=9, hours=10)
    usage.record(hour, [
        UsageRow(tenant.pk, priced_plan.pk, "inst-a", "db", "cpu", "core", Decimal("2")),
        UsageRow(tenant.pk, priced_plan.pk, "inst-a", "db", "memory", "GiB", Decimal("1000")),
    ])  # fmt: skip
    usage.record_none(usage.unmetered_hours(start, end))

    closed = invoicing.period_close(last_month)
    (draft,) = closed.invoices
    memory_line = InvoiceLine.objects.get(invoice=draft, dimension="memory")
    assert memory_line.amount == Decimal("5.00")  # 1000 GiB-hours at 0.005: billed once here
    # Staff issue it.
    Invoice.objects.filter(pk=draft.pk).update(status="open", number="2026-000001")

    # Later the catalog is synced (README: run it after a plan's prices change), and beat's
    # outbox runs every minute.
    stripe_sync.catalog_sync(gw)
    meter_events.enqueue()
    meter_events.flush()

    record = UsageRecord.objects.get(dimension="memory")
    this_month = usage.period_key(timezone.now())
    shown = reports.period_cost(tenant, this_month)
    memory_again = sum((c.by_dimension.get("memory", 0) for c in shown.currencies), Decimal(0))
    assert (record.period, record.adjustment, memory_again) == (last_month, False, Decimal(0))
    assert not MeterEvent.objects.filter(usage_record=record).exists()


def test_cancelling_a_subscription_stripe_ended_bills_its_unsent_usage_here(
    client, owner_client, tenant, subscription, emulator, gw, record_usage
):
    """Stripe ended it, the webhook lost; the customer cancels it and is told it is cancelled.
    Its usage not sent yet stayed in the outbox, to be sent to a meter no subscription bills
    any more, on no invoice (the webhook, late, found ours cancelled already)."""
    record_usage(_this_hour(), ("inst-a", "cpu", "2.5"))
    assert meter_events.enqueue() == 1
    gw.client.v1.subscriptions.cancel(subscription.stripe_subscription_id)

    page = owner_client.post(
        f"/t/{tenant.slug}/billing/subscriptions/{subscription.pk}/cancel/", follow=True
    ).content.decode()
    assert f"Your subscription to {subscription.plan.name} is cancelled." in page
    _deliver(client, emulator.events("customer.subscription.deleted")[-1])

    assert meter_events.flush().sent == 0
    (row,) = meter_events.adjustments()
    assert row.usage_record.quantity == Decimal("2.5")  # on Opsdeck's invoice instead


def test_a_draft_deleted_in_stripe_is_forgotten_here(
    client, tenant, subscription, emulator, record_usage
):
    """A draft deleted in Stripe's dashboard stayed a draft here, and the organization could
    not be deleted ("its invoice is being prepared"), for ever."""

    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    _deliver(client, emulator.events("invoice.created")[-1])
    assert Invoice.objects.get(stripe_invoice_id=invoice["id"]).status == "draft"
    emulator.delete_draft(invoice["id"])

    _deliver(client, emulator.events("invoice.deleted")[-1])

    assert not Invoice.objects.filter(stripe_invoice_id=invoice["id"]).exists()
    assert not [b for b in tenant_delete_blockers(tenant) if "being prepared" in b]
    assert AuditEvent.objects.filter(action="invoice.stripe_deleted", tenant=tenant).exists()


def _figures(page: str) -> str:
    """The invoice's table as read aloud: its cells' text in order."""
    table = page[page.index('<table class="invoice-lines') : page.index("</table>")]
    return " ".join(re.sub(r"<[^>]+>", " ", table).split())


@pytest.mark.parametrize(
    ("total", "discounts", "excluding_tax", "said", "team_said"),
    [
        # A 25 % coupon: Stripe's lines keep their amounts, its total does not.
        (937, [{"amount": 313, "discount": "di_1"}], 937,
         "Subtotal 12.50 Discount \u22123.13 Total 9.37 USD",
         "Discount \u22123.13 USD (Stripe's coupons)"),
        # 20 % tax on top of the lines (not included in their amounts).
        (1500, [], 1250, "Subtotal 12.50 Tax 2.50 Total 15.00 USD",
         "Tax 2.50 USD (added by Stripe)"),
    ],
)  # fmt: skip
def test_a_stripe_invoice_says_what_took_its_lines_to_its_total(
    owner_client, tenant, subscription, emulator, gw, record_usage, make_user,
    total, discounts, excluding_tax, said, team_said,
):  # fmt: skip
    """Staff give discounts as coupons in Stripe, and Stripe may add tax: the page listed
    lines of 12.50 above a total of 9.37 with nothing to say where the 3.13 went."""
    record_usage(_this_hour(), ("inst-a", "cpu", "250"))  # 12.50
    meter_events.enqueue()
    meter_events.flush()
    made = emulator.close_period(subscription.stripe_subscription_id)
    emulator.finalize_invoice(made["id"])
    fetched = gw.invoice(made["id"])
    lines = list(gw.invoice_lines(fetched))
    assert fetched.total == 1250
    # What Stripe sends of the same invoice with a coupon on the customer, or with its tax.
    fetched.total = fetched.amount_due = total
    fetched.total_discount_amounts = discounts
    fetched.total_excluding_tax = excluding_tax
    finance = make_user("finance@opsdeck.example", is_staff=True)
    finance.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    team = Client()
    team.force_login(finance)

    stored = stripe_sync.invoice_mirror(fetched, lines)

    page = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{stored.pk}/").content.decode()
    assert _figures(page).endswith(said)
    team_page = team.get(f"/billing-team/invoices/{stored.pk}/").content.decode()
    assert team_said in " ".join(re.sub(r"<[^>]+>", " ", team_page).split())
