"""Billing details reach the tenant's Stripe customer (name, email, address, tax ID) against the
Stripe emulator; a failure leaves the details saved, is said on the page, and beat tries again."""

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.audit import Actor
from billing import services, stripe_sync
from billing.models import BillingProfile, Invoice, StripeCustomer
from tests.billing.test_billing_details import DETAILS
from tests.billing.test_stripe_invoices import (  # noqa: F401 - `subscription`: a fixture
    _deliver,
    _metered_and_invoiced,
    subscription,
)

pytestmark = pytest.mark.unsubscribed


def _url(tenant, suffix=""):
    return f"/t/{tenant.slug}/billing/{suffix}"


def _held(gw, customer_id):
    customer = gw.client.v1.customers.retrieve(customer_id)
    tax_ids = [(t.type, t.value) for t in gw.customer_tax_ids(customer_id)]
    address = customer.address.to_dict() if customer.address else None
    return customer.name, customer.email, address, tax_ids


def test_saved_details_go_to_the_stripe_customer_at_once(owner_client, tenant, gw, customer):
    owner_client.post(_url(tenant, "details/"), DETAILS)

    assert _held(gw, customer.customer_id) == (
        "Acme GmbH",
        "ap@acme.example",
        {
            "line1": "Unter den Linden 1",
            "line2": "3. OG",
            "city": "Berlin",
            "postal_code": "10117",
            "state": None,
            "country": "DE",
        },
        [("eu_vat", "DE123456789")],
    )
    profile = BillingProfile.objects.get(tenant=tenant)
    assert (profile.stripe_version, profile.stripe_error) == (1, "")
    assert "Your billing details are saved" in owner_client.get(_url(tenant)).content.decode()


def test_a_changed_tax_id_replaces_the_one_stripe_held_and_a_cleared_one_removes_it(
    owner_client, tenant, gw, customer
):
    owner_client.post(_url(tenant, "details/"), DETAILS)

    owner_client.post(
        _url(tenant, "details/"),
        {**DETAILS, "tax_id_type": "gb_vat", "tax_id_value": "GB123456789"},
    )
    assert _held(gw, customer.customer_id)[3] == [("gb_vat", "GB123456789")]

    owner_client.post(
        _url(tenant, "details/"),
        {**DETAILS, "tax_id_type": "", "tax_id_value": "", "line1": "", "line2": "",
         "city": "", "postal_code": "", "country": "", "email": ""},
    )  # fmt: skip
    assert _held(gw, customer.customer_id) == ("Acme GmbH", None, None, [])


def test_stripe_out_of_reach_leaves_the_details_saved_says_so_and_beat_sends_them_later(
    owner_client, tenant, gw, customer, emulator
):
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", method="POST", status=503)

    sent = owner_client.post(_url(tenant, "details/"), DETAILS, follow=True)

    said = sent.content.decode()
    assert "Your billing details are saved, but Stripe could not be updated just now" in said
    assert 'id="billing-details-stripe"' in said and "It is tried again automatically" in said
    profile = BillingProfile.objects.get(tenant=tenant)
    assert profile.legal_name == "Acme GmbH" and profile.stripe_pending
    assert profile.stripe_next_attempt_at > timezone.now()
    assert gw.client.v1.customers.retrieve(customer.customer_id).name == "Acme"

    assert stripe_sync.billing_details_push_due() == 0  # not due yet
    emulator.clear_faults()
    later = timezone.now() + timedelta(minutes=2)

    assert stripe_sync.billing_details_push_due(now=later) == 1

    assert _held(gw, customer.customer_id)[0] == "Acme GmbH"
    profile.refresh_from_db()
    assert (profile.stripe_pending, profile.stripe_error, profile.stripe_next_attempt_at) == (
        False,
        "",
        None,
    )
    assert "billing-details-stripe" not in owner_client.get(_url(tenant)).content.decode()


def test_each_failed_try_waits_longer(tenant, owner, gw, customer, emulator):
    services.billing_details_update(actor=Actor(user=owner), tenant=tenant, details=DETAILS)
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", status=500)
    now = timezone.now()

    waits = []
    for _ in range(3):
        with pytest.raises(stripe_sync.StripeFailure):
            stripe_sync.billing_details_push(gw, tenant.pk, now=now)
        due = BillingProfile.objects.get(tenant=tenant).stripe_next_attempt_at
        waits.append(due - now)
        now = due

    assert waits == [timedelta(seconds=30), timedelta(seconds=60), timedelta(seconds=120)]


def test_details_stripe_refuses_are_said_and_not_tried_again(
    owner_client, tenant, gw, customer, emulator
):
    emulator.reset()  # the customer is gone from Stripe: it refuses the update (404)

    sent = owner_client.post(_url(tenant, "details/"), DETAILS, follow=True)

    said = sent.content.decode()
    assert "Stripe refused them" in said and "No such customer" in said
    profile = BillingProfile.objects.get(tenant=tenant)
    assert profile.stripe_pending and profile.stripe_next_attempt_at is None
    assert "Stripe refused these details" in said
    assert stripe_sync.billing_details_push_due(now=timezone.now() + timedelta(days=1)) == 0


