"""After a verb succeeds, what Opsdeck stores is what the cluster runs; a verb refused before
the cluster took any of it leaves the instance as it was. Real worker, sandbox cluster."""

import base64
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from accounts import crypto
from accounts.audit import Actor
from accounts.errors import ActionDenied
from deployments import services
from deployments.models import Instance, Operation, Snapshot, TaskRun
from tests.deployments.conftest import SPEC, instance_object, wait_done, wait_for


def _cluster(kube, instance):
    return instance_object(kube, instance, "postgresql.cnpg.io/v1", "Cluster", instance.pk)


def _password_in_cluster(kube, instance) -> str:
    secret = instance_object(kube, instance, "v1", "Secret", f"{instance.pk}-owner")
    return base64.b64decode(secret["data"]["password"]).decode()


def _create(owner, tenant, plan, **parameters):
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def _act(owner, instance, verb, **parameters):
    return services.instance_action(
        actor=Actor(user=owner), instance=instance, verb=verb,
        request_id=uuid.uuid4().hex, parameters=parameters,
    )  # fmt: skip


def _running(owner, tenant, plan, **parameters):
    create = _create(owner, tenant, plan, **parameters)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def test_a_runs_state_and_rendered_objects_are_stored_compressed(worker, cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error

    with connection.cursor() as cursor:
        cursor.execute("SELECT engine_state FROM deployments_operation WHERE id = %s", [create.pk])
        (stored,) = cursor.fetchone()
        cursor.execute(
            "SELECT object FROM deployments_taskrun WHERE operation_id = %s", [create.pk]
        )
        stored_runs = [token for (token,) in cursor.fetchall()]
    state = Operation.objects.get(pk=create.pk).engine_state
    runs = [run.object for run in TaskRun.objects.filter(operation=create).order_by("node")]
    assert '"kind": "Cluster"' in state
    assert len(stored) < len(crypto.encrypt(state)) * 0.6
    assert sum(map(len, stored_runs)) < sum(len(crypto.encrypt(obj)) for obj in runs) * 0.8


def test_a_modify_queued_behind_a_rotation_keeps_the_new_password(
    worker, cell, plan, tenant, owner, kube
):
    instance = _running(owner, tenant, plan, password="the-first-password")

    rotate = _act(owner, instance, "rotateCredentials", newPassword="the-rotated-password")
    modify = _act(owner, instance, "modify", instances="2")  # queued while the rotation runs

    assert wait_done(rotate).state == Operation.State.SUCCEEDED, rotate.error
    assert wait_done(modify).state == Operation.State.SUCCEEDED, modify.error
    instance.refresh_from_db()
    assert services.instance_parameters(instance)["password"] == "the-rotated-password"
    assert _password_in_cluster(kube, instance) == "the-rotated-password"
    assert _cluster(kube, instance)["spec"]["instances"] == 2


def test_two_queued_modifies_both_take_effect(worker, cell, plan, tenant, owner, kube):
    instance = _running(owner, tenant, plan)

    first = _act(owner, instance, "modify", instances="3")
    second = _act(owner, instance, "modify", cpu="2")

    assert wait_done(first).state == Operation.State.SUCCEEDED, first.error
    assert wait_done(second).state == Operation.State.SUCCEEDED, second.error
    instance.refresh_from_db()
    assert (instance.parameters["instances"], instance.parameters["cpu"]) == (3, 2)
    spec = _cluster(kube, instance)["spec"]
    assert spec["instances"] == 3
    assert spec["resources"]["limits"]["cpu"] == "2"
    assert second.requested == {"cpu": 2}  # an operation stores only what it changes


def test_a_change_the_api_server_refuses_leaves_the_instance_running(
    worker, cell, tenant, owner, kube
):
    # A plan without the whole-number step lets 2.5 through to the cluster, which refuses it.
    text = SPEC.read_text().replace("        x-opsdeck: {step: 1}  # whole servers\n", "")
    plan = services.plan_load(text=text.replace("plan: postgres-cnpg", "plan: pg-loose")).plan
    instance = _running(owner, tenant, plan, instances="2")

    modify = _act(owner, instance, "modify", instances="2.5")

    assert wait_done(modify).state == Operation.State.FAILED
    assert "instances" in modify.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.parameters["instances"] == 2
    assert _cluster(kube, instance)["spec"]["instances"] == 2
    assert instance.history.last().reason == modify.error  # the reason is shown with the state
    restart = _act(owner, instance, "restart")  # and it can be operated as before
    assert wait_done(restart).state == Operation.State.SUCCEEDED, restart.error


def test_storage_grows_every_volume_and_a_shrink_is_refused_with_nothing_changed(
    worker, cell, plan, tenant, owner, kube
):
    instance = _running(owner, tenant, plan, instances="2", storageGi="10")

    grow = _act(owner, instance, "modify", storageGi="15")

    assert wait_done(grow).state == Operation.State.SUCCEEDED, grow.error
    for server in (f"{instance.pk}-1", f"{instance.pk}-2"):
        claim = instance_object(kube, instance, "v1", "PersistentVolumeClaim", server)
        assert claim["spec"]["resources"]["requests"]["storage"] == "15Gi", server

    # The spec marks storage grow-only: refused before anything is queued, as the operator's
    # webhook would refuse it (tested in the sandbox).
    with pytest.raises(ValidationError, match="Can grow, not shrink: it is 15 now"):
        _act(owner, instance, "modify", storageGi="5")

    assert not instance.operations.filter(verb="modify", requested__storageGi=5).exists()
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.parameters["storageGi"] == 15
    assert _cluster(kube, instance)["spec"]["storage"]["size"] == "15Gi"


def test_a_restart_cancelled_after_the_cluster_took_it_is_retried_back_to_running(
    worker, cell, plan, tenant, owner
):
    instance = _running(owner, tenant, plan)
    # What a cancel of a restart under way leaves: the run cancelled, the instance failed.
    Operation.objects.create(
        instance=instance, verb="restart", request_id="cancelled", state="cancelled",
        plan_version=instance.plan_version, started_at=timezone.now(), finished_at=timezone.now(),
    )  # fmt: skip
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.FAILED)
    with pytest.raises(ActionDenied, match="start needs it to be stopped"):
        _act(owner, instance, "start")  # only the verb that failed it runs from failed

    retry = _act(owner, instance, "restart")

    assert wait_done(retry).state == Operation.State.SUCCEEDED, retry.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING


