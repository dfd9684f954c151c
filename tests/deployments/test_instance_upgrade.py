"""Upgrade to the plan's newer version, roll back a failed change, deletion protection: the
services, with a real worker and the sandbox cluster where a run matters."""

import base64
import re
import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts import idempotency
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from deployments import selectors, services, transitions
from deployments.models import Cell, Instance, Operation, Snapshot
from deployments.parameters import values_for_version
from deployments.spec.model import Parameter
from tests.concurrency import beside_a_held_write
from tests.deployments.conftest import SPEC, instance_object, wait_done, wait_for
from tests.deployments.factories import BACKUPS

IMAGE = "                    imageName: ghcr.io/cloudnative-pg/postgresql:{{ $var.version }}\n"
MAX_CONNECTIONS = """\
      - key: maxConnections
        name: Maximum connections
        description: Connections each server accepts at once.
        type: Float64
        limits: {min: 10, max: 1000}
        defaultValue: "200"
        required: false
        modifiable: true
"""


def _v2_text(text: str) -> str:
    """The shipped spec with a new parameter (default 200) that the Cluster uses."""
    assert IMAGE in text  # the create and restore Clusters (modify reuses the create one)
    text = text.replace("      - key: database\n", MAX_CONNECTIONS + "      - key: database\n", 1)
    return text.replace(
        IMAGE,
        IMAGE + "                    postgresql:\n"
        '                      parameters: {max_connections: "{{ $var.maxConnections }}"}\n',
    )


def _cluster(kube, instance):
    return instance_object(kube, instance, "postgresql.cnpg.io/v1", "Cluster", instance.pk)


def _password_in_cluster(kube, instance) -> str:
    secret = instance_object(kube, instance, "v1", "Secret", f"{instance.pk}-owner")
    return base64.b64decode(secret["data"]["password"]).decode()


def _running(owner, tenant, plan, **parameters) -> Instance:
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def _upgrade(user, instance, request_id=None):
    return services.instance_upgrade(
        actor=Actor(user=user), instance=instance, request_id=request_id or uuid.uuid4().hex
    )


def _rollback(user, instance, request_id=None):
    return services.instance_rollback(
        actor=Actor(user=user), instance=instance, request_id=request_id or uuid.uuid4().hex
    )


# --- with a worker and the sandbox cluster ---


def test_an_upgrade_moves_the_instance_to_the_new_version_with_the_new_defaults(
    worker, cell, plan, tenant, owner, kube
):
    instance = _running(owner, tenant, plan, instances="2")
    v1 = instance.plan_version
    v2 = services.plan_load(text=_v2_text(SPEC.read_text())).version
    assert v2.number == v1.number + 1

    upgrade = _upgrade(owner, instance)

    assert upgrade.plan_version == v2
    assert wait_done(upgrade).state == Operation.State.SUCCEEDED, upgrade.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.plan_version == v2
    assert instance.parameters["maxConnections"] == 200
    assert instance.parameters["instances"] == 2  # its own values carried over
    spec = _cluster(kube, instance)["spec"]
    assert spec["postgresql"]["parameters"]["max_connections"] == "200"
    assert spec["instances"] == 2
    with pytest.raises(ActionDenied, match="newest version already"):
        _upgrade(owner, instance)


def _modify_failing(text: str) -> str:
    """The spec with a modify that fails once it applied the Cluster (its cluster task's
    failureCondition holds at once)."""
    head, modify = text.split("      modify:\n", 1)
    body, rest = modify.split("      stop:\n", 1)
    failing = body.split("failureCondition: >-\n", 1)
    body = failing[0] + "failureCondition: 'cel: true'\n" + failing[1].split("\n", 2)[2]
    return head + "      modify:\n" + body + "      stop:\n" + rest


def _with_storage_quota(text: str, storage: str) -> str:
    """The spec with `x-opsdeck.quota.storage`: the namespace's quota its instances get."""
    return re.sub(r"(\nx-opsdeck:\n)", rf'\1  quota: {{storage: "{storage}"}}\n', text, count=1)


