"""Backups become snapshots that outlive their instance and restore into new instances."""

import itertools
import time
import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts.audit import Actor
from accounts.errors import ActionDenied
from deployments import runner, selectors, services
from deployments.models import Cell, Instance, Operation, PlatformSecret, Snapshot
from tests.concurrency import beside_a_lock, race
from tests.deployments.conftest import SPEC, instance_object, wait_done
from tests.deployments.factories import BACKUPS


def _act(owner, instance, verb):
    return services.instance_action(
        actor=Actor(user=owner), instance=instance, verb=verb, request_id=uuid.uuid4().hex
    )


def _create(owner, tenant, plan, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def test_a_snapshot_restores_into_a_new_instance_after_its_source_is_deleted(
    worker, cell, plan, tenant, owner, sandbox_cluster
):
    create = _create(owner, tenant, plan, instances="2")
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    source = create.instance
    backup = _act(owner, source, "backup")
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    snapshot = Snapshot.objects.get(instance=source)
    delete = services.instance_delete(actor=Actor(user=owner), instance=source, request_id="d")
    assert wait_done(delete).state == Operation.State.SUCCEEDED, delete.error

    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="orders-copy", request_id="r"
    )

    assert wait_done(restore).state == Operation.State.SUCCEEDED, restore.error
    copy = Instance.objects.get(pk=restore.instance_id)
    assert copy.pk != source.pk
    assert copy.state == Instance.State.RUNNING
    assert copy.parameters["instances"] == 2  # the source's parameters by default
    assert copy.outputs["phase"] == "Cluster in healthy state"
    snapshot.refresh_from_db()
    assert snapshot.instance_id == source.pk  # the snapshot outlived its instance
    bootstrap = restore.task_runs.get(node="main.from-snapshot")
    assert snapshot.metadata["backupId"] in bootstrap.object


def test_a_restore_whose_bootstrap_failed_fails_and_its_retry_restores(
    worker, cell, plan, tenant, owner, sandbox_cluster
):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    backup = _act(owner, create.instance, "backup")
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    snapshot = Snapshot.objects.get(instance=create.instance)
    sandbox_cluster.set_faults(frozen=["clusters"])  # the new Cluster waits, untouched
    try:
        restore = services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="orders-copy", request_id="r"
        )
        copy = restore.instance
        sandbox_cluster.set_faults(fail_bootstrap=[f"{copy.namespace}/{copy.pk}"], frozen=[])
        # The operator says it cannot make the cluster: failed at once, not at the deadline.
        assert wait_done(restore, timeout=30).state == Operation.State.FAILED
    finally:
        sandbox_cluster.set_faults(fail_bootstrap=[], frozen=[])
    copy.refresh_from_db()
    assert copy.state == Instance.State.FAILED

    retry = _act(owner, copy, "restore")  # the page's Retry

    assert wait_done(retry).state == Operation.State.SUCCEEDED, retry.error
    copy.refresh_from_db()
    assert copy.state == Instance.State.RUNNING


def test_only_completed_snapshots_restore(worker, cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    wait_done(create)
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=create.instance, source_instance_id=create.instance_id,
        plan_version=create.plan_version, name="x", status=Snapshot.Status.FAILED,
    )  # fmt: skip

    with pytest.raises(ValidationError) as refused:
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r2"
        )

    assert refused.value.messages == ["Only a completed backup can be restored."]
    assert Instance.objects.filter(tenant=tenant).count() == 1


def test_a_restore_cannot_shrink_what_the_backup_holds(cell, plan, tenant, owner):
    snapshot = Snapshot.objects.create(
        tenant=tenant, source_instance_id="gone", plan_version=plan.versions.get(),
        name="x", status=Snapshot.Status.COMPLETED, parameters={"storageGi": 20},
    )  # fmt: skip

    with pytest.raises(ValidationError) as refused:
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r3",
            parameters={"storageGi": "5"},
        )  # fmt: skip

    assert refused.value.message_dict["storageGi"] == [
        "Can grow, not shrink: the backup holds 20."  # not "it is 20 now": nothing runs it
    ]
    assert not Instance.objects.filter(tenant=tenant).exists()


