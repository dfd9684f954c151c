"""Whom an invoice is made out to and who issues it: a draft shows the tenant's billing details
as they are, a finalized invoice keeps them as they were when it was finalized."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from accounts.audit import Actor
from billing import invoicing, services
from billing.models import Invoice, InvoiceLine, Plan
from billing.team_views import BILLING_TEAM
from tests.billing.test_billing_details import DETAILS

ISSUER = "Opsdeck Cloud Ltd\n1 Main Street\nDublin D01 AB12\nIE1234567T"


@pytest.fixture
def plan(db):
    return Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")


@pytest.fixture
def draft(tenant, plan):
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-10", currency="usd", total=Decimal("12.34")
    )
    InvoiceLine.objects.create(
        invoice=invoice, instance_id="inst-abcdefgh", instance_name="orders", dimension="cpu",
        unit="core", quantity=Decimal("352.5"), unit_price=Decimal("0.035"),
        amount=Decimal("12.34"),
    )  # fmt: skip
    return invoice


@pytest.fixture
def staff(make_user):
    user = make_user("finance@opsdeck.example", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    return user


def _details(tenant, owner, **changes):
    services.billing_details_update(
        actor=Actor(user=owner), tenant=tenant, details={**DETAILS, **changes}
    )


def _page(client, invoice):
    return client.get(f"/t/{invoice.tenant.slug}/billing/invoices/{invoice.pk}/").content.decode()


def test_a_finalized_invoice_keeps_the_details_it_was_issued_with(
    client, settings, tenant, owner, draft, staff
):
    settings.OPSDECK_INVOICE_ISSUER = ISSUER
    _details(tenant, owner)
    finalized = invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)

    _details(tenant, owner, legal_name="Acme Holding AG", city="Munich", postal_code="80331")
    settings.OPSDECK_INVOICE_ISSUER = "Someone Else Inc."
    client.force_login(owner)
    page = _page(client, finalized)

    assert finalized.billed_to["legal_name"] == "Acme GmbH"
    for kept in ("Acme GmbH", "10117 Berlin", "Germany", "EU VAT number: DE123456789"):
        assert kept in page
    assert "Acme Holding AG" not in page and "Munich" not in page
    assert "Opsdeck Cloud Ltd<br>1 Main Street<br>Dublin D01 AB12<br>IE1234567T" in page
    assert "Someone Else" not in page


def test_a_draft_shows_the_details_as_they_are_now_to_the_billing_team(
    client, settings, tenant, owner, draft, staff
):
    settings.OPSDECK_INVOICE_ISSUER = ISSUER
    _details(tenant, owner)
    _details(tenant, owner, legal_name="Acme Holding AG")
    client.force_login(staff)

    page = client.get(f"/billing-team/invoices/{draft.pk}/").content.decode()

    assert "Acme Holding AG" in page and "EU VAT number: DE123456789" in page
    assert "finalizing keeps them on the invoice" in page
    assert "Opsdeck Cloud Ltd<br>1 Main Street" in page


def test_the_database_refuses_to_change_whom_a_finalized_invoice_is_made_out_to(
    tenant, owner, draft, staff
):
    _details(tenant, owner)
    finalized = invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)

    for change in (
        lambda: Invoice.objects.filter(pk=finalized.pk).update(billed_to={"legal_name": "X"}),
        lambda: Invoice.objects.filter(pk=finalized.pk).update(billed_to=None),
        lambda: Invoice.objects.filter(pk=finalized.pk).update(issuer="Someone Else Inc."),
    ):
        with pytest.raises(DatabaseError, match="finalized"), transaction.atomic():
            change()

    finalized.refresh_from_db()
    assert finalized.billed_to["legal_name"] == "Acme GmbH"
    invoicing.invoice_mark_paid(actor=Actor(user=staff, staff=True), invoice=finalized)


def test_an_invoice_finalized_before_it_kept_details_names_the_tenant_alone(
    client, tenant, owner, draft
):
    Invoice.objects.filter(pk=draft.pk).update(status="open", number="2026-000001")
    _details(tenant, owner)
    client.force_login(owner)

    page = _page(client, draft)

    assert "<strong>Acme</strong>" in page and "Acme GmbH" not in page
    assert "Issued by" not in page


def test_the_invoice_page_reads_the_parties_in_a_constant_number_of_queries(
    client, tenant, owner, draft, staff, plan
):
    _details(tenant, owner)
    finalized = invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)
    older = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-09", currency="usd", total=Decimal(1)
    )
    Invoice.objects.filter(pk=older.pk).update(status="open", number="2025-000009")
    client.force_login(owner)
    _page(client, finalized)  # the session learns the organization once

    counts = []
    for invoice in (finalized, older):
        with CaptureQueriesContext(connection) as done:
            _page(client, invoice)
        counts.append(len(done))

    assert counts[0] == counts[1]


@pytest.mark.parametrize(
    ("address", "written"),
    [
        (
            {"country": "US", "city": "San Francisco", "postal_code": "94105", "state": "CA"},
            ["San Francisco, CA 94105", "United States"],
        ),
        (  # a British postcode on a line of its own, after the town
            {"country": "GB", "city": "London", "postal_code": "SW1A 1AA"},
            ["London", "SW1A 1AA", "United Kingdom"],
        ),
        (
            {"country": "US", "city": "Austin", "postal_code": "78701"},
            ["Austin, 78701", "United States"],  # no state: no stray comma
        ),
        (  # Japan's Latin format has no city: nothing typed is left out
            {"country": "JP", "city": "Chiyoda-ku", "postal_code": "100-0001", "state": "Tokyo"},
            ["100-0001 Chiyoda-ku", "Tokyo", "Japan"],
        ),
        (  # what was typed is kept whole, separators and all
            {"country": "US", "city": "-Springfield-", "postal_code": "62701", "state": "IL,"},
            ["-Springfield-, IL, 62701", "United States"],
        ),
    ],
    ids=["us", "gb", "us-no-state", "jp-city", "typed-whole"],
)
def test_an_address_is_written_as_its_countrys_post_writes_it(
    client, tenant, owner, address, written
):
    _details(tenant, owner, **{"state": "", **address, "tax_id_type": "", "tax_id_value": ""})
    client.force_login(owner)

    page = client.get(f"/t/{tenant.slug}/billing/").content.decode()  # as invoices print it
    block = page.split('<address class="billed-to">')[1].split("</address>")[0]

    lines = [line for line in block.replace("</span>", "").split("<span>")[1:]]
    assert [line.strip() for line in lines][:-1] == [
        "Unter den Linden 1",
        "3. OG",
        *written,
    ]
