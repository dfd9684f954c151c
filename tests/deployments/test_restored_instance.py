"""A restored PostgreSQL instance runs as a created one does, and the verbs after it change only
what they should: the size it was given, its owner's password, one bootstrap method through
every modify and upgrade (CloudNativePG refuses a Cluster with two)."""

import base64
import uuid

from accounts.audit import Actor
from deployments import services
from deployments.models import Instance, Operation, Snapshot
from deployments.spec import load_spec
from deployments.workflow.render import Context, render_manifest
from tests.deployments.conftest import SPEC, instance_object, wait_done, wait_for
from tests.deployments.test_instance_upgrade import _v2_text


def _create(user, tenant, plan, **parameters) -> Operation:
    return services.instance_create(
        actor=Actor(user=user), tenant=tenant, plan=plan, name="orders",
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def _restored(owner, tenant, plan, **parameters) -> Instance:
    """A running instance restored from a backup of a fresh one, with `parameters` changed."""
    create = _create(owner, tenant, plan, password="the-source-password")
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    backup = services.instance_action(
        actor=Actor(user=owner), instance=create.instance, verb="backup", request_id="b"
    )
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=Snapshot.objects.get(instance=create.instance),
        name="orders-restored", request_id="r", parameters=parameters,
    )  # fmt: skip
    assert wait_done(restore).state == Operation.State.SUCCEEDED, restore.error
    return Instance.objects.get(pk=restore.instance_id)


def test_a_restore_of_a_backup_the_object_store_no_longer_holds_fails_soon_and_says_why(
    worker, cell, plan, tenant, owner, sandbox_cluster
):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    backup = services.instance_action(
        actor=Actor(user=owner), instance=create.instance, verb="backup", request_id="b"
    )
    assert wait_done(backup).state == Operation.State.SUCCEEDED, backup.error
    snapshot = Snapshot.objects.get(instance=create.instance)
    # The object store's retention pruned its data (the list still shows it until it expires).
    with sandbox_cluster.core.lock:
        stored = sandbox_cluster.object_store[snapshot.metadata["destinationPath"]]
        entry = stored[snapshot.metadata["serverName"]]
        entry["backups"] = [
            b for b in entry["backups"] if b["backupId"] != snapshot.metadata["backupId"]
        ]

    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="orders-restored", request_id="r"
    )

    # Not the restore's hour: its restore Job's retries (630 s, a few seconds on the sandbox).
    assert wait_done(restore, timeout=60).state == Operation.State.FAILED
    assert 'its phase is "Cluster is unrecoverable and needs manual intervention"' in restore.error
    # Why, as the operator says it in an event (its status names only the restore's Job).
    assert 'Its last warning: "ErrorNoBackup: ' in restore.error
    assert Instance.objects.get(pk=restore.instance_id).state == Instance.State.FAILED


def _modify(owner, instance, **parameters) -> Operation:
    modify = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="modify",
        request_id=uuid.uuid4().hex, parameters=parameters,
    )  # fmt: skip
    return wait_done(modify)


def _cluster(kube, instance) -> dict:
    return instance_object(kube, instance, "postgresql.cnpg.io/v1", "Cluster", instance.pk)


def _resources(cpu: str, memory: str) -> dict:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


def test_a_restored_instance_runs_with_the_size_and_the_password_it_was_given(
    worker, cell, plan, tenant, owner, kube
):
    restored = _restored(
        owner, tenant, plan, cpu="2", memoryGi="4", password="a-password-typed-in-the-form"
    )

    spec = _cluster(kube, restored)["spec"]
    assert spec["resources"] == _resources("2", "4Gi")
    assert restored.parameters["cpu"] == 2 and restored.parameters["memoryGi"] == 4
    # The recovered owner role takes the password of the Secret the Connection tab shows.
    recovery = spec["bootstrap"]["recovery"]
    assert (recovery["database"], recovery["owner"]) == ("app", "app")
    assert recovery["secret"] == {"name": f"{restored.pk}-owner"}
    secret = instance_object(kube, restored, "v1", "Secret", f"{restored.pk}-owner")
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert password == "a-password-typed-in-the-form"
    # It reports what a created instance does.
    assert set(restored.outputs) >= {"phase", "primary", "readyInstances", "image", "writeService"}
    assert restored.outputs["writeService"] == f"{restored.pk}-rw"


def test_a_modify_of_a_restored_instance_changes_its_size_and_keeps_its_recovery(
    worker, cell, plan, tenant, owner, kube
):
    restored = _restored(owner, tenant, plan)

    modify = _modify(owner, restored, instances="2", memoryGi="4")

    assert modify.state == Operation.State.SUCCEEDED, modify.error
    spec = _cluster(kube, restored)["spec"]
    assert (spec["instances"], spec["resources"]) == (2, _resources("1", "4Gi"))
    assert list(spec["bootstrap"]) == ["recovery"]
    # The recovery still names its source, which CloudNativePG requires to exist.
    source = spec["bootstrap"]["recovery"]["source"]
    assert [c["name"] for c in spec["externalClusters"]] == [source]


