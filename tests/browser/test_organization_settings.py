"""An owner renames and deletes an organization in a real browser, at 1280 px and 390 px."""

import pytest
from playwright.sync_api import expect

from accounts import services
from accounts.audit import Actor
from accounts.models import Membership, Tenant
from tests.browser.conftest import scrolls_sideways, shot

LONG_NAME = "Acme Research and Development Laboratories Worldwide"


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_an_owner_renames_then_deletes_the_organization(open_page, owner, tenant, width):
    other = services.tenant_create(actor=Actor(user=owner), name="Beta")
    page = open_page(owner, f"/t/{tenant.slug}/", width)
    page.locator("aside.sidebar").get_by_role("link", name="Settings").click()
    expect(page.locator("h1")).to_have_text("Settings")
    assert not scrolls_sideways(page)

    page.get_by_label("Organization name").fill(" ")
    page.get_by_role("button", name="Rename").click()
    expect(page.locator(".error-summary")).to_contain_text("Give the organization a name.")
    expect(page.get_by_label("Organization name")).to_have_attribute("aria-invalid", "true")

    page.get_by_label("Organization name").fill(LONG_NAME)
    page.get_by_role("button", name="Rename").click()
    expect(page.locator("#messages")).to_contain_text(f"Acme is now called {LONG_NAME}.")
    expect(page.locator(".tenant-switcher summary")).to_have_text(LONG_NAME)
    shot(page, f"organization-settings-{width}")
    assert not scrolls_sideways(page)
    delete = page.get_by_role("button", name=f"Delete {LONG_NAME}")
    box, view = delete.bounding_box(), page.viewport_size
    assert box["x"] >= 0 and box["x"] + box["width"] <= view["width"]

    page.get_by_label("Type").fill("Acme")
    delete.click()
    expect(page.locator(".error-summary")).to_contain_text(
        f"Type the organization's name, {LONG_NAME}, to delete it."
    )
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None

    page.get_by_label("Type").fill(LONG_NAME)
    page.get_by_role("button", name=f"Delete {LONG_NAME}").click()
    expect(page.locator("#messages")).to_contain_text(f"Organization {LONG_NAME} deleted.")
    expect(page).to_have_url(f"{page.url.split('/t/')[0]}/t/{other.slug}/")
    page.locator(".tenant-switcher summary").click()
    expect(page.locator(".tenant-switcher")).not_to_contain_text(LONG_NAME)
    assert not scrolls_sideways(page)
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_a_viewer_sees_the_settings_without_rename_or_delete(open_page, tenant, add_member, width):
    page = open_page(add_member("vic@example.com", "viewer"), f"/t/{tenant.slug}/settings/", width)

    expect(page.locator("#organization-name-shown")).to_contain_text("Acme")
    expect(page.get_by_role("button", name="Rename")).to_have_count(0)
    expect(page.locator("#organization-delete")).to_have_count(0)
    expect(page.get_by_role("button", name="Leave Acme")).to_be_visible()
    assert not scrolls_sideways(page)


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_a_long_one_word_name_breaks_inside_the_settings_page(open_page, owner, tenant, width):
    word = "W" * 100
    services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name=word)

    page = open_page(owner, f"/t/{tenant.slug}/settings/", width)

    expect(page.get_by_role("button", name=f"Delete {word}")).to_be_visible()
    shot(page, f"organization-settings-long-name-{width}")
    assert not scrolls_sideways(page)


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_two_organizations_of_one_name_show_their_addresses_in_the_open_switcher(
    open_page, tenant, make_user, width
):
    newcomer = make_user("newcomer@example.com")
    other = services.tenant_create(actor=Actor(user=newcomer), name="ACME")
    Membership.objects.create(tenant=tenant, user=newcomer, role="member")  # then joins Acme
    page = open_page(newcomer, f"/t/{tenant.slug}/", width)

    page.locator(".tenant-switcher summary").click()
    shot(page, f"switcher-same-names-{width}")

    for slug in (tenant.slug, other.slug):
        entry = page.locator(f'.tenant-switcher a[href="/t/{slug}/"]')
        expect(entry).to_contain_text(slug)
        box, view = entry.bounding_box(), page.viewport_size
        assert box["x"] >= 0 and box["x"] + box["width"] <= view["width"]
    assert not scrolls_sideways(page)