def test_an_upgrade_and_its_roll_back_give_the_namespace_their_versions_quota(
    worker, cell, tenant, owner, kube
):
    plan = services.plan_load(text=_with_storage_quota(SPEC.read_text(), "60Gi")).plan
    instance = _running(owner, tenant, plan)
    # The new version allows more storage, and its workflow fails.
    services.plan_load(text=_modify_failing(_with_storage_quota(SPEC.read_text(), "120Gi")))

    def hard():
        quota = instance_object(kube, instance, "v1", "ResourceQuota", "opsdeck-quota")
        return quota["spec"]["hard"]["requests.storage"]

    assert hard() == "60Gi"
    upgrade = _upgrade(owner, instance)
    wait_done(upgrade)
    assert hard() == "120Gi"  # applied before its workflow, as the new version renders it

    instance.refresh_from_db()
    assert instance.state == Instance.State.FAILED, upgrade.error
    rollback = _rollback(owner, instance)
    assert wait_done(rollback).state == Operation.State.SUCCEEDED, rollback.error
    assert hard() == "60Gi"  # the version it is on again


def _hard_storage(kube, instance) -> str:
    quota = instance_object(kube, instance, "v1", "ResourceQuota", "opsdeck-quota")
    return quota["spec"]["hard"]["requests.storage"]


def _running_before_a_larger_quota(register, owner, tenant) -> Instance:
    """An instance on the cell `register` makes, on a version whose quota allows 60Gi of
    storage, which a newer version of its plan raises to 120Gi."""
    register(customer_sources=["203.0.113.0/24"])
    plan = services.plan_load(text=_with_storage_quota(SPEC.read_text(), "60Gi")).plan
    instance = _running(owner, tenant, plan)
    services.plan_load(text=_with_storage_quota(SPEC.read_text(), "120Gi"))
    return instance


def test_add_cell_during_an_upgrade_applies_the_quota_of_the_version_it_goes_to(
    worker, relayed_cell, tenant, owner, kube
):
    relay, register = relayed_cell
    instance = _running_before_a_larger_quota(register, owner, tenant)
    # The upgrade applied its version's quota, and its workflow's first write is on its way.
    relay.hold(r"/clusters/", before=True, method="PATCH")
    upgrade = _upgrade(owner, instance)
    try:
        assert relay.holding.wait(30), "the upgrade did not reach its workflow"
        done = services.cell_namespaces_apply(register(customer_sources=["198.51.100.0/24"]))
        upgrade.refresh_from_db()
        assert upgrade.state == Operation.State.RUNNING
        assert (done.applied, _hard_storage(kube, instance)) == (1, "120Gi")
    finally:
        relay.release()
    assert wait_done(upgrade).state == Operation.State.SUCCEEDED, upgrade.error
    assert _hard_storage(kube, instance) == "120Gi"


def test_an_upgrade_starting_as_add_cell_writes_the_old_quota_ends_with_its_own(
    worker, relayed_cell, tenant, owner, kube
):
    """add_cell read the instance's version before the upgrade started, and its write of that
    version's quota reaches the cluster after the upgrade applied its own."""
    relay, register = relayed_cell
    instance = _running_before_a_larger_quota(register, owner, tenant)
    relay.hold(r"/resourcequotas/opsdeck-quota\b", before=True, method="PATCH")

    def upgraded():
        upgrade = _upgrade(owner, instance)
        wait_for(lambda: _hard_storage(kube, instance) == "120Gi", what="the upgrade's quota")
        return upgrade

    done, upgrade = beside_a_held_write(
        relay,
        lambda: services.cell_namespaces_apply(register(customer_sources=["198.51.100.0/24"])),
        upgraded,
    )

    assert (done.applied, _hard_storage(kube, instance)) == (1, "120Gi")
    assert wait_done(upgrade).state == Operation.State.SUCCEEDED, upgrade.error


