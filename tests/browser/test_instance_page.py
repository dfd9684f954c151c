"""The instance page in a real browser, at a desktop width (1280 px) and a phone's (390 px)."""

import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.audit import Actor
from tests.browser.conftest import scrolls_sideways, shot

ROOT = Path(__file__).resolve().parents[2]
BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])


@pytest.fixture
def instance(tenant, owner):
    """A running instance with a long name, a finished create with task runs, a backup and a
    backup that failed."""
    from deployments import services
    from deployments.models import Cell, Instance, Operation, Snapshot, TaskRun

    plan = services.plan_load(text=(ROOT / "specs" / "postgres-cnpg.yaml").read_text()).plan
    Cell.objects.create(name="local", region="local", is_default=True)
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan,
        name="orders-production-database-for-the-europe-region", parameters={},
        request_id=uuid.uuid4().hex,
    )  # fmt: skip
    now = timezone.now()
    Operation.objects.filter(pk=create.pk).update(
        state=Operation.State.FAILED, started_at=now - timedelta(minutes=3), finished_at=now,
        error="Cluster inst-x is invalid: spec.storage.size: Invalid value: "
        "a-very-long-unbroken-value-that-could-widen-the-page-0123456789abcdef",
    )  # fmt: skip
    TaskRun.objects.create(
        operation=create, node="main.cluster-with-a-long-task-name", state="Failed",
        message="admission webhook denied the request: " + "x" * 80, started_at=now,
    )  # fmt: skip
    instance = create.instance
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING)
    Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-20261130080000",
        status=Snapshot.Status.COMPLETED,
    )  # fmt: skip
    Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-20261130090000",
        status=Snapshot.Status.FAILED,
    )  # fmt: skip
    instance.refresh_from_db()
    return instance


@BOTH_WIDTHS
@pytest.mark.parametrize("tab", ["overview", "operations", "backups", "activity"])
def test_the_instance_page_never_scrolls_sideways(open_page, owner, instance, width, tab):
    page = open_page(
        owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab={tab}", width
    )
    if tab == "operations":
        page.locator("#instance-operations summary").first.click()
    shot(page, f"instance-{tab}-{width}")

    expect(page.locator("h1")).to_have_text(instance.name)
    assert not scrolls_sideways(page)


@pytest.mark.parametrize("away", ["tab", "page"])
def test_back_to_an_instance_that_changed_meanwhile_shows_it_as_it_is_now(
    open_page, owner, instance, away
):
    from deployments.models import Instance

    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/")
    expect(page.locator("#instance-state")).to_have_text("Running")
    if away == "tab":  # htmx swaps the tab in and pushes its address
        page.get_by_role("link", name="Backups").click()
        expect(page).to_have_url(re.compile(r"\?tab=backups$"))
    else:
        page.goto(page.url.split("/t/")[0] + f"/t/{instance.tenant.slug}/deployments/")
    # A delete queued from another tab (or this one) meanwhile: Back must not show it running.
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETING)

    page.go_back()

    expect(page.locator("#instance-state")).to_have_text("Deleting")


def test_tabs_switch_and_the_address_follows(open_page, owner, instance):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/")

    page.get_by_role("link", name="Backups").click()
    expect(page).to_have_url(re.compile(r"\?tab=backups$"))
    expect(page.locator("#instance-backups")).to_contain_text(f"{instance.pk}-20261130080000")

    page.get_by_role("link", name="Operations").click()
    expect(page).to_have_url(re.compile(r"\?tab=operations$"))
    expect(page.get_by_role("link", name="Operations")).to_have_attribute("aria-current", "page")
    expect(page.locator("#instance-operations")).to_contain_text("What went wrong")

    page.go_back()
    expect(page).to_have_url(re.compile(r"\?tab=backups$"))
    expect(page.locator("#instance-backups")).to_be_visible()


def test_a_tab_and_an_action_that_shows_another_tab_title_the_window_with_it(
    open_page, owner, instance
):
    """Each tab has an address of its own, and a title of its own where history, bookmarks and
    a screen reader's window list name it: htmx sets it from the part it swaps in."""
    name = instance.name
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/")
    expect(page).to_have_title(f"{name} · Opsdeck")

    page.get_by_role("link", name="Backups").click()
    expect(page).to_have_url(re.compile(r"\?tab=backups$"))
    expect(page).to_have_title(f"Backups · {name} · Opsdeck")

    page.get_by_role("link", name="Overview").click()
    page.get_by_role("button", name="Stop", exact=True).click()
    page.locator("#confirm-dialog").get_by_role("button", name="Stop", exact=True).click()
    expect(page).to_have_url(re.compile(r"\?tab=operations$"))
    expect(page).to_have_title(f"Operations · {name} · Opsdeck")

    page.go_back()
    expect(page).to_have_title(f"{name} · Opsdeck")


