# ruff: noqa: F811 (the fixtures imported from the instance page tests are parameters here)
"""Cancel on the Operations tab: queued operations end at once, running ones get a reason to
stop at their next step, a delete has none, and another tenant's operation is a 404."""

import uuid

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import services
from deployments.models import Operation
from tests.deployments.test_instance_page import (  # noqa: F401 (fixtures)
    _create,
    _url,
    instance,
    local_cell,
    plan,
)


def _queue(owner, instance, verb="restart"):
    return services.instance_action(
        actor=Actor(user=owner), instance=instance, verb=verb, request_id=uuid.uuid4().hex
    )


def _cancel(client, instance, operation, request_id="cancel-1"):
    url = _url(instance, f"operations/{operation.pk}/cancel/")
    return client.post(url, {"request_id": request_id}, follow=True)


def test_a_queued_operation_is_cancelled_from_the_operations_tab(owner_client, owner, instance):
    restart = _queue(owner, instance)
    tab = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()
    assert f"operations/{restart.pk}/cancel/" in tab

    html = _cancel(owner_client, instance, restart).content.decode()

    restart.refresh_from_db()
    assert restart.state == Operation.State.CANCELLED
    assert f"Restart of {instance.name} is cancelled." in html
    assert f"operations/{restart.pk}/cancel/" not in html


def test_cancelling_a_running_operation_asks_first_and_says_what_it_leaves(
    owner_client, owner, instance
):
    queued = _queue(owner, instance)
    running = [_queue(owner, instance, verb=verb) for verb in ("backup", "failover")]
    running.append(
        services.instance_action(
            actor=Actor(user=owner), instance=instance, verb="modify",
            request_id=uuid.uuid4().hex, parameters={"instances": 3},
        )
    )  # fmt: skip
    Operation.objects.filter(pk__in=[op.pk for op in running]).update(state=Operation.State.RUNNING)

    tab = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()

    def confirm(operation) -> str:
        html = tab[tab.index(f'id="operation-{operation.pk}"') :]
        form = html[: html.index("</form>")]
        return form[form.index('hx-confirm="') :].split('"')[1] if "hx-confirm" in form else ""

    backup, failover, modify = running
    # A backup the database has begun runs to its end: it offers no cancel.
    assert f"operations/{backup.pk}/cancel/" not in tab
    failover, modify = confirm(failover), confirm(modify)
    # ... and a modify Roll back undoes, as the Failed instance offers.
    assert modify.endswith("the instance may be left Failed until you roll it back.")
    # The operator finishes a switchover it took.
    assert failover.endswith("If the cluster has already begun it, the cluster still finishes it.")
    # Queued when the page was drawn, it may have started by the time of the click.
    assert confirm(queued) == (
        "Cancel this restart? If it has started by now, it stops at its next step. If the cluster"
        " has already begun it, the cluster still finishes it."
    )


def test_a_running_backup_offers_no_cancel_and_a_forged_one_says_why_and_changes_nothing(
    owner_client, owner, instance
):
    backup = _queue(owner, instance, verb="backup")
    tab = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()
    # Queued, it has not started: it can still be cancelled, with no question asked.
    assert f"operations/{backup.pk}/cancel/" in tab
    Operation.objects.filter(pk=backup.pk).update(state=Operation.State.RUNNING)

    html = _cancel(owner_client, instance, backup).content.decode()

    backup.refresh_from_db()
    assert backup.state == Operation.State.RUNNING and not backup.cancel_reason
    assert "A backup that has started cannot be cancelled" in html
    assert f"operations/{backup.pk}/cancel/" not in html
    assert not AuditEvent.objects.filter(action="operation.cancel", result="ok").exists()


def test_a_repeated_cancel_request_returns_the_same_and_audits_once(owner_client, owner, instance):
    restart = _queue(owner, instance)

    _cancel(owner_client, instance, restart)
    again = _cancel(owner_client, instance, restart).content.decode()

    assert f"Restart of {instance.name} is cancelled." in again
    assert AuditEvent.objects.filter(action="operation.cancel", result="ok").count() == 1


def test_a_running_operation_is_told_to_stop_at_its_next_step(owner_client, owner, instance):
    restart = _queue(owner, instance)
    Operation.objects.filter(pk=restart.pk).update(state=Operation.State.RUNNING)

    html = _cancel(owner_client, instance, restart).content.decode()

    restart.refresh_from_db()
    assert restart.state == Operation.State.RUNNING
    assert restart.cancel_reason == "Cancelled by owner@example.com."
    assert f"Restart of {instance.name} stops at its next step." in html
    assert "clean-up" not in html  # words of the workflow, not of the customer
    assert "Stopping at its next step: Cancelled by owner@example.com." in html


def test_a_delete_has_no_cancel_and_a_forged_cancel_is_refused(owner_client, owner, instance):
    delete = services.instance_delete(
        actor=Actor(user=owner), instance=instance, request_id=uuid.uuid4().hex
    )

    tab = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()
    assert "/cancel/" not in tab
    html = _cancel(owner_client, instance, delete).content.decode()

    assert "A delete cannot be cancelled." in html
    delete.refresh_from_db()
    assert delete.state == Operation.State.QUEUED


def test_a_viewer_sees_no_cancel_and_a_forged_one_is_refused_and_audited(
    client, owner, instance, add_member
):
    restart = _queue(owner, instance)
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)

    assert "/cancel/" not in client.get(_url(instance), {"tab": "operations"}).content.decode()
    response = _cancel(client, instance, restart)

    assert response.status_code == 403
    restart.refresh_from_db()
    assert restart.state == Operation.State.QUEUED
    assert AuditEvent.objects.filter(action="operation.cancel", result="denied").exists()


def test_another_tenants_operation_is_a_404(owner_client, owner, instance, make_user, plan):
    stranger = make_user("stranger@example.com")
    other = account_services.tenant_create(actor=Actor(user=stranger), name="Other")
    theirs = _create(stranger, other, plan, name="theirs")

    mine = _cancel(owner_client, instance, theirs)
    on_theirs = _cancel(owner_client, theirs.instance, theirs)

    assert mine.status_code == 404 and on_theirs.status_code == 404
    theirs.refresh_from_db()
    assert theirs.state == Operation.State.QUEUED
