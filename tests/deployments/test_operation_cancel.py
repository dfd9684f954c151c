"""Cancelling an operation, and the emails that tell its requester how an operation ended."""

import uuid

import pytest
from django.core import mail
from django.core.exceptions import ValidationError

from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from deployments import services
from deployments.models import Instance, Operation, Snapshot
from tests.deployments.conftest import instance_object, wait_done, wait_for


def _create(owner, tenant, plan, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def _act(user, instance, verb, **parameters):
    return services.instance_action(
        actor=Actor(user=user), instance=instance, verb=verb,
        request_id=uuid.uuid4().hex, parameters=parameters,
    )  # fmt: skip


def _cancel(user, operation):
    return services.operation_cancel(
        actor=Actor(user=user), operation=operation, request_id=uuid.uuid4().hex
    )


@pytest.fixture
def running(worker, cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def test_a_cancelled_running_operation_ends_cancelled_and_the_instance_is_not_stuck(
    running, owner, faults
):
    faults(frozen=["clusters"])  # the modify waits on the operator for ever
    modify = _act(owner, running, "modify", instances=2)
    wait_for(lambda: modify.task_runs.filter(state="Running").exists(), what="the modify to wait")

    _cancel(owner, modify)
    faults(frozen=[])

    assert wait_done(modify).state == Operation.State.CANCELLED
    assert modify.error.startswith("Cancelled by owner@example.com.")
    running.refresh_from_db()
    # Its change reached the cluster: the instance cannot be said to run as before (and what
    # Opsdeck stores is not what is deployed: Roll back re-applies it).
    assert running.state == Instance.State.FAILED
    assert AuditEvent.objects.filter(action="operation.cancel", target_id=str(modify.pk)).exists()


@pytest.mark.parametrize(
    ("verb", "annotation", "leads_to"),
    [
        ("restart", "kubectl.kubernetes.io/restartedAt", Instance.State.RUNNING),
        ("stop", "cnpg.io/hibernation", Instance.State.STOPPED),
    ],
)
def test_a_stop_or_restart_cancelled_after_the_cluster_took_it_leaves_the_instance_where_it_leads(
    running, owner, faults, kube, verb, annotation, leads_to
):
    faults(frozen=["clusters"])  # the operator does not get round to it while the test looks
    operation = _act(owner, running, verb)
    wait_for(
        lambda: (
            operation.task_runs.filter(state="Running").exclude(object="").exists()
            and annotation in _annotations(kube, running)
        ),
        what=f"the {verb} to reach the cluster",
    )

    _cancel(owner, operation)
    faults(frozen=[])

    assert wait_done(operation).state == Operation.State.CANCELLED
    running.refresh_from_db()
    # The operator carries through what it took: the instance is not failed.
    assert running.state == leads_to
    change = running.history.get(operation=operation, to_state=leads_to)
    assert change.from_state == Instance.State.UPDATING


def _annotations(kube, instance) -> dict:
    cluster = instance_object(kube, instance, "postgresql.cnpg.io/v1", "Cluster", instance.pk)
    return cluster["metadata"].get("annotations") or {}


def test_a_cancelled_queued_backup_shows_its_snapshot_cancelled(running, owner, faults):
    faults(frozen=["clusters"])
    restart = _act(owner, running, "restart")
    backup = _act(owner, running, "backup")  # queued behind the restart

    _cancel(owner, backup)

    backup.refresh_from_db()
    assert backup.state == Operation.State.CANCELLED
    assert Snapshot.objects.get(operation=backup).status == Snapshot.Status.CANCELLED
    _cancel(owner, restart)
    faults(frozen=[])
    wait_done(restart)


def test_a_backup_the_cluster_has_begun_cannot_be_cancelled_and_completes(running, owner, faults):
    """The database carries a backup it began to its end: a cancel that claimed to stop it
    would list as cancelled a backup the object store holds."""
    faults(frozen=["backups"])  # the operator holds the backup running
    backup = _act(owner, running, "backup")
    wait_for(lambda: backup.task_runs.filter(state="Running").exists(), what="the backup to wait")

    with pytest.raises(ValidationError, match="A backup that has started cannot be cancelled"):
        _cancel(owner, backup)
    faults(frozen=[])

    assert wait_done(backup).state == Operation.State.SUCCEEDED
    assert Snapshot.objects.get(operation=backup).status == Snapshot.Status.COMPLETED
    assert not AuditEvent.objects.filter(action="operation.cancel", result="ok").exists()


def test_an_operation_queued_behind_a_cancelled_one_that_cannot_start_ends_failed_untouched(
    running, owner, faults, kube
):
    """A modify was accepted on the running instance a queued start would leave; the start
    was cancelled, so the modify found the instance stopped. It ran anyway: it scaled the
    stopped cluster and waited for it to be healthy until its deadline."""
    faults(frozen=["clusters"])  # the restart waits, so the rest stay queued behind it
    restart = _act(owner, running, "restart")
    stop, start = _act(owner, running, "stop"), _act(owner, running, "start")
    modify = _act(owner, running, "modify", instances=3)
    _cancel(owner, start)
    faults(frozen=[])

    assert wait_done(restart).state == wait_done(stop).state == Operation.State.SUCCEEDED
    modify = wait_done(modify)
    assert modify.state == Operation.State.FAILED
    assert modify.error == (
        "Did not start. The instance is stopped; modify needs it to be running."
    )
    running.refresh_from_db()
    assert running.state == Instance.State.STOPPED
    assert running.parameters["instances"] == 1  # stored = deployed
    cluster = instance_object(kube, running, "postgresql.cnpg.io/v1", "Cluster", running.pk)
    assert cluster["spec"]["instances"] == 1
    # Sent by the mail worker once the modify's end committed: it may still be on its way.
    wait_for(
        lambda: any("modify" in m.subject and "failed" in m.subject.lower() for m in mail.outbox),
        what="the email saying the modify failed",
    )


def test_a_viewer_cannot_cancel_and_a_delete_cannot_be_cancelled(running, owner, add_member):
    viewer = add_member("viewer@example.com", "viewer")
    delete = services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d")

    with pytest.raises(ActionDenied):
        _cancel(viewer, delete)
    with pytest.raises(ActionDenied, match="cannot be cancelled"):
        _cancel(owner, delete)
    assert wait_done(delete).state == Operation.State.SUCCEEDED
    with pytest.raises(ValidationError, match="has ended"):
        _cancel(owner, running.operations.get(verb="create"))


def test_the_requester_hears_when_an_instance_is_ready_and_when_an_operation_fails(
    request, cell, plan, tenant, owner, sandbox_cluster
):
    ready = _create(owner, tenant, plan)
    broken = _create(owner, tenant, plan, "billing")
    instance = broken.instance
    sandbox_cluster.set_faults(fail_bootstrap=[f"{instance.namespace}/{instance.pk}"])
    try:
        request.getfixturevalue("worker")
        assert wait_done(ready).state == Operation.State.SUCCEEDED, ready.error
        assert wait_done(broken).state == Operation.State.FAILED
    finally:
        sandbox_cluster.set_faults(fail_bootstrap=[])

    wait_for(lambda: len(mail.outbox) >= 2, what="two emails")
    subjects = sorted(m.subject for m in mail.outbox)
    assert subjects == ["[Opsdeck] billing: create failed", "[Opsdeck] orders is ready"]
    failed = next(m for m in mail.outbox if m.subject.endswith("failed"))
    assert failed.to == ["owner@example.com"]
    assert "Unable to create required cluster objects" in failed.body
    assert f"The create of billing ({instance.pk}) you asked for failed on " in failed.body
    assert "The instance has failed." in failed.body
    assert f"/deployments/{instance.pk}/" in failed.body


def test_a_create_cancelled_before_it_started_leaves_its_instance_failed_and_unbilled(
    cell, plan, tenant, owner
):
    from datetime import timedelta

    from django.utils import timezone

    from deployments import metering

    create = _create(owner, tenant, plan)  # no worker: it stays queued

    _cancel(owner, create)

    instance = Instance.objects.get(pk=create.instance_id)
    assert instance.state == Instance.State.FAILED  # not "creating" for ever
    change = instance.history.get(to_state=Instance.State.FAILED)
    assert change.operation_id == create.pk and change.reason == "Cancelled by owner@example.com."
    later = (timezone.now() + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    assert [row for row in metering.usage_rows(later) if row.instance_id == instance.pk] == []
    # What a failed create offers: trying again, or deleting it.
    retry = _act(owner, instance, "create")
    assert retry.state == Operation.State.QUEUED
