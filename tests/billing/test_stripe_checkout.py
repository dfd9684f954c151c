"""Subscribing through Stripe Checkout (the local Stripe emulator stands in for Stripe): the
Billing page sends the tenant to Checkout, and Stripe's webhooks move our subscription as
Stripe's moves, whatever order they arrive in."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from accounts.audit import SYSTEM, Actor
from accounts.models import AuditEvent
from accounts.services import tenant_lock
from billing import entitlements, periods, services, stripe_sync
from billing.models import Plan, StripeCustomer, Subscription
from stripe_emulator import sign
from tests.billing.conftest import WEBHOOK_SECRET
from tests.concurrency import beside_a_lock, race

pytestmark = pytest.mark.unsubscribed

WEBHOOK = "/billing/stripe/webhook/"


def _deliver(client, event: dict):
    body = json.dumps(event).encode()
    response = client.post(
        WEBHOOK, body, content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body, WEBHOOK_SECRET, int(time.time())),
    )  # fmt: skip
    assert response.status_code == 200, response.content
    return response


@pytest.fixture
def catalog(gw, priced_plan):
    stripe_sync.catalog_sync(gw)
    return priced_plan


def _subscribe(client, tenant, plan, request_id="sub-1"):
    return client.post(
        f"/t/{tenant.slug}/billing/subscribe/{plan.key}/", {"request_id": request_id}
    )


def _checkout_paid(owner_client, tenant, plan, emulator) -> Subscription:
    response = _subscribe(owner_client, tenant, plan)
    assert response.status_code == 302
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    emulator.complete_checkout(session_id)
    return Subscription.objects.get(tenant=tenant, plan=plan)


def test_subscribing_goes_to_checkout_and_waits_for_payment(
    owner_client, tenant, catalog, emulator, gw
):
    mail.outbox.clear()
    response = _subscribe(owner_client, tenant, catalog)

    assert response.status_code == 302
    assert response["Location"].startswith(f"{emulator.url}/c/pay/cs_")
    subscription = Subscription.objects.get(tenant=tenant, plan=catalog)
    assert subscription.status == "pending"
    customer = StripeCustomer.objects.get(tenant=tenant)
    assert subscription.stripe_customer_id == customer.customer_id
    session = gw.client.v1.checkout.sessions.retrieve(
        re.findall(r"cs_\w+", response["Location"])[0]
    )
    assert session.client_reference_id == str(tenant.pk)
    assert session.customer == customer.customer_id
    assert not mail.outbox  # nothing is said before Stripe confirms
    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "Awaiting payment</span>" in page and "Awaiting approval" not in page
    # Asking again (a double click, or "Continue to payment") gives the same page.
    again = _subscribe(owner_client, tenant, catalog, request_id="sub-2")
    assert again["Location"] == response["Location"]
    assert Subscription.objects.filter(tenant=tenant).count() == 1


def test_after_its_checkout_page_expired_continue_to_payment_opens_a_payable_page(
    client, owner_client, tenant, catalog, emulator, gw
):
    """Stripe expires a Checkout page after 24 hours (or when told to). "Continue to payment"
    then made it again with the same idempotency key, and Stripe answered with the expired
    page: nothing could be paid any more."""
    first = _subscribe(owner_client, tenant, catalog)
    (expired,) = re.findall(r"/c/pay/(cs_\w+)", first["Location"])
    gw.checkout_session_expire(expired)
    _deliver(client, emulator.events("checkout.session.expired")[-1])
    assert "Continue to payment" in owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()

    again = _subscribe(owner_client, tenant, catalog, request_id="sub-2")

    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", again["Location"])
    assert session_id != expired and gw.checkout_session(session_id).status == "open"
    # Asked again meanwhile, it is the same page.
    assert (
        _subscribe(owner_client, tenant, catalog, request_id="sub-3")["Location"]
        == again["Location"]
    )
    emulator.complete_checkout(session_id)
    _deliver(client, emulator.events("checkout.session.completed")[-1])
    assert Subscription.objects.get(tenant=tenant, plan=catalog).status == "active"


def test_continuing_to_payment_from_another_address_opens_the_same_page(
    owner_client, tenant, catalog, settings
):
    """The return addresses follow the address the portal was reached by: asking again from
    another one reused Stripe's idempotency key with other parameters, and Stripe refused it."""
    settings.ALLOWED_HOSTS = ["testserver", "localhost"]
    first = _subscribe(owner_client, tenant, catalog)

    again = owner_client.post(
        f"/t/{tenant.slug}/billing/subscribe/{catalog.key}/", {"request_id": "sub-2"},
        HTTP_HOST="localhost",
    )  # fmt: skip

    assert again.status_code == 302 and again["Location"] == first["Location"]


