"""The instance page's Upgrade, Roll back and Deletion protection controls: who sees them,
when, and what a forged request gets."""

import csv
import io
import re
import uuid

import pytest

from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import services, transitions
from deployments.models import Cell, Instance, Operation
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS
from tests.deployments.test_instance_upgrade import _v2_text

UPGRADE = 'data-dialog="dialog-upgrade"'
ROLLBACK = 'data-dialog="dialog-rollback"'
PROTECT = "deletion protection</button>"


@pytest.fixture
def local_cell(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)


def _running(owner, tenant, name="orders"):
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=create.instance_id)


@pytest.fixture
def instance(owner, tenant, local_cell):
    return _running(owner, tenant)


@pytest.fixture
def v2(instance):
    return services.plan_load(text=_v2_text(SPEC.read_text())).version


def _url(instance, suffix=""):
    return f"/t/{instance.tenant.slug}/deployments/{instance.pk}/{suffix}"


def _page(client, instance) -> str:
    return client.get(_url(instance)).content.decode()


def _fail(instance, verb):
    op = Operation.objects.create(
        instance=instance, verb=verb, request_id=uuid.uuid4().hex,
        plan_version=instance.plan_version, state=Operation.State.FAILED, error="refused",
    )  # fmt: skip
    transitions.instance_state_set(instance, Instance.State.FAILED, operation=op, reason="refused")


@pytest.mark.parametrize(
    ("role", "upgrade", "protect"),
    [("owner", True, True), ("admin", True, True), ("member", True, False),
     ("viewer", False, False), ("billing", False, False)],
)  # fmt: skip
def test_each_role_sees_the_controls_it_may_use(
    client, instance, v2, owner, add_member, role, upgrade, protect
):
    user = owner if role == "owner" else add_member(f"{role}@example.com", role)
    client.force_login(user)

    html = _page(client, instance)

    assert (UPGRADE in html) is upgrade
    assert (PROTECT in html) is protect


def test_the_upgrade_dialog_says_what_changes(owner_client, instance, v2):
    html = _page(owner_client, instance)

    assert "Upgrade orders to version 2?" in html
    assert "Maximum connections: takes 200" in html


def test_no_upgrade_is_offered_without_a_newer_version(owner_client, instance):
    assert UPGRADE not in _page(owner_client, instance)


def test_an_upgrade_the_state_forbids_is_shown_disabled_with_the_reason(owner_client, instance, v2):
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)

    html = _page(owner_client, instance)

    assert f'{UPGRADE} disabled aria-describedby="why-upgrade"' in html
    assert "upgrade needs it to be running" in html
    assert 'id="dialog-upgrade"' not in html


def test_an_upgrade_to_a_version_for_other_cells_is_shown_disabled_with_the_reason(
    owner_client, instance
):
    text = _v2_text(SPEC.read_text())
    services.plan_load(
        text=text.replace("  entitlements:\n", "  entitlements:\n    cells: [us-1]\n")
    )

    html = _page(owner_client, instance)

    assert f'{UPGRADE} disabled aria-describedby="why-upgrade"' in html
    assert "does not run in the local cell, where orders runs; it runs in: us-1." in html
    assert 'id="dialog-upgrade"' not in html


def test_roll_back_appears_only_after_a_failed_modify_or_upgrade(owner_client, instance):
    assert ROLLBACK not in _page(owner_client, instance)
    _fail(instance, "restart")
    assert ROLLBACK not in _page(owner_client, instance)
    transitions.instance_state_set(instance, Instance.State.RUNNING)  # e.g. a retry repaired it
    _fail(instance, "modify")
    assert ROLLBACK in _page(owner_client, instance)


def test_the_roll_back_dialog_says_whether_the_change_failed_or_was_cancelled(
    owner_client, instance
):
    _fail(instance, "modify")
    assert "failed. Rolling back applies again" in _page(owner_client, instance)

    Operation.objects.filter(verb="modify").update(state=Operation.State.CANCELLED)

    page = _page(owner_client, instance)
    assert ROLLBACK in page
    assert "was cancelled after it had changed the cluster. Rolling back applies again" in page


