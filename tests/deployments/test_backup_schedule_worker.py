"""The object store keeps backups as long as the instance's schedule says, on a real run."""

import uuid
from datetime import timedelta

from accounts.audit import Actor
from deployments import services
from deployments.models import BackupSchedule, Operation, Snapshot
from tests.deployments.conftest import decoded, instance_object, wait_done, wait_for


def _retention(operation) -> str:
    cluster = operation.task_runs.filter(node="main.cluster").last()
    return decoded(cluster.object)["spec"]["backup"]["retentionPolicy"]


def _created(actor, tenant, plan) -> Operation:
    """The create of a running instance, through the worker."""
    create = services.instance_create(
        actor=actor, tenant=tenant, plan=plan, name="orders", parameters={},
        request_id=uuid.uuid4().hex,
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return create


def test_the_schedules_retention_reaches_the_clusters_retention_policy(
    worker, cell, plan, tenant, owner
):
    actor = Actor(user=owner)
    create = _created(actor, tenant, plan)
    assert _retention(create) == "30d"  # the spec's backupRetentionInDays

    services.backup_schedule_update(
        actor=actor, instance=create.instance, interval_hours=24, cron="",
        retention_days=7, retention_count=None, enabled=True,
    )  # fmt: skip
    modify = services.instance_action(
        actor=actor, instance=create.instance, verb="modify",
        request_id=uuid.uuid4().hex, parameters={"instances": "2"},
    )  # fmt: skip

    assert wait_done(modify).state == Operation.State.SUCCEEDED, modify.error
    assert _retention(modify) == "7d"


def test_a_backup_brings_the_clusters_retention_in_line_with_the_schedule(
    worker, cell, plan, tenant, owner
):
    actor = Actor(user=owner)
    create = _created(actor, tenant, plan)
    services.backup_schedule_update(
        actor=actor, instance=create.instance, interval_hours=24, cron="",
        retention_days=3, retention_count=None, enabled=True,
    )  # fmt: skip

    backup = services.instance_action(
        actor=actor, instance=create.instance, verb="backup", request_id=uuid.uuid4().hex
    )

    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    patch = decoded(backup.task_runs.get(node="main.retention").object)
    assert patch["spec"]["backup"]["retentionPolicy"] == "3d"


def test_a_longer_retention_reaches_the_cluster_with_scheduled_backups_off(
    worker, cell, plan, tenant, owner, kube
):
    actor = Actor(user=owner)
    create = _created(actor, tenant, plan)
    instance = create.instance
    backup = services.instance_action(
        actor=actor, instance=instance, verb="backup", request_id=uuid.uuid4().hex
    )
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error

    def policy():
        cluster = instance_object(kube, instance, "postgresql.cnpg.io/v1", "Cluster", instance.pk)
        return cluster["spec"]["backup"]["retentionPolicy"]

    def keep(days: int) -> None:  # scheduled backups off
        services.backup_schedule_update(
            actor=actor, instance=instance, interval_hours=24, cron="",
            retention_days=days, retention_count=None, enabled=False,
            request_id=uuid.uuid4().hex,
        )  # fmt: skip

    assert policy() == "30d"
    keep(90)

    # No backup runs, yet the object store keeps backups as long as the page says.
    wait_for(lambda: policy() == "90d", timeout=30, what="the cluster to keep backups 90 days")
    snapshot = Snapshot.objects.get(instance=instance)
    wait_for(
        lambda: (
            Snapshot.objects.get(pk=snapshot.pk).expires_at == snapshot.taken + timedelta(days=90)
        ),
        what="the backup to expire 90 days after it was taken",
    )
    applied = Operation.objects.get(instance=instance, verb="applyBackupRetention")
    assert wait_done(applied).state == Operation.State.SUCCEEDED, applied.error
    # What the cluster holds now: going back to 30 days is a change to apply again.
    assert BackupSchedule.objects.get(instance=instance).retention_days_applied == 90
    keep(30)
    wait_for(lambda: policy() == "30d", timeout=30, what="the cluster to keep backups 30 days")