def test_deleting_a_snapshot_runs_delete_backup_and_marks_it_deleted(
    worker, cell, plan, tenant, owner
):
    create = _create(owner, tenant, plan)
    wait_done(create)
    wait_done(_act(owner, create.instance, "backup"))
    snapshot = Snapshot.objects.get(instance=create.instance)

    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f")

    assert wait_done(forget).state == Operation.State.SUCCEEDED, forget.error
    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.DELETED


def test_two_backups_in_one_second_are_two_and_deleting_one_keeps_the_other(
    worker, cell, plan, tenant, owner, kube, monkeypatch
):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    instance = create.instance
    second = timezone.now().replace(microsecond=0)
    ticks = itertools.count()
    # Both named within one second: a click, then a schedule's slot once its backup is done
    # (a slot is skipped while a backup is pending).
    frozen = lambda: second + timedelta(microseconds=next(ticks))  # noqa: E731
    monkeypatch.setattr(timezone, "now", frozen)
    backups = [_act(owner, instance, "backup")]
    monkeypatch.undo()
    assert wait_done(backups[0]).state == Operation.State.SUCCEEDED, backups[0].error
    monkeypatch.setattr(timezone, "now", frozen)
    backups.append(services._backup_queue_scheduled(Instance.objects.get(pk=instance.pk), second))
    monkeypatch.undo()

    for backup in backups:
        assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    kept, forgotten = Snapshot.objects.filter(instance=instance).order_by("-pk")
    assert kept.name != forgotten.name
    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=forgotten, request_id="f")
    assert wait_done(forget).state == Operation.State.SUCCEEDED, forget.error

    def backup_object(snapshot):
        return instance_object(kube, instance, "postgresql.cnpg.io/v1", "Backup", snapshot.name)

    assert backup_object(forgotten) is None
    assert backup_object(kept)["status"]["phase"] == "completed"


def test_back_up_now_while_a_backup_is_queued_or_running_is_refused_and_queues_nothing(
    cell, plan, tenant, owner
):
    create = _create(owner, tenant, plan)  # no worker: what it queues stays queued
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    instance = Instance.objects.get(pk=create.instance_id)

    # Two tabs, each with its own form: the clicks race for the instance.
    results = race(lambda: _act(owner, instance, "backup"))

    queued = [r for r in results if isinstance(r, Operation)]
    refused = [r for r in results if isinstance(r, ActionDenied)]
    assert len(queued) == 1 and len(refused) == len(results) - 1, results
    assert refused[0].reason.startswith("A backup of this instance is already queued or running")
    assert Snapshot.objects.filter(instance=instance).count() == 1  # the refused left none
    assert instance.operations.filter(verb="backup").count() == 1

    # Started, it still refuses another; once it has finished, the next one is accepted.
    Operation.objects.filter(pk=queued[0].pk).update(state=Operation.State.RUNNING)
    with pytest.raises(ActionDenied):
        _act(owner, instance, "backup")
    Operation.objects.filter(pk=queued[0].pk).update(state=Operation.State.SUCCEEDED)
    assert _act(owner, instance, "backup").state == Operation.State.QUEUED


def _running_with_a_backup(owner, tenant, plan):
    """A running instance (no worker: what is queued stays queued) and a completed backup."""
    create = _create(owner, tenant, plan)
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    instance = Instance.objects.get(pk=create.instance_id)
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-20261201030000",
        status=Snapshot.Status.COMPLETED, parameters=instance.parameters,
    )  # fmt: skip
    return instance, snapshot


def test_a_backup_restored_and_deleted_at_once_does_one_and_refuses_the_other(
    cell, plan, tenant, owner
):
    _, snapshot = _running_with_a_backup(owner, tenant, plan)
    calls = itertools.cycle([
        lambda: services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id=uuid.uuid4().hex
        ),
        lambda: services.snapshot_delete(
            actor=Actor(user=owner), snapshot=snapshot, request_id=uuid.uuid4().hex
        ),
    ])  # fmt: skip

    results = race(lambda: next(calls)(), times=2)

    accepted = [r for r in results if isinstance(r, Operation)]
    refused = [r for r in results if isinstance(r, ValidationError | ActionDenied)]
    assert len(accepted) == len(refused) == 1, results
    if accepted[0].verb == "restore":  # the deletion came second: it waits for the restore
        assert refused[0].reason == services.FORGET_RESTORING
        assert not Operation.objects.filter(verb="deleteBackup").exists()
    else:  # the restore came second: the backup is going
        assert refused[0].messages == [services.RESTORE_FORGETTING]
        assert not Instance.objects.filter(name="copy").exists()


