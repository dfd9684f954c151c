# ruff: noqa: F811 (the Stripe fixtures of the billing tests are parameters here)
"""Paying for a subscription on Stripe's Checkout page (the local emulator's) and coming back,
in a real browser: the Billing page follows the subscription until Stripe confirms it."""

import json
import re
import time

import pytest
from playwright.sync_api import expect

from stripe_emulator import sign
from tests.billing.conftest import WEBHOOK_SECRET, emulator, gw, priced_plan, stripe_settings  # noqa: F401
from tests.browser.conftest import scrolls_sideways, shot

pytestmark = pytest.mark.unsubscribed


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_back_from_paying_the_page_shows_the_subscription_start_without_a_reload(
    open_page, client, owner, tenant, priced_plan, gw, emulator, width
):
    from billing import stripe_sync

    stripe_sync.catalog_sync(gw)
    page = open_page(owner, f"/t/{tenant.slug}/billing/", width)
    page.get_by_role("button", name="Subscribe to PostgreSQL").click()
    page.get_by_role("button", name="Pay").click()  # on Stripe's page, then back

    plan = page.locator("#plan-pg")
    expect(plan.locator(".badge")).to_have_text("Confirming payment")
    expect(page.get_by_role("button", name="Continue to payment")).to_have_count(0)
    shot(page, f"billing-confirming-{width}")
    assert not scrolls_sideways(page)
    loaded = page.evaluate("performance.timeOrigin")

    event = emulator.events("checkout.session.completed")[-1]  # Stripe tells Opsdeck
    body = json.dumps(event).encode()
    client.post(
        "/billing/stripe/webhook/", body, content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body, WEBHOOK_SECRET, int(time.time())),
    )  # fmt: skip

    expect(plan.locator(".badge")).to_have_text("Active", timeout=10_000)
    expect(page.get_by_role("status")).to_have_text(
        re.compile("Stripe confirmed your payment details")
    )
    assert page.evaluate("performance.timeOrigin") == loaded  # the same page, not a reload
    shot(page, f"billing-confirmed-{width}")
    # Thanked once: the address is the Billing page's own, so a reload does not thank again.
    expect(page).to_have_url(re.compile(rf"/t/{tenant.slug}/billing/$"))
    page.reload()
    expect(plan.locator(".badge")).to_have_text("Active")
    expect(page.get_by_text("Stripe confirmed your payment details")).to_have_count(0)