def test_a_paid_checkout_activates_the_subscription_through_the_webhook(
    client, owner_client, tenant, catalog, emulator
):
    subscription = _checkout_paid(owner_client, tenant, catalog, emulator)

    _deliver(client, emulator.events("checkout.session.completed")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "active"
    assert subscription.stripe_subscription_id.startswith("sub_")
    assert subscription.current_period_start is not None
    # Stripe bills Opsdeck's periods, calendar months in UTC (not a month from today).
    start = periods.current_start()
    assert subscription.current_period_end == start.replace(
        year=start.year + start.month // 12, month=start.month % 12 + 1
    )
    event = AuditEvent.objects.get(action="subscription.approve", tenant=tenant)
    assert event.actor_kind == "system"


def test_the_subscription_event_may_come_before_the_checkout_one(
    client, owner_client, tenant, catalog, emulator
):
    subscription = _checkout_paid(owner_client, tenant, catalog, emulator)

    _deliver(client, emulator.events("customer.subscription.created")[-1])
    _deliver(client, emulator.events("checkout.session.completed")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "active"
    assert AuditEvent.objects.filter(action="subscription.approve").count() == 1


def test_a_failed_payment_makes_it_past_due_and_stripe_ending_it_cancels_it_for_good(
    client, owner_client, tenant, catalog, emulator, gw
):
    subscription = _checkout_paid(owner_client, tenant, catalog, emulator)
    _deliver(client, emulator.events("checkout.session.completed")[-1])
    subscription.refresh_from_db()
    invoice = emulator.close_period(subscription.stripe_subscription_id)
    emulator.finalize_invoice(invoice["id"])
    emulator.fail_invoice(invoice["id"])

    _deliver(client, emulator.events("customer.subscription.updated")[-1])
    subscription.refresh_from_db()
    assert subscription.status == "past_due" and subscription.past_due_since is not None

    gw.client.v1.subscriptions.cancel(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("customer.subscription.deleted")[-1])
    # An older event arriving late: Stripe holds the subscription cancelled now.
    _deliver(client, emulator.events("customer.subscription.created")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "cancelled"


def test_a_plan_without_a_price_starts_at_once_with_nothing_to_pay(
    owner_client, tenant, catalog, emulator, gw
):
    free = Plan.objects.create(key="free", name="Free tier", service="postgresql")
    stripe_sync.catalog_sync(gw)  # which has nothing of it for Stripe to sell

    response = _subscribe(owner_client, tenant, free)

    assert response.status_code == 302 and response["Location"] == f"/t/{tenant.slug}/billing/"
    subscription = Subscription.objects.get(tenant=tenant, plan=free)
    assert subscription.status == "active" and not subscription.stripe_subscription_id
    page = owner_client.get(response["Location"]).content.decode()
    assert "You are subscribed to Free tier." in page
    assert "Payment by card is not available" not in page


def test_a_plan_without_a_price_that_staff_approve_waits_for_them_not_for_payment(
    owner_client, tenant, catalog, emulator, gw
):
    free = Plan.objects.create(
        key="free", name="Free tier", service="postgresql", limits={"auto_approve": False}
    )

    response = _subscribe(owner_client, tenant, free)
    page = owner_client.get(response["Location"]).content.decode()
    refused = entitlements.check(tenant=tenant, plan=free, action="create")
    subscription = Subscription.objects.get(tenant=tenant, plan=free)
    approved = services.subscription_approve(actor=SYSTEM, subscription=subscription)

    assert "awaits approval by the platform team" in page
    assert "Continue to payment" not in page and "Awaiting payment" not in page
    assert refused.reason == (  # what a create on it is told meanwhile
        "Your subscription to the Free tier plan is awaiting approval by the platform team; "
        "you can create instances on it once it is approved."
    )
    assert approved.status == "active"


def test_without_the_plan_in_stripes_catalog_the_page_says_paying_is_unavailable(
    owner_client, tenant, priced_plan, gw
):
    response = _subscribe(owner_client, tenant, priced_plan)

    assert response.status_code == 302 and response["Location"] == f"/t/{tenant.slug}/billing/"
    page = owner_client.get(response["Location"]).content.decode()
    assert "Payment by card is not available right now" in page
    assert Subscription.objects.get(tenant=tenant).status == "pending"
    assert ">Continue to payment</button>" in page


def test_manage_payment_method_opens_stripes_portal(
    client, owner_client, tenant, catalog, emulator
):
    _subscribe(owner_client, tenant, catalog)  # a checkout page opened, not paid yet
    unpaid = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "Manage payment method" not in unpaid  # Stripe holds nothing to manage
    _active(client, owner_client, tenant, catalog, emulator)

    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    response = owner_client.post(f"/t/{tenant.slug}/billing/payment/")

    assert "Manage payment method" in page
    assert response.status_code == 302 and response["Location"].startswith(emulator.url)


def test_without_stripe_subscribing_stays_local(owner_client, tenant, priced_plan):
    response = _subscribe(owner_client, tenant, priced_plan)

    assert response["Location"] == f"/t/{tenant.slug}/billing/"
    assert Subscription.objects.get(tenant=tenant).status == "active"
    assert owner_client.post(f"/t/{tenant.slug}/billing/payment/").status_code == 404


def _active(client, owner_client, tenant, plan, emulator) -> Subscription:
    subscription = _checkout_paid(owner_client, tenant, plan, emulator)
    _deliver(client, emulator.events("checkout.session.completed")[-1])
    subscription.refresh_from_db()
    return subscription


def _cancel(owner_client, tenant, subscription):
    return owner_client.post(
        f"/t/{tenant.slug}/billing/subscriptions/{subscription.pk}/cancel/", follow=True
    )


def test_cancelling_ends_the_stripe_subscription_with_its_period(
    client, owner_client, tenant, catalog, emulator, gw
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)

    page = _cancel(owner_client, tenant, subscription).content.decode()

    assert f"Your subscription to {catalog.name} is cancelled." in page
    subscription.refresh_from_db()
    assert subscription.status == "cancelled"
    in_stripe = gw.subscription(subscription.stripe_subscription_id)
    assert in_stripe.cancel_at_period_end and in_stripe.status == "active"  # until it ends
    # The period ends: Stripe invoices it and ends the subscription; ours stays cancelled.
    emulator.close_period(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("customer.subscription.deleted")[-1])
    subscription.refresh_from_db()
    assert subscription.status == "cancelled"


def test_coming_back_from_a_cancelled_checkout_says_the_subscription_waits_and_how_to_end_it(
    owner_client, tenant, catalog, emulator, gw
):
    _subscribe(owner_client, tenant, catalog)

    page = owner_client.get(f"/t/{tenant.slug}/billing/", {"checkout": "cancelled"})

    html = page.content.decode()
    assert "Checkout was cancelled: nothing was charged. A subscription you started stays" in html
    assert "Awaiting payment</span>" in html and "Continue to payment" in html
    assert Subscription.objects.get(tenant=tenant).status == "pending"


def test_cancelling_a_subscription_waiting_for_payment_closes_its_checkout_page(
    client, owner_client, tenant, catalog, emulator, gw
):
    """The checkout page kept open (or its address copied) can no longer be paid once the
    subscription it was for is cancelled."""
    response = _subscribe(owner_client, tenant, catalog)
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    pending = Subscription.objects.get(tenant=tenant, plan=catalog)

    _cancel(owner_client, tenant, pending)

    assert gw.checkout_session(session_id).status == "expired"
    paid = emulator.complete_checkout(session_id)  # the Pay button, pressed late
    assert paid["status"] == "expired" and paid["subscription"] is None
    assert not emulator.events("customer.subscription.created")
    pending.refresh_from_db()
    assert (pending.status, pending.stripe_subscription_id) == ("cancelled", "")


def test_a_stripe_subscription_started_for_a_cancelled_one_of_ours_is_ended_at_once(
    client, owner_client, tenant, catalog, emulator, gw
):
    """A checkout page paid before Stripe heard of the cancel (or made by anything else): the
    Stripe subscription it starts would bill the tenant's usage again."""
    response = _subscribe(owner_client, tenant, catalog)
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    pending = Subscription.objects.get(tenant=tenant, plan=catalog)
    Subscription.objects.filter(pk=pending.pk).update(status="cancelled")  # Stripe not told

    emulator.complete_checkout(session_id)
    _deliver(client, emulator.events("customer.subscription.created")[-1])
    _deliver(client, emulator.events("checkout.session.completed")[-1])

    pending.refresh_from_db()
    assert (pending.status, pending.stripe_subscription_id) == ("cancelled", "")
    started = gw.checkout_session(session_id).subscription
    assert gw.subscription(started).status == "canceled"  # ended at once: nothing to bill on it


def test_a_second_stripe_subscription_for_one_of_ours_is_ended_and_the_first_kept(
    client, owner_client, tenant, catalog, emulator, gw
):
    """Two checkout pages of one subscription both paid: the second would bill again."""
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    first = subscription.stripe_subscription_id
    customer = subscription.stripe_customer_id
    second = gw.checkout_session_create(
        subscription_id=subscription.pk, page=1, customer_id=customer, tenant_id=tenant.pk,
        price_ids=[p.id for p in gw.client.v1.prices.list().data],
        success_url="http://elsewhere.example/done", cancel_url="http://elsewhere.example/no",
    )  # fmt: skip
    emulator.complete_checkout(second.id)

    _deliver(client, emulator.events("customer.subscription.created")[-1])

    subscription.refresh_from_db()
    assert (subscription.status, subscription.stripe_subscription_id) == ("active", first)
    assert gw.subscription(first).status == "active"
    assert gw.subscription(gw.checkout_session(second.id).subscription).status == "canceled"


@pytest.mark.parametrize("how", ["ended", "gone"])
def test_cancelling_a_subscription_stripe_ended_already_cancels_it(
    client, owner_client, tenant, catalog, emulator, gw, how
):
    """Ended in Stripe (its dashboard, its dunning) or gone from it (its customer deleted),
    the webhook saying so late or lost: Stripe refused to end it again, and the customer was
    told Stripe could not be reached, to try again, for ever."""
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    if how == "ended":
        gw.client.v1.subscriptions.cancel(subscription.stripe_subscription_id)
    else:
        Subscription.objects.filter(pk=subscription.pk).update(stripe_subscription_id="sub_gone")

    page = _cancel(owner_client, tenant, subscription).content.decode()

    assert f"Your subscription to {catalog.name} is cancelled." in page
    subscription.refresh_from_db()
    assert subscription.status == "cancelled"


def test_a_subscription_stripe_refuses_to_end_is_not_cancelled_and_says_why(
    client, owner_client, tenant, catalog, emulator, gw
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    emulator.add_fault(
        f"/v1/subscriptions/{subscription.stripe_subscription_id}", method="POST", status=400
    )

    page = _cancel(owner_client, tenant, subscription).content.decode()

    assert "Stripe refused to end it, so nothing was cancelled: ask the platform team." in page
    subscription.refresh_from_db()
    assert subscription.status == "active"


@pytest.mark.parametrize("how", ["ended", "gone"])
def test_a_subscription_stripe_ended_without_a_webhook_is_ended_by_the_hourly_reconcile(
    client, owner_client, tenant, catalog, emulator, gw, how
):
    """Stripe's webhook saying it ended lost (or given up on after its three days): ours stayed
    active for good, its usage sent to meters no subscription bills, on no invoice."""
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    if how == "ended":
        gw.client.v1.subscriptions.cancel(subscription.stripe_subscription_id)
    else:
        Subscription.objects.filter(pk=subscription.pk).update(stripe_subscription_id="sub_gone")

    assert stripe_sync.subscriptions_reconcile() == 1

    subscription.refresh_from_db()
    assert subscription.status == "cancelled"
    assert AuditEvent.objects.filter(action="subscription.cancel", actor_kind="system").exists()
    assert stripe_sync.subscriptions_reconcile() == 0  # nothing open is left to read


def test_the_hourly_reconcile_leaves_a_subscription_stripe_still_bills_as_it_is(
    client, owner_client, tenant, catalog, emulator, gw
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    emulator.add_fault("/v1/subscriptions", method="GET", status=500)

    assert stripe_sync.subscriptions_reconcile() == 0  # Stripe out of reach: next round

    emulator.clear_faults()
    assert stripe_sync.subscriptions_reconcile() == 1
    subscription.refresh_from_db()
    assert subscription.status == "active"


def test_an_invoice_whose_event_comes_before_its_subscriptions_is_kept(
    client, owner_client, tenant, catalog, emulator
):
    """Stripe sends no event in order: an invoice of a subscription started on Checkout could
    come before the checkout's own event linked the subscription to ours. Its invoice was
    taken as "not one of ours", its event marked done, and the invoice never appeared."""
    from billing.models import Invoice

    subscription = _checkout_paid(owner_client, tenant, catalog, emulator)
    assert not subscription.stripe_subscription_id  # the checkout's event is late
    [started] = emulator.events("customer.subscription.created")
    invoice = emulator.close_period(started["data"]["object"]["id"])

    _deliver(client, emulator.events("invoice.created")[-1])

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert (stored.tenant_id, stored.plan_id) == (tenant.pk, catalog.pk)
    subscription.refresh_from_db()
    assert subscription.status == "active"


def test_when_stripe_cannot_be_told_nothing_is_cancelled(
    client, owner_client, tenant, catalog, emulator, gw
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    emulator.add_fault(f"/v1/subscriptions/{subscription.stripe_subscription_id}", method="POST")
    mail.outbox.clear()

    page = _cancel(owner_client, tenant, subscription).content.decode()

    assert "Stripe could not be reached, so nothing was cancelled" in page
    subscription.refresh_from_db()
    assert subscription.status == "active"
    assert not gw.subscription(subscription.stripe_subscription_id).cancel_at_period_end
    assert not AuditEvent.objects.filter(action="subscription.cancel").exists()
    assert not mail.outbox


def test_staff_cancelling_in_the_admin_ends_it_in_stripe_too(
    client, owner_client, tenant, catalog, emulator, gw, make_user
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    staff = make_user("staff@example.com", is_staff=True, is_superuser=True)
    emulator.add_fault("/v1/subscriptions/", method="POST", count=1)
    owner_client.force_login(staff)
    changelist = "/admin/billing/subscription/"
    form = {"action": "cancel", "_selected_action": [subscription.pk]}

    refused = owner_client.post(changelist, form, follow=True).content.decode()
    assert "Stripe could not be reached, so nothing was cancelled" in refused
    subscription.refresh_from_db()
    assert subscription.status == "active"

    owner_client.post(changelist, form, follow=True)
    subscription.refresh_from_db()
    assert subscription.status == "cancelled"
    assert gw.subscription(subscription.stripe_subscription_id).cancel_at_period_end


def test_a_staff_suspension_holds_when_stripe_next_reports_the_subscription_active(
    client, owner_client, tenant, catalog, emulator, gw, make_user
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    staff = make_user("staff@example.com", is_staff=True, is_superuser=True)
    owner_client.force_login(staff)
    changelist = "/admin/billing/subscription/"
    owner_client.post(changelist, {"action": "suspend", "_selected_action": [subscription.pk]})
    # Anything Stripe then says about it: a change of its metadata, a period invoiced.
    gw.client.v1.subscriptions.update(subscription.stripe_subscription_id, {"metadata": {"x": "1"}})
    _deliver(client, emulator.events("customer.subscription.updated")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "suspended"
    assert not AuditEvent.objects.filter(action="subscription.reactivate", result="ok").exists()

    owner_client.post(changelist, {"action": "reactivate", "_selected_action": [subscription.pk]})
    subscription.refresh_from_db()
    assert subscription.status == "active" and not subscription.suspended_by_staff


@pytest.mark.django_db(transaction=True)
def test_stripe_reporting_a_subscription_active_while_it_is_cancelled_changes_nothing(
    client, owner_client, owner, tenant, catalog, emulator, gw
):
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    services.subscription_mark_past_due(actor=SYSTEM, subscription=subscription)
    services.subscription_suspend(actor=SYSTEM, subscription=subscription, reason="unpaid")
    held = gw.subscription(subscription.stripe_subscription_id)  # still active in Stripe

    cancelled, mirrored = beside_a_lock(
        # The cancel has locked what it locks first: the organization, then the subscription.
        lambda: (tenant_lock(tenant.pk), _locked(subscription)),
        lambda: services.subscription_cancel(actor=Actor(user=owner), subscription=subscription),
        lambda: stripe_sync.subscription_mirror(held, gw),  # its webhook, read before the cancel
    )

    assert cancelled == "committed" and mirrored.status == "cancelled", mirrored
    assert not AuditEvent.objects.filter(action="subscription.reactivate").exists()


def _locked(subscription: Subscription) -> Subscription:
    return Subscription.objects.select_for_update().get(pk=subscription.pk)


@pytest.mark.django_db(transaction=True)
def test_stripe_pausing_a_subscription_while_its_billing_manager_cancels_it_is_no_deadlock(
    client, owner_client, owner, tenant, catalog, emulator, gw
):
    """Stripe's word that it paused the subscription (its webhook, or the hourly reconcile)
    locked the subscription, then, suspending ours, the organization; a billing manager's
    cancel locks them in the other order: PostgreSQL ended one of the two with a deadlock (the
    click a 500, or the webhook failed). Each waits for the other now, and the cancel holds."""
    subscription = _active(client, owner_client, tenant, catalog, emulator)
    emulator.pause_subscription(subscription.stripe_subscription_id)
    held = gw.subscription(subscription.stripe_subscription_id)
    assert held.status == "paused"

    cancelled, mirrored = beside_a_lock(
        # The cancel has passed its role check, which locked the organization.
        lambda: tenant_lock(tenant.pk),
        lambda: services.subscription_cancel(actor=Actor(user=owner), subscription=subscription),
        lambda: stripe_sync.subscription_mirror(held, gw),  # the webhook's handler
    )

    assert cancelled == "committed", cancelled
    assert isinstance(mirrored, Subscription), mirrored
    subscription.refresh_from_db()
    assert subscription.status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_subscription_stripe_paused_is_suspended(client, owner_client, tenant, catalog, emulator):
    subscription = _active(client, owner_client, tenant, catalog, emulator)

    emulator.pause_subscription(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("customer.subscription.updated")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "suspended"


@pytest.mark.django_db(transaction=True)
def test_a_checkout_paid_while_its_subscription_is_being_cancelled_is_ended_in_stripe(
    owner_client, owner, tenant, catalog, emulator, gw
):
    """The cancel found no Stripe subscription to end (the page was paid a moment before, and
    Stripe had not told us yet): the one Stripe then reports is not left billing."""
    response = _subscribe(owner_client, tenant, catalog)
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    pending = Subscription.objects.get(tenant=tenant, plan=catalog)
    emulator.complete_checkout(session_id)
    started = gw.checkout_session(session_id).subscription

    cancelled, mirrored = beside_a_lock(
        lambda: (tenant_lock(tenant.pk), _locked(pending)),
        lambda: services.subscription_cancel(
            actor=Actor(user=owner), subscription=pending, then=stripe_sync.subscription_end
        ),
        lambda: stripe_sync.subscription_mirror(gw.subscription(started), gw),  # its webhook
    )

    assert cancelled == "committed", cancelled
    pending.refresh_from_db()
    assert (pending.status, pending.stripe_subscription_id) == ("cancelled", "")
    assert gw.subscription(started).status == "canceled", mirrored  # nothing left billing


def test_staff_cannot_approve_a_subscription_waiting_for_payment_on_stripe(
    owner_client, tenant, catalog, emulator, gw, make_user
):
    _subscribe(owner_client, tenant, catalog)  # its checkout page is left unpaid
    subscription = Subscription.objects.get(tenant=tenant, plan=catalog)
    owner_client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))

    page = owner_client.post(
        "/admin/billing/subscription/",
        {"action": "approve", "_selected_action": [subscription.pk]},
        follow=True,
    ).content.decode()

    assert "no Stripe subscription would bill its usage" in page
    assert 'class="field-standing">Awaiting payment<' in page  # not "Awaiting approval"
    subscription.refresh_from_db()
    assert subscription.status == "pending"


def test_waiting_for_payment_creating_an_instance_is_refused_with_how_to_pay(
    owner_client, tenant, catalog, emulator, gw
):
    _subscribe(owner_client, tenant, catalog)  # its checkout page is left unpaid

    decision = entitlements.check(tenant=tenant, plan=catalog, action="create")

    assert decision.reason == (
        "Your subscription to the PostgreSQL plan is awaiting payment: finish it on the Billing "
        "page (Continue to payment); you can create instances on it once Stripe confirms it."
    )


def test_subscribing_again_within_the_cancelled_period_keeps_the_stripe_subscription_going(
    client, owner_client, tenant, catalog, emulator, gw
):
    """Cancelled, then subscribed again before the period ends: a second Stripe subscription
    would bill the plan's usage beside the first until then; the first goes on instead."""
    cancelled = _active(client, owner_client, tenant, catalog, emulator)
    held = cancelled.stripe_subscription_id
    _cancel(owner_client, tenant, cancelled)

    response = _subscribe(owner_client, tenant, catalog, request_id="again")

    assert response["Location"] == f"/t/{tenant.slug}/billing/"  # no Checkout page
    page = owner_client.get(response["Location"]).content.decode()
    assert f"You are subscribed to {catalog.name} again" in page
    again = Subscription.objects.get(tenant=tenant, plan=catalog, status="active")
    assert again.stripe_subscription_id == held
    cancelled.refresh_from_db()
    assert (cancelled.status, cancelled.stripe_subscription_id) == ("cancelled", "")
    assert not gw.subscription(held).cancel_at_period_end
    live = gw.client.v1.subscriptions.list({"customer": again.stripe_customer_id}).data
    assert [s.id for s in live] == [held]
    assert AuditEvent.objects.filter(
        action="subscription.stripe_resume", target_id=str(again.pk)
    ).exists()
    # Its webhook, and the period's end, are the new one's.
    _deliver(client, emulator.events("customer.subscription.updated")[-1])
    emulator.close_period(held)
    _deliver(client, emulator.events("customer.subscription.updated")[-1])
    again.refresh_from_db()
    assert again.status == "active" and again.current_period_start is not None


def test_subscribing_again_after_the_cancelled_period_ended_goes_to_checkout(
    client, owner_client, tenant, catalog, emulator, gw
):
    cancelled = _active(client, owner_client, tenant, catalog, emulator)
    _cancel(owner_client, tenant, cancelled)
    emulator.close_period(cancelled.stripe_subscription_id)  # Stripe ends it

    response = _subscribe(owner_client, tenant, catalog, request_id="again")

    assert "/c/pay/cs_" in response["Location"]
    assert Subscription.objects.get(tenant=tenant, plan=catalog, status="pending")


@pytest.mark.django_db(transaction=True)
def test_two_requests_subscribing_again_at_once_resume_it_once(
    client, owner_client, owner, tenant, catalog, emulator, gw
):
    from django.test import Client

    cancelled = _active(client, owner_client, tenant, catalog, emulator)
    _cancel(owner_client, tenant, cancelled)

    def submit():
        browser = Client()
        browser.force_login(owner)
        return _subscribe(browser, tenant, catalog, request_id="again")

    results = race(submit)

    assert [r.status_code for r in results] == [302] * 4, results
    assert all("/c/pay/" not in r["Location"] for r in results)
    again = Subscription.objects.get(tenant=tenant, plan=catalog, status="active")
    assert again.stripe_subscription_id == cancelled.stripe_subscription_id
    assert AuditEvent.objects.filter(action="subscription.stripe_resume").count() == 1
    assert AuditEvent.objects.filter(action="subscription.approve").count() == 2  # both starts


@pytest.mark.django_db(transaction=True)
def test_checkout_asked_for_from_two_addresses_at_once_makes_one_page(
    owner_client, tenant, catalog, emulator, gw
):
    """The portal reached by two names (their return addresses differ, so Stripe's
    idempotency alone would make two pages, both payable)."""
    _subscribe(owner_client, tenant, catalog)  # one page, then forgotten: expire it
    pending = Subscription.objects.get(tenant=tenant, plan=catalog)
    for session in gw.client.v1.checkout.sessions.list({"status": "open"}).data:
        gw.checkout_session_expire(session.id)
    hosts = iter(range(4))

    def ask():
        host = f"http://portal-{next(hosts)}.example"
        return stripe_sync.checkout_start(
            gw, pending, success_url=f"{host}/done", cancel_url=f"{host}/back"
        )

    urls = race(ask)

    assert len(set(urls)) == 1 and str(urls[0]).startswith(f"{emulator.url}/c/pay/cs_"), urls
    assert len(gw.client.v1.checkout.sessions.list({"status": "open"}).data) == 1


def test_no_checkout_page_for_a_subscription_no_longer_waiting_for_payment(
    client, owner_client, tenant, catalog, emulator, gw
):
    active = _active(client, owner_client, tenant, catalog, emulator)

    assert stripe_sync.checkout_start(gw, active, success_url="http://x/", cancel_url="") is None


def test_a_resumed_subscription_cancelled_again_ends_with_its_period_in_stripe(
    client, owner_client, tenant, catalog, emulator, gw
):
    first = _active(client, owner_client, tenant, catalog, emulator)
    held = first.stripe_subscription_id
    _cancel(owner_client, tenant, first)
    _subscribe(owner_client, tenant, catalog, request_id="again")
    again = Subscription.objects.get(tenant=tenant, plan=catalog, status="active")

    page = _cancel(owner_client, tenant, again).content.decode()

    assert f"Your subscription to {catalog.name} is cancelled." in page
    # Cancelled in Stripe too: not the first cancel's answer replayed for its idempotency key.
    assert gw.subscription(held).cancel_at_period_end


def test_a_stripe_subscription_kept_going_but_not_handed_over_is_taken_over_on_the_next_try(
    client, owner_client, tenant, catalog, emulator, gw
):
    """Stripe was told to keep it, then the resume failed before ours took it over: it bills
    on, for a cancelled subscription of ours. The next try takes it over, rather than send the
    tenant to Checkout for a second one."""
    first = _active(client, owner_client, tenant, catalog, emulator)
    _cancel(owner_client, tenant, first)
    gw.subscription_keep(first.stripe_subscription_id, for_=0)  # the half-done attempt

    response = _subscribe(owner_client, tenant, catalog, request_id="again")

    assert "/c/pay/" not in response["Location"]
    again = Subscription.objects.get(tenant=tenant, plan=catalog, status="active")
    assert again.stripe_subscription_id == first.stripe_subscription_id
    live = gw.client.v1.subscriptions.list({"customer": again.stripe_customer_id}).data
    assert len(live) == 1


def test_subscribing_again_while_the_cancelled_one_owes_an_invoice_says_to_pay_it_first(
    client, owner_client, tenant, catalog, emulator, gw
):
    first = _active(client, owner_client, tenant, catalog, emulator)
    invoice = emulator.close_period(first.stripe_subscription_id)
    emulator.finalize_invoice(invoice["id"])
    emulator.fail_invoice(invoice["id"])
    _deliver(client, emulator.events("customer.subscription.updated")[-1])
    _cancel(owner_client, tenant, first)
    first.refresh_from_db()
    assert first.status == "cancelled"

    response = _subscribe(owner_client, tenant, catalog, request_id="again")

    page = owner_client.get(response["Location"]).content.decode()
    assert "still has an unpaid invoice on Stripe: pay it" in page
    assert "/c/pay/" not in response["Location"]
    assert len(gw.client.v1.subscriptions.list({"customer": first.stripe_customer_id}).data) == 1
    # Nothing was made: no subscription awaiting a payment its Continue button would refuse.
    assert list(Subscription.objects.filter(tenant=tenant).values_list("status", flat=True)) == [
        "cancelled"
    ]
    assert "Awaiting payment" not in page and "Not subscribed" in page


def test_a_cancelled_subscription_stripe_no_longer_has_does_not_block_subscribing(
    owner_client, tenant, catalog, emulator, gw, customer
):
    Subscription.objects.create(
        tenant=tenant, plan=catalog, status="cancelled", cancelled_at=timezone.now(),
        stripe_subscription_id="sub_from_another_account",
    )  # fmt: skip

    response = _subscribe(owner_client, tenant, catalog, request_id="again")

    assert "/c/pay/" in response["Location"]  # off to Checkout, not "Stripe could not be reached"


def test_a_subscribe_form_sent_again_after_its_subscription_was_cancelled_says_so(
    client, owner_client, tenant, catalog, emulator, gw
):
    first = _active(client, owner_client, tenant, catalog, emulator)  # request id "sub-1"
    cancelled = _cancel(owner_client, tenant, first).content.decode()

    again = _subscribe(owner_client, tenant, catalog, request_id="sub-1")  # Back, then Subscribe

    assert "Stripe bills this period&#x27;s usage when the period ends, on " in cancelled
    page = owner_client.get(again["Location"]).content.decode()
    assert "This form was sent before, for a subscription to PostgreSQL cancelled since" in page
    assert "You are subscribed" not in page
    assert not Subscription.objects.filter(tenant=tenant).exclude(status="cancelled").exists()


def test_the_thank_you_after_checkout_shows_only_for_a_subscription_paid_through_it(
    owner_client, tenant, catalog, emulator, gw
):
    thanks = "Stripe has your payment details"
    billing_page = f"/t/{tenant.slug}/billing/"

    assert thanks not in owner_client.get(billing_page, {"checkout": "done"}).content.decode()
    _subscribe(owner_client, tenant, catalog)  # off to Checkout, back with ?checkout=done

    assert thanks in owner_client.get(billing_page, {"checkout": "done"}).content.decode()


def test_back_from_checkout_the_page_follows_the_subscription_until_stripe_confirms_it(
    client, owner_client, tenant, catalog, emulator, gw
):
    response = _subscribe(owner_client, tenant, catalog)
    (session_id,) = re.findall(r"/c/pay/(cs_\w+)", response["Location"])
    session = gw.client.v1.checkout.sessions.retrieve(session_id)
    # Stripe sends the payer back to the Billing page naming the plan paid for.
    assert session.success_url.endswith(
        f"/t/{tenant.slug}/billing/?checkout=done&plan={catalog.key}"
    )
    emulator.complete_checkout(session_id)
    back = session.success_url.split("testserver", 1)[1]

    page = owner_client.get(back).content.decode()

    plan = page[page.index(f'id="plan-{catalog.key}"') :]
    assert "Confirming payment</span>" in plan and "Awaiting payment" not in page
    assert "Continue to payment" not in page  # it is paid for: no second page to pay on
    assert "this page shows it when it does" in page
    (follow,) = re.findall(r'id="billing-live" hx-get="([^"]+)" hx-trigger="every 2s', page)
    follow = follow.replace("&amp;", "&")
    assert re.fullmatch(rf"/t/{tenant.slug}/billing/\?checkout=done&plan=pg&since=\d+", follow)
    # Its polls get the plans alone: no page around them, no flash message taken from another tab.
    poll = owner_client.get(follow, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="billing-live")
    assert "<html" not in poll.content.decode() and 'id="billing-live"' in poll.content.decode()

    _deliver(client, emulator.events("checkout.session.completed")[-1])  # Stripe confirms it
    page = owner_client.get(follow, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="billing-live")
    page = page.content.decode()

    assert "Active</span>" in page[page.index(f'id="plan-{catalog.key}"') :]
    assert (
        "Thank you: Stripe confirmed your payment details, and your PostgreSQL subscription has"
        in page
    )
    assert "Stripe has your payment details" not in page
    assert 'id="billing-live">' in page  # no longer followed


def test_a_payment_stripe_does_not_confirm_is_followed_for_two_minutes_then_left_to_pay(
    owner_client, tenant, catalog
):
    _subscribe(owner_client, tenant, catalog)  # off to Checkout, and back without paying
    billing = f"/t/{tenant.slug}/billing/"
    stale = int(time.time()) - 121

    page = owner_client.get(billing, {"checkout": "done", "plan": "pg", "since": stale})

    html = page.content.decode()
    assert "Stripe has not confirmed a payment for PostgreSQL yet." in html
    assert "Continue to payment" in html and "Awaiting payment</span>" in html
    assert 'id="billing-live">' in html  # no longer followed
    # A plan the tenant has no such subscription to gets no word about a payment.
    other = owner_client.get(billing, {"checkout": "done", "plan": "nonsense"}).content.decode()
    assert "Thank you" not in other and "Stripe has not confirmed" not in other


def test_two_members_paying_for_the_first_time_at_once_both_reach_the_same_checkout(
    transactional_db, tenant, owner, add_member, catalog, emulator, gw
):
    """The organization has no Stripe customer yet; each member's own address goes into the
    one Stripe makes, so two creates at once would ask one idempotency key for two things."""
    members = iter([owner, add_member("billing@example.com", "billing")])
    lock = threading.Lock()

    def subscribe():
        with lock:
            member = next(members)
        browser = Client()
        browser.force_login(member)
        return _subscribe(browser, tenant, catalog, request_id=f"sub-{member.pk}")

    answers = race(subscribe, times=2)

    locations = [getattr(answer, "headers", {}).get("Location", repr(answer)) for answer in answers]
    assert all(f"{emulator.url}/c/pay/cs_" in location for location in locations), locations
    assert len(set(locations)) == 1
    assert StripeCustomer.objects.filter(tenant=tenant).count() == 1
    assert len(gw.client.v1.customers.list({"limit": 100}).data) == 1