def test_a_backup_being_restored_is_deleted_once_the_restore_has_finished(
    cell, plan, tenant, owner
):
    _, snapshot = _running_with_a_backup(owner, tenant, plan)
    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r"
    )

    with pytest.raises(ActionDenied) as refused:
        services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f1")
    Operation.objects.filter(pk=restore.pk).update(state=Operation.State.SUCCEEDED)
    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f2")

    assert refused.value.reason == services.FORGET_RESTORING
    assert forget.verb == "deleteBackup"
    with pytest.raises(ValidationError) as too_late:
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="again", request_id="r2"
        )
    assert too_late.value.messages == [services.RESTORE_FORGETTING]


def test_a_failed_restore_is_not_run_again_from_a_backup_being_deleted_or_deleted(
    cell, plan, tenant, owner, owner_client
):
    _, snapshot = _running_with_a_backup(owner, tenant, plan)
    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r"
    )
    Operation.objects.filter(pk=restore.pk).update(
        state=Operation.State.FAILED, started_at=timezone.now()
    )
    Instance.objects.filter(pk=restore.instance_id).update(state=Instance.State.FAILED)
    copy = Instance.objects.get(pk=restore.instance_id)
    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f")

    with pytest.raises(ActionDenied) as while_deleting:
        _act(owner, copy, "restore")  # the page's Retry
    Operation.objects.filter(pk=forget.pk).update(state=Operation.State.SUCCEEDED)
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.DELETED)
    with pytest.raises(ActionDenied) as once_deleted:
        _act(owner, copy, "restore")

    assert while_deleting.value.reason == services.RESTORE_FORGETTING
    assert once_deleted.value.reason == selectors.RESTORE_AGAIN_DELETED
    assert list(copy.operations.values_list("verb", flat=True)) == ["restore"]  # none queued
    # Its page offers the Retry disabled, and says why beside it.
    page = owner_client.get(f"/t/{tenant.slug}/deployments/{copy.pk}/").content.decode()
    assert 'disabled aria-describedby="why-restore">Retry</button>' in page
    assert f'<li id="why-restore"><strong>Retry:</strong> {selectors.RESTORE_AGAIN_DELETED}' in page


def test_a_backup_restores_into_its_instances_cell_while_it_is_offered(cell, plan, tenant, owner):
    own = Cell.objects.create(name="byoc-eu", region="eu", public=False, **BACKUPS)
    own.tenants.add(tenant)
    instance, snapshot = _running_with_a_backup(owner, tenant, plan)
    Instance.objects.filter(pk=instance.pk).update(cell=own)

    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r1"
    )
    own.tenants.remove(tenant)  # withdrawn: the next restore goes to the default cell
    again = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="copy-2", request_id="r2"
    )

    assert restore.instance.cell == own  # where its backup is
    assert again.instance.cell == cell


def _without_delete_backup(text: str) -> str:
    """The spec without its deleteBackup verb nor its backup configuration."""
    head, rest = text.split("      deleteBackup:\n", 1)
    text = head + "      delete:\n" + rest.split("      delete:\n", 1)[1]
    block = (
        "    capabilities:\n      backupConfiguration:\n        backupRetentionInDays: 30\n"
        "        backupPeriodInHours: 24\n        snapshotBeforeDeletion: false\n"
    )
    assert block in text
    return text.replace(block, "")


def test_a_backup_deleted_after_an_upgrade_to_a_version_without_its_deletion_is_forgotten(
    cell, plan, tenant, owner
):
    instance, snapshot = _running_with_a_backup(owner, tenant, plan)
    upgraded = services.plan_load(text=_without_delete_backup(SPEC.read_text())).version
    Instance.objects.filter(pk=instance.pk).update(plan_version=upgraded)  # as an upgrade ends

    forgotten = services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f")

    # Nothing queued that the instance's version could not run, to block what follows it.
    assert forgotten is None
    assert not Operation.objects.filter(verb="deleteBackup").exists()
    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.DELETED
    assert _act(owner, Instance.objects.get(pk=instance.pk), "restart").state == "queued"