@BOTH_WIDTHS
def test_the_delete_dialog_refuses_a_wrong_name(open_page, owner, instance, width):
    from deployments.models import Operation

    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", width)

    page.get_by_role("button", name="Delete", exact=True).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Its 1 backup stays")
    dialog.get_by_label(re.compile("to confirm")).fill("orders")
    dialog.get_by_role("button", name=f"Delete {instance.name}").click()

    dialog = page.get_by_role("dialog")
    expect(dialog.locator(".field-error")).to_have_text(
        f"Type the instance's name, {instance.name}, to delete it."
    )
    shot(page, f"instance-delete-refused-{width}")
    assert not scrolls_sideways(page)
    assert not Operation.objects.filter(verb="delete").exists()

    dialog.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("dialog")).to_have_count(0)


def test_the_copy_button_copies_the_id(open_page, owner, instance):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])

    page.get_by_role("button", name=re.compile("Copy the instance id")).click()

    expect(page.get_by_role("button", name=re.compile("Copy the instance id"))).to_have_text(
        "Copied"
    )
    assert page.evaluate("navigator.clipboard.readText()") == instance.pk


def test_the_timeline_follows_a_pending_operation_and_keeps_what_the_reader_folded(
    open_page, owner, instance
):
    from deployments import services
    from deployments.models import Instance, Operation

    restart = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="restart", request_id="b-restart"
    )
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=operations")
    item = page.locator(f"#operation-{restart.pk}")
    expect(item.locator("details")).to_have_attribute("open", "")
    item.locator("summary").click()  # the reader folds it
    expect(item.locator(".badge")).to_have_text("Queued")

    Operation.objects.filter(pk=restart.pk).update(state=Operation.State.RUNNING)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.UPDATING)
    expect(item.locator(".badge")).to_have_text("Running", timeout=5000)
    expect(page.locator("#instance-state")).to_have_text("Updating")
    expect(item.locator("details")).not_to_have_attribute("open", "")

    Operation.objects.filter(pk=restart.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING)
    expect(item.locator(".badge")).to_have_text("Succeeded", timeout=5000)
    expect(page.locator("#instance-state")).to_have_text("Running")
    expect(page.locator("#instance-operations")).not_to_have_attribute(
        "hx-trigger", re.compile(".")
    )


@BOTH_WIDTHS
def test_a_custom_action_shows_the_services_error_in_its_dialog_then_queues(
    open_page, owner, instance, width
):
    from deployments.models import Operation

    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", width)
    page.get_by_role("button", name="Rotate owner password").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_label("New password").fill("short")
    dialog.get_by_role("button", name="Rotate owner password").click()

    dialog = page.get_by_role("dialog")
    expect(dialog.locator(".field-error")).to_have_text(
        "Must be between 12 and 100 characters long."
    )
    expect(dialog.get_by_label("New password")).to_have_value("")  # never sent back
    shot(page, f"instance-custom-error-{width}")
    assert not scrolls_sideways(page)

    dialog.get_by_label("New password").fill("a-long-enough-password")
    dialog.get_by_role("button", name="Rotate owner password").click()

    expect(page.locator("#messages")).to_contain_text("Rotate owner password of")
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page).to_have_url(re.compile(r"\?tab=operations$"))
    expect(page.locator("#instance-operations")).to_contain_text("Queued")
    assert Operation.objects.filter(verb="rotateCredentials").count() == 1


def test_stop_queues_from_the_header_and_the_message_links_to_the_operation(
    open_page, owner, instance
):
    from deployments.models import Operation

    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/")
    page.evaluate("document.getElementById('messages').dataset.kept = 'yes'")

    page.get_by_role("button", name="Stop", exact=True).click()
    page.locator("#confirm-dialog").get_by_role("button", name="Stop", exact=True).click()

    expect(page.locator("#messages")).to_contain_text(f"Stop of {instance.name} is queued.")
    # Said in the live region the page kept (a region swapped in whole is not read).
    expect(page.locator("#messages")).to_have_attribute("data-kept", "yes")
    expect(page.locator("#messages")).to_have_attribute("aria-live", "polite")
    stop = Operation.objects.get(verb="stop")
    page.locator("#messages").get_by_role("link", name="queued").click()
    expect(page).to_have_url(re.compile(rf"operation={stop.pk}#operation-{stop.pk}$"))
    expect(page.locator(f"#operation-{stop.pk} details")).to_have_attribute("open", "")


