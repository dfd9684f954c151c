"""The Billing page in a real browser, at a desktop width and a phone's (390 px); and money end
to end with billing kept by Opsdeck (no Stripe): a tenant subscribes on its Billing page, its
instance's hours are metered, the month closes into a draft that the billing team finds,
finalizes and exports, and the tenant reads the invoice with its chart. (One module: the
browser fixture is one per module that imports it.)"""

import csv
import io
import re

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from accounts.audit import SYSTEM
from billing import invoicing, pricing, services, usage
from billing.models import Invoice, Subscription
from billing.team_views import BILLING_TEAM
from deployments import metering
from tests.browser.conftest import (  # noqa: F401 - fixtures shared with the browser tests
    _served_like_a_browser_expects,
    browser,
    open_page,
    scrolls_sideways,
    shot,
)
from tests.deployments import factories

pytestmark = pytest.mark.unsubscribed


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_the_billing_page_never_scrolls_sideways(open_page, owner, tenant, width):  # noqa: F811
    version = factories.postgres_version()
    services.subscription_create_active(actor=SYSTEM, tenant=tenant, plan=version.plan)
    factories.make_instances(tenant, version, factories.cell(), 3)

    page = open_page(owner, f"/t/{tenant.slug}/billing/", width)
    shot(page, f"billing-{width}")

    assert "3 of 10 instances" in page.content()
    assert not scrolls_sideways(page)


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_an_ended_subscription_with_instances_on_it_says_when_they_stop(
    open_page,  # noqa: F811 - the fixture imported above
    owner,
    tenant,
    width,
):
    version = factories.postgres_version()
    subscription = services.subscription_create_active(
        actor=SYSTEM, tenant=tenant, plan=version.plan
    )
    factories.make_instances(tenant, version, factories.cell(), 2)
    services.subscription_cancel(actor=SYSTEM, subscription=subscription, instances_may_run=True)

    page = open_page(owner, f"/t/{tenant.slug}/billing/", width)
    shot(page, f"billing-ended-{width}")

    said = page.locator(f"#stop-due-{version.plan.key}")
    expect(said).to_contain_text("Your subscription to this plan has ended, and 2 instances")
    expect(said).to_contain_text("unless you are subscribed again by then. Their data is kept.")
    expect(page.get_by_role("button", name=f"Subscribe to {version.plan.name}")).to_be_visible()
    assert not scrolls_sideways(page)