def test_an_upgrade_of_a_restored_instance_keeps_its_recovery(
    worker, cell, plan, tenant, owner, kube
):
    restored = _restored(owner, tenant, plan)
    services.plan_load(text=_v2_text(SPEC.read_text()))

    upgrade = services.instance_upgrade(
        actor=Actor(user=owner), instance=restored, request_id=uuid.uuid4().hex
    )

    assert wait_done(upgrade).state == Operation.State.SUCCEEDED, upgrade.error
    spec = _cluster(kube, restored)["spec"]
    assert spec["postgresql"]["parameters"]["max_connections"] == "200"
    assert list(spec["bootstrap"]) == ["recovery"]


def test_a_modify_of_a_created_instance_changes_its_size_and_keeps_its_initdb(
    worker, cell, plan, tenant, owner, kube
):
    create = _create(owner, tenant, plan, database="shop", owner="shopper")
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error

    modify = _modify(owner, create.instance, instances="2", cpu="2")

    assert modify.state == Operation.State.SUCCEEDED, modify.error
    spec = _cluster(kube, create.instance)["spec"]
    assert (spec["instances"], spec["resources"]) == (2, _resources("2", "2Gi"))
    assert spec["bootstrap"] == {
        "initdb": {
            "database": "shop",
            "owner": "shopper",
            "secret": {"name": f"{create.instance_id}-owner"},
        }
    }


def test_a_modify_that_grows_the_storage_succeeds_once_every_servers_volume_has_grown(
    worker, cell, plan, tenant, owner, kube, faults
):
    create = _create(owner, tenant, plan, storageGi="10", instances="2")
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    faults(frozen=["volumes"])  # the storage takes its time to expand

    modify = services.instance_action(
        actor=Actor(user=owner), instance=create.instance, verb="modify",
        request_id=uuid.uuid4().hex, parameters={"storageGi": "15"},
    )  # fmt: skip

    def healthy_or_done():
        modify.refresh_from_db()
        cluster = _cluster(kube, create.instance)
        return modify.state in (Operation.State.SUCCEEDED, Operation.State.FAILED) or (
            cluster["status"]["phase"] == "Cluster in healthy state"
            and modify.task_runs.filter(node__startswith="main.volumes", state="Running").count()
            == 2
        )

    wait_for(healthy_or_done, what="the modify to wait for the volumes")
    # The Cluster is healthy and has asked for the larger volumes: the change is not done.
    modify.refresh_from_db()  # read again: the look above read it before its task runs
    assert modify.state == Operation.State.RUNNING
    faults(frozen=[])
    assert wait_done(modify).state == Operation.State.SUCCEEDED, modify.error
    claims = kube.list_objects(
        "v1", "PersistentVolumeClaim", label_selector=f"cnpg.io/cluster={create.instance_id}"
    )
    assert {c["metadata"]["name"]: c["status"]["capacity"]["storage"] for c in claims} == {
        f"{create.instance_id}-{n}": "15Gi" for n in (1, 2)
    }


# --- the spec alone ---

PARAMETERS = {
    "version": "17", "instances": 3, "cpu": 0.5, "memoryGi": 8, "storageGi": 20,
    "database": "shop", "owner": "shopper", "password": "x" * 12,
}  # fmt: skip
SYS = {
    "id": "inst-abcd1234",
    "backup": {
        "retentionDays": 30,
        "destinationPath": "s3://backups/tenant",
        "credentialsSecret": "opsdeck-backup",
    },
    "restore": {
        "targetTime": "",
        "metadata": {
            "backupId": "20260101T000000",
            "destinationPath": "s3://backups/tenant",
            "serverName": "inst-source1",
        },
    },
}


def _rendered_cluster(verb: str, template: str, **inputs: str) -> dict:
    verbs = load_spec(SPEC.read_text()).main.verbs
    manifest = verbs[verb].workflow.templates[template].resource.manifest
    return render_manifest(manifest, Context(var=PARAMETERS, sys=SYS, inputs=inputs))


def test_the_restore_and_the_modify_set_every_field_the_create_sets_from_the_parameters():
    created = _rendered_cluster("create", "cluster")
    restored = _rendered_cluster("restore", "recovered", target="backupID", value="x")
    modified = _rendered_cluster("modify", "cluster")

    settings = {k: v for k, v in created["spec"].items() if k != "bootstrap"}
    assert settings["resources"] == _resources("0.5", "8Gi")
    assert {k: v for k, v in restored["spec"].items() if k != "externalClusters"} == {
        **settings,
        "bootstrap": {
            "recovery": {
                "source": "origin",
                "database": "shop",
                "owner": "shopper",
                "secret": {"name": "inst-abcd1234-owner"},
                "recoveryTarget": {"backupID": "x"},
            }
        },
    }
    assert restored["metadata"] == created["metadata"]
    # The modify applies those fields, never the bootstrap.
    assert modified["spec"] == settings
    assert modified["metadata"] == {"name": "inst-abcd1234"}