def test_a_roll_back_removes_from_the_cluster_what_the_failed_upgrade_added(
    worker, cell, plan, tenant, owner, kube
):
    instance = _running(owner, tenant, plan, instances="1")
    # Version 2's modify sets max_connections, then fails: the Cluster holds what it applied.
    services.plan_load(text=_modify_failing(_v2_text(SPEC.read_text())))
    upgrade = _upgrade(owner, instance)
    assert wait_done(upgrade).state == Operation.State.FAILED
    assert _cluster(kube, instance)["spec"]["postgresql"]["parameters"]["max_connections"]

    rollback = _rollback(owner, instance)

    assert wait_done(rollback).state == Operation.State.SUCCEEDED, rollback.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING and instance.plan_version.number == 1
    spec = _cluster(kube, instance)["spec"]
    assert "max_connections" not in (spec.get("postgresql") or {}).get("parameters", {})
    assert spec["bootstrap"]["initdb"]["database"] == "app"  # the create's, kept


def test_an_upgrade_the_api_server_refuses_leaves_the_instance_on_its_version(
    worker, cell, plan, tenant, owner, kube
):
    instance = _running(owner, tenant, plan, instances="2")
    v1 = instance.plan_version
    # Version 2 sends a fractional maxSyncReplicas, which the Cluster's schema refuses.
    sync = MAX_CONNECTIONS.replace("maxConnections", "syncReplicas").replace('"200"', '"0.5"')
    text = SPEC.read_text().replace("      - key: database\n", sync + "      - key: database\n", 1)
    text = text.replace(
        IMAGE, IMAGE + "                    maxSyncReplicas: {{ $var.syncReplicas }}\n"
    )
    services.plan_load(
        text=text.replace("limits: {min: 10, max: 1000}", "limits: {min: 0, max: 5}")
    )

    upgrade = _upgrade(owner, instance)

    assert wait_done(upgrade).state == Operation.State.FAILED
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.plan_version == v1
    assert "syncReplicas" not in instance.parameters
    assert _cluster(kube, instance)["spec"].get("maxSyncReplicas", 0) == 0  # its schema default


def _loose_plan_writing_the_secret_first():
    """A plan that lets 2.5 servers through to the API server (which refuses it), whose modify
    writes the password Secret before the Cluster: the refusal comes after a write."""
    text = SPEC.read_text().replace("        x-opsdeck: {step: 1}  # whole servers\n", "")
    head, rest = text.split("      modify:\n", 1)
    modify, tail = rest.split("      stop:\n", 1)
    for cluster_first, secret_first in (
        (
            "- {name: cluster, template: cluster}\n",
            "- {name: cluster, template: cluster, dependencies: [credentials]}\n",
        ),
        (
            "- {name: credentials, template: credentials, dependencies: [cluster]}\n",
            "- {name: credentials, template: credentials}\n",
        ),
    ):
        assert modify.count(cluster_first) == 1
        modify = modify.replace(cluster_first, secret_first)
    text = head + "      modify:\n" + modify + "      stop:\n" + tail
    return services.plan_load(text=text.replace("plan: postgres-cnpg", "plan: pg-loose")).plan


def test_a_roll_back_after_a_failed_modify_returns_the_instance_to_its_old_values(
    worker, cell, tenant, owner, kube
):
    plan = _loose_plan_writing_the_secret_first()
    instance = _running(owner, tenant, plan, instances="2", password="the-first-password")
    modify = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="modify", request_id="m-1",
        parameters={"instances": "2.5", "password": "the-second-password"},
    )  # fmt: skip
    assert wait_done(modify).state == Operation.State.FAILED
    instance.refresh_from_db()
    assert instance.state == Instance.State.FAILED  # the new password reached the cluster
    assert _password_in_cluster(kube, instance) == "the-second-password"

    rollback = _rollback(owner, instance)

    assert rollback.verb == "rollback"
    assert rollback.arguments["rollback_of"] == str(modify.pk)
    assert wait_done(rollback).state == Operation.State.SUCCEEDED, rollback.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.parameters["instances"] == 2
    assert services.instance_parameters(instance)["password"] == "the-first-password"
    assert _password_in_cluster(kube, instance) == "the-first-password"
    assert _cluster(kube, instance)["spec"]["instances"] == 2
    with pytest.raises(ActionDenied, match="is for an instance that has failed"):
        _rollback(owner, instance)


# --- services, without a cluster ---


@pytest.fixture
def local_cell(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)


@pytest.fixture
def running(db, owner, tenant, local_cell):
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="c-1",
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=create.instance_id)