def test_a_tenant_subscribes_and_reads_the_invoice_the_billing_team_finalized(
    open_page,  # noqa: F811 - the fixture imported above
    owner,
    tenant,
    make_user,
):
    version = factories.postgres_version()
    plan = version.plan

    page = open_page(owner, f"/t/{tenant.slug}/billing/")
    page.get_by_role("button", name=f"Subscribe to {plan.name}").click()
    expect(page.locator("#messages")).to_contain_text(f"You are subscribed to {plan.name}.")
    assert Subscription.objects.get(tenant=tenant, plan=plan).status == "active"

    # The instance has run since last month's last two hours; metering counts every hour of
    # last month (a period closes only once all of them are metered: those before any instance
    # hold nothing) and this month's last two.
    this_month = usage.period_bounds(usage.period_key(timezone.now()))[0]
    last_month = usage.period_bounds(usage.period_key(this_month - usage.HOUR))[0]
    factories.ran_since(tenant, version, factories.cell(), this_month - 2 * usage.HOUR)
    hours, hour = [], last_month
    while hour < this_month:
        hours.append(hour)
        hour += usage.HOUR
    latest = metering.last_full_hour()
    this_months = [h for h in (latest - usage.HOUR, latest) if h >= this_month]  # none at 00:xx
    metering.meter_hours([*hours, *this_months])
    (draft,) = invoicing.period_close(f"{last_month:%Y-%m}").invoices

    finance = make_user("finance@opsdeck.example", is_staff=True)
    finance.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])  # flushed by live tests
    team = open_page(finance, "/billing-team/")
    team.get_by_label("Organization").fill(tenant.name)
    team.get_by_label("Status").select_option("draft")
    team.get_by_role("button", name="Filter").click()
    team.get_by_role("link", name="Draft").click()
    expect(team.locator("h1")).to_have_text("Draft invoice")
    team.get_by_role("button", name="Finalize").click()  # it asks first: nothing is undone
    dialog = team.locator("#confirm-dialog")
    expect(dialog).to_contain_text(f"Finalize this draft for {tenant.name}?")
    dialog.get_by_role("button", name="Keep the draft").click()
    expect(dialog).not_to_be_visible()
    assert Invoice.objects.get(pk=draft.pk).status == "draft"
    team.get_by_role("button", name="Finalize").click()
    dialog.get_by_role("button", name="Finalize").click()
    expect(team.locator("#messages")).to_contain_text("finalized")
    number = Invoice.objects.get(pk=draft.pk).number
    team.get_by_role("link", name="All invoices").click()
    with team.expect_download() as download:
        team.get_by_role("button", name="Export CSV").click()
    rows = list(csv.reader(io.StringIO(download.value.path().read_text())))
    assert [number, tenant.name, plan.name, f"{last_month:%Y-%m}", "Finalized"] == rows[1][:5]
    shot(team, "billing-team-invoices")

    page = open_page(owner, f"/t/{tenant.slug}/billing/")
    if this_months:
        expect(page.locator("#daily-cost-usd canvas")).to_be_visible()  # this month, drawn
    else:
        expect(page.locator("#period-cost")).to_be_visible()
    page.get_by_role("link", name=number).click()
    expect(page.locator("h1")).to_have_text(f"Invoice {number}")
    expect(page.locator(".invoice-lines")).to_contain_text("orders")
    total = page.locator(".invoice-lines tfoot").inner_text()
    assert re.search(rf"{pricing.rounded(draft.total, draft.currency)} USD", total)
    expect(page.locator("#invoice-daily-cost canvas")).to_be_visible()
    # Drawn by Chart.js: the figures' table is folded away behind the chart.
    expect(page.locator("#invoice-daily-cost details")).not_to_have_attribute("open", "")
    shot(page, "invoice")

    phone = open_page(owner, f"/t/{tenant.slug}/billing/invoices/{draft.pk}/", "narrow")
    assert not scrolls_sideways(phone)
    # Each line's amount and the total are in view, not beyond the edge of a box that scrolls.
    for cell in (
        phone.locator(".invoice-lines td.num").last,
        phone.locator(".invoice-lines tfoot td"),
    ):
        box = cell.bounding_box()
        assert box is not None and box["x"] + box["width"] <= phone.viewport_size["width"]
    expect(phone.locator(".invoice-lines tbody td.num").last).to_contain_text("Amount ")
    # On a phone the invoice list is one block per invoice: its total is in view, not
    # beyond the edge of a box that scrolls.
    phone = open_page(owner, f"/t/{tenant.slug}/billing/", "narrow")
    total = phone.locator("#invoice-list td.num").first
    expect(total).to_contain_text(f"Total {pricing.rounded(draft.total, draft.currency)} USD")
    box = total.bounding_box()
    assert box is not None and box["x"] + box["width"] <= phone.viewport_size["width"]


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_older_invoices_are_a_click_away_and_the_pages_never_scroll_sideways(
    open_page,  # noqa: F811 - the fixture imported above
    owner,
    tenant,
    width,
):
    from decimal import Decimal

    plan = factories.postgres_version().plan
    for n in range(30):  # 2 plans' invoices for 15 months
        invoice = Invoice.objects.create(
            tenant=tenant, plan=plan, period=f"20{24 + n // 12}-{n % 12 + 1:02d}",
            currency="usd", total=Decimal("12.34"), number=f"n-{n:03d}",
        )  # fmt: skip
        Invoice.objects.filter(pk=invoice.pk).update(status="open")

    page = open_page(owner, f"/t/{tenant.slug}/billing/", width)
    expect(page.locator("#invoice-list")).to_contain_text("n-029")
    assert not scrolls_sideways(page)
    page.get_by_role("link", name="Older →").click()

    expect(page).to_have_url(re.compile(r"\?page=2#invoices$"))
    expect(page.locator("#invoice-list")).to_contain_text("n-000")
    expect(page.locator("#invoice-list")).not_to_contain_text("n-029")
    shot(page, f"billing-invoices-older-{width}")
    assert not scrolls_sideways(page)
