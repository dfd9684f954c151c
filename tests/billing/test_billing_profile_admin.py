"""Staff see organizations' billing details in the admin, read-only, with whether Stripe's
customer holds them; and send them to Stripe again now, audited."""

import contextlib

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts import services as accounts_services
from accounts.audit import Actor
from accounts.models import AuditEvent
from billing import services, stripe_sync
from billing.models import BillingProfile, StripeCustomer
from tests.billing.test_billing_details import DETAILS

pytestmark = pytest.mark.unsubscribed

PROFILES = reverse("admin:billing_billingprofile_changelist")
CUSTOMERS = reverse("admin:billing_stripecustomer_changelist")


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the push runs in-process, after commit


def _details_saved(owner, tenant, gw):
    services.billing_details_update(actor=Actor(user=owner), tenant=tenant, details=DETAILS)
    with contextlib.suppress(stripe_sync.StripeFailure):  # recorded on the profile
        stripe_sync.billing_details_push(gw, tenant.pk)


def _retry(staff_client, changelist, row, capture):
    with capture(execute=True):
        return staff_client.post(
            changelist, {"action": "retry", "_selected_action": [row.pk]}, follow=True
        ).content.decode()


def test_staff_see_billing_details_and_that_stripe_refused_them_then_send_them_again(
    staff_client, owner, tenant, gw, customer, emulator, eager, django_capture_on_commit_callbacks
):
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", method="POST", status=400)
    _details_saved(owner, tenant, gw)
    profile = BillingProfile.objects.get(tenant=tenant)

    listed = staff_client.get(PROFILES).content.decode()
    shown = staff_client.get(
        reverse("admin:billing_billingprofile_change", args=[profile.pk])
    ).content.decode()

    assert "Acme GmbH" in listed and "Refused: " in listed
    assert "DE123456789" in shown and 'name="legal_name"' not in shown  # read-only
    emulator.clear_faults()

    said = _retry(staff_client, PROFILES, profile, django_capture_on_commit_callbacks)

    assert "Sent to Stripe again: 1." in said
    assert gw.client.v1.customers.retrieve(customer.customer_id).name == "Acme GmbH"
    profile.refresh_from_db()
    assert (profile.stripe_pending, profile.stripe_error) == (False, "")
    assert "Up to date" in staff_client.get(PROFILES).content.decode()
    event = AuditEvent.objects.get(action="billing.details_retry")
    assert (event.actor_kind, event.tenant_id, event.payload["version"]) == ("staff", tenant.pk, 1)


def test_details_stripe_holds_already_are_not_sent_again(
    staff_client, owner, tenant, gw, customer, django_capture_on_commit_callbacks
):
    _details_saved(owner, tenant, gw)

    said = _retry(
        staff_client,
        PROFILES,
        BillingProfile.objects.get(tenant=tenant),
        django_capture_on_commit_callbacks,
    )

    assert "Stripe already holds the billing details of Acme." in said
    assert not AuditEvent.objects.filter(action="billing.details_retry").exists()


def test_staff_send_the_name_of_an_organization_without_details_again(
    staff_client, owner, tenant, gw, customer, emulator, eager, django_capture_on_commit_callbacks
):
    emulator.add_fault(f"/v1/customers/{customer.customer_id}", method="POST", status=400)
    with django_capture_on_commit_callbacks(execute=True):
        accounts_services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="Acme Labs")
    assert "Refused: " in staff_client.get(CUSTOMERS).content.decode()
    emulator.clear_faults()

    said = _retry(
        staff_client,
        CUSTOMERS,
        StripeCustomer.objects.get(tenant=tenant),
        django_capture_on_commit_callbacks,
    )

    assert "Sent to Stripe again: 1." in said
    assert gw.client.v1.customers.retrieve(customer.customer_id).name == "Acme Labs"
    assert "Up to date" in staff_client.get(CUSTOMERS).content.decode()


def test_staff_who_may_only_view_billing_details_are_offered_no_action(
    client, make_user, owner, tenant
):
    services.billing_details_update(actor=Actor(user=owner), tenant=tenant, details=DETAILS)
    viewer = make_user("viewer@opsdeck.example", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_billingprofile"))
    client.force_login(viewer)
    profile = BillingProfile.objects.get()

    listed = client.get(PROFILES).content.decode()
    client.post(PROFILES, {"action": "retry", "_selected_action": [profile.pk]})

    assert "Acme GmbH" in listed and 'name="action"' not in listed
    assert not AuditEvent.objects.filter(action="billing.details_retry").exists()


def test_the_billing_details_list_makes_as_many_queries_for_many_as_for_few(
    staff_client, make_user
):
    def profiles(count):
        for n in range(BillingProfile.objects.count(), count):
            owner = make_user(f"owner{n}@example.com")
            tenant = accounts_services.tenant_create(actor=Actor(user=owner), name=f"Org {n}")
            details = {**DETAILS, "legal_name": f"Org {n} Ltd"}
            services.billing_details_update(actor=Actor(user=owner), tenant=tenant, details=details)

    profiles(2)
    staff_client.get(PROFILES)
    with CaptureQueriesContext(connection) as few:
        staff_client.get(PROFILES)
    profiles(8)
    with CaptureQueriesContext(connection) as many:
        page = staff_client.get(PROFILES).content.decode()

    assert len(many.captured_queries) == len(few.captured_queries)
    assert all(f"Org {n} Ltd" in page for n in range(8))
