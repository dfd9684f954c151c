"""Instances through their whole life: services, a real Celery worker, the sandbox cluster."""

import uuid

from django.db import connection

from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import services
from deployments.models import Instance, Operation, Snapshot
from tests.deployments.conftest import wait_done


def _cluster(kube, instance):
    return kube.get({
        "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
        "metadata": {"name": instance.pk, "namespace": instance.namespace},
    })  # fmt: skip


def _get(kube, api, kind, name, namespace):
    return kube.get({"apiVersion": api, "kind": kind,
                     "metadata": {"name": name, "namespace": namespace}})  # fmt: skip


def _act(owner, instance, verb, **parameters):
    return services.instance_action(
        actor=Actor(user=owner),
        instance=instance,
        verb=verb,
        request_id=uuid.uuid4().hex,
        parameters=parameters or None,
    )


def test_an_instance_is_created_scaled_stopped_started_backed_up_and_deleted(
    worker, cell, plan, tenant, owner, kube
):
    op = services.instance_create(
        actor=Actor(user=owner),
        tenant=tenant,
        plan=plan,
        name="orders",
        parameters={"instances": "1", "database": "orders", "owner": "shop"},
        request_id="req-1",
    )
    instance = op.instance
    assert instance.pk.startswith("inst-") and len(instance.pk) == 13

    assert wait_done(op).state == Operation.State.SUCCEEDED, op.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.outputs["phase"] == "Cluster in healthy state"
    assert instance.outputs["writeService"] == f"{instance.pk}-rw"
    cluster = _cluster(kube, instance)
    assert cluster["spec"]["instances"] == 1
    assert cluster["spec"]["bootstrap"]["initdb"]["database"] == "orders"
    assert cluster["spec"]["backup"]["barmanObjectStore"]["destinationPath"] == (
        f"s3://sandbox-backups/opsdeck/{tenant.slug}/{instance.pk}"
    )
    namespace = _get(kube, "v1", "Namespace", instance.namespace, None)
    assert namespace["metadata"]["labels"]["opsdeck.io/tenant"] == tenant.slug
    assert _get(kube, "v1", "ResourceQuota", "opsdeck-quota", instance.namespace)
    assert _get(
        kube, "networking.k8s.io/v1", "NetworkPolicy", "opsdeck-isolation", instance.namespace
    )
    owner_secret = _get(kube, "v1", "Secret", f"{instance.pk}-owner", instance.namespace)
    assert owner_secret["type"] == "kubernetes.io/basic-auth"
    # The generated password is stored encrypted, never in the plain parameters.
    assert "password" not in instance.parameters
    assert len(services.instance_parameters(instance)["password"]) >= 12

    modify = _act(owner, instance, "modify", instances="3")
    assert wait_done(modify).state == Operation.State.SUCCEEDED, modify.error
    assert _cluster(kube, instance)["status"]["readyInstances"] == 3
    instance.refresh_from_db()
    assert instance.parameters["instances"] == 3

    stop = _act(owner, instance, "stop")
    assert wait_done(stop).state == Operation.State.SUCCEEDED, stop.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED
    assert instance.outputs["readyInstances"] == "0"  # its outputs say no server runs

    start = _act(owner, instance, "start")
    assert wait_done(start).state == Operation.State.SUCCEEDED, start.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.outputs["readyInstances"] == "3"

    backup = _act(owner, instance, "backup")
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    snapshot = Snapshot.objects.get(instance=instance)
    assert snapshot.status == Snapshot.Status.COMPLETED
    assert snapshot.metadata["backupId"]
    assert snapshot.metadata["serverName"] == instance.pk

    delete = services.instance_delete(
        actor=Actor(user=owner), instance=instance, request_id="req-delete"
    )
    assert wait_done(delete).state == Operation.State.SUCCEEDED, delete.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.DELETED
    assert _cluster(kube, instance) is None
    states = list(instance.history.values_list("to_state", flat=True))
    assert states == [
        "creating", "running", "updating", "running", "updating", "stopped",
        "updating", "running", "deleting", "deleted",
    ]  # fmt: skip


