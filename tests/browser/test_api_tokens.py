"""An owner makes an API token, copies its secret and revokes it, on a phone's width."""

from playwright.sync_api import expect

from accounts.models import ApiToken
from tests.browser.conftest import scrolls_sideways, shot


def test_an_owner_makes_then_revokes_a_token_on_a_narrow_screen(open_page, owner, tenant):
    page = open_page(owner, f"/t/{tenant.slug}/settings/", "narrow")

    page.get_by_label("Token name").fill("ci-deploy")
    page.get_by_role("button", name="Create token").click()

    expect(page.locator("#new-token-secret")).to_contain_text("odt_")
    expect(page.get_by_role("button", name="Copy the API token")).to_be_visible()
    shot(page, "api-token-created-narrow")
    assert not scrolls_sideways(page)
    page.get_by_role("button", name="Revoke ci-deploy").click()
    page.get_by_role("button", name="Revoke", exact=True).click()  # the page's own dialog
    expect(page.locator("#messages")).to_contain_text("API token “ci-deploy” revoked")
    expect(page.locator("#new-token-secret")).to_have_count(0)
    assert ApiToken.objects.get().revoked_at is not None
