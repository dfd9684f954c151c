"""A running instance's Servers, Metrics, Logs and Events tabs in a real browser, at 1280 and
390 px, with live data from the sandbox cluster and a real worker."""

import pytest
from playwright.sync_api import expect

from accounts.audit import Actor
from deployments import metrics, services
from deployments.models import Operation
from tests.browser.conftest import (  # noqa: F401 - fixtures, found by name
    _served_like_a_browser_expects,
    browser,
    htmx_settled,
    open_page,
    scrolls_sideways,
)
from tests.deployments.conftest import wait_done

pytestmark = pytest.mark.usefixtures("_served_like_a_browser_expects")


def test_each_live_tab_of_a_running_instance_shows_what_its_cluster_reports(
    open_page,  # noqa: F811 - the fixture imported above
    worker,
    cell,
    plan,
    tenant,
    owner,
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="browser-tabs",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    instance_id = create.instance_id
    metrics.samples_take()  # beat's minute sample
    url = f"/t/{tenant.slug}/deployments/{instance_id}/"

    for width in ("wide", "narrow"):
        page = open_page(owner, url, width)
        page.get_by_role("link", name="Servers", exact=True).click()
        servers = page.locator("#instance-servers")
        expect(servers).to_contain_text(f"{instance_id}-1")
        expect(servers).to_contain_text("Primary")
        expect(servers).to_contain_text("Replica")
        assert not scrolls_sideways(page), width

        page.get_by_role("link", name="Metrics", exact=True).click()
        canvas = page.locator("#metrics-cpu canvas")
        expect(canvas).to_be_visible()
        page.wait_for_function(
            "() => !!Chart.getChart(document.querySelector('#metrics-cpu canvas'))"
        )
        assert not scrolls_sideways(page), width

        page.get_by_role("link", name="Logs", exact=True).click()
        expect(page.locator(".log-lines")).to_contain_text(
            "database system is ready to accept connections"
        )
        htmx_settled(page)
        page.get_by_label("Server", exact=True).select_option(f"{instance_id}-2")
        expect(page.locator(".log-status")).to_contain_text(f"{instance_id}-2")
        htmx_settled(page)
        page.get_by_label("Follow").check()
        expect(page.locator(".log-status")).to_contain_text("Following")
        assert not scrolls_sideways(page), width

        page.get_by_role("link", name="Events", exact=True).click()
        expect(page.locator("#instance-events")).to_contain_text("ClusterPrimaryReady")
        assert not scrolls_sideways(page), width
