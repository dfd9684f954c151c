"""Money end to end with Stripe, in a real browser, against the local Stripe emulator: a tenant
subscribes through Checkout, its instance's hours go to Stripe's meters, Stripe closes the
period and issues the invoice, webhooks bring it back, the tenant reads it with its chart, and
a billing team member finds it and exports it. (One module: one browser per module.)"""

import csv
import io
import re

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from billing import meter_events, pricing, stripe_sync, usage
from billing.models import Invoice, StripeCustomer, StripeEvent, Subscription
from billing.stripe_gateway import gateway
from billing.team_views import BILLING_TEAM
from deployments import metering
from stripe_emulator import StripeEmulator
from tests.billing.conftest import API_KEY, WEBHOOK_SECRET
from tests.browser.conftest import (  # noqa: F401 - fixtures shared with the browser tests
    _served_like_a_browser_expects,
    browser,
    open_page,
    scrolls_sideways,
    shot,
)
from tests.deployments import factories
from tests.deployments.conftest import wait_for

pytestmark = pytest.mark.unsubscribed


@pytest.fixture
def stripe_live(settings, live_server):
    """The emulator, delivering its webhooks to the live server, and billing pointed at it."""
    with StripeEmulator(
        webhook_url=f"{live_server.url}/billing/stripe/webhook/", webhook_secret=WEBHOOK_SECRET
    ) as emulator:
        settings.STRIPE_API_KEY = API_KEY
        settings.STRIPE_API_BASE = emulator.url
        settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
        yield emulator


def test_a_tenant_subscribes_through_checkout_and_reads_stripes_invoice(
    open_page,  # noqa: F811 - the fixture imported above
    stripe_live,
    owner,
    tenant,
    make_user,
):
    version = factories.postgres_version()
    plan = version.plan
    stripe_sync.catalog_sync(gateway())

    page = open_page(owner, f"/t/{tenant.slug}/billing/")
    page.get_by_role("button", name=f"Subscribe to {plan.name}").click()
    page.wait_for_url(f"{stripe_live.url}/c/pay/cs_*")  # Stripe's Checkout page
    shot(page, "checkout")
    page.get_by_role("button", name="Pay").click()
    # Back from Checkout, the page thanks for the payment: as confirming it, or as confirmed
    # when Stripe's webhook came first.
    expect(page.locator("main")).to_contain_text(
        re.compile(r"Thank you: Stripe (has|confirmed) your payment details")
    )
    subscription = wait_for(
        lambda: Subscription.objects.filter(tenant=tenant, plan=plan, status="active").first(),
        timeout=15,
        what="the webhook to activate the subscription",
    )
    page.reload()
    expect(page.locator(f"#plan-{plan.key} .badge")).to_have_text("Active")
    expect(page.get_by_role("button", name="Manage payment method")).to_be_visible()

    # Stripe's webhooks so far handled: each mirrors the subscription's start, which the
    # history below fakes.
    wait_for(
        lambda: (
            {e["id"] for e in stripe_live.events()}
            <= set(
                StripeEvent.objects.exclude(processed_at=None).values_list("event_id", flat=True)
            )
        ),
        timeout=15,
        what="Stripe's webhooks to be handled",
    )
    # The instance runs from the start of the month; the customer has been Stripe's since
    # then (a test cannot wait for an hour to pass). Its hours go to Stripe's meters.
    this_month = usage.period_bounds(usage.period_key(timezone.now()))[0]
    StripeCustomer.objects.filter(tenant=tenant).update(created_at=this_month)
    Subscription.objects.filter(tenant=tenant, plan=plan).update(
        created_at=this_month, stripe_started_at=this_month
    )
    factories.ran_since(tenant, version, factories.cell(), this_month)
    latest = metering.last_full_hour()
    hours = [h for h in (latest - usage.HOUR, latest) if h >= this_month]  # none at 00:xx
    metering.meter_hours(hours)
    meter_events.enqueue()
    sent = meter_events.flush().sent
    assert sent == len(stripe_live.meter_events()) and (sent > 0) == bool(hours)

    # Stripe closes the period, drafts the invoice, finalizes it an hour later.
    invoice = stripe_live.close_period(subscription.stripe_subscription_id)
    stripe_live.finalize_invoice(invoice["id"])
    stored = wait_for(
        lambda: Invoice.objects.filter(stripe_invoice_id=invoice["id"], status="open").first(),
        timeout=15,
        what="the finalized invoice's webhook",
    )
    assert stored.number and stored.source == "stripe"

    page = open_page(owner, f"/t/{tenant.slug}/billing/")
    page.get_by_role("link", name=stored.number).click()
    expect(page.locator("h1")).to_have_text(f"Invoice {stored.number}")
    expect(page.locator(".invoice-lines")).to_contain_text("CPU")
    shown = pricing.rounded(stored.total, stored.currency)
    expect(page.locator(".invoice-lines tfoot")).to_contain_text(f"{shown} USD")
    if hours:
        expect(page.locator("#invoice-daily-cost canvas")).to_be_visible()
    else:  # in a month's first hour nothing is metered yet: no cost to chart
        expect(page.locator("#invoice-daily-cost")).to_have_count(0)
    link = page.get_by_role("button", name="Pay or view on Stripe")
    expect(link).to_have_attribute("href", f"{stripe_live.url}/i/{invoice['id']}")
    shot(page, "stripe-invoice")
    phone = open_page(owner, f"/t/{tenant.slug}/billing/invoices/{stored.pk}/", "narrow")
    assert not scrolls_sideways(phone)

    finance = make_user("finance@opsdeck.example", is_staff=True)
    finance.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])  # flushed by live tests
    team = open_page(finance, "/billing-team/")
    team.get_by_label("Organization").fill(tenant.name)
    team.get_by_label("Status").select_option("open")
    team.get_by_role("button", name="Filter").click()
    team.get_by_role("link", name=stored.number).click()
    expect(team.locator("#invoice-review")).to_contain_text("Stripe issues this invoice")
    team.get_by_role("link", name="All invoices").click()
    with team.expect_download() as download:
        team.get_by_role("button", name="Export CSV").click()
    rows = list(csv.reader(io.StringIO(download.value.path().read_text())))
    assert [stored.number, tenant.name, plan.name, stored.period, "Finalized"] == rows[1][:5]