def test_a_tax_id_stripe_refuses_is_said_to_be_all_it_refused(
    owner_client, tenant, gw, customer, emulator
):
    """Stripe took the new name and address, then refused the tax ID: the page said it had
    refused them all and that its invoices showed the details it held before."""
    owner_client.post(_url(tenant, "details/"), {**DETAILS, "tax_id_type": "", "tax_id_value": ""})
    emulator.add_fault(f"/v1/customers/{customer.customer_id}/tax_ids", method="POST", status=400)

    sent = owner_client.post(
        _url(tenant, "details/"), {**DETAILS, "legal_name": "Acme Holding AG"}, follow=True
    )

    said = sent.content.decode()
    assert _held(gw, customer.customer_id)[0] == "Acme Holding AG"
    assert _held(gw, customer.customer_id)[3] == []
    assert "Stripe refused the tax ID" in said and "show the new name and address" in said
    assert "details it held before" not in said
    page = owner_client.get(_url(tenant)).content.decode()
    assert "Stripe refused the tax ID" in page and "details it held before" not in page

    emulator.clear_faults()
    owner_client.post(_url(tenant, "details/"), {**DETAILS, "legal_name": "Acme Holding SE"})
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", method="POST", status=400)
    owner_client.post(_url(tenant, "details/"), {**DETAILS, "legal_name": "Acme AG"})

    page = owner_client.get(_url(tenant)).content.decode()
    assert "Stripe refused these details" in page and "details it held before" in page
    assert "Stripe refused the tax ID" not in page


def test_a_tax_id_stripe_could_not_be_reached_for_is_said_as_that_alone(
    owner_client, tenant, gw, customer, emulator
):
    """Stripe took the new name and address, then answered 503 for the tax ID: the page said
    Stripe had not been updated with these details and showed those it held before."""
    owner_client.post(_url(tenant, "details/"), {**DETAILS, "tax_id_type": "", "tax_id_value": ""})
    emulator.add_fault(f"/v1/customers/{customer.customer_id}/tax_ids", method="POST", status=503)

    sent = owner_client.post(
        _url(tenant, "details/"), {**DETAILS, "legal_name": "Acme Holding AG"}, follow=True
    )

    assert _held(gw, customer.customer_id)[0] == "Acme Holding AG"
    assert "Stripe has the new name and address" in sent.content.decode()
    page = owner_client.get(_url(tenant)).content.decode()
    state = page.split('id="billing-details-stripe"', 1)[1].split("</p>", 1)[0]
    assert "not been updated with the tax ID of these details yet" in state
    assert "show the new name and address, with the tax ID it held before" in state

    emulator.clear_faults()
    later = timezone.now() + timedelta(minutes=2)
    assert stripe_sync.billing_details_push_due(now=later) == 1
    assert _held(gw, customer.customer_id)[3] == [("eu_vat", "DE123456789")]
    assert not BillingProfile.objects.get(tenant=tenant).stripe_tax_id_behind


def test_details_saved_before_the_tenant_had_a_stripe_customer_go_once_it_has_one(
    owner_client, tenant, gw
):
    owner_client.post(_url(tenant, "details/"), DETAILS)
    assert BillingProfile.objects.get(tenant=tenant).stripe_pending
    assert stripe_sync.billing_details_push_due() == 0  # no customer yet: nothing to update

    made = stripe_sync.customer_ensure(gw, tenant)

    assert stripe_sync.billing_details_push_due() == 1
    assert _held(gw, made.customer_id)[3] == [("eu_vat", "DE123456789")]
    assert not BillingProfile.objects.get(tenant=tenant).stripe_pending


def test_without_stripe_the_details_are_saved_and_nothing_is_said_of_stripe(owner_client, tenant):
    owner_client.post(_url(tenant, "details/"), DETAILS)

    page = owner_client.get(_url(tenant)).content.decode()
    assert "Your billing details are saved" in page and "Stripe" not in page.split("<main")[1]
    assert not StripeCustomer.objects.exists()


def test_a_stripe_invoice_keeps_the_details_it_was_finalized_with(
    client,
    owner_client,
    tenant,
    subscription,  # noqa: F811 - the fixture imported above
    emulator,
    record_usage,
):
    owner_client.post(_url(tenant, "details/"), DETAILS)
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    _deliver(client, emulator.events("invoice.created")[-1])
    assert Invoice.objects.get(stripe_invoice_id=invoice["id"]).billed_to is None  # a draft

    emulator.finalize_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.finalized")[-1])
    owner_client.post(_url(tenant, "details/"), {**DETAILS, "legal_name": "Acme Holding AG"})

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert stored.billed_to["legal_name"] == "Acme GmbH"
    page = owner_client.get(_url(tenant, f"invoices/{stored.pk}/")).content.decode()
    assert "Acme GmbH" in page and "Acme Holding AG" not in page