def test_a_backup_queued_for_deletion_shows_as_being_deleted_with_no_restore(
    cell, plan, tenant, owner, owner_client
):
    instance, going = _running_with_a_backup(owner, tenant, plan)
    kept = Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-20261202030000",
        status=Snapshot.Status.COMPLETED, parameters=instance.parameters,
    )  # fmt: skip
    services.snapshot_delete(actor=Actor(user=owner), snapshot=going, request_id="f")

    page = owner_client.get(
        f"/t/{tenant.slug}/deployments/{instance.pk}/", {"tab": "backups"}
    ).content.decode()

    going_row = page.split(f'id="backup-{going.pk}"')[1].split("</tr>")[0]
    kept_row = page.split(f'id="backup-{kept.pk}"')[1].split("</tr>")[0]
    assert "Being deleted" in going_row and "No longer restorable" in going_row
    assert "Restore" not in going_row and "Delete backup" not in going_row
    assert "Completed" in kept_row and "Restore" in kept_row and "Delete backup" in kept_row


def test_snapshot_before_deletion_takes_a_last_backup_first(worker, cell, tenant, owner):
    text = SPEC.read_text()
    text = text.replace("plan: postgres-cnpg", "plan: postgres-keep-last", 1)
    text = text.replace("snapshotBeforeDeletion: false", "snapshotBeforeDeletion: true", 1)
    plan = services.plan_load(text=text).plan
    create = _create(owner, tenant, plan)
    wait_done(create)

    delete = services.instance_delete(
        actor=Actor(user=owner), instance=create.instance, request_id="bye"
    )

    assert wait_done(delete).state == Operation.State.SUCCEEDED, delete.error
    last = Snapshot.objects.get(source_instance_id=create.instance_id)
    assert last.status == Snapshot.Status.COMPLETED
    assert last.operation.finished_at <= delete.started_at


def test_platform_secrets_reach_workflows_as_secret_variables(worker, cell, tenant, owner):
    PlatformSecret.objects.create(name="MONITORING_TOKEN", value="s3cr3t-token")
    text = SPEC.read_text().replace("plan: postgres-cnpg", "plan: postgres-with-secret", 1)
    password_line = "                    password: {{ $var.password }}\n"
    extra_line = "                    monitoring: {{ $secret.MONITORING_TOKEN }}\n"
    assert password_line in text
    text = text.replace(password_line, password_line + extra_line, 1)
    plan = services.plan_load(text=text).plan

    create = _create(owner, tenant, plan)

    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    secret_run = create.task_runs.get(node="main.credentials")
    assert "s3cr3t-token" in secret_run.object  # decrypted here; encrypted in the database


def test_a_snapshot_restores_to_a_point_in_time_after_it(worker, cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    wait_done(create)
    wait_done(_act(owner, create.instance, "backup"))
    snapshot = Snapshot.objects.get(instance=create.instance)
    when = timezone.now()

    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="as-of", request_id="pitr",
        target_time=when,
    )  # fmt: skip

    assert wait_done(restore).state == Operation.State.SUCCEEDED, restore.error
    recovered = restore.task_runs.get(node="main.to-point-in-time")
    assert f'"targetTime": "{when:%Y-%m-%dT%H:%M:%SZ}"' in recovered.object
    assert not restore.task_runs.filter(node="main.from-snapshot").exclude(state="Skipped").exists()
    with pytest.raises(ValidationError, match="in the future"):
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="later", request_id="pitr-2",
            target_time=when + timedelta(days=1),
        )  # fmt: skip


def test_deleting_a_backup_while_an_operation_on_its_instance_finishes_does_not_deadlock(
    cell, plan, tenant, owner
):
    """A worker finishing an operation locks the instance, then writes its snapshot; deleting
    the backup locked the snapshot, then queued an operation naming the instance: a deadlock.
    It now locks the instance first, as the worker does."""
    instance = Instance.objects.create(
        tenant=tenant, name="a", plan_version=plan.versions.get(), cell=cell,
        state=Instance.State.RUNNING,
    )  # fmt: skip
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name="a-1", status=Snapshot.Status.COMPLETED,
    )  # fmt: skip

    finished, deleted = beside_a_lock(
        lambda: Instance.objects.select_for_update().get(pk=instance.pk),  # as `_finish`
        lambda: Snapshot.objects.filter(pk=snapshot.pk).update(metadata={"backupId": "b"}),
        lambda: services.snapshot_delete(
            actor=Actor(user=owner), snapshot=snapshot, request_id="forget"
        ),
    )

    assert finished == "committed", finished
    assert isinstance(deleted, Operation), deleted


