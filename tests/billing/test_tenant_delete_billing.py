"""Deleting an organization waits for its last invoice: usage not invoiced yet would otherwise
come on an invoice no one could open or pay."""

from decimal import Decimal

import pytest

from accounts import services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import Tenant
from billing import invoicing
from billing.models import Invoice, Plan, Subscription
from tests.billing.test_invoicing import AFTER, NOVEMBER, _metered, _use, plan  # noqa: F401

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