def test_a_repeated_request_returns_the_same_operation(worker, cell, plan, tenant, owner):
    first = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="a", parameters={},
        request_id="same",
    )  # fmt: skip
    again = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="a", parameters={},
        request_id="same",
    )  # fmt: skip

    assert again.pk == first.pk
    assert Instance.objects.filter(tenant=tenant).count() == 1
    wait_done(first)


def test_the_deployments_page_lists_the_tenants_instances_only(
    worker, cell, plan, tenant, owner, client, make_user
):
    mine = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders", parameters={},
        request_id="page-1",
    )  # fmt: skip
    stranger = make_user("other@example.com")
    from accounts import services as accounts_services

    other = accounts_services.tenant_create(actor=Actor(user=stranger), name="Other")
    services.instance_create(
        actor=Actor(user=stranger), tenant=other, plan=plan, name="secret-db", parameters={},
        request_id="page-2",
    )  # fmt: skip
    wait_done(mine)
    client.force_login(owner)

    page = client.get(f"/t/{tenant.slug}/deployments/")
    dashboard = client.get(f"/t/{tenant.slug}/")

    assert b"orders" in page.content
    assert mine.instance_id.encode() in page.content
    assert b"secret-db" not in page.content
    assert b'<span class="figure">1</span>' in dashboard.content


def test_restart_failover_and_custom_verbs_run_through_the_worker(
    worker, cell, plan, tenant, owner, kube
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="ha",
        parameters={"instances": "2"}, request_id="ha-1",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    instance = create.instance

    restart = _act(owner, instance, "restart")
    assert wait_done(restart).state == Operation.State.SUCCEEDED, restart.error
    pods = [_get(kube, "v1", "Pod", f"{instance.pk}-{n}", instance.namespace) for n in (1, 2)]
    assert all(
        p["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] for p in pods
    )  # every server went through the restart

    failover = _act(owner, instance, "failover")
    assert wait_done(failover).state == Operation.State.SUCCEEDED, failover.error
    assert failover.outputs["primary"] == f"{instance.pk}-2"
    assert _cluster(kube, instance)["status"]["currentPrimary"] == f"{instance.pk}-2"
    # Scaled down and up again, the servers are -2 and -3: the switchover promotes the replica
    # there is, not a server by a fixed name (it waited 30 minutes on a -1 that was gone).
    for servers in ("1", "2"):
        modify = _act(owner, instance, "modify", instances=servers)
        assert wait_done(modify).state == Operation.State.SUCCEEDED, modify.error
    assert sorted(_cluster(kube, instance)["status"]["instanceNames"]) == [
        f"{instance.pk}-2", f"{instance.pk}-3",
    ]  # fmt: skip
    again = _act(owner, instance, "failover")
    assert wait_done(again, timeout=60).state == Operation.State.SUCCEEDED, again.error
    assert again.outputs["primary"] == f"{instance.pk}-3"

    rotate = _act(owner, instance, "rotateCredentials", newPassword="a-new-password-123")
    assert wait_done(rotate).state == Operation.State.SUCCEEDED, rotate.error
    rotated = rotate.task_runs.get(node="rotate")
    assert "a-new-password-123" in rotated.object
    assert "a-new-password-123" not in str(AuditEvent.objects.values_list("payload", flat=True))
    with connection.cursor() as cursor:  # what the database holds: no password in the clear
        cursor.execute(
            "SELECT arguments::text, secret_parameters FROM deployments_operation WHERE id = %s",
            [rotate.pk],
        )
        assert "a-new-password-123" not in "".join(cursor.fetchone())

    reload = _act(owner, instance, "reloadConfiguration")
    assert wait_done(reload).state == Operation.State.SUCCEEDED, reload.error
    annotations = _cluster(kube, instance)["metadata"]["annotations"]
    assert annotations["cnpg.io/reloadedAt"]