def _stored(tenant, cell, plan, *, state=Instance.State.RUNNING):
    instance = Instance.objects.create(
        tenant=tenant, name="a", plan_version=plan.versions.get(), cell=cell, state=state,
    )  # fmt: skip
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name="a-1", status=Snapshot.Status.COMPLETED,
    )  # fmt: skip
    return instance, snapshot


def test_deleting_an_instance_fails_its_queued_backup_and_forgets_a_backup_queued_for_deletion(
    db, tenant, owner
):
    from deployments.models import Cell

    cell = Cell.objects.create(name="eu-1", region="eu", is_default=True, **BACKUPS)
    plan = services.plan_load(text=SPEC.read_text()).plan
    instance, kept = _stored(tenant, cell, plan)
    restart = _act(owner, instance, "restart")
    Operation.objects.filter(pk=restart.pk).update(state=Operation.State.RUNNING)  # under way
    backup = _act(owner, instance, "backup")  # queued behind it
    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=kept, request_id="f")

    services.instance_delete(actor=Actor(user=owner), instance=instance, request_id="d")

    taken = Snapshot.objects.get(pk=backup.arguments["snapshot"])
    assert taken.status == Snapshot.Status.CANCELLED  # not pending for ever
    kept.refresh_from_db()
    assert kept.status == Snapshot.Status.DELETED
    assert {Operation.objects.get(pk=o.pk).state for o in [backup, forget]} == {"cancelled"}


def test_a_backup_deleted_while_its_instance_waits_to_be_deleted_is_forgotten_at_once(
    db, tenant, owner
):
    from deployments.models import Cell

    cell = Cell.objects.create(name="eu-1", region="eu", is_default=True, **BACKUPS)
    plan = services.plan_load(text=SPEC.read_text()).plan
    instance, snapshot = _stored(tenant, cell, plan)
    services.instance_delete(actor=Actor(user=owner), instance=instance, request_id="d")

    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f")

    snapshot.refresh_from_db()
    assert forget is None and snapshot.status == Snapshot.Status.DELETED
    assert not instance.operations.filter(verb="deleteBackup").exists()