def _fail(instance, verb="modify"):
    """Mark the instance failed by a `verb` operation, as the runner does."""
    op = Operation.objects.create(
        instance=instance, verb=verb, request_id=uuid.uuid4().hex,
        plan_version=instance.plan_version, state=Operation.State.FAILED, error="refused",
    )  # fmt: skip
    transitions.instance_state_set(instance, Instance.State.FAILED, operation=op, reason="refused")
    return op


def test_an_upgrade_without_a_newer_version_is_refused_and_audited(running, owner):
    with pytest.raises(ActionDenied, match="newest version already"):
        _upgrade(owner, running)

    assert not running.operations.filter(verb="upgrade").exists()
    assert AuditEvent.objects.filter(action="instance.upgrade", result="denied").exists()


def test_an_upgrade_is_refused_while_the_state_forbids_it(running, owner):
    services.plan_load(text=_v2_text(SPEC.read_text()))
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.STOPPED)

    with pytest.raises(ActionDenied, match="upgrade needs it to be running"):
        _upgrade(owner, running)


def test_a_deleted_instance_is_refused_an_upgrade_and_protection_for_being_deleted(running, owner):
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.DELETED)

    with pytest.raises(ActionDenied) as upgrade:
        _upgrade(owner, running)  # no newer version either: its state is the reason
    with pytest.raises(ActionDenied) as protect:
        services.instance_protect(actor=Actor(user=owner), instance=running, on=True)

    assert "deleted" in upgrade.value.reason and "newest version" not in upgrade.value.reason
    assert protect.value.reason == "The instance is deleted."


def test_an_upgrade_is_refused_when_the_new_version_refuses_the_instances_values(running, owner):
    text = SPEC.read_text().replace('options: ["16", "17", "18"]', 'options: ["18"]')
    text = text.replace('defaultValue: "17"', 'defaultValue: "18"')
    services.plan_load(text=text)

    with pytest.raises(ValidationError, match="refuses 17"):
        _upgrade(owner, running)
    preview = selectors.upgrade_preview(running)
    assert [(c.key, c.before, c.after) for c in preview.defaults] == [("version", "17", "18")]


def test_an_upgrade_checks_the_password_against_the_new_rules_without_showing_it(running, owner):
    services.plan_load(
        text=SPEC.read_text().replace("limits: {min: 12, max: 100}", "limits: {min: 30, max: 100}")
    )
    password = services.instance_parameters(running)["password"]

    with pytest.raises(ValidationError) as refused:
        _upgrade(owner, running)
    assert "Owner password: version 2 refuses its value." in refused.value.messages[0]
    assert password not in refused.value.messages[0]


def test_a_repeated_upgrade_request_returns_the_same_operation(running, owner):
    services.plan_load(text=_v2_text(SPEC.read_text()))

    first = _upgrade(owner, running, "up-1")
    again = _upgrade(owner, running, "up-1")

    assert again == first
    assert running.operations.filter(verb="upgrade").count() == 1


def test_an_upgrade_request_id_sent_again_for_another_version_is_refused(running, owner):
    """An upgrade's request id was kept without the version it asked for: sent again asking
    for version 3, it returned the queued upgrade to version 2 as if version 3 were queued (the
    API answered 202 where a reused Idempotency-Key with other values is a 409)."""
    services.plan_load(text=_v2_text(SPEC.read_text()))
    first = services.instance_upgrade(
        actor=Actor(user=owner), instance=running, request_id="up-1", seen=2
    )
    services.plan_load(text=_v2_text(SPEC.read_text()) + "\n# version 3\n")

    with pytest.raises(ValidationError) as refused:
        services.instance_upgrade(
            actor=Actor(user=owner), instance=running, request_id="up-1", seen=3
        )

    assert refused.value.messages == [idempotency.REUSED]
    assert list(running.operations.filter(verb="upgrade")) == [first]
    again = services.instance_upgrade(
        actor=Actor(user=owner), instance=running, request_id="up-1", seen=2
    )
    assert again == first


