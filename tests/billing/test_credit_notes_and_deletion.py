# ruff: noqa: F811 (the fixtures imported from the credit note tests are parameters here)
"""An Opsdeck invoice credited by its credit notes was read as still owing its whole
total where the organization's deletion (and its sole member's account deletion) is refused."""

from decimal import Decimal

import pytest

from accounts import services
from accounts.audit import Actor
from billing import invoicing
from tests.billing.test_billing_team_credit_notes import (  # noqa: F401 - fixtures
    _invoice,
    finance,
    plan,
)

pytestmark = [pytest.mark.django_db, pytest.mark.unsubscribed]


def _credit(finance, invoice, amount, request_id):
    return invoicing.credit_note_issue(
        actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(amount),
        reason="order_change", request_id=request_id,
    )  # fmt: skip


def test_an_unpaid_invoice_credited_whole_does_not_keep_the_organization_from_being_deleted(
    tenant,
    plan,
    finance,
):
    invoice = _invoice(tenant, plan, finance, status="open")
    _credit(finance, invoice, "40.00", "req-1")
    invoice.refresh_from_db()
    assert invoice.amount_remaining == 0  # its page: "Remains due 0.00 USD"

    said = services.tenant_delete_blockers(tenant)

    # Nothing remains to pay: the customer is told "(40.00 USD) is unpaid: pay it first".
    assert not [line for line in said if "is unpaid" in line], said


def test_an_unpaid_invoice_credited_in_part_is_said_to_owe_what_remains(
    tenant,
    plan,
    finance,
):
    invoice = _invoice(tenant, plan, finance, status="open")
    _credit(finance, invoice, "30.00", "req-1")

    said = services.tenant_delete_blockers(tenant)

    unpaid = [line for line in said if "is unpaid" in line]
    assert unpaid and "10.00 USD" in unpaid[0], said