def _run(op, timeout=90):
    """Run the operation's steps here, as a worker would, until it ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.operation_step(str(op.pk))
        op.refresh_from_db()
        if op.state in {"succeeded", "failed", "cancelled"}:
            return op
        time.sleep(0.1)
    raise AssertionError(f"{op.verb} still {op.state}")


def test_a_backup_deleted_while_it_is_being_taken_stays_deleted(cell, tenant, owner):
    text = SPEC.read_text()
    text = text.replace("plan: postgres-cnpg", "plan: postgres-keep-last", 1)
    text = text.replace("snapshotBeforeDeletion: false", "snapshotBeforeDeletion: true", 1)
    create = _create(owner, tenant, services.plan_load(text=text).plan)
    assert _run(create).state == Operation.State.SUCCEEDED, create.error
    delete = services.instance_delete(
        actor=Actor(user=owner), instance=create.instance, request_id="bye"
    )
    last = Operation.objects.get(instance=create.instance, verb="backup")  # taken before it
    snapshot = Snapshot.objects.get(pk=last.arguments["snapshot"])

    services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="forget")
    assert _run(last).state == Operation.State.SUCCEEDED, last.error
    assert _run(delete).state == Operation.State.SUCCEEDED, delete.error

    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.DELETED  # not back as completed once taken


def _keeping_a_last_backup(owner, tenant):
    """A running instance of a plan that takes a last backup before deletion."""
    text = SPEC.read_text()
    text = text.replace("plan: postgres-cnpg", "plan: postgres-keep-last", 1)
    text = text.replace("snapshotBeforeDeletion: false", "snapshotBeforeDeletion: true", 1)
    create = _create(owner, tenant, services.plan_load(text=text).plan)
    assert _run(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def test_a_delete_whose_last_backup_was_cancelled_deletes_nothing(cell, tenant, owner, kube):
    instance = _keeping_a_last_backup(owner, tenant)
    delete = services.instance_delete(actor=Actor(user=owner), instance=instance, request_id="bye")
    last = Operation.objects.get(instance=instance, verb="backup")
    services.operation_cancel(actor=Actor(user=owner), operation=last, request_id="keep")

    refused = _run(delete)

    assert refused.state == Operation.State.FAILED
    assert "The last backup before deletion was cancelled, so nothing was deleted" in refused.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance_object(kube, instance, "postgresql.cnpg.io/v1", "Cluster", instance.pk)


def test_a_delete_asked_for_without_a_last_backup_takes_none(cell, tenant, owner, owner_client):
    instance = _keeping_a_last_backup(owner, tenant)
    page = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/").content.decode()
    assert "A last backup is taken first, and nothing is deleted if it fails." in page
    assert 'name="without_last_backup"' in page

    owner_client.post(
        f"/t/{tenant.slug}/deployments/{instance.pk}/delete/",
        {"request_id": "bye", "confirm_name": instance.name, "without_last_backup": "on"},
    )

    delete = Operation.objects.get(instance=instance, verb="delete")
    assert not Operation.objects.filter(instance=instance, verb="backup").exists()
    assert _run(delete).state == Operation.State.SUCCEEDED, delete.error
    with pytest.raises(ValidationError):  # the same request, asking for the last backup now
        services.instance_delete(actor=Actor(user=owner), instance=instance, request_id="bye")


def test_a_backup_is_taken_when_it_ran_not_when_it_was_asked_for(
    cell, plan, tenant, owner, owner_client
):
    """A backup queued behind a long change runs after it, and holds the data as it was then.
    The Backups tab, its delete dialog and its restore page said it was taken when it was
    asked for, an hour before it ran, and a point in time in that hour was offered, though
    no backup holds it."""
    create = _create(owner, tenant, plan)
    _run(create)
    backup = _act(owner, create.instance, "backup")
    asked = timezone.now() - timedelta(hours=1)  # it waited an hour behind a change
    Snapshot.objects.filter(operation=backup).update(created_at=asked)

    ran = _run(backup)

    snapshot = Snapshot.objects.get(operation=backup)
    assert snapshot.taken_at == ran.finished_at
    page = owner_client.get(
        f"/t/{tenant.slug}/deployments/{create.instance_id}/", {"tab": "backups"}
    ).content.decode()
    row = page.split(f'id="backup-{snapshot.pk}"', 1)[1].split("</tr>", 1)[0]
    assert f'datetime="{ran.finished_at.isoformat()}"' in row
    assert f"{asked:%-d %b %Y %H:%M} UTC" not in page
    with pytest.raises(ValidationError, match="before the backup was taken"):
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="as-of", request_id="pitr",
            target_time=asked + timedelta(minutes=30),
        )  # fmt: skip


def test_a_point_in_time_after_the_disk_grew_is_restored_onto_the_disk_it_had_then(
    cell, plan, tenant, owner
):
    """A backup taken at 10 GiB, then the disk grown to 20 GiB: a restore to a point in time
    after that recovers the data as it was then (the newest backup before it and the changes
    since), yet was given the backup's 10 GiB, the size a restore of the backup itself is
    refused below."""
    _, snapshot, grown = _backed_up_then_grown(owner, tenant, plan)
    assert grown.state == Operation.State.SUCCEEDED, grown.error
    assert snapshot.parameters["storageGi"] == 10

    before = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="as-taken", request_id="r-1",
    )  # fmt: skip
    after = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="as-of-now", request_id="r-2",
        target_time=timezone.now(),
    )  # fmt: skip

    assert Instance.objects.get(pk=before.instance_id).parameters["storageGi"] == 10
    assert Instance.objects.get(pk=after.instance_id).parameters["storageGi"] == 20


def _backed_up_then_grown(owner, tenant, plan) -> tuple[Operation, Snapshot, Operation]:
    """An instance's create, its backup taken at 10 GiB, and the modify that grew the disk to
    20 GiB after it, a second ago (a restore form's point in time is to the second)."""
    create = _create(owner, tenant, plan, storageGi="10")
    _run(create)
    backup = _run(_act(owner, create.instance, "backup"))
    grown = services.instance_action(
        actor=Actor(user=owner), instance=Instance.objects.get(pk=create.instance_id),
        verb="modify", request_id=uuid.uuid4().hex, parameters={"storageGi": "20"},
    )  # fmt: skip
    _run(grown)
    time.sleep(1)
    return create, Snapshot.objects.get(operation=backup), grown


def test_the_restore_form_to_a_point_in_time_after_the_disk_grew_restores_it_grown(
    cell, plan, tenant, owner, owner_client
):
    """The form offers the backup's values: sent as they were with a point in time after the
    disk grew, it was refused with "Can grow, not shrink: the backup holds 20", the backup
    holding 10. A value left as the backup holds it is the instance's at that time."""
    import re

    create, snapshot, _ = _backed_up_then_grown(owner, tenant, plan)
    page = owner_client.get(
        f"/t/{tenant.slug}/deployments/{create.instance_id}/backups/{snapshot.pk}/restore/",
        follow=True,
    )
    form = page.content.decode().split("<form", 2)[-1]
    fields = dict(re.findall(r'name="([^"]+)"[^>]*value="([^"]*)"', form))
    assert fields["p-storageGi"] == "10"  # the backup's

    fields.update(name="as-of-now", target_time=f"{timezone.now():%Y-%m-%dT%H:%M:%S}")
    owner_client.post(page.redirect_chain[-1][0], fields)

    assert Instance.objects.get(name="as-of-now").parameters["storageGi"] == 20


def test_the_restore_estimate_to_a_point_in_time_prices_the_disk_it_had_then(
    cell, plan, tenant, owner, owner_client
):
    """The restore form's price, as the user picks a point in time after the disk grew, kept
    pricing the backup's smaller disk: the restore it started made the grown one."""
    import re

    create, snapshot, _ = _backed_up_then_grown(owner, tenant, plan)
    restore = f"/t/{tenant.slug}/deployments/{create.instance_id}/backups/{snapshot.pk}/restore/"
    page = owner_client.get(restore, follow=True).content.decode()
    fields = dict(re.findall(r'name="([^"]+)"[^>]*value="([^"]*)"', page.split("<form", 2)[-1]))

    def hourly(**changes):
        answer = owner_client.post(f"{restore}estimate/", {**fields, **changes}).content.decode()
        return re.search(r'id="estimate-hour">([^<]+)<', answer).group(1)

    as_taken, grown_by_hand = hourly(), hourly(**{"p-storageGi": "20"})
    assert as_taken != grown_by_hand
    assert hourly(target_time=f"{timezone.now():%Y-%m-%dT%H:%M:%S}") == grown_by_hand


@pytest.mark.usefixtures("mail_at_commit")
def test_a_scheduled_backup_that_fails_is_told_to_the_owners_and_admins(
    cell, plan, tenant, owner, add_member, faults
):
    """A backup nobody asked for (its schedule's) that failed told nobody: its operation has no
    requester, so the organization learnt of backups failing night after night only by opening
    the Backups tab. Its owners and admins are told, as of an instance degraded."""
    from django.core import mail

    from deployments.models import BackupSchedule

    add_member("admin@example.com", "admin")
    add_member("member@example.com", "member")
    create = _create(owner, tenant, plan)
    _run(create)
    slot = (timezone.now() - timedelta(minutes=1)).replace(microsecond=0)
    BackupSchedule.objects.filter(instance_id=create.instance_id).update(next_run_at=slot)
    assert services.backups_run_due()["ran"] == 1
    faults(fail_backups=1)
    mail.outbox.clear()

    failed = _run(Operation.objects.get(instance_id=create.instance_id, verb="backup"))

    assert failed.state == Operation.State.FAILED
    [email] = mail.outbox
    assert sorted(email.to) == ["admin@example.com", "owner@example.com"]
    assert email.subject == "[Opsdeck] orders: backup failed"
    assert "that Opsdeck started on its own failed" in email.body


@pytest.mark.usefixtures("mail_at_commit")
def test_a_backup_whose_requesters_account_is_gone_is_not_told_as_opsdecks_own(
    cell, plan, tenant, owner, add_member, faults
):
    """An operation keeps no requester once their account is deleted: its failure was told to
    the owners and admins as one Opsdeck had started on its own."""
    from django.core import mail

    create = _create(owner, tenant, plan)
    _run(create)
    leaver = add_member("leaver@example.com", "admin")
    backup = services.instance_action(
        actor=Actor(user=leaver), instance=Instance.objects.get(pk=create.instance_id),
        verb="backup", request_id=uuid.uuid4().hex,
    )  # fmt: skip
    leaver.delete()
    faults(fail_backups=1)
    mail.outbox.clear()

    assert _run(backup).state == Operation.State.FAILED
    assert mail.outbox == []
