"""Upgrade and deletion protection on the instance page, in a real browser at 1280 and 390 px."""

import uuid

import pytest
from playwright.sync_api import expect

from accounts.audit import Actor
from tests.browser.conftest import scrolls_sideways, shot
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS
from tests.deployments.test_instance_upgrade import _v2_text


@pytest.fixture
def instance(tenant, owner):
    """A running instance whose plan has a newer version."""
    from deployments import services
    from deployments.models import Cell, Instance, Operation

    plan = services.plan_load(text=SPEC.read_text()).plan
    Cell.objects.create(name="local", region="local", is_default=True, **BACKUPS)
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan,
        name="orders-production-database-for-the-europe-region", parameters={},
        request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    services.plan_load(text=_v2_text(SPEC.read_text()))
    return Instance.objects.get(pk=create.instance_id)


@pytest.mark.parametrize("width", ["wide", "narrow"])
def test_the_upgrade_dialog_lists_the_changes_and_queues_the_upgrade(
    open_page, owner, instance, width
):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", width)

    page.get_by_role("button", name="Upgrade to v2").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Maximum connections: takes 200")
    shot(page, f"instance-upgrade-{width}")
    assert not scrolls_sideways(page)
    dialog.get_by_role("button", name="Upgrade to v2").click()

    expect(page.locator("#messages")).to_contain_text(f"Upgrade of {instance.name} to v2 is queued")
    assert instance.operations.filter(verb="upgrade").count() == 1


def test_deletion_protection_disables_delete_until_turned_off(open_page, owner, instance):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/")

    page.get_by_role("button", name="Turn on deletion protection").click()

    expect(page.locator("#messages")).to_contain_text("Deletion protection of")
    expect(page.get_by_role("button", name="Delete", exact=True)).to_be_disabled()
    page.get_by_role("button", name="Turn off deletion protection").click()
    expect(page.get_by_role("button", name="Delete", exact=True)).to_be_enabled()
