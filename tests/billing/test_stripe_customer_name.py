"""An organization without billing details is billed under its name: renamed, its Stripe
customer takes the new name once the rename commits, and beat sends it when Stripe could not be
reached. One with billing details keeps its legal name on Stripe."""

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.audit import Actor
from billing import services, stripe_sync
from billing.models import StripeCustomer
from tests.billing.test_billing_details import DETAILS

pytestmark = pytest.mark.unsubscribed


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the push runs in-process, after commit


def _rename(owner_client, tenant, name, capture):
    with capture(execute=True):
        owner_client.post(f"/t/{tenant.slug}/settings/rename/", {"name": name})


def _stripe_name(gw, customer):
    return gw.client.v1.customers.retrieve(customer.customer_id).name


def test_renaming_an_organization_without_billing_details_renames_its_stripe_customer(
    owner_client, tenant, gw, customer, eager, django_capture_on_commit_callbacks
):
    assert _stripe_name(gw, customer) == "Acme"

    _rename(owner_client, tenant, "Acme Labs", django_capture_on_commit_callbacks)

    assert _stripe_name(gw, customer) == "Acme Labs"
    customer.refresh_from_db()
    assert (customer.name, customer.name_error, customer.name_next_attempt_at) == (
        "Acme Labs",
        "",
        None,
    )
    assert stripe_sync.billing_details_push_due() == 0  # nothing left to send


def test_renaming_an_organization_with_billing_details_keeps_its_legal_name_on_stripe(
    owner, owner_client, tenant, gw, customer, eager, django_capture_on_commit_callbacks
):
    services.billing_details_update(actor=Actor(user=owner), tenant=tenant, details=DETAILS)
    stripe_sync.billing_details_push(gw, tenant.pk)

    _rename(owner_client, tenant, "Acme Labs", django_capture_on_commit_callbacks)

    assert _stripe_name(gw, customer) == "Acme GmbH"
    assert stripe_sync.billing_details_push_due(now=timezone.now() + timedelta(days=1)) == 0


def test_stripe_out_of_reach_a_rename_reaches_it_later_by_beat(
    owner_client, tenant, gw, customer, emulator, eager, django_capture_on_commit_callbacks
):
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", method="POST", status=503)

    _rename(owner_client, tenant, "Acme Labs", django_capture_on_commit_callbacks)

    customer.refresh_from_db()
    assert customer.name == "Acme" and customer.name_error
    assert customer.name_next_attempt_at > timezone.now()
    assert stripe_sync.billing_details_push_due() == 0  # not due yet
    emulator.clear_faults()

    assert stripe_sync.billing_details_push_due(now=timezone.now() + timedelta(minutes=2)) == 1

    assert _stripe_name(gw, customer) == "Acme Labs"
    customer.refresh_from_db()
    assert (customer.name, customer.name_error, customer.name_next_attempt_at) == (
        "Acme Labs",
        "",
        None,
    )


def test_a_rename_whose_worker_is_not_reached_goes_with_beat(
    owner_client, tenant, gw, customer, broker, django_capture_on_commit_callbacks
):
    broker.down()

    _rename(owner_client, tenant, "Acme Labs", django_capture_on_commit_callbacks)

    assert _stripe_name(gw, customer) == "Acme"
    assert stripe_sync.billing_details_push_due() == 1
    assert _stripe_name(gw, customer) == "Acme Labs"


def test_a_name_stripe_refused_is_not_tried_again_until_the_next_rename(
    owner_client, tenant, gw, customer, emulator, eager, django_capture_on_commit_callbacks
):
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", method="POST", status=400)

    _rename(owner_client, tenant, "Acme Labs", django_capture_on_commit_callbacks)

    customer.refresh_from_db()
    assert customer.name_error and customer.name_next_attempt_at is None
    assert stripe_sync.billing_details_push_due(now=timezone.now() + timedelta(days=1)) == 0
    emulator.clear_faults()

    _rename(owner_client, tenant, "Acme Works", django_capture_on_commit_callbacks)

    assert _stripe_name(gw, customer) == "Acme Works"


def test_a_customer_whose_name_is_not_known_takes_the_organization_name_from_beat(tenant, gw):
    made = gw.customer_create(tenant_id=tenant.pk, name="Someone else")
    stripe_sync.customer_remember(tenant=tenant, customer_id=made.id)  # as a checkout does

    assert stripe_sync.billing_details_push_due() == 1

    assert gw.client.v1.customers.retrieve(made.id).name == "Acme"
    assert StripeCustomer.objects.get(tenant=tenant).name == "Acme"
