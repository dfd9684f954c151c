# ruff: noqa: F811 (the instance fixture of the instance page tests is a parameter here)
"""Modify and Connection on the instance page in a real browser, at 1280 px and 390 px."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import scrolls_sideways, shot
from tests.browser.test_instance_page import instance  # noqa: F401 (fixture)

BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])


def _open(open_page, owner, instance, width="wide", tab=""):
    query = f"?tab={tab}" if tab else ""
    return open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/{query}", width)


@BOTH_WIDTHS
def test_the_modify_dialog_never_scrolls_sideways(open_page, owner, instance, width):
    page = _open(open_page, owner, instance, width)

    page.get_by_role("button", name="Modify").click()
    dialog = page.locator("#dialog-modify")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_label("Servers")).to_have_value("1")
    shot(page, f"instance-modify-{width}")

    assert not scrolls_sideways(page)


def test_typing_a_server_count_updates_the_cost_after_the_change(open_page, owner, instance):
    page = _open(open_page, owner, instance)
    errors = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.get_by_role("button", name="Modify").click()
    now = page.locator("#modify-current-month").inner_text()
    expect(page.locator("#modify-new-month")).to_have_text(now)

    page.locator("#dialog-modify").get_by_label("Servers").fill("3")

    expect(page.locator("#modify-new-month")).not_to_have_text(now)
    after = float(page.locator("#modify-new-month").inner_text())
    assert after == pytest.approx(3 * float(now), abs=0.03)
    expect(page.locator("#modify-current-month")).to_have_text(now)
    assert errors == []  # the estimate's request disables no button of the form's


def test_the_cost_after_the_change_is_said_by_the_live_region_that_was_there(
    open_page, owner, instance
):
    """A screen reader reads a live region's changes, not a region put in whole: each new
    estimate swapped in a new #modify-estimate, and the new price went unsaid."""
    page = _open(open_page, owner, instance)
    page.get_by_role("button", name="Modify").click()
    now = page.locator("#modify-new-month").inner_text()
    page.evaluate("() => { document.getElementById('modify-estimate').dataset.heard = '1'; }")

    page.locator("#dialog-modify").get_by_label("Servers").fill("3")
    expect(page.locator("#modify-new-month")).not_to_have_text(now)

    heard = page.locator("[data-heard]")
    expect(heard).to_have_attribute("aria-live", "polite")
    expect(heard).to_contain_text(page.locator("#modify-new-month").inner_text())


@BOTH_WIDTHS
def test_the_connection_tab_never_scrolls_sideways(open_page, owner, instance, width):
    page = _open(open_page, owner, instance, width, tab="connection")
    shot(page, f"instance-connection-{width}")

    expect(page.locator("#connection-uri")).to_contain_text("postgresql://app:••••••@")
    expect(page.get_by_role("button", name="Reveal password")).to_be_visible()
    assert not scrolls_sideways(page)


@BOTH_WIDTHS
def test_reveal_asks_for_the_password_then_shows_it_once(open_page, owner, instance, width):
    from deployments import services
    from tests.conftest import PASSWORD

    secret = services.instance_parameters(instance)["password"]
    page = _open(open_page, owner, instance, width, tab="connection")

    page.get_by_role("button", name="Reveal password").click()
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_label("Password").press("Enter")

    expect(page.locator("#connection-password")).to_have_text(secret)
    # The address is the tab's, not the password check's the answer came from.
    address = f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=connection"
    expect(page).to_have_url(re.compile(re.escape(address) + "$"))
    shot(page, f"instance-connection-revealed-{width}")
    assert not scrolls_sideways(page)
    page.reload()  # a GET of the same address: the revealed answer is not cached
    expect(page.locator("#connection-host")).to_be_visible()
    assert secret not in page.content()
