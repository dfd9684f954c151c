# ruff: noqa: F811 (the instance fixture of the instance page tests is a parameter here)
"""The portal for people who use only a keyboard, or a screen reader, in a real browser: what
changes on its own, or in place, leaves their focus and what they typed where they left it
(or takes it where they now are), and is said."""

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from tests.browser.conftest import htmx_settled
from tests.browser.test_instance_page import instance  # noqa: F401 (fixture)

BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])
FOCUSED = """() => {
    const el = document.activeElement;
    if (!el) return null;
    return `${el.tagName.toLowerCase()}#${el.id} ${(el.textContent || '').trim().slice(0, 40)}`;
}"""


def _path(instance, tab=""):
    return f"/t/{instance.tenant.slug}/deployments/{instance.pk}/" + (f"?tab={tab}" if tab else "")


@BOTH_WIDTHS
def test_the_operations_timeline_poll_leaves_the_keyboard_focus_where_it_was(
    open_page, owner, instance, width
):
    """A keyboard user tabs to a running operation's Cancel button while the timeline polls
    every 2 s: a poll that replaced the timeline took the focus with it, and Enter did
    nothing."""
    from tests.deployments import factories

    factories.make_operation(instance, verb="restart", state="running")
    page = open_page(owner, _path(instance, "operations"), width)
    cancel = page.get_by_role("button", name="Cancel this restart")
    expect(cancel).to_be_visible()
    htmx_settled(page)
    cancel.focus()

    page.wait_for_timeout(4500)  # two polls of the timeline
    page.keyboard.press("Enter")  # on the button they tabbed to, as far as they can tell

    expect(page.locator("#confirm-dialog")).to_be_visible()  # "Cancel this restart?"


def test_an_operation_ending_keeps_a_half_typed_field_and_its_focus(open_page, owner, instance):
    """A member edits the backup schedule while a restart runs. When the restart ends, the
    header's poll swaps in the whole page: what they typed, and their focus, went with it."""
    from deployments.models import Operation
    from tests.deployments import factories

    restart = factories.make_operation(instance, verb="restart", state="running")
    page = open_page(owner, _path(instance, "backups"))
    htmx_settled(page)
    page.get_by_text("Change the schedule").click()
    field = page.get_by_label("Hours between backups")
    field.fill("12")
    expect(field).to_be_focused()

    Operation.objects.filter(pk=restart.pk).update(
        state=Operation.State.SUCCEEDED, finished_at=timezone.now()
    )
    expect(page.locator("#instance-head")).to_have_attribute("hx-trigger", "every 15s")
    htmx_settled(page)  # the header's poll found it ended, and the page was swapped

    field = page.get_by_label("Hours between backups")
    expect(field).to_have_value("12")
    expect(field).to_be_focused()
    page.evaluate("() => { window.notReloaded = true; }")
    field.press("Enter")  # the form kept still sends as htmx does, into the page
    expect(page.locator("#backup-schedule-status")).to_contain_text("every 12 hours")
    assert page.evaluate("() => window.notReloaded")


def test_an_operation_ending_is_said_in_a_live_region(open_page, owner, instance):
    """A screen reader user starts a restart and waits on the instance page: the state label
    turned from Updating to Running, but the poll replaced the whole page, live regions with
    it, so none that was there to hear it said so."""
    from deployments.models import Instance, Operation
    from tests.deployments import factories

    restart = factories.make_operation(instance, verb="restart", state="running")
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.UPDATING)
    page = open_page(owner, _path(instance))
    expect(page.locator("#instance-state")).to_have_text("Updating")
    htmx_settled(page)
    page.evaluate(
        """() => document.querySelectorAll('[aria-live], [role=status], [role=alert], [role=log]')
                   .forEach((el) => { el.dataset.wasLive = '1'; })"""
    )

    Operation.objects.filter(pk=restart.pk).update(
        state=Operation.State.SUCCEEDED, finished_at=timezone.now()
    )
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING)
    expect(page.locator("#instance-state")).to_have_text("Running", timeout=6000)
    htmx_settled(page)

    said = page.evaluate(
        """() => Array.from(document.querySelectorAll('[data-was-live]'))
                   .filter((el) => el.isConnected && el.getAttribute('aria-live') !== 'off')
                   .map((el) => el.textContent.trim()).join(' | ')"""
    )
    assert f"Restart succeeded; {instance.name} is Running." in said, said


@pytest.mark.parametrize(
    ("start", "name", "lands"),
    [
        ("backups", "Restore", r"/backups/\d+/restore/"),
        ("list", "New deployment", r"/deployments/new/$"),
        ("catalog", "Create instance of PostgreSQL", r"/deployments/new/postgres-cnpg/"),
    ],
)
def test_a_link_that_says_it_is_a_button_works_with_space(
    open_page, owner, instance, start, name, lands
):
    """Links styled and announced as buttons (`<a role="button">`): a screen reader says
    "button", so its user presses Space, as for every button; the page scrolled, and nothing
    opened."""
    tenant = instance.tenant
    path = {
        "backups": f"/t/{tenant.slug}/deployments/{instance.pk}/?tab=backups",
        "list": f"/t/{tenant.slug}/deployments/",
        "catalog": f"/t/{tenant.slug}/deployments/new/",
    }[start]
    page = open_page(owner, path)
    htmx_settled(page)
    button = page.get_by_role("button", name=name, exact=True).first
    button.focus()

    button.press("Space")

    expect(page).to_have_url(re.compile(lands))