def test_the_roll_back_dialog_names_what_a_failed_change_grew_and_keeps(owner_client, instance):
    _fail(instance, "modify")
    plain = _page(owner_client, instance)
    stored = instance.parameters["storageGi"]
    Operation.objects.filter(verb="modify").update(
        parameters={**instance.parameters, "storageGi": stored + 40, "instances": 4}
    )

    grown = _page(owner_client, instance)

    assert "as the Overview lists them." in plain and 'id="rollback-keeps"' not in plain
    assert "except what can grow but not shrink, which stays as the change grew it:" in grown
    keeps = re.search(r'<ul id="rollback-keeps">(.*?)</ul>', grown).group(1)
    assert keeps == f"<li>Storage per server (GiB): {stored + 40}</li>"  # not the servers


def test_the_parameters_of_an_instance_a_change_left_failed_say_they_ran_before_it(
    owner_client, instance
):
    assert 'id="parameters-left"' not in _page(owner_client, instance)
    _fail(instance, "modify")
    failed = _page(owner_client, instance)
    Operation.objects.filter(verb="modify").update(state=Operation.State.CANCELLED)
    cancelled = _page(owner_client, instance)

    assert "These are the values orders ran before the modify of" in failed
    assert "which failed. Its servers may run some of that change" in failed
    assert "which was cancelled after it had changed the cluster." in cancelled


def test_the_parameters_of_a_failed_instance_being_deleted_promise_no_roll_back(
    owner_client, instance
):
    _fail(instance, "modify")
    services.instance_delete(actor=Actor(user=instance.created_by), instance=instance,
                             request_id=uuid.uuid4().hex)  # fmt: skip

    page = _page(owner_client, instance)

    assert "which failed. Its deletion is queued: its servers are deleted as they are." in page
    assert "until a roll back applies these values again" not in page
    assert "Roll back: orders is queued for deletion." in page


def test_an_upgrade_posted_from_the_page_is_queued_on_the_new_version(owner_client, instance, v2):
    response = owner_client.post(_url(instance, "upgrade/"), {"request_id": "up-1"})

    assert response.status_code == 302
    upgrade = instance.operations.get(verb="upgrade")
    assert upgrade.plan_version == v2
    page = owner_client.get(response["Location"]).content.decode()
    assert "Upgrade of orders to v2" in page


def test_an_upgrade_confirmed_before_a_newer_version_was_published_is_shown_that_version(
    owner_client, instance, v2
):
    dialog = _page(owner_client, instance)
    seen = re.search(r'name="version" value="(\d+)"', dialog).group(1)
    text = _v2_text(SPEC.read_text()).replace("description: Major version.", "description: v3.")
    services.plan_load(text=text)  # version 3, published while the dialog was open

    response = owner_client.post(
        _url(instance, "upgrade/"), {"request_id": "up-1", "version": seen}
    )

    assert seen == "2" and response.status_code == 400
    html = response.content.decode()
    assert "Version 3 was published after this was opened" in html
    assert "Upgrade orders to version 3?" in html  # the dialog again, with what 3 changes
    assert not instance.operations.filter(verb="upgrade").exists()
    again = re.search(r'name="version" value="(\d+)"', html).group(1)
    confirmed = owner_client.post(
        _url(instance, "upgrade/"), {"request_id": "up-2", "version": again}
    )
    assert confirmed.status_code == 302
    assert instance.operations.get(verb="upgrade").plan_version.number == 3


@pytest.mark.parametrize("version", ["1" * 5000, "2_0", "٢", "v2"])
def test_an_upgrade_posted_with_a_version_no_dialog_shows_is_refused_as_changed(
    owner_client, instance, v2, version
):
    form = {"request_id": "up-1", "version": version}

    response = owner_client.post(_url(instance, "upgrade/"), form)

    assert response.status_code == 400
    assert "was published after this was opened" in response.content.decode()
    assert not instance.operations.filter(verb="upgrade").exists()


def test_roll_back_posted_from_the_page_is_queued(owner_client, instance):
    _fail(instance, "upgrade")

    response = owner_client.post(_url(instance, "rollback/"), {"request_id": "rb-1"})

    assert response.status_code == 302
    assert instance.operations.get(verb="rollback").plan_version == instance.plan_version


