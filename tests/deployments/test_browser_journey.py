"""A new user's path through the portal in a real browser, against the sandbox cluster and a real
worker: create PostgreSQL through the form, then operate, back up, restore and delete."""

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import (  # noqa: F401 - fixtures, found by name
    _served_like_a_browser_expects,
    browser,
    htmx_settled,
    open_page,
    scrolls_sideways,
    select_cuts_its_text,
)
from tests.conftest import PASSWORD

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
pytestmark = pytest.mark.usefixtures("_served_like_a_browser_expects")


def _step(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"journey-{name}.png"), full_page=True)


def _wait_state(page: Page, label: str, timeout: float = 90) -> None:
    """Until the instance page's header shows `label`, without reloading: while an operation
    is pending the header follows it, and the page refreshes when it ends. When it does not,
    what the page says of a failed operation is the test's failure."""
    try:
        expect(page.locator("#instance-state")).to_have_text(label, timeout=timeout * 1000)
    except AssertionError as exc:
        failed = page.locator("#instance-failed")
        said = failed.inner_text() if failed.count() else "the page names no failed operation"
        _step(page, f"not-{label.lower()}")
        raise AssertionError(f"{page.url} is not {label}: {said}") from exc


def _press(page: Page, label: str) -> None:
    page.locator("#instance-actions").get_by_role("button", name=label, exact=True).click()


def test_a_new_user_creates_operates_restores_and_deletes_postgresql(
    open_page,  # noqa: F811 - the fixture imported above
    worker,
    cell,
    plan,
    tenant,
    owner,
):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/")
    page.get_by_role("button", name="New deployment").click()
    page.get_by_text("Create instance").first.click()
    estimate = page.locator(".estimate")
    before = estimate.inner_text()
    page.get_by_label("Servers").fill("3")
    expect(estimate).not_to_have_text(before)  # the price follows what is typed
    page.get_by_label("Servers").fill("1")
    page.get_by_label("Instance name").fill("shop")
    _step(page, "01-create-form")
    page.get_by_role("button", name="Create instance").click()

    expect(page.locator("h1")).to_have_text("shop")
    _wait_state(page, "Running")
    _step(page, "02-running")
    instance_url = page.url.split("?")[0]

    page.goto(instance_url + "?tab=connection")
    page.get_by_role("button", name="Reveal password").click()
    page.get_by_label("Password").fill(PASSWORD)  # recent sign-in asked for again
    page.get_by_label("Password").press("Enter")
    expect(page.locator("#connection-password")).to_have_text(re.compile(r"\S{12,}"))
    _step(page, "02-revealed")

    page.goto(instance_url)
    _press(page, "Modify")
    page.locator("#dialog-modify").get_by_label("Servers").fill("3")
    page.locator("#dialog-modify").get_by_role(
        "button", name=re.compile("Modify|Apply|Save")
    ).last.click()
    expect(page.locator("#messages")).to_contain_text("Modification of shop")
    page.goto(instance_url)
    _wait_state(page, "Running")
    expect(page.locator("tr", has_text="Servers")).to_contain_text("3")
    _step(page, "02-scaled")

    page.goto(instance_url + "?tab=logs")
    expect(page.locator("#log-server")).to_contain_text("(primary)")
    _step(page, "02-logs")
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "tab=logs" in r.url else None)
    page.get_by_label("Containing").fill("listening")
    page.get_by_label("Containing").press("Enter")
    expect(page.locator(".log-lines")).to_contain_text("listening")
    htmx_settled(page)
    assert len(sent) == 1, sent  # Enter sends the filter once (not a change, then a submit)
    page.locator("#log-tail").select_option(index=1)
    expect(page).to_have_url(re.compile(r"tail=(?!100\b)\d+"))  # a select shows at once
    assert len(sent) == 2, sent
    assert not select_cuts_its_text(page, "#log-server")  # "inst-…-1 (primary)" whole
    phone = open_page(owner, urlsplit(instance_url).path + "?tab=logs", "narrow")
    expect(phone.locator("#log-server")).to_contain_text("(primary)")
    _step(phone, "02-logs-narrow")
    assert not select_cuts_its_text(phone, "#log-server") and not scrolls_sideways(phone)

    page.get_by_role("link", name="Backups").click()
    # The tab's own button (the header has one too, once the tab has loaded beside it).
    page.get_by_role("region", name="Backups").get_by_role("button", name="Back up now").click()
    # The tab on screen refreshes when the backup ends.
    completed = page.locator("#instance-backups .badge-snapshot-completed")
    expect(completed).to_have_count(1, timeout=60_000)
    _step(page, "03-backup")
    page.locator("#instance-backups").get_by_role("button", name="Restore").click()
    page.get_by_label("Instance name").fill("shop-copy")
    page.get_by_role("button", name="Restore into a new instance").click()
    expect(page.locator("#messages")).to_contain_text("shop-copy")
    source_url = instance_url

    page.locator("#messages").get_by_role("link", name="queued").click()
    _wait_state(page, "Running")
    _step(page, "04-restored")
    copy_url = page.url

    page.goto(source_url.split("?")[0])
    _press(page, "Reload configuration")
    expect(page.locator("#messages")).to_contain_text("Reload configuration")
    _press(page, "Stop")
    page.locator("#confirm-dialog").get_by_role("button", name="Stop", exact=True).click()
    _wait_state(page, "Stopped")
    _press(page, "Start")
    _wait_state(page, "Running")
    _step(page, "05-started-again")

    for url, name in ((source_url, "shop"), (copy_url, "shop-copy")):
        page.goto(url.split("?")[0])
        _press(page, "Delete")
        page.get_by_label(re.compile("to confirm")).fill(name)
        page.get_by_role("button", name=f"Delete {name}").click()
        _wait_state(page, "Deleted")
    _step(page, "06-deleted")
