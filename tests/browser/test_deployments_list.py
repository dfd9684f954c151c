"""The deployments list in a real browser: it fits a phone, searches as you type, and pages."""

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import scrolls_sideways, shot
from tests.deployments import factories


@pytest.fixture
def thirty(tenant):
    """27 running deployments (one with a long name) and 3 stopped, on two services."""
    version = factories.postgres_version()
    cell = factories.cell("eu-1", "europe-west-frankfurt")
    factories.make_instances(tenant, version, cell, 26, name="orders")
    factories.make_instances(tenant, version, cell, 3, state="stopped", name="reports")
    redis = factories.other_service_version()
    factories.make_instances(
        tenant, redis, cell, 1, name="analytics-event-stream-cache-for-the-eu-region"
    )


def rows(page):
    return page.locator("#deployment-table tbody tr")


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_thirty_deployments_never_scroll_the_page_sideways(open_page, owner, tenant, thirty, width):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/", width)
    shot(page, f"deployments-list-{width}")

    expect(rows(page)).to_have_count(25)
    expect(page.get_by_role("button", name="New deployment")).to_be_visible()
    assert not scrolls_sideways(page)
    # Every column is seen without scrolling the table either: a phone stacks each row.
    box = page.locator("#deployment-table .table-scroll")
    assert box.evaluate("el => el.scrollWidth <= el.clientWidth")
    last = rows(page).last
    last.scroll_into_view_if_needed()
    for n in range(6):
        expect(last.locator("td").nth(n)).to_be_in_viewport(ratio=1)
    if width == "narrow":  # with no header row in sight, each value says what it is
        for label in ("Service", "Plan", "Region", "Created"):
            expect(last.locator(".stack-label", has_text=label)).to_be_visible()
    # Each filter's choice is read whole ("Any but deleted", not "Any but delete").
    for select in ("#f-state", "#f-service"):
        assert page.locator(select).evaluate(TEXT_FITS), select


# Whether a select's chosen option fits inside it, beside its arrow (its padding).
TEXT_FITS = """el => {
    const style = getComputedStyle(el);
    const context = document.createElement("canvas").getContext("2d");
    context.font = style.font;
    const room = el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return context.measureText(el.options[el.selectedIndex].text).width <= room;
}"""


def test_typing_in_the_search_narrows_the_list_without_reloading(open_page, owner, tenant, thirty):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/")
    page.evaluate("window.stillTheSamePage = true")

    page.get_by_label("Name or id").press_sequentially("REPORTS", delay=20)

    expect(rows(page)).to_have_count(3)
    expect(page).to_have_url(re.compile(r"q=REPORTS"))
    expect(page.get_by_label("Name or id")).to_be_focused()
    assert page.evaluate("window.stillTheSamePage") is True
    shot(page, "deployments-search-wide")


def test_paging_keeps_the_filters(open_page, owner, tenant, thirty):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/", "narrow")

    page.get_by_label("State").select_option("running")
    expect(page).to_have_url(re.compile(r"state=running"))
    expect(page.locator("#deployment-table")).to_contain_text("Page 1 of 2")
    page.get_by_role("link", name="Older →").click()

    expect(page.locator("#deployment-table")).to_contain_text("Page 2 of 2")
    expect(rows(page)).to_have_count(2)
    expect(rows(page).locator(".badge")).to_have_text(["Running", "Running"])
    expect(page).to_have_url(re.compile(r"state=running.*page=2"))
    expect(page.get_by_label("State")).to_have_value("running")
    assert not scrolls_sideways(page)
    shot(page, "deployments-page-2-narrow")

    page.go_back()
    expect(page.locator("#deployment-table")).to_contain_text("Page 1 of 2")


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_the_dashboard_with_running_and_failed_operations_never_scrolls_sideways(
    open_page, owner, tenant, thirty, width
):
    from datetime import timedelta

    from deployments.models import Instance

    first, second = Instance.objects.filter(tenant=tenant)[:2]
    factories.make_operation(first, verb="backup", state="running")
    error = "Task main.cluster failed: Cluster.postgresql.cnpg.io is invalid: " + "x" * 200
    factories.make_operation(
        second, verb="modify", state="failed", ago=timedelta(hours=3), error=error
    )
    page = open_page(owner, f"/t/{tenant.slug}/", width)
    shot(page, f"dashboard-operations-{width}")

    expect(page.locator("#operations-running")).to_contain_text(first.name)
    expect(page.locator("#operations-failed")).to_contain_text(second.name)
    expect(page.locator("#recent-activity")).to_contain_text(owner.email)
    assert not scrolls_sideways(page)
    # Nor does a table inside its box: a phone reads every column of every row.
    for table in ("#operations-running", "#operations-failed", "#recent-activity"):
        box = page.locator(f".table-scroll:has({table})")
        assert box.evaluate("el => el.scrollWidth <= el.clientWidth"), table
    page.locator("#operations-failed").get_by_role("link", name=second.name).click()
    expect(page.locator("h1")).to_have_text(second.name)


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_a_deployment_being_created_turns_running_in_the_list_without_a_reload(
    open_page, owner, tenant, width
):
    from deployments.models import Instance

    version = factories.postgres_version()
    cell = factories.cell("eu-1", "europe-west-frankfurt")
    factories.make_instances(tenant, version, cell, 2, name="orders")
    (shop,) = factories.make_instances(tenant, version, cell, 1, state="creating", name="shop")
    create = factories.make_operation(shop, verb="create", state="running")
    page = open_page(owner, f"/t/{tenant.slug}/deployments/", width)
    page.evaluate("window.stillTheSamePage = true")
    row = page.locator("#deployment-table tbody tr", has_text="shop-0")
    expect(row.locator(".badge")).to_have_text("Creating")

    create.state = "succeeded"  # as the worker ends it
    create.save(update_fields=["state"])
    Instance.objects.filter(pk=shop.pk).update(state="running")

    expect(row.locator(".badge")).to_have_text("Running", timeout=10_000)
    assert page.evaluate("window.stillTheSamePage") is True
    expect(page.locator("#deployment-table")).not_to_have_attribute("hx-get", re.compile(""))
    assert not scrolls_sideways(page)


