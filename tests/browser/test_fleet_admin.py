"""Fleet actions in the admin, in a real browser at a desktop's width and a phone's."""

import pytest
from playwright.sync_api import expect

from deployments.fleet import fleet_run_advance
from deployments.models import FleetRun, Operation
from tests.browser.conftest import scrolls_sideways, shot
from tests.deployments.factories import cell, make_instances, postgres_version


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_staff_select_instances_confirm_a_restart_and_read_what_was_queued(
    open_page, make_user, tenant, width
):
    staff = make_user("staff@example.com", is_staff=True, is_superuser=True)
    instances = make_instances(tenant, postgres_version(), cell("eu-central-with-a-long-name"),
                               3, name="orders-database-for-the-reporting-team")  # fmt: skip
    page = open_page(staff, "/admin/deployments/instance/", width)

    page.locator("#action-toggle").check()  # every instance listed
    page.select_option("select[name=action]", "restart")
    page.get_by_role("button", name="Go").click()

    expect(page.get_by_role("heading", name="Restart the selected instances")).to_be_visible()
    shot(page, f"fleet-confirm-{width}")
    assert not scrolls_sideways(page)
    assert not Operation.objects.exists()  # nothing until confirmed

    page.get_by_role("button", name="Restart the selected instances: 3").click()

    expect(page.locator("ul.messagelist")).to_contain_text("The restart of 3 instances is being")
    run = FleetRun.objects.get()
    while fleet_run_advance(run.pk):  # as a worker queues it
        pass
    page.reload()
    expect(page.locator(".field-progress")).to_contain_text("3 of 3")
    assert not scrolls_sideways(page)
    assert Operation.objects.filter(verb="restart").count() == len(instances)