def test_a_modify_read_before_an_upgrade_ended_is_checked_by_the_new_versions_rules(running, owner):
    page_read = Instance.objects.get(pk=running.pk)  # the request's read, before the lock
    newer = services.plan_load(
        text=SPEC.read_text().replace("limits: {min: 1, max: 5}", "limits: {min: 1, max: 3}")
    ).version
    Instance.objects.filter(pk=running.pk).update(plan_version=newer)  # the upgrade ended

    with pytest.raises(ValidationError) as refused:
        services.instance_action(
            actor=Actor(user=owner), instance=page_read, verb="modify", request_id="m-1",
            parameters={"instances": "5"},
        )  # fmt: skip

    assert "instances" in refused.value.message_dict
    assert not running.operations.filter(verb="modify").exists()


def test_other_actions_wait_until_a_queued_upgrade_has_run(running, owner):
    services.plan_load(text=_v2_text(SPEC.read_text()))
    _upgrade(owner, running)

    with pytest.raises(ActionDenied, match="being upgraded"):
        services.instance_action(
            actor=Actor(user=owner), instance=running, verb="restart", request_id="r-1"
        )


def test_deleting_a_backup_waits_until_a_queued_upgrade_has_run(running, owner):
    snapshot = Snapshot.objects.create(
        tenant=running.tenant, instance=running, source_instance_id=running.pk,
        plan_version=running.plan_version, name=f"{running.pk}-1", status="completed",
    )  # fmt: skip
    services.plan_load(text=_v2_text(SPEC.read_text()))
    _upgrade(owner, running)

    with pytest.raises(ActionDenied, match="being upgraded"):
        services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="d-1")

    snapshot.refresh_from_db()
    assert snapshot.status == Snapshot.Status.COMPLETED
    assert not running.operations.filter(verb="deleteBackup").exists()


def test_pruning_skips_a_backup_while_an_upgrade_is_queued(running, owner):
    taken = timezone.now() - timedelta(days=40)
    expired = Snapshot.objects.create(
        tenant=running.tenant, instance=running, source_instance_id=running.pk,
        plan_version=running.plan_version, name=f"{running.pk}-old", status="completed",
        scheduled=True, created_at=taken, expires_at=taken + timedelta(days=30),
    )  # fmt: skip
    Snapshot.objects.create(
        tenant=running.tenant, instance=running, source_instance_id=running.pk,
        plan_version=running.plan_version, name=f"{running.pk}-new", status="completed",
        scheduled=True,
    )  # fmt: skip
    services.plan_load(text=_v2_text(SPEC.read_text()))
    upgrade = _upgrade(owner, running)

    assert services.snapshots_prune() == 0
    assert not running.operations.filter(verb="deleteBackup").exists()

    Operation.objects.filter(pk=upgrade.pk).update(state=Operation.State.SUCCEEDED)
    assert services.snapshots_prune() == 1
    (forget,) = running.operations.filter(verb="deleteBackup")
    assert forget.arguments["forget_snapshot"] == expired.pk


def _for_cells(text: str, *cells: str) -> str:
    """The spec, its instances let run only in `cells` (`x-opsdeck.entitlements.cells`)."""
    return text.replace(
        "  entitlements:\n", f"  entitlements:\n    cells: [{', '.join(cells)}]\n", 1
    )


def test_an_upgrade_to_a_version_that_does_not_run_in_the_instances_cell_is_refused(running, owner):
    """A version published for other cells only is checked against those cells alone
    (`plan_cells_check`): queued, its workflows ran in the instance's cell, which may not
    serve the kinds it writes."""
    services.plan_load(text=_for_cells(_v2_text(SPEC.read_text()), "widget-cell"))

    with pytest.raises(ActionDenied) as refused:
        _upgrade(owner, running)

    assert refused.value.reason == (
        "Version 2 of the PostgreSQL plan does not run in the local cell, where "
        "orders runs; it runs in: widget-cell."
    )
    assert not running.operations.filter(verb="upgrade").exists()
    assert AuditEvent.objects.filter(action="instance.upgrade", result="denied").exists()


def test_an_upgrade_to_a_version_that_runs_in_the_instances_cell_for_its_organization_is_queued(
    running, owner, tenant
):
    from billing.models import PlanOverride

    v2 = services.plan_load(text=_for_cells(_v2_text(SPEC.read_text()), "widget-cell")).version
    PlanOverride.objects.create(tenant=tenant, plan=v2.plan, limits={"cells": ["local"]})

    assert _upgrade(owner, running).plan_version == v2