def test_the_backup_schedule_is_changed_from_the_backups_tab(open_page, owner, instance):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=backups")
    page.get_by_text("Change the schedule").click()
    page.get_by_label("At the times of a cron expression").check()
    page.get_by_label("Cron expression (UTC)").fill("0 25 * * *")
    page.get_by_role("button", name="Save schedule").click()

    expect(page.locator("#schedule-cron-error")).to_contain_text('The hour field "25" is not valid')
    shot(page, "backup-schedule-error")
    page.get_by_label("Cron expression (UTC)").fill("0 3 * * *")
    page.get_by_role("button", name="Save schedule").click()

    expect(page.locator("#backup-schedule-status")).to_contain_text("at 0 3 * * * (UTC)")
    expect(page.get_by_text("The backup schedule of")).to_be_visible()
    shot(page, "backup-schedule-saved")


@BOTH_WIDTHS
def test_a_schedule_saved_in_a_tab_opened_before_a_teammates_save_says_so_and_keeps_theirs(
    open_page, owner, instance, width
):
    path = f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=backups"
    theirs, mine = open_page(owner, path, width), open_page(owner, path, width)
    theirs.get_by_text("Change the schedule").click()
    theirs.get_by_label("Keep backups for").fill("7")
    theirs.get_by_role("button", name="Save schedule").click()
    expect(theirs.locator("#backup-schedule-status")).to_contain_text("Backups are kept 7 days")

    mine.get_by_text("Change the schedule").click()
    mine.get_by_label("Hours between backups").fill("12")
    mine.get_by_role("button", name="Save schedule").click()

    expect(mine.locator("#backup-schedule-form")).to_contain_text(
        "Someone changed this schedule after you opened the page"
    )
    expect(mine.locator("#backup-schedule-status")).to_contain_text("Backups are kept 7 days")
    # The form holds their schedule with this change: saving again keeps both.
    expect(mine.get_by_label("Hours between backups")).to_have_value("12")
    expect(mine.get_by_label("Keep backups for")).to_have_value("7")
    assert not scrolls_sideways(mine)
    shot(mine, f"backup-schedule-changed-meanwhile-{width}")
    mine.get_by_role("button", name="Save schedule").click()
    expect(mine.locator("#backup-schedule-status")).to_contain_text("every 12 hours")
    expect(mine.locator("#backup-schedule-status")).to_contain_text("Backups are kept 7 days")


@BOTH_WIDTHS
def test_the_restore_form_opens_from_the_backups_tab_and_never_scrolls_sideways(
    open_page, owner, instance, width
):
    from deployments.models import Instance

    # Named as many teams name things: "Back to <name>" in the page header, one word a
    # browser could not break, scrolled the page sideways on a phone.
    Instance.objects.filter(pk=instance.pk).update(
        name="orders_production_database_for_the_europe_region"
    )
    instance.refresh_from_db()
    page = open_page(
        owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=backups", width
    )
    completed = page.locator("#instance-backups tbody tr", has_text="Completed")
    restore, delete = (
        completed.get_by_role("button", name=name).bounding_box()
        for name in ("Restore", "Delete backup")
    )
    assert abs(restore["height"] - delete["height"]) < 1  # a row's buttons stand alike
    assert abs(restore["y"] - delete["y"]) < 1
    page.locator("#instance-backups").get_by_role("button", name="Restore").click()

    expect(page.get_by_role("heading", name="Restore a backup")).to_be_visible()
    expect(page.get_by_label("Instance name")).to_have_value(f"{instance.name}-restored")
    expect(page.get_by_label("Database", exact=True)).to_have_attribute("readonly", "")
    expect(page.get_by_label("Point in time (UTC)")).to_have_attribute("type", "datetime-local")
    assert re.search(r"\?request=[0-9a-f]{32}$", page.url)
    # Priced as the backup was taken (one server), then as typed.
    expect(page.locator("#estimate-hour")).to_have_text("0.0464")
    shot(page, f"restore-form-{width}")
    assert not scrolls_sideways(page)
    page.get_by_label("Servers").fill("3")
    expect(page.locator("#estimate-hour")).to_have_text("0.1392")


def test_generate_fills_a_custom_actions_password(open_page, owner, instance):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", "narrow")
    page.get_by_role("button", name="Rotate owner password").click()
    dialog = page.get_by_role("dialog")

    dialog.get_by_role("button", name="Generate").click()

    expect(dialog.get_by_label("New password")).to_have_value(re.compile(r"^[A-Za-z2-9]{24}$"))
    assert not scrolls_sideways(page)