@BOTH_WIDTHS
@pytest.mark.parametrize("menu", ["account-menu", "tenant-switcher"])
def test_escape_closes_a_menu_of_the_top_bar_and_leaves_the_focus_on_it(
    open_page, owner, tenant, menu, width
):
    """The account and organization menus stayed open on Escape, from their summary or from
    within: only a click elsewhere closed them."""
    page = open_page(owner, f"/t/{tenant.slug}/deployments/", width)
    menu = page.locator(f"details.{menu}")
    summary = menu.locator("summary")
    summary.focus()
    summary.press("Enter")
    expect(menu).to_have_attribute("open", "")
    page.keyboard.press("Tab")  # into the menu

    page.keyboard.press("Escape")

    expect(menu).not_to_have_attribute("open", "")
    expect(summary).to_be_focused()


def test_copy_says_copied_to_a_screen_reader(open_page, owner, instance):
    """The Copy button's text turned to "Copied", but its aria-label stays "Copy the instance
    id …", and nothing live said it: a screen reader user never learned it worked."""
    page = open_page(owner, _path(instance))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    htmx_settled(page)
    copy = page.get_by_role("button", name=re.compile("Copy the instance id"))
    copy.focus()
    copy.press("Enter")
    expect(copy).to_have_text("Copied")

    said = page.evaluate(
        """() => Array.from(document.querySelectorAll('[aria-live], [role=status], [role=alert]'))
                   .map((el) => el.textContent.trim()).join(' | ')"""
    )
    assert "Copied" in said, said


@BOTH_WIDTHS
def test_a_tab_chosen_with_the_keyboard_keeps_the_focus_on_the_tabs(
    open_page, owner, instance, width
):
    """Enter on the Backups tab swaps the tab's part with htmx: the link that had the focus is
    replaced, and the focus falls to the page's body (a screen reader starts over at the top)."""
    page = open_page(owner, _path(instance), width)
    htmx_settled(page)
    backups = page.get_by_role("link", name="Backups", exact=True)
    backups.focus()
    backups.press("Enter")
    expect(page).to_have_url(re.compile(r"\?tab=backups$"))
    htmx_settled(page)

    focused = page.evaluate(FOCUSED)
    assert not focused.startswith("body"), focused
    # On the tab now current, or in the panel it shows.
    assert page.evaluate("""() => !!document.activeElement.closest('#instance-tab')"""), focused


@BOTH_WIDTHS
def test_the_step_down_confirmation_takes_the_focus(open_page, owner, tenant, add_member, width):
    """An owner (with another owner beside them) picks Admin for themselves and presses
    Change: the panel swaps in an alertdialog asking to confirm, but the focus is dropped on
    the page's body, not moved into it."""
    add_member("kim@example.com", "owner")
    page = open_page(owner, f"/t/{tenant.slug}/team/", width)
    htmx_settled(page)
    page.get_by_label(f"Role of {owner.email}").select_option("admin")
    change = page.locator(f"tr:has-text('{owner.email}')").get_by_role("button", name="Change")
    change.focus()
    change.press("Enter")

    confirm = page.get_by_role("alertdialog")
    expect(confirm).to_be_visible()
    htmx_settled(page)
    focused = page.evaluate(FOCUSED)
    assert page.evaluate("() => !!document.activeElement.closest('[role=alertdialog]')"), focused


@BOTH_WIDTHS
def test_the_next_page_of_deployments_keeps_the_focus_in_the_list(open_page, owner, tenant, width):
    """Enter on "Older →" swaps the table with htmx: the link is replaced and the focus falls
    to the page's body, so the keyboard user starts again from the top bar."""
    from tests.deployments import factories

    version = factories.postgres_version()
    cell = factories.cell("eu-1", "europe-west-frankfurt")
    factories.make_instances(tenant, version, cell, 30, name="orders")
    page = open_page(owner, f"/t/{tenant.slug}/deployments/", width)
    htmx_settled(page)
    older = page.get_by_role("link", name="Older →")
    older.focus()
    older.press("Enter")
    expect(page).to_have_url(re.compile(r"page=2"))
    htmx_settled(page)

    focused = page.evaluate(FOCUSED)
    assert page.evaluate("() => !!document.activeElement.closest('#deployment-table')"), focused


@BOTH_WIDTHS
def test_changing_a_members_role_keeps_the_focus_on_their_row(
    open_page, owner, tenant, add_member, width
):
    kim = add_member("kim@example.com", "viewer")
    page = open_page(owner, f"/t/{tenant.slug}/team/", width)
    htmx_settled(page)
    role = page.get_by_label(f"Role of {kim.email}")
    role.focus()
    role.select_option("admin")
    page.keyboard.press("Tab")  # to its Change button
    page.keyboard.press("Enter")
    expect(page.locator("#messages")).to_contain_text("kim@example.com")
    htmx_settled(page)

    focused = page.evaluate(FOCUSED)
    assert page.evaluate(
        "(email) => !!document.activeElement.closest('tr')?.textContent.includes(email)", kim.email
    ), focused


def test_a_refused_delete_says_error_in_the_title_and_escape_goes_back_to_its_button(
    open_page, owner, instance
):
    """The dialog came back with its error in a page swapped in whole: the window's title did
    not say anything was wrong, and Escape left the focus on the page's body (a screen reader
    starting over at the top), not on the Delete button it was opened from."""
    page = open_page(owner, _path(instance))
    title = page.title()
    page.get_by_role("button", name="Delete", exact=True).click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label(re.compile("to confirm")).fill("not-its-name")
    dialog.get_by_role("button", name=f"Delete {instance.name}").click()
    expect(page.get_by_role("dialog").locator(".field-error")).to_be_visible()
    htmx_settled(page)

    refused = (page.title(), page.evaluate(FOCUSED))
    page.keyboard.press("Escape")

    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page.get_by_role("button", name="Delete", exact=True)).to_be_focused()
    assert refused[0] == f"Error: {title}", refused
    assert "Nothing was done" in refused[1], refused  # the summary of what to correct
    assert page.title() == title