def test_the_upgrade_preview_lists_the_new_parameter_and_its_default(running):
    services.plan_load(text=_v2_text(SPEC.read_text()))

    preview = selectors.upgrade_preview(running)

    assert preview.target.number == 2
    assert [(c.key, c.after) for c in preview.added] == [("maxConnections", "200")]
    assert preview.removed == [] and preview.problems == {}


def test_an_upgrade_keeps_the_values_the_new_version_has_and_defaults_the_new_ones():
    def parameter(key, default=None, kind="String"):
        return Parameter(key=key, name=key, description="", type=kind, default=default)

    values = values_for_version(
        [parameter("kept", "x"), parameter("new", "d"), parameter("secret", kind="Password")],
        {"kept": "mine", "gone": "old"},
    )

    assert values["kept"] == "mine" and values["new"] == "d"
    assert "gone" not in values and len(values["secret"]) >= 12


def test_a_roll_back_needs_a_failed_modify_or_upgrade(running, owner):
    with pytest.raises(ActionDenied, match="is for an instance that has failed"):
        _rollback(owner, running)
    _fail(running, verb="restart")
    with pytest.raises(ActionDenied, match="failed modify or upgrade"):
        _rollback(owner, running)


def test_a_roll_back_re_applies_the_stored_version_and_repeats_return_it(running, owner):
    failed = _fail(running, verb="upgrade")

    rollback = _rollback(owner, running, "rb-1")

    assert _rollback(owner, running, "rb-1") == rollback
    assert rollback.plan_version == running.plan_version
    assert rollback.arguments == {"rollback_of": str(failed.pk)}
    assert AuditEvent.objects.filter(action="instance.rollback", result="ok").count() == 1


def test_a_roll_back_keeps_the_volume_size_a_failed_change_grew_and_shrinks_nothing(running, owner):
    """Volumes cannot shrink: a roll back to the stored size was refused by the operator and
    left the instance failed for good. It keeps the grown size (and stores it once it ran)."""
    failed = _fail(running)
    stored = running.parameters["storageGi"]
    Operation.objects.filter(pk=failed.pk).update(
        parameters={**running.parameters, "storageGi": stored + 10, "instances": 4}
    )

    rollback = _rollback(owner, running)

    assert rollback.requested == {"storageGi": stored + 10}  # the servers go back to 2


def test_a_protected_instance_cannot_be_deleted_until_protection_is_off(running, owner):
    services.instance_protect(actor=Actor(user=owner), instance=running, on=True)

    with pytest.raises(ActionDenied, match="Deletion protection is on"):
        services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d-1")
    assert not running.operations.filter(verb="delete").exists()
    assert AuditEvent.objects.filter(action="instance.delete", result="denied").exists()

    services.instance_protect(actor=Actor(user=owner), instance=running, on=False)
    delete = services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d-1")
    assert delete.verb == "delete"
    with pytest.raises(ActionDenied, match="too late"):  # the queued delete would run anyway
        services.instance_protect(actor=Actor(user=owner), instance=running, on=True)
    events = AuditEvent.objects.filter(action="instance.protect", result="ok")
    assert AuditEvent.objects.filter(action="instance.protect", result="denied").count() == 1
    assert [e.payload for e in events.order_by("created_at", "id")] == [{"on": True}, {"on": False}]


@pytest.mark.parametrize(("role", "allowed"), [("admin", True), ("member", False)])
def test_only_owners_and_admins_may_switch_deletion_protection(running, add_member, role, allowed):
    user = add_member(f"{role}@example.com", role)

    if allowed:
        services.instance_protect(actor=Actor(user=user), instance=running, on=True)
    else:
        with pytest.raises(ActionDenied, match="does not allow"):
            services.instance_protect(actor=Actor(user=user), instance=running, on=True)
    running.refresh_from_db()
    assert running.deletion_protected is allowed
    result = "ok" if allowed else "denied"
    assert AuditEvent.objects.filter(action="instance.protect", result=result, actor=user).exists()