def test_a_name_of_one_long_word_wraps_inside_the_delete_button(open_page, owner, instance):
    from deployments.models import Instance

    Instance.objects.filter(pk=instance.pk).update(name="n" * 100)
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", "narrow")

    page.get_by_role("button", name="Delete", exact=True).click()
    button = page.get_by_role("dialog").get_by_role("button", name=f"Delete {'n' * 100}")

    expect(button).to_be_visible()
    shot(page, "instance-delete-long-name-narrow")
    # Its whole text shows: the button stays within its dialog, which cuts off what overflows.
    inside = """b => {
        const r = b.getBoundingClientRect(), d = b.closest("article").getBoundingClientRect();
        return r.left >= d.left && r.right <= d.right && b.scrollWidth <= b.clientWidth;
    }"""
    assert button.evaluate(inside)
    assert not scrolls_sideways(page)


@BOTH_WIDTHS
def test_the_backups_tab_shows_a_backup_complete_without_a_reload(
    open_page, owner, instance, width
):
    from deployments.models import Operation, Snapshot

    page = open_page(
        owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=backups", width
    )
    back_up = page.get_by_role("region", name="Backups").get_by_role("button", name="Back up now")
    back_up.click()
    row = page.locator("#instance-backups tbody tr").first
    expect(row.locator(".badge")).to_have_text("Pending")
    expect(back_up).to_be_disabled()
    loaded = page.evaluate("performance.timeOrigin")

    # The worker took it, and the operator finished it.
    Operation.objects.filter(instance=instance, verb="backup").update(
        state=Operation.State.SUCCEEDED, finished_at=timezone.now()
    )
    Snapshot.objects.filter(instance=instance, status=Snapshot.Status.PENDING).update(
        status=Snapshot.Status.COMPLETED
    )

    expect(row.locator(".badge")).to_have_text("Completed", timeout=10_000)
    expect(back_up).to_be_enabled()
    assert page.evaluate("performance.timeOrigin") == loaded  # the same page, not a reload
    assert not scrolls_sideways(page)


def test_a_long_task_message_leaves_the_cells_beside_it_whole(open_page, owner, instance):
    """A task waiting on what the cluster refuses says its last warning, a few hundred
    characters: beside it, its state read "Runni-ng", broken over two lines at 1280 px."""
    from deployments.models import TaskRun

    TaskRun.objects.filter(operation__instance=instance).update(
        state="Running",
        message=f'Waiting on StatefulSet "{instance.pk}". Its last warning: "FailedCreate: '
        f"create Pod {instance.pk}-2 in StatefulSet {instance.pk} failed error: failed to "
        f'create PVC data-{instance.pk}-2: persistentvolumeclaims "data-{instance.pk}-2" is '
        "forbidden: exceeded quota: opsdeck-quota, requested: requests.storage=2Gi, used: "
        'requests.storage=4Gi, limited: requests.storage=5Gi".',
    )
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=operations")
    page.locator("#instance-operations summary").first.click()
    state = page.locator(".task-runs tbody td").nth(2)
    expect(state).to_have_text("Running")

    lines = state.evaluate(
        "td => { const r = document.createRange(); r.selectNodeContents(td);"
        " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }"
    )
    assert lines == 1
    assert not scrolls_sideways(page)


def test_details_of_one_long_word_break_inside_the_activity_table(open_page, owner, instance):
    from accounts.audit import audit_record

    audit_record(
        actor=Actor(user=owner), action="instance.rename", tenant=instance.tenant,
        target=instance, payload={"name": "W" * 100},
    )  # fmt: skip
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=activity")

    table = page.locator("#instance-activity")
    expect(table).to_contain_text("W" * 100)
    shot(page, "instance-activity-long-word")
    # Every column shows within the table's box: none is pushed out of it.
    assert table.evaluate("t => t.scrollWidth <= t.parentElement.clientWidth")


@BOTH_WIDTHS
def test_cancelling_an_operation_asks_in_a_dialog_whose_buttons_say_what_each_does(
    open_page, owner, instance, width
):
    from tests.deployments import factories

    restart = factories.make_operation(instance, verb="restart", state="running")
    page = open_page(
        owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=operations", width
    )
    dialog = page.locator("#confirm-dialog")

    page.get_by_role("button", name="Cancel this restart").click()

    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(
        "Cancel this restart? It stops at its next step. If the cluster has already begun it, "
        "the cluster still finishes it."
    )
    expect(dialog.get_by_role("button", name="Keep it")).to_be_focused()  # the safe answer
    shot(page, f"instance-cancel-confirm-{width}")
    assert not scrolls_sideways(page)
    dialog.get_by_role("button", name="Keep it").click()
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Cancel this restart").click()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    restart.refresh_from_db()
    assert restart.cancel_reason == ""  # neither answer sent anything

    page.get_by_role("button", name="Cancel this restart").click()
    page.wait_for_timeout(2500)  # the timeline's poll leaves the form asked about in place
    dialog.get_by_role("button", name="Cancel the restart").click()

    expect(page.locator(".operation-stopping")).to_contain_text("Stopping at its next step")
    restart.refresh_from_db()
    assert restart.cancel_reason == f"Cancelled by {owner.email}."