def test_a_failed_create_can_be_retried(request, cell, plan, tenant, owner, sandbox_cluster):
    create = _create(owner, tenant, plan)
    instance = create.instance
    sandbox_cluster.set_faults(fail_bootstrap=[f"{instance.namespace}/{instance.pk}"])
    try:
        request.getfixturevalue("worker")  # the create runs once the fault is in place
        assert wait_done(create).state == Operation.State.FAILED
        instance.refresh_from_db()
        assert instance.state == Instance.State.FAILED
    finally:
        sandbox_cluster.set_faults(fail_bootstrap=[])

    retry = _act(owner, instance, "create")

    assert retry.verb == "create"
    assert wait_done(retry).state == Operation.State.SUCCEEDED, retry.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    with pytest.raises(ActionDenied, match="is for an instance that has failed"):
        _act(owner, instance, "create")  # a running instance has nothing to retry


def test_an_operation_shows_the_cluster_error_while_it_retries(
    worker, cell, plan, tenant, owner, sandbox_cluster
):
    instance = _running(owner, tenant, plan)
    sandbox_cluster.set_faults(error_500=1.0)
    try:
        restart = _act(owner, instance, "restart")

        def retrying():
            restart.refresh_from_db()
            return restart.error.startswith("Retrying after a cluster error:")

        wait_for(retrying, timeout=30, what="the retried error to show")
        assert restart.state == Operation.State.RUNNING
    finally:
        sandbox_cluster.set_faults(error_500=0.0)
    assert wait_done(restart).state == Operation.State.SUCCEEDED, restart.error
    assert restart.error == ""


def test_a_restore_keeps_the_snapshots_version_after_its_source_is_gone(
    worker, cell, plan, tenant, owner
):
    source = _running(owner, tenant, plan, version="16", instances="2")
    backup = _act(owner, source, "backup")
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    snapshot = Snapshot.objects.get(operation=backup)
    assert snapshot.parameters["version"] == "16"
    assert "password" not in snapshot.parameters
    delete = services.instance_delete(actor=Actor(user=owner), instance=source, request_id="d")
    assert wait_done(delete).state == Operation.State.SUCCEEDED, delete.error

    with pytest.raises(ValidationError) as refused:
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r-1",
            parameters={"version": "17"},
        )  # fmt: skip
    assert refused.value.message_dict["version"] == ["Fixed by the backup, which holds 16."]

    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="r-2",
        parameters={"instances": "1"},
    )  # fmt: skip
    assert wait_done(restore).state == Operation.State.SUCCEEDED, restore.error
    copy = Instance.objects.get(pk=restore.instance_id)
    assert (copy.parameters["version"], copy.parameters["instances"]) == ("16", 1)