def test_a_protected_instance_says_why_it_cannot_be_deleted(owner_client, instance):
    owner_client.post(_url(instance, "protection/"), {"protect": "on"})

    html = _page(owner_client, instance)
    assert "Turn off deletion protection" in html
    assert "Deletion protection is on; an owner or an admin can turn it off." in html
    response = owner_client.post(
        _url(instance, "delete/"), {"request_id": "d-1", "confirm_name": "orders"}, follow=True
    )

    assert "Deletion protection is on" in response.content.decode()
    assert not instance.operations.filter(verb="delete").exists()


@pytest.mark.parametrize(
    ("role", "path", "action"),
    [("viewer", "upgrade/", "instance.upgrade"), ("billing", "rollback/", "instance.rollback"),
     ("member", "protection/", "instance.protect")],
)  # fmt: skip
def test_forged_posts_are_refused_and_audited(client, instance, v2, add_member, role, path, action):
    if path == "rollback/":
        _fail(instance, "modify")
    user = add_member(f"{role}@example.com", role)
    client.force_login(user)

    response = client.post(_url(instance, path), {"request_id": "f-1", "protect": "on"})

    assert response.status_code == 403
    assert AuditEvent.objects.filter(action=action, result="denied", actor=user).exists()
    instance.refresh_from_db()
    assert not instance.deletion_protected
    assert instance.operations.count() == (2 if path == "rollback/" else 1)


def test_another_tenants_instance_is_a_404(client, instance, v2, make_user, add_member):
    from accounts import services as accounts_services

    stranger = make_user("stranger@example.com")
    other = accounts_services.tenant_create(actor=Actor(user=stranger), name="Globex")
    theirs = _running(stranger, other, name="their-db")
    client.force_login(add_member("member@example.com", "admin"))
    mine = f"/t/{instance.tenant.slug}/deployments/{theirs.pk}/"

    for path in ["upgrade/", "rollback/", "protection/"]:
        response = client.post(mine + path, {"request_id": uuid.uuid4().hex, "protect": "on"})
        assert response.status_code == 404, path

    theirs.refresh_from_db()
    assert not theirs.deletion_protected
    assert theirs.operations.count() == 1


def test_an_upgrade_the_new_version_cannot_take_reopens_its_dialog_with_the_reason(
    owner_client, instance
):
    text = SPEC.read_text().replace('options: ["16", "17", "18"]', 'options: ["18"]')
    services.plan_load(text=text.replace('defaultValue: "17"', 'defaultValue: "18"'))

    response = owner_client.post(_url(instance, "upgrade/"), {"request_id": "up-2"})

    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="dialog-upgrade" aria-labelledby="dialog-upgrade-title" open data-open' in html
    assert "PostgreSQL version: version 2 refuses 17." in html
    assert not instance.operations.filter(verb="upgrade").exists()


def test_the_audit_log_names_the_instance_and_the_operation_an_event_is_about(
    owner_client, instance, owner
):
    restart = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="restart", request_id=uuid.uuid4().hex
    )
    services.operation_cancel(actor=Actor(user=owner), operation=restart, request_id="cancel-1")

    log = owner_client.get(f"/t/{instance.tenant.slug}/audit/").content.decode()
    export = owner_client.get(f"/t/{instance.tenant.slug}/audit/export.csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))

    assert f"instance {instance.pk} (orders)" in log
    assert f"operation {restart.pk} (restart of orders)" in log
    named = {(r["action"], r["target_id"]): r["target_name"] for r in rows}
    assert named[("instance.restart", instance.pk)] == "orders"
    assert named[("operation.cancel", str(restart.pk))] == "restart of orders"


@pytest.mark.parametrize("role", ["member", "viewer"])
@pytest.mark.parametrize("sent", [{}, {"protect": "yes"}])
def test_a_forged_protection_switch_is_refused_for_the_role_whatever_it_sends(
    client, instance, add_member, role, sent
):
    """A member's forged switch saying neither on nor off was told to say which, its role
    never checked nor the refusal audited, as it is for one saying on."""
    user = add_member(f"{role}@example.com", role)
    client.force_login(user)

    response = client.post(_url(instance, "protection/"), sent)

    assert response.status_code == 403
    assert AuditEvent.objects.filter(action="instance.protect", result="denied", actor=user)
    assert not Instance.objects.get(pk=instance.pk).deletion_protected