def test_a_poll_answered_while_the_cancel_dialog_asks_leaves_its_form_to_the_answer(
    open_page, owner, instance
):
    from tests.deployments import factories

    restart = factories.make_operation(instance, verb="restart", state="running")
    path = f"/t/{instance.tenant.slug}/deployments/{instance.pk}/"
    page = open_page(owner, f"{path}?tab=operations")
    held = []
    # The timeline's next poll is held on its way, to answer while the dialog asks.
    polls = re.compile(re.escape(path) + r"\?tab=operations&shown=\w+$")
    page.route(polls, lambda route: held.append(route))
    while not held:
        page.wait_for_timeout(100)

    page.get_by_role("button", name="Cancel this restart").click()
    held[0].continue_()
    page.wait_for_timeout(1000)
    page.locator("#confirm-dialog").get_by_role("button", name="Cancel the restart").click()

    expect(page.locator(".operation-stopping")).to_contain_text("Stopping at its next step")
    restart.refresh_from_db()
    assert restart.cancel_reason == f"Cancelled by {owner.email}."


@BOTH_WIDTHS
def test_stop_asks_first_and_a_stray_click_stops_nothing(open_page, owner, instance, width):
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", width)
    dialog = page.locator("#confirm-dialog")

    page.locator("#instance-actions").get_by_role("button", name="Stop", exact=True).click()

    expect(dialog).to_contain_text("Stop this instance? Its servers shut down")
    shot(page, f"instance-stop-confirm-{width}")
    assert not scrolls_sideways(page)
    dialog.get_by_role("button", name="Keep it running").click()
    expect(dialog).to_be_hidden()
    assert not instance.operations.filter(verb="stop").exists()

    page.locator("#instance-actions").get_by_role("button", name="Stop", exact=True).click()
    dialog.get_by_role("button", name="Stop", exact=True).click()

    expect(page.locator("#messages")).to_contain_text("queued")
    assert instance.operations.filter(verb="stop").count() == 1


@BOTH_WIDTHS
def test_older_operations_and_activity_are_a_click_away_and_never_scroll_sideways(
    open_page, owner, instance, width
):
    from accounts.audit import audit_record
    from deployments.models import Operation

    now = timezone.now()
    for n in range(60):  # with the create, 61: two pages of 50
        Operation.objects.create(
            instance=instance, verb="restart", request_id=f"restart-{n}",
            plan_version=instance.plan_version, state=Operation.State.SUCCEEDED,
            created_at=now - timedelta(days=61 - n), started_at=now, finished_at=now,
        )  # fmt: skip
    for n in range(100):  # with the create's, two pages of 100
        audit_record(
            actor=Actor(user=owner), action="instance.restart", tenant=instance.tenant,
            target=instance, payload={"n": n},
        )  # fmt: skip
    page = open_page(
        owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=operations", width
    )
    expect(page.get_by_text("Page 1 of 2 · 61 operations")).to_be_visible()

    page.get_by_role("link", name="Older →").click()

    expect(page).to_have_url(re.compile(r"\?tab=operations&page=2$"))
    expect(page.get_by_text("Page 2 of 2 · 61 operations")).to_be_visible()
    expect(page.locator("#instance-operations .timeline-item")).to_have_count(11)
    assert not scrolls_sideways(page)
    page.get_by_role("link", name="← Newer").click()
    expect(page.locator("#instance-operations .timeline-item")).to_have_count(50)

    page.get_by_role("link", name="Activity").click()
    expect(page.get_by_text(re.compile(r"Page 1 of 2 · 10\d events"))).to_be_visible()
    page.get_by_role("link", name="Older →").click()
    expect(page).to_have_url(re.compile(r"\?tab=activity&page=2$"))
    expect(page.get_by_text(re.compile(r"Page 2 of 2 · 10\d events"))).to_be_visible()
    shot(page, f"instance-activity-page-2-{width}")
    assert not scrolls_sideways(page)
