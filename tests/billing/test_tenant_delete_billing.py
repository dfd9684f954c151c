"""Deleting an organization waits for its last invoice: usage not invoiced yet would otherwise
come on an invoice no one could open or pay."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import Tenant
from billing import invoicing
from billing.models import Invoice, Plan, Subscription
from billing.usage import HOUR
from deployments import metering
from deployments.models import Instance
from tests.billing.test_invoicing import (  # noqa: F401 - plan: a fixture
    AFTER,
    DECEMBER,
    JANUARY,
    NOVEMBER,
    _metered,
    _use,
    plan,
)
from tests.billing.test_stripe_invoices import _deliver, subscription  # noqa: F401 - a fixture
from tests.deployments.test_metering_hourly import cell, make, move, version  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.unsubscribed]


def _delete(owner, tenant):
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")


def test_deleting_waits_for_the_invoice_of_the_months_usage_and_its_payment(
    owner,
    tenant,
    plan,  # noqa: F811 - the fixture imported above
    make_user,
):
    Subscription.objects.create(tenant=tenant, plan=plan, status="cancelled")
    _use(tenant, plan, NOVEMBER, cpu="2")

    with pytest.raises(ActionDenied) as refused:
        _delete(owner, tenant)
    assert refused.value.reason == (
        "Acme cannot be deleted yet. Its usage of November 2026 is invoiced once the month has "
        "ended, from 1 December 2026: delete the organization once that invoice is paid."
    )

    _metered()
    (draft,) = invoicing.period_close("2026-11", now=AFTER).invoices
    with pytest.raises(ActionDenied, match=r"Its invoice for 2026-11 is being prepared"):
        _delete(owner, tenant)

    staff = make_user("finance@opsdeck.example", is_staff=True)
    invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)
    with pytest.raises(ActionDenied, match=r"Invoice 2026-\d+ \(0.07 USD\) is unpaid"):
        _delete(owner, tenant)

    Invoice.objects.filter(pk=draft.pk).update(status="paid")
    _delete(owner, tenant)
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None


def test_usage_of_a_plan_without_prices_does_not_hold_a_deletion(owner, tenant):
    free = Plan.objects.create(key="free", name="Free", service="postgresql")
    Subscription.objects.create(tenant=tenant, plan=free, status="cancelled")
    _use(tenant, free, NOVEMBER, cpu=Decimal(2))

    _delete(owner, tenant)

    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None


def test_the_invoice_at_0_of_a_plan_without_prices_does_not_hold_a_deletion(
    owner, tenant, make_user
):
    """Its month closed, free usage gets an invoice at 0 (`invoicing._drafts`): nothing to pay,
    whether drafted or issued."""
    free = Plan.objects.create(key="free", name="Free", service="postgresql")
    Subscription.objects.create(tenant=tenant, plan=free, status="cancelled")
    _use(tenant, free, NOVEMBER, cpu=Decimal(2))
    _metered()
    (draft,) = invoicing.period_close("2026-11", now=AFTER).invoices
    assert draft.total == 0

    assert services.tenant_delete_blockers(tenant) == []
    staff = make_user("finance@opsdeck.example", is_staff=True)
    invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)
    _delete(owner, tenant)

    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None


def _deleted(instance, at):
    move(instance, Instance.State.DELETING, at)
    move(instance, Instance.State.DELETED, at + timedelta(minutes=1))


def test_deleting_waits_for_the_usage_of_an_hour_not_metered_yet(
    owner,
    tenant,
    make,  # noqa: F811 - the fixture imported above
    make_user,
):
    """A database deleted on 1 December at 00:10: nothing of December is recorded until its
    00:00 hour is metered, at about 01:05, yet those ten minutes come on December's invoice."""
    staff = Actor(user=make_user("finance@opsdeck.example", is_staff=True), staff=True)
    instance = make(DECEMBER - 2 * HOUR)
    metering.meter_hour(DECEMBER - 2 * HOUR)
    metering.meter_hour(DECEMBER - HOUR)
    _metered()
    (november,) = invoicing.period_close("2026-11", now=DECEMBER + HOUR).invoices
    invoicing.invoice_finalize(actor=staff, invoice=november)
    invoicing.invoice_mark_paid(actor=staff, invoice=november)
    _deleted(instance, DECEMBER + timedelta(minutes=10))

    with pytest.raises(ActionDenied) as refused:
        _delete(owner, tenant)
    assert refused.value.reason == (
        "Acme cannot be deleted yet. Its usage of December 2026 is invoiced once the month has "
        "ended, from 1 January 2027: delete the organization once that invoice is paid."
    )

    metering.meter_hour(DECEMBER)
    _metered(DECEMBER, JANUARY)
    (december,) = invoicing.period_close("2026-12", now=JANUARY + HOUR).invoices
    assert december.total > 0
    invoicing.invoice_finalize(actor=staff, invoice=december)
    invoicing.invoice_mark_paid(actor=staff, invoice=december)
    _delete(owner, tenant)
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None


