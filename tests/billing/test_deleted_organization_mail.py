"""A Stripe event about a deleted organization's subscription is recorded as any other, but
mails no one: its former owners and billing members can no longer open it. Staff find it in
the log."""

import logging

import pytest
from django.core import mail
from django.utils import timezone

from accounts.models import AuditEvent, Tenant
from billing.models import StripeEvent
from tests.billing.test_stripe_invoices import (  # noqa: F401 - `subscription`: a fixture
    _deliver,
    _metered_and_invoiced,
    subscription,
)
from tests.conftest import mail_forget

pytestmark = pytest.mark.unsubscribed


@pytest.mark.parametrize("deleted", [False, True], ids=["organization", "deleted organization"])
def test_a_failed_payment_mails_the_owners_unless_the_organization_was_deleted(
    client,
    settings,
    tenant,
    subscription,  # noqa: F811 - the fixture imported above
    emulator,
    record_usage,
    caplog,
    django_capture_on_commit_callbacks,
    deleted,
):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the mail is sent in-process, after commit
    invoice = _metered_and_invoiced(emulator, record_usage, subscription)
    emulator.finalize_invoice(invoice["id"])
    emulator.fail_invoice(invoice["id"])
    if deleted:
        Tenant.objects.filter(pk=tenant.pk).update(deleted_at=timezone.now())
    mail_forget()

    with (
        caplog.at_level(logging.WARNING, logger="billing.services"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        _deliver(client, emulator.events("invoice.payment_failed")[-1])

    subscription.refresh_from_db()
    assert subscription.status == "past_due"  # recorded either way
    assert AuditEvent.objects.filter(tenant=tenant, action="subscription.mark_past_due").exists()
    assert StripeEvent.objects.get(type="invoice.payment_failed").processed_at is not None
    subjects = [message.subject for message in mail.outbox]
    unsent = [r.getMessage() for r in caplog.records if "not mailed" in r.getMessage()]
    if deleted:
        assert subjects == []
        assert unsent == [
            f"subscription {subscription.pk} of deleted organization {tenant.slug} ({tenant.pk}): "
            "'mark_past_due' not mailed to its members"
        ]
    else:
        assert subjects == ["[Opsdeck] Your subscription to PostgreSQL is past due"]
        assert unsent == []
