"""Billing details in a real browser, at a desktop width and a phone's (390 px): the owner fills
them in from the Billing page, corrects what is refused, and reads them on a finalized invoice,
which prints with them."""

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from accounts.audit import Actor
from billing import invoicing
from billing.models import BillingProfile, Invoice, InvoiceLine, Plan
from tests.browser.conftest import (  # noqa: F401 - fixtures shared with the browser tests
    _served_like_a_browser_expects,
    browser,
    htmx_settled,
    open_page,
    scrolls_sideways,
    shot,
)

pytestmark = pytest.mark.unsubscribed


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_the_owner_fills_in_the_billing_details_and_reads_them_on_the_invoice(
    open_page,  # noqa: F811 - the fixture imported above
    owner,
    tenant,
    make_user,
    settings,
    width,
):
    settings.OPSDECK_INVOICE_ISSUER = "Opsdeck Cloud Ltd\n1 Main Street\nDublin D01 AB12"
    page = open_page(owner, f"/t/{tenant.slug}/billing/", width)
    page.get_by_role("button", name="Add billing details").click()

    expect(page.get_by_label("Legal name")).to_have_value("Acme")
    page.get_by_label("Legal name").fill("Acme Industries GmbH & Co. KG")
    page.get_by_label("Billing email").fill("accounts-payable@acme-industries.example")
    page.get_by_label("Address line 1").fill("Friedrichstraße 123")
    page.get_by_label("Country").select_option("DE")
    page.get_by_label("Tax ID type").select_option("eu_vat")
    page.get_by_label("Tax ID number").fill("DE 123 456 789")
    page.get_by_role("button", name="Save billing details").click()

    # Refused: the city is missing; said beside the field and in the summary, values kept.
    expect(page.locator("#billing-details-errors")).to_contain_text("City: Enter the city")
    expect(page.locator("#id_city_error")).to_have_text("Enter the city, or clear the address.")
    expect(page.get_by_label("Address line 1")).to_have_value("Friedrichstraße 123")
    shot(page, f"billing-details-refused-{width}")
    assert not scrolls_sideways(page)
    page.get_by_label("City").fill("Berlin")
    page.get_by_label("Postal code").fill("10117")
    page.get_by_role("button", name="Save billing details").click()

    expect(page.locator("#messages")).to_contain_text("Your billing details are saved")
    details = page.locator("address.billed-to")
    expect(details).to_contain_text("Acme Industries GmbH & Co. KG")
    expect(details).to_contain_text("10117 Berlin")
    expect(details).to_contain_text("EU VAT number: DE123456789")
    shot(page, f"billing-details-{width}")
    assert not scrolls_sideways(page)

    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    draft = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-10", currency="usd", total=Decimal("12.34")
    )
    InvoiceLine.objects.create(
        invoice=draft, instance_id="inst-abcdefgh", instance_name="orders", dimension="cpu",
        unit="core", quantity=Decimal("352.5"), unit_price=Decimal("0.035"),
        amount=Decimal("12.34"),
    )  # fmt: skip
    staff = make_user("finance@opsdeck.example", is_staff=True)
    invoicing.invoice_finalize(actor=Actor(user=staff, staff=True), invoice=draft)
    BillingProfile.objects.filter(tenant=tenant).update(legal_name="Renamed Later AG")

    page.goto(page.url.split("/t/")[0] + f"/t/{tenant.slug}/billing/invoices/{draft.pk}/")

    billed = page.locator("#invoice-billed-to")
    expect(billed).to_contain_text("Acme Industries GmbH & Co. KG")
    expect(billed).not_to_contain_text("Renamed Later AG")
    expect(page.locator("#invoice-issuer")).to_contain_text("Dublin D01 AB12")
    shot(page, f"invoice-billed-to-{width}")
    assert not scrolls_sideways(page)
    page.emulate_media(media="print")
    expect(billed).to_be_visible()
    expect(page.locator("#invoice-issuer")).to_be_visible()
    expect(page.get_by_role("button", name="Print or save as PDF")).to_be_hidden()
    assert not scrolls_sideways(page)
    # Printed, the invoice takes the page's width, with its amounts: not the hidden sidebar's
    # column of the layout's grid.
    wide = page.viewport_size["width"]
    assert page.locator("main").bounding_box()["width"] > 0.8 * wide
    total = page.locator(".invoice-lines tfoot td")
    expect(total).to_contain_text("12.34 USD")
    box = total.bounding_box()
    assert box["width"] > 0 and box["x"] + box["width"] <= wide


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_refused_billing_details_move_the_focus_to_the_errors(
    open_page,  # noqa: F811 - the fixture imported above
    owner,
    tenant,
    width,
):
    """Sent with Enter from the email field, a wrong email and no legal name came back with a
    summary above, but the focus stayed in the email field, below the first error: as on the
    other forms, the summary takes it, its links leading to each field."""
    page = open_page(owner, f"/t/{tenant.slug}/billing/details/", width)
    htmx_settled(page)
    page.get_by_label("Legal name").fill("")
    page.get_by_label("Billing email").fill("not-an-address")
    page.get_by_label("Billing email").press("Enter")

    expect(page.locator("#billing-details-errors")).to_be_focused()
    expect(page.locator("#billing-details-errors")).to_contain_text("Legal name")
