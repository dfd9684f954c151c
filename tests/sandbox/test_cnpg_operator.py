"""The simulated CloudNativePG operator, step by step, through the official client."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json

import pytest
from kubernetes import client, watch

G, V = "postgresql.cnpg.io", "v1"


def cluster(name: str, instances: int = 3, **spec: object) -> dict:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"instances": instances, "storage": {"size": "1Gi"}, **spec},
    }


def with_store(name: str, instances: int = 1, path: str = "s3://backups/", **spec: object) -> dict:
    return cluster(name, instances, backup={"barmanObjectStore": {"destinationPath": path}}, **spec)


def get(custom, ns, plural, name):
    return custom.get_namespaced_custom_object(G, V, ns, plural, name)


def create(custom, ns, plural, body):
    return custom.create_namespaced_custom_object(G, V, ns, plural, body)


def backup(name: str, cluster_name: str) -> dict:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Backup",
        "metadata": {"name": name},
        "spec": {"cluster": {"name": cluster_name}},
    }


def events(core_v1, ns, name):
    return [
        (e.type, e.reason, e.message)
        for e in core_v1.list_namespaced_event(
            ns, field_selector=f"involvedObject.name={name}"
        ).items
    ]


def condition(obj, ctype):
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


def test_bootstrap_goes_through_the_documented_phases(custom, core_v1, namespace, sandbox):
    w = watch.Watch()
    rv = create(custom, namespace, "clusters", cluster("pg"))["metadata"]["resourceVersion"]
    phases = []
    for event in w.stream(
        custom.list_namespaced_custom_object,
        G,
        V,
        namespace,
        "clusters",
        resource_version=rv,
        timeout_seconds=10,
    ):
        phase = (event["object"].get("status") or {}).get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if phase == "Cluster in healthy state":
            w.stop()
    assert phases == ["Setting up primary", "Creating a new replica", "Cluster in healthy state"]
    sandbox.run_until_idle()
    status = get(custom, namespace, "clusters", "pg")["status"]
    assert status["instances"] == 3 and status["readyInstances"] == 3
    assert status["currentPrimary"] == "pg-1" and status["targetPrimary"] == "pg-1"
    assert status["instanceNames"] == ["pg-1", "pg-2", "pg-3"]
    assert (status["writeService"], status["readService"]) == ("pg-rw", "pg-r")
    assert status["image"].startswith("ghcr.io/cloudnative-pg/postgresql:")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ClusterIsReady")
    assert ("Normal", "ClusterReady", "Cluster is ready") in events(core_v1, namespace, "pg")


def test_cluster_objects_secrets_services_pods_pvcs(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("db", 2, enableSuperuserAccess=True))
    sandbox.run_until_idle()
    app = core_v1.read_namespaced_secret("db-app", namespace)
    assert app.type == "kubernetes.io/basic-auth"
    data = {k: base64.b64decode(v).decode() for k, v in app.data.items()}
    assert set(data) == {
        "username",
        "user",
        "password",
        "dbname",
        "host",
        "port",
        "pgpass",
        "uri",
        "jdbc-uri",
        "fqdn-uri",
        "fqdn-jdbc-uri",
    }
    assert (data["username"], data["dbname"], data["host"], data["port"]) == (
        "app",
        "app",
        "db-rw",
        "5432",
    )
    assert data["uri"] == f"postgresql://app:{data['password']}@db-rw.{namespace}:5432/app"
    superuser = core_v1.read_namespaced_secret("db-superuser", namespace)
    assert base64.b64decode(superuser.data["username"]).decode() == "postgres"
    services = {s.metadata.name: s for s in core_v1.list_namespaced_service(namespace).items}
    assert set(services) == {"db-rw", "db-ro", "db-r"}
    assert services["db-rw"].spec.ports[0].port == 5432
    assert services["db-rw"].spec.selector["cnpg.io/instanceRole"] == "primary"
    pods = {
        p.metadata.name: p
        for p in core_v1.list_namespaced_pod(namespace, label_selector="cnpg.io/cluster=db").items
    }
    assert {n: p.metadata.labels["cnpg.io/instanceRole"] for n, p in pods.items()} == {
        "db-1": "primary",
        "db-2": "replica",
    }
    assert all(p.status.phase == "Running" for p in pods.values())
    pvcs = [
        p.metadata.name for p in core_v1.list_namespaced_persistent_volume_claim(namespace).items
    ]
    assert pvcs == ["db-1", "db-2"]


def test_no_superuser_secret_unless_enabled_and_user_app_secret_respected(
    custom, core_v1, namespace, sandbox
):
    core_v1.create_namespaced_secret(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "mine"},
            "type": "kubernetes.io/basic-auth",
            "stringData": {"username": "app", "password": "pw"},
        },
    )
    create(
        custom,
        namespace,
        "clusters",
        cluster(
            "own",
            1,
            bootstrap={"initdb": {"database": "app", "owner": "app", "secret": {"name": "mine"}}},
        ),
    )
    sandbox.run_until_idle()
    names = {s.metadata.name for s in core_v1.list_namespaced_secret(namespace).items}
    assert "own-app" not in names and "own-superuser" not in names


def test_scale_up_and_down(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("sc", 1))
    sandbox.run_until_idle()
    custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "sc", {"spec": {"instances": 3}}
    )
    sandbox.run_until_idle()
    status = get(custom, namespace, "clusters", "sc")["status"]
    assert (status["readyInstances"], status["instanceNames"]) == (3, ["sc-1", "sc-2", "sc-3"])
    custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "sc", {"spec": {"instances": 1}}
    )
    sandbox.run_until_idle()
    status = get(custom, namespace, "clusters", "sc")["status"]
    assert (status["instances"], status["readyInstances"], status["instanceNames"]) == (
        1,
        1,
        ["sc-1"],
    )
    assert [p.metadata.name for p in core_v1.list_namespaced_pod(namespace).items] == ["sc-1"]
    assert [
        p.metadata.name for p in core_v1.list_namespaced_persistent_volume_claim(namespace).items
    ] == ["sc-1"]


def test_image_upgrade_rolls_replicas_first_then_primary(custom, core_v1, namespace, sandbox):
    create(
        custom,
        namespace,
        "clusters",
        cluster("up", 3, imageName="ghcr.io/cloudnative-pg/postgresql:17.0"),
    )
    sandbox.run_until_idle()
    rv = core_v1.list_namespaced_pod(namespace).metadata.resource_version
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "up",
        {"spec": {"imageName": "ghcr.io/cloudnative-pg/postgresql:17.2"}},
    )
    sandbox.run_until_idle()
    order = []
    phases = set()
    for event in watch.Watch().stream(
        core_v1.list_namespaced_pod, namespace, resource_version=rv, timeout_seconds=1
    ):
        pod = event["object"]
        if pod.spec.containers[0].image.endswith(":17.2") and pod.metadata.name not in order:
            order.append(pod.metadata.name)
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        G,
        V,
        namespace,
        "clusters",
        resource_version=rv,
        timeout_seconds=1,
    ):
        phases.add(event["object"]["status"]["phase"])
    assert order[-1] == "up-1" and set(order) == {"up-1", "up-2", "up-3"}
    assert "Upgrading cluster" in phases
    status = get(custom, namespace, "clusters", "up")["status"]
    assert status["image"].endswith(":17.2") and status["phase"] == "Cluster in healthy state"


def test_hibernation_deletes_pods_keeps_pvcs_and_rehydrates(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("hib", 2))
    sandbox.run_until_idle()
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "hib",
        {"metadata": {"annotations": {"cnpg.io/hibernation": "on"}}},
    )
    sandbox.run_until_idle()
    obj = get(custom, namespace, "clusters", "hib")
    hib = condition(obj, "cnpg.io/hibernation")
    assert (hib["status"], hib["reason"]) == ("True", "Hibernated")
    assert (
        obj["status"]["phase"] == "Cluster in healthy state"
        and obj["status"]["readyInstances"] == 0
    )
    assert core_v1.list_namespaced_pod(namespace).items == []
    assert len(core_v1.list_namespaced_persistent_volume_claim(namespace).items) == 2
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "hib",
        {"metadata": {"annotations": {"cnpg.io/hibernation": "off"}}},
    )
    sandbox.run_until_idle()
    obj = get(custom, namespace, "clusters", "hib")
    assert obj["status"]["readyInstances"] == 2
    assert condition(obj, "cnpg.io/hibernation")["status"] == "False"
    assert len(core_v1.list_namespaced_pod(namespace).items) == 2


def test_restart_annotation_restarts_every_instance(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("rs", 2))
    sandbox.run_until_idle()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "rs",
        {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}},
    )
    sandbox.run_until_idle()
    for pod in core_v1.list_namespaced_pod(namespace).items:
        assert pod.metadata.annotations["kubectl.kubernetes.io/restartedAt"] == stamp
        assert pod.status.container_statuses[0].restart_count == 1
    assert get(custom, namespace, "clusters", "rs")["status"]["phase"] == "Cluster in healthy state"


def test_switchover_through_status_target_primary(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("sw", 3))
    sandbox.run_until_idle()
    current = get(custom, namespace, "clusters", "sw")
    custom.patch_namespaced_custom_object_status(
        G,
        V,
        namespace,
        "clusters",
        "sw",
        {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "status": {"targetPrimary": "sw-2"},
        },
    )
    sandbox.run_until_idle()
    status = get(custom, namespace, "clusters", "sw")["status"]
    assert (status["currentPrimary"], status["targetPrimary"], status["phase"]) == (
        "sw-2",
        "sw-2",
        "Cluster in healthy state",
    )
    roles = {
        p.metadata.name: p.metadata.labels["cnpg.io/instanceRole"]
        for p in core_v1.list_namespaced_pod(namespace).items
    }
    assert roles == {"sw-1": "replica", "sw-2": "primary", "sw-3": "replica"}
    assert any(r == "SwitchoverCompleted" for _, r, _ in events(core_v1, namespace, "sw"))


def test_backup_completes_with_all_status_fields(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", with_store("bk", path=f"s3://{namespace}/"))
    sandbox.run_until_idle()
    create(custom, namespace, "backups", backup("bk-1", "bk"))
    sandbox.run_until_idle()
    status = get(custom, namespace, "backups", "bk-1")["status"]
    assert status["phase"] == "completed"
    for key in ("backupId", "startedAt", "stoppedAt", "beginLSN", "endLSN", "beginWal", "endWal"):
        assert status[key]
    assert (status["destinationPath"], status["serverName"], status["method"]) == (
        f"s3://{namespace}/",
        "bk",
        "barmanObjectStore",
    )
    assert status["instanceID"]["podName"] == "bk-1"
    assert (
        condition(get(custom, namespace, "clusters", "bk"), "LastBackupSucceeded")["status"]
        == "True"
    )


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        ("missing", 'while getting cluster nope: clusters.postgresql.cnpg.io "nope" not found'),
        ("no-store", "cannot proceed with the backup as the cluster has no backup section"),
        ("hibernated", "cannot backup a hibernated cluster"),
        ("unhealthy", "cannot proceed with the backup as the cluster is not in a healthy state"),
    ],
)
def test_backup_fails_with_error(custom, namespace, sandbox, setup, error):
    target = "nope"
    if setup == "no-store":
        create(custom, namespace, "clusters", cluster("plain", 1))
        target = "plain"
    elif setup == "hibernated":
        body = with_store("sleepy")
        body["metadata"]["annotations"] = {"cnpg.io/hibernation": "on"}
        create(custom, namespace, "clusters", body)
        target = "sleepy"
    elif setup == "unhealthy":
        sandbox.set_faults(fail_bootstrap=[f"{namespace}/broken"])
        create(custom, namespace, "clusters", with_store("broken"))
        target = "broken"
    sandbox.run_until_idle()
    try:
        create(custom, namespace, "backups", backup("b", target))
        sandbox.run_until_idle()
    finally:
        sandbox.set_faults(fail_bootstrap=[])
    status = get(custom, namespace, "backups", "b")["status"]
    assert (status["phase"], status["error"]) == ("failed", error)


def test_injected_backup_failures_then_success(custom, namespace, sandbox):
    create(custom, namespace, "clusters", with_store("flaky", path=f"s3://{namespace}/"))
    sandbox.run_until_idle()
    sandbox.set_faults(fail_backups=1)
    create(custom, namespace, "backups", backup("one", "flaky"))
    sandbox.run_until_idle()
    create(custom, namespace, "backups", backup("two", "flaky"))
    sandbox.run_until_idle()
    assert get(custom, namespace, "backups", "one")["status"]["phase"] == "failed"
    assert get(custom, namespace, "backups", "two")["status"]["phase"] == "completed"


def test_bootstrap_fault_leaves_cluster_unhealthy_with_event(custom, core_v1, namespace, sandbox):
    sandbox.set_faults(fail_bootstrap=[f"{namespace}/bad"])
    try:
        create(custom, namespace, "clusters", cluster("bad", 1))
        sandbox.run_until_idle()
        obj = get(custom, namespace, "clusters", "bad")
    finally:
        sandbox.set_faults(fail_bootstrap=[])
    assert obj["status"]["phase"] == "Unable to create required cluster objects"
    assert condition(obj, "Ready")["status"] == "False"
    assert any(
        t == "Warning" and r == "BootstrapFailed" for t, r, _ in events(core_v1, namespace, "bad")
    )


def test_scheduled_backup_creates_named_backups(custom, namespace, sandbox):
    create(custom, namespace, "clusters", with_store("sched", path=f"s3://{namespace}/"))
    sandbox.run_until_idle()
    create(
        custom,
        namespace,
        "scheduledbackups",
        {
            "apiVersion": f"{G}/{V}",
            "kind": "ScheduledBackup",
            "metadata": {"name": "nightly"},
            "spec": {
                "schedule": "0 0 0 * * *",
                "immediate": True,
                "backupOwnerReference": "self",
                "cluster": {"name": "sched"},
            },
        },
    )
    sandbox.run_until_idle()
    backups = custom.list_namespaced_custom_object(G, V, namespace, "backups")["items"]
    assert len(backups) == 1
    made = backups[0]
    assert (
        made["metadata"]["name"].startswith("nightly-")
        and len(made["metadata"]["name"]) == len("nightly-") + 14
    )
    assert made["metadata"]["labels"]["cnpg.io/scheduled-backup"] == "nightly"
    assert made["metadata"]["labels"]["cnpg.io/cluster"] == "sched"
    assert made["metadata"]["ownerReferences"][0]["kind"] == "ScheduledBackup"
    status = get(custom, namespace, "scheduledbackups", "nightly")["status"]
    assert status["nextScheduleTime"].endswith("T00:00:00Z")
    assert status["lastScheduleTime"] and status["lastCheckTime"]


def test_deleting_a_backup_object_keeps_the_data(custom, namespace, sandbox):
    create(custom, namespace, "clusters", with_store("keep", path=f"s3://{namespace}-keep/"))
    sandbox.run_until_idle()
    create(custom, namespace, "backups", backup("kb", "keep"))
    sandbox.run_until_idle()
    backup_id = get(custom, namespace, "backups", "kb")["status"]["backupId"]
    custom.delete_namespaced_custom_object(G, V, namespace, "backups", "kb")
    stored = sandbox.object_store[f"s3://{namespace}-keep/"]["keep"]["backups"]
    assert [b["backupId"] for b in stored] == [backup_id]


def test_retention_policy_prunes_old_backups(custom, namespace, sandbox):
    path = f"s3://{namespace}-ret/"
    create(custom, namespace, "clusters", with_store("ret", path=path))
    sandbox.run_until_idle()
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%SZ")
    sandbox.object_store[path]["ret"]["backups"].append(
        {"backupId": "20200101T000000", "startedAt": old, "stoppedAt": old}
    )
    custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "ret", {"spec": {"backup": {"retentionPolicy": "30d"}}}
    )
    create(custom, namespace, "backups", backup("fresh", "ret"))
    sandbox.run_until_idle()
    ids = [b["backupId"] for b in sandbox.object_store[path]["ret"]["backups"]]
    assert "20200101T000000" not in ids and len(ids) == 1


def test_restore_from_backup_name_in_same_namespace(custom, namespace, sandbox):
    create(custom, namespace, "clusters", with_store("origin", path=f"s3://{namespace}-r/"))
    sandbox.run_until_idle()
    create(custom, namespace, "backups", backup("snap", "origin"))
    sandbox.run_until_idle()
    create(
        custom,
        namespace,
        "clusters",
        cluster("copy", 1, bootstrap={"recovery": {"backup": {"name": "snap"}}}),
    )
    sandbox.run_until_idle()
    assert (
        get(custom, namespace, "clusters", "copy")["status"]["phase"] == "Cluster in healthy state"
    )


def test_restore_without_usable_backup_stays_unhealthy_and_says_why(
    custom, core_v1, namespace, sandbox
):
    create(
        custom,
        namespace,
        "clusters",
        cluster("orphan", 1, bootstrap={"recovery": {"backup": {"name": "missing"}}}),
    )
    sandbox.run_until_idle()
    obj = get(custom, namespace, "clusters", "orphan")
    why = f"Backup object {namespace}/missing not found"
    assert (obj["status"]["phase"], obj["status"]["phaseReason"]) == ("Setting up primary", why)
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ClusterIsNotReady",
        why,
    )
    assert ("Warning", "ErrorNoBackup", why) in events(core_v1, namespace, "orphan")
    assert core_v1.list_namespaced_pod(namespace).items == []


def test_backup_restored_into_another_namespace_after_the_first_is_deleted(
    custom, core_v1, sandbox
):
    for ns in ("src-ns", "dst-ns"):
        core_v1.create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
    path = "s3://cross-namespace/"
    create(custom, "src-ns", "clusters", with_store("inst-a", path=path))
    sandbox.run_until_idle()
    create(custom, "src-ns", "backups", backup("last", "inst-a"))
    sandbox.run_until_idle()
    backup_id = get(custom, "src-ns", "backups", "last")["status"]["backupId"]
    core_v1.delete_namespace("src-ns")
    sandbox.run_until_idle()
    with pytest.raises(client.ApiException):
        core_v1.read_namespace("src-ns")
    restore = cluster(
        "inst-b",
        1,
        bootstrap={"recovery": {"source": "origin", "recoveryTarget": {"backupID": backup_id}}},
        externalClusters=[
            {
                "name": "origin",
                "barmanObjectStore": {"destinationPath": path, "serverName": "inst-a"},
            }
        ],
    )
    create(custom, "dst-ns", "clusters", restore)
    sandbox.run_until_idle()
    status = get(custom, "dst-ns", "clusters", "inst-b")["status"]
    assert status["phase"] == "Cluster in healthy state" and status["readyInstances"] == 1
    core_v1.delete_namespace("dst-ns")
    sandbox.run_until_idle()


def test_point_in_time_restore_needs_a_backup_before_the_target(
    custom, core_v1, namespace, sandbox
):
    path = f"s3://{namespace}-pitr/"
    create(custom, namespace, "clusters", with_store("pitr", path=path))
    sandbox.run_until_idle()
    create(custom, namespace, "backups", backup("p1", "pitr"))
    sandbox.run_until_idle()
    external = [
        {"name": "origin", "barmanObjectStore": {"destinationPath": path, "serverName": "pitr"}}
    ]
    early = cluster(
        "too-early",
        1,
        bootstrap={
            "recovery": {
                "source": "origin",
                "recoveryTarget": {"targetTime": "2020-11-26 15:22:00.00000+00"},
            }
        },
        externalClusters=external,
    )
    create(custom, namespace, "clusters", early)
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fine = cluster(
        "in-time",
        1,
        bootstrap={"recovery": {"source": "origin", "recoveryTarget": {"targetTime": later}}},
        externalClusters=external,
    )
    create(custom, namespace, "clusters", fine)
    sandbox.run_until_idle()
    # Its restore Job finds nothing to restore, retries, then fails for good.
    status = get(custom, namespace, "clusters", "too-early")["status"]
    assert (status["phase"], status["phaseReason"]) == (
        "Cluster is unrecoverable and needs manual intervention",
        "Instance creation failed for the following jobs: too-early-1-full-recovery."
        " Check the job logs to investigate the cause of the failure.",
    )
    why = "too-early-1-full-recovery: no target backup found before 2020-11-26 15:22:00.00000+00"
    assert ("Warning", "ErrorNoBackup", why) in events(core_v1, namespace, "too-early")
    assert (
        get(custom, namespace, "clusters", "in-time")["status"]["phase"]
        == "Cluster in healthy state"
    )


def test_frozen_operator_does_nothing_until_thawed(custom, namespace, sandbox):
    sandbox.set_faults(frozen=["cnpg"])
    try:
        create(custom, namespace, "clusters", cluster("ice", 1))
        sandbox.run_until_idle()
        assert "status" not in get(custom, namespace, "clusters", "ice")
    finally:
        sandbox.set_faults(frozen=[])
    sandbox.run_until_idle()
    assert (
        get(custom, namespace, "clusters", "ice")["status"]["phase"] == "Cluster in healthy state"
    )


def test_supervised_primary_update_waits_for_the_user(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("sup", 2, primaryUpdateStrategy="supervised"))
    sandbox.run_until_idle()
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "sup",
        {"spec": {"imageName": "ghcr.io/cloudnative-pg/postgresql:18.2"}},
    )
    sandbox.run_until_idle()
    status = get(custom, namespace, "clusters", "sup")["status"]
    assert status["phase"] == "Waiting for user action"
    images = {
        p.metadata.name: p.spec.containers[0].image
        for p in core_v1.list_namespaced_pod(namespace).items
    }
    assert images["sup-2"].endswith(":18.2") and not images["sup-1"].endswith(":18.2")


def test_primary_update_by_switchover_promotes_an_upgraded_replica(
    custom, core_v1, namespace, sandbox
):
    create(custom, namespace, "clusters", cluster("swu", 2, primaryUpdateMethod="switchover"))
    sandbox.run_until_idle()
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "swu",
        {"spec": {"imageName": "ghcr.io/cloudnative-pg/postgresql:18.2"}},
    )
    sandbox.run_until_idle()
    status = get(custom, namespace, "clusters", "swu")["status"]
    assert (status["phase"], status["currentPrimary"]) == ("Cluster in healthy state", "swu-2")
    assert all(
        p.spec.containers[0].image.endswith(":18.2")
        for p in core_v1.list_namespaced_pod(namespace).items
    )


def test_every_second_schedule_keeps_making_backups_until_suspended(custom, namespace, sandbox):
    import time

    create(custom, namespace, "clusters", with_store("tick", path=f"s3://{namespace}-tick/"))
    sandbox.run_until_idle()
    create(
        custom,
        namespace,
        "scheduledbackups",
        {
            "apiVersion": f"{G}/{V}",
            "kind": "ScheduledBackup",
            "metadata": {"name": "often"},
            "spec": {
                "schedule": "* * * * * *",
                "cluster": {"name": "tick"},
                "backupOwnerReference": "cluster",
            },
        },
    )
    deadline = time.monotonic() + 10
    while len(custom.list_namespaced_custom_object(G, V, namespace, "backups")["items"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    custom.patch_namespaced_custom_object(
        G, V, namespace, "scheduledbackups", "often", {"spec": {"suspend": True}}
    )
    sandbox.run_until_idle()
    count = len(custom.list_namespaced_custom_object(G, V, namespace, "backups")["items"])
    time.sleep(1.2)
    sandbox.run_until_idle()
    made = custom.list_namespaced_custom_object(G, V, namespace, "backups")["items"]
    assert len(made) == count
    assert all(b["metadata"]["ownerReferences"][0]["kind"] == "Cluster" for b in made)


def test_deleting_the_primary_pod_fails_over(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("fo", 3))
    sandbox.run_until_idle()
    rv = get(custom, namespace, "clusters", "fo")["metadata"]["resourceVersion"]
    core_v1.delete_namespaced_pod("fo-1", namespace)
    sandbox.run_until_idle()
    seen = [
        (e["object"]["status"]["phase"], e["object"]["status"].get("targetPrimary"))
        for e in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            namespace,
            "clusters",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert ("Failing over", "pending") in seen
    status = get(custom, namespace, "clusters", "fo")["status"]
    assert (status["currentPrimary"], status["phase"], status["readyInstances"]) == (
        "fo-2",
        "Cluster in healthy state",
        3,
    )
    roles = {
        p.metadata.name: p.metadata.labels["cnpg.io/instanceRole"]
        for p in core_v1.list_namespaced_pod(namespace).items
    }
    assert roles == {"fo-1": "replica", "fo-2": "primary", "fo-3": "replica"}


def test_changing_postgresql_parameters_applies_configuration(custom, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("cfg", 2))
    sandbox.run_until_idle()
    rv = get(custom, namespace, "clusters", "cfg")["metadata"]["resourceVersion"]
    patch = {"spec": {"postgresql": {"parameters": {"max_connections": "200"}}}}
    custom.patch_namespaced_custom_object(G, V, namespace, "clusters", "cfg", patch)
    sandbox.run_until_idle()
    phases = [
        e["object"]["status"]["phase"]
        for e in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            namespace,
            "clusters",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert "Applying configuration" in phases
    assert phases[-1] == "Cluster in healthy state"


def test_volume_snapshot_backup_goes_through_finalizing(custom, namespace, sandbox):
    create(
        custom,
        namespace,
        "clusters",
        cluster("snap", 1, backup={"volumeSnapshot": {"className": "csi"}}),
    )
    sandbox.run_until_idle()
    body = backup("vs", "snap")
    body["spec"]["method"] = "volumeSnapshot"
    rv = create(custom, namespace, "backups", body)["metadata"]["resourceVersion"]
    sandbox.run_until_idle()
    phases = [
        (e["object"].get("status") or {}).get("phase")
        for e in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            G,
            V,
            namespace,
            "backups",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert phases == ["pending", "running", "finalizing", "completed"]
    assert "destinationPath" not in get(custom, namespace, "backups", "vs")["status"]


def test_defaulting_webhook_fills_initdb(custom, namespace):
    created = create(custom, namespace, "clusters", cluster("dflt", 1))
    assert created["spec"]["bootstrap"] == {"initdb": {"database": "app", "owner": "app"}}
    own = create(
        custom,
        namespace,
        "clusters",
        cluster("own-db", 1, bootstrap={"initdb": {"database": "shop"}}),
    )
    assert own["spec"]["bootstrap"]["initdb"] == {"database": "shop", "owner": "shop"}


def test_a_larger_storage_size_grows_every_claim(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("grow", 2))
    sandbox.run_until_idle()

    custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "grow", {"spec": {"storage": {"size": "3Gi"}}}
    )
    sandbox.run_until_idle()

    claims = core_v1.list_namespaced_persistent_volume_claim(namespace).items
    assert [(c.metadata.name, c.spec.resources.requests["storage"]) for c in claims] == [
        ("grow-1", "3Gi"),
        ("grow-2", "3Gi"),
    ]
    assert [c.status.capacity["storage"] for c in claims] == ["3Gi", "3Gi"]  # expanded
    assert get(custom, namespace, "clusters", "grow")["status"]["phase"] == (
        "Cluster in healthy state"
    )


def test_the_validating_webhook_refuses_a_smaller_storage_size(custom, core_v1, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("shrink", 1, storage={"size": "2Gi"}))
    sandbox.run_until_idle()

    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object(
            G, V, namespace, "clusters", "shrink", {"spec": {"storage": {"size": "1Gi"}}}
        )

    assert refused.value.status == 422
    assert json.loads(refused.value.body)["message"] == (
        'admission webhook "vcluster.cnpg.io" denied the request: Cluster.postgresql.cnpg.io '
        '"shrink" is invalid: spec.storage.size: Invalid value: "1Gi": '
        "can't shrink existing storage from 2Gi to 1Gi"
    )
    assert get(custom, namespace, "clusters", "shrink")["spec"]["storage"]["size"] == "2Gi"
    [claim] = core_v1.list_namespaced_persistent_volume_claim(namespace).items
    assert claim.spec.resources.requests["storage"] == "2Gi"


BOTH_METHODS = (
    'admission webhook "vcluster.cnpg.io" denied the request: Cluster.postgresql.cnpg.io '
    '"{name}" is invalid: spec.bootstrap: Forbidden: Only one bootstrap method can be specified '
    "at a time"
)


def test_the_validating_webhook_refuses_a_cluster_with_two_bootstrap_methods(custom, namespace):
    both = {"initdb": {"database": "app"}, "recovery": {"backup": {"name": "snap"}}}

    with pytest.raises(client.ApiException) as refused:
        create(custom, namespace, "clusters", cluster("both", 1, bootstrap=both))

    assert refused.value.status == 422
    status = json.loads(refused.value.body)
    assert (status["reason"], status["message"]) == ("Invalid", BOTH_METHODS.format(name="both"))
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: Only one bootstrap method can be specified at a time",
            "field": "spec.bootstrap",
        }
    ]
    with pytest.raises(client.ApiException, match="Not Found"):
        get(custom, namespace, "clusters", "both")


def test_applying_initdb_over_a_recovered_cluster_is_refused_and_a_patch_of_its_size_is_not(
    custom, namespace
):
    # A restore creates the Cluster: its recovery belongs to no manager that applies it again.
    recovery = {"recovery": {"backup": {"name": "snap"}}}
    create(custom, namespace, "clusters", cluster("restored", 1, bootstrap=recovery))
    initdb = cluster("restored", 1, bootstrap={"initdb": {"database": "app"}})

    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object(
            G, V, namespace, "clusters", "restored", initdb,
            field_manager="opsdeck", force=True, _content_type="application/apply-patch+yaml",
        )  # fmt: skip
    patched = custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "restored", {"spec": {"instances": 2}}
    )

    assert refused.value.status == 422
    assert json.loads(refused.value.body)["message"] == BOTH_METHODS.format(name="restored")
    assert patched["spec"]["instances"] == 2
    assert patched["spec"]["bootstrap"] == recovery


def test_the_webhook_sees_writes_to_a_cluster_not_to_its_status(custom, namespace, sandbox):
    create(custom, namespace, "clusters", cluster("legacy", 1))
    sandbox.run_until_idle()
    # Stored with two methods, as a state file from before the webhook refused them may hold it.
    rt = sandbox.core.resolve(G, V, "clusters")
    with sandbox.core.lock:
        stored = copy.deepcopy(sandbox.core.store.get(rt.key, namespace, "legacy"))
        stored["spec"]["bootstrap"]["recovery"] = {"backup": {"name": "snap"}}
        sandbox.core.store.write(rt.key, stored, "MODIFIED")

    custom.patch_namespaced_custom_object_status(
        G, V, namespace, "clusters", "legacy", {"status": {"targetPrimary": "legacy-1"}}
    )
    with pytest.raises(client.ApiException) as refused:
        custom.patch_namespaced_custom_object(
            G, V, namespace, "clusters", "legacy", {"metadata": {"annotations": {"a": "b"}}}
        )

    assert refused.value.status == 422
    assert json.loads(refused.value.body)["message"] == BOTH_METHODS.format(name="legacy")