def test_a_search_typed_while_the_list_follows_a_creation_stays(open_page, owner, tenant, thirty):
    from deployments.models import Instance

    version = factories.postgres_version()
    cell = factories.cell("us-1", "us-east")
    creating = factories.make_instances(tenant, version, cell, 2, state="creating", name="shop")
    for instance in creating:
        factories.make_operation(instance, verb="create", state="running")
    page = open_page(owner, f"/t/{tenant.slug}/deployments/")

    page.get_by_label("Name or id").press_sequentially("shop", delay=20)
    expect(rows(page)).to_have_count(2)
    Instance.objects.filter(pk=creating[0].pk).update(state="running")

    # The poll asks for the search shown: the row turns Running and the list stays narrowed.
    expect(rows(page).locator(".badge")).to_have_text(["Creating", "Running"], timeout=10_000)
    page.wait_for_timeout(2500)  # a poll more
    expect(rows(page)).to_have_count(2)
    expect(page.get_by_label("Name or id")).to_have_value("shop")


def test_the_dashboard_sees_an_operation_end_without_a_reload(open_page, owner, tenant, thirty):
    from deployments.models import Instance

    first = Instance.objects.filter(tenant=tenant).first()
    operation = factories.make_operation(first, verb="restart", state="running")
    page = open_page(owner, f"/t/{tenant.slug}/", "narrow")
    page.evaluate("window.stillTheSamePage = true")
    expect(page.locator("#operations-running")).to_contain_text(first.name)

    operation.state = "succeeded"  # as the worker ends it
    operation.save(update_fields=["state"])

    expect(page.get_by_text("Nothing is running.")).to_be_visible(timeout=10_000)
    assert page.evaluate("window.stillTheSamePage") is True
    assert not scrolls_sideways(page)


def test_a_search_sent_while_a_poll_is_under_way_is_not_undone_by_its_answer(
    open_page, owner, tenant, thirty
):
    """The poll's answer arriving after the search was sent must not put the whole list back
    over it: sending the search aborts the poll. The order is forced by holding both answers."""
    from contextlib import suppress

    from playwright.sync_api import Error

    from deployments.models import Instance

    version = factories.postgres_version()
    cell = factories.cell("us-1", "us-east")
    (shop,) = factories.make_instances(tenant, version, cell, 1, state="creating", name="shop")
    factories.make_operation(shop, verb="create", state="running")
    page = open_page(owner, f"/t/{tenant.slug}/deployments/")
    held = []

    def hold(route):
        if route.request.headers.get("hx-request"):
            held.append(route)  # answered when the test says so
        else:
            route.continue_()

    page.route(re.compile(r"/deployments/\?"), hold)

    def next_held():
        for _ in range(100):
            if held:
                return held.pop()
            page.wait_for_timeout(50)
        raise AssertionError("no request was sent")

    poll = next_held()
    shop.operations.update(state="succeeded")  # the poll's answer will have news: the whole list
    Instance.objects.filter(pk=shop.pk).update(state="running")
    page.get_by_label("Name or id").fill("reports")
    search = next_held()
    with suppress(Error):  # the page aborted it: nothing to answer
        poll.continue_()
    page.wait_for_timeout(500)
    search.continue_()

    expect(rows(page)).to_have_count(3)
    expect(rows(page)).to_contain_text(["reports-2", "reports-1", "reports-0"])


def test_a_list_following_an_operation_sends_a_signed_out_reader_to_sign_in_and_back(
    open_page, owner, tenant
):
    from django.contrib.sessions.models import Session

    from tests.conftest import PASSWORD

    version = factories.postgres_version()
    cell = factories.cell("eu-1", "europe-west-frankfurt")
    (shop,) = factories.make_instances(tenant, version, cell, 1, state="creating", name="shop")
    factories.make_operation(shop, verb="create", state="running")
    page = open_page(owner, f"/t/{tenant.slug}/deployments/?q=shop")
    expect(rows(page)).to_have_count(1)

    Session.objects.all().delete()  # the session ended (signed out elsewhere, or expired)

    expect(page).to_have_url(re.compile(r"/accounts/login/\?next="), timeout=10_000)
    page.get_by_label("Email").fill(owner.email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name=re.compile("sign in", re.I)).click()
    expect(page).to_have_url(re.compile(rf"/t/{tenant.slug}/deployments/\?q=shop$"))
    expect(rows(page)).to_have_count(1)
