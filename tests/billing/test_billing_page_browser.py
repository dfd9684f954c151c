"""The Billing page in a real browser, at a desktop width and a phone's (390 px)."""

import pytest

from accounts.audit import SYSTEM
from billing import services
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