def test_databases_made_and_deleted_within_an_hour_not_metered_yet_hold_a_deletion(
    tenant,
    make,  # noqa: F811 - the fixture imported above
):
    """However many there were, in as many queries."""
    _metered(NOVEMBER, NOVEMBER + 10 * HOUR)
    _deleted(make(NOVEMBER + 10 * HOUR, name="a"), NOVEMBER + 10 * HOUR + timedelta(minutes=20))
    with CaptureQueriesContext(connection) as one:
        said = services.tenant_delete_blockers(tenant)
    for name in ("b", "c", "d"):
        made = NOVEMBER + 10 * HOUR + timedelta(minutes=30)
        _deleted(make(made, name=name), made + timedelta(minutes=5))
    with CaptureQueriesContext(connection) as four:
        assert services.tenant_delete_blockers(tenant) == said

    assert said == [
        "Its usage of November 2026 is invoiced once the month has ended, from 1 December 2026: "
        "delete the organization once that invoice is paid."
    ]
    assert len(four) == len(one)


def test_deleting_waits_for_stripes_invoice_of_the_usage_on_its_meters(
    client,
    owner_client,
    owner,
    tenant,
    subscription,  # noqa: F811 - the fixture imported above
    emulator,
    record_usage,
):
    """The owner cancels (Stripe bills the subscription to its period's end), the month ends
    and closes with no invoice of ours (the usage went to Stripe's meters); deleted before
    Stripe's invoice of the month came, the organization got it afterwards, charged to its card
    with no one able to open it."""
    from django.utils import timezone

    from billing import meter_events, usage
    from billing.models import MeteredHour

    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    record_usage(hour, ("inst-a", "cpu", "100"))
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    owner_client.post(f"/t/{tenant.slug}/billing/subscriptions/{subscription.pk}/cancel/")
    start, end = usage.period_bounds(usage.period_key(hour))
    MeteredHour.objects.bulk_create(
        [MeteredHour(hour=start + HOUR * i) for i in range((end - start) // HOUR)],
        ignore_conflicts=True,
    )
    assert invoicing.period_close(usage.period_key(hour), now=end + HOUR).invoices == []

    with pytest.raises(ActionDenied) as refused:
        _delete(owner, tenant)
    invoice = emulator.close_period(subscription.stripe_subscription_id)  # its period ends
    _deliver(client, emulator.events("invoice.created")[-1])

    subscription.refresh_from_db()
    assert (
        "Stripe invoices its usage of the PostgreSQL plan when the subscription's last period "
        f"ends, {subscription.current_period_end:%-d %B %Y %H:%M} UTC" in str(refused.value)
    )
    assert Invoice.objects.get(stripe_invoice_id=invoice["id"]).total > 0
    # Stripe's invoice of it came: it holds the deletion now (until it is paid), not the meters.
    said = services.tenant_delete_blockers(tenant)
    assert said and not [sentence for sentence in said if "last period ends" in sentence], said


def test_usage_sent_while_stripes_last_invoice_was_a_draft_holds_the_deletion_no_more(
    client,
    owner_client,
    tenant,
    subscription,  # noqa: F811 - the fixture imported above
    emulator,
    record_usage,
):
    """Stripe's last invoice is made as a draft at the period's end; the last meter event goes
    out minutes later (the outbox was behind), before Stripe finalizes it, which so bills it:
    once it is paid, nothing of Stripe's is to come."""
    from django.utils import timezone

    from billing import meter_events

    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    record_usage(hour, ("inst-a", "cpu", "3"))
    meter_events.enqueue()
    owner_client.post(f"/t/{tenant.slug}/billing/subscriptions/{subscription.pk}/cancel/")
    invoice = emulator.close_period(subscription.stripe_subscription_id)
    _deliver(client, emulator.events("invoice.created")[-1])
    assert meter_events.flush().sent == 1  # sent while Stripe's invoice is a draft
    emulator.finalize_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.finalized")[-1])
    emulator.pay_invoice(invoice["id"])
    _deliver(client, emulator.events("invoice.paid")[-1])

    assert not [s for s in services.tenant_delete_blockers(tenant) if "Stripe" in s]


def test_stripes_last_invoice_is_waited_for_as_long_as_stripe_retries_a_webhook(
    client,
    owner_client,
    tenant,
    subscription,  # noqa: F811 - the fixture imported above
    record_usage,
):
    """One Stripe ended at once (its dashboard, failed payments) makes no last invoice: the
    wait ends three days past the period's end, as Stripe's retries of a webhook do."""
    from django.utils import timezone

    from billing import meter_events
    from billing.selectors import STRIPE_LAST_INVOICE_WAIT

    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    record_usage(hour, ("inst-a", "cpu", "3"))
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    owner_client.post(f"/t/{tenant.slug}/billing/subscriptions/{subscription.pk}/cancel/")
    ended = timezone.now() - HOUR
    Subscription.objects.filter(pk=subscription.pk).update(current_period_end=ended)
    waiting = services.tenant_delete_blockers(tenant)
    Subscription.objects.filter(pk=subscription.pk).update(
        current_period_end=timezone.now() - STRIPE_LAST_INVOICE_WAIT - HOUR
    )

    assert [s for s in waiting if "last period ends" in s]
    assert not [s for s in services.tenant_delete_blockers(tenant) if "last period ends" in s]
