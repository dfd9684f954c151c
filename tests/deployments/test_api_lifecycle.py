"""The API makes, deletes and cancels: a token creates a deployment as the portal's form does,
deletes one as its Delete button does and cancels an operation as the Operations tab does,
with its role's rights, one object per Idempotency-Key, and bad input said per field."""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import selectors, services, transitions
from deployments.models import Cell, Instance, Operation, Snapshot
from tests.concurrency import race
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS
from tests.deployments.test_api_actions import _act, _token
from tests.deployments.test_instance_lifecycle_actions import _running
from tests.deployments.test_instance_upgrade import _v2_text


@pytest.fixture
def plan(db):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return services.plan_load(text=SPEC.read_text()).plan


def _create(client, secret, body, *, key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(
        "/api/v1/deployments", data=json.dumps(body), content_type="application/json", **headers
    )


def _delete(client, instance, secret, *, query="", key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.delete(f"/api/v1/deployments/{instance.pk}{query}", **headers)


def _cancel(client, operation, secret):
    return client.post(
        f"/api/v1/deployments/{operation.instance_id}/operations/{operation.pk}/cancel",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


# --- create ---


@pytest.mark.django_db
def test_a_member_token_creates_a_deployment_that_the_api_and_the_portal_show(
    client, owner_client, owner, tenant, plan
):
    secret = _token(owner, tenant)

    response = _create(
        client, secret, {"name": "orders", "plan": plan.key, "parameters": {"instances": 2}}
    )

    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["verb"], body["state"]) == ("create", "queued")
    assert body["requested_by"].startswith("API token “ci-deploy” (odt_")
    instance = Instance.objects.get(pk=body["deployment"])
    assert (instance.name, instance.tenant, instance.cell.name) == ("orders", tenant, "local")
    assert instance.parameters["instances"] == 2
    event = AuditEvent.objects.get(action="instance.create")
    assert (event.actor_kind, event.result) == ("token", "ok")
    shown = client.get(
        f"/api/v1/deployments/{instance.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}"
    ).json()
    assert (shown["name"], shown["state"], shown["region"]) == ("orders", "creating", "eu-local")
    page = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/?tab=operations")
    assert f"by {body['requested_by']}" in page.content.decode()
    # Its page says the token made it, where it said "the system".
    overview = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/").content.decode()
    assert f"<dt>Created by</dt><dd>{body['requested_by']}</dd>" in overview


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"name": "", "plan": "?"}, {"plan"}),
        ({"plan": "PLAN", "parameters": {"instances": 9}}, {"name", "instances"}),
        ({"name": "orders", "plan": "PLAN", "cell": "nowhere"}, {"cell"}),
        ({"name": "orders", "plan": "PLAN", "cell": 7}, {"cell"}),
        ({"name": "orders", "plan": "PLAN", "parameters": [1]}, {"parameters"}),
        ({"name": 5, "plan": "PLAN"}, {"name"}),
    ],
)
def test_a_create_with_bad_input_names_each_field_and_makes_nothing(
    client, owner, tenant, plan, body, fields
):
    body = {k: plan.key if v == "PLAN" else v for k, v in body.items()}

    response = _create(client, _token(owner, tenant), body)

    assert response.status_code == 400
    assert set(response.json()["fields"]) == fields, response.json()
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_a_region_not_offered_to_the_organization_is_refused_as_unknown(
    client, owner, tenant, plan
):
    Cell.objects.create(name="private", region="us-private", public=False, **BACKUPS)

    response = _create(
        client, _token(owner, tenant), {"name": "orders", "plan": plan.key, "cell": "private"}
    )

    assert response.status_code == 400
    assert response.json()["fields"] == {"cell": "No such region is offered to your organization."}
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_a_name_the_organization_has_already_is_refused(client, owner, tenant, plan):
    secret = _token(owner, tenant)
    _create(client, secret, {"name": "orders", "plan": plan.key})

    response = _create(client, secret, {"name": "orders", "plan": plan.key})

    assert response.status_code == 400
    assert "orders" in response.json()["fields"]["name"]
    assert Instance.objects.count() == 1


@pytest.mark.django_db
def test_a_viewer_token_cannot_create_and_the_refusal_is_audited(client, owner, tenant, plan):
    secret = _token(owner, tenant, role="viewer", name="dashboards")

    response = _create(client, secret, {"name": "orders", "plan": plan.key})

    assert response.status_code == 403
    assert "Viewer" in response.json()["error"]
    assert not Instance.objects.exists()
    denied = AuditEvent.objects.get(action="instance.create")
    assert (denied.result, denied.actor_kind) == ("denied", "token")


@pytest.mark.django_db
def test_a_plan_limit_reached_is_a_409_with_its_reason(client, owner, tenant, plan):
    secret = _token(owner, tenant)
    limit = services.plan_load(
        text=SPEC.read_text().replace(
            "maxNumberOfInstancesAllowed: 10", "maxNumberOfInstancesAllowed: 1"
        )
    )
    assert limit.version.plan == plan
    first = _create(client, secret, {"name": "orders", "plan": plan.key})

    second = _create(client, secret, {"name": "billing", "plan": plan.key})

    assert first.status_code == 202
    assert second.status_code == 409
    assert "1" in second.json()["error"]
    assert Instance.objects.count() == 1


@pytest.mark.django_db
def test_a_repeated_create_returns_the_first_and_the_key_cannot_make_another(
    client, owner, tenant, plan
):
    secret = _token(owner, tenant)
    body = {"name": "orders", "plan": plan.key}

    first = _create(client, secret, body, key="tf-orders")
    again = _create(client, secret, body, key="tf-orders")
    other = _create(client, secret, {**body, "name": "billing"}, key="tf-orders")

    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert other.status_code == 409
    assert "Idempotency-Key" in other.json()["error"]
    assert list(Instance.objects.values_list("name", flat=True)) == ["orders"]


@pytest.mark.django_db(transaction=True)
def test_two_creates_with_one_key_at_once_make_one_deployment(owner, tenant, plan):
    secret = _token(owner, tenant)
    body = {"name": "orders", "plan": plan.key}

    results = race(lambda: _create(Client(), secret, body, key="tf-orders"), times=3)

    assert [r.status_code for r in results] == [202, 202, 202], results
    assert len({r.json()["id"] for r in results}) == 1
    assert Instance.objects.count() == 1


# --- delete ---


@pytest.mark.django_db
def test_a_member_token_deletes_a_deployment_after_a_last_backup(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    backs_up = services.plan_load(
        text=SPEC.read_text().replace(
            "snapshotBeforeDeletion: false", "snapshotBeforeDeletion: true", 1
        )
    ).version
    Instance.objects.filter(pk=instance.pk).update(plan_version=backs_up)
    secret = _token(owner, tenant)

    response = _delete(client, instance, secret, key="tf-destroy")
    again = _delete(client, instance, secret, key="tf-destroy")

    assert response.status_code == again.status_code == 202, response.json()
    body = response.json()
    assert (body["verb"], body["deployment"]) == ("delete", instance.pk)
    assert again.json()["id"] == body["id"]
    delete = Operation.objects.get(instance=instance, verb="delete")
    last = Operation.objects.get(instance=instance, verb="backup")
    assert delete.arguments == {"last_backup": str(last.pk)}
    event = AuditEvent.objects.get(action="instance.delete")
    assert (event.actor_kind, event.result) == ("token", "ok")


@pytest.mark.django_db
def test_a_delete_can_go_without_the_last_backup_and_bad_values_are_refused(
    client, owner, tenant, plan
):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)

    bad = _delete(client, instance, secret, query="?last_backup=no")
    assert bad.status_code == 400
    assert bad.json()["fields"] == {"last_backup": "Use true or false."}
    assert not Operation.objects.filter(instance=instance, verb="delete").exists()

    response = _delete(client, instance, secret, query="?last_backup=false")

    assert response.status_code == 202
    assert not Operation.objects.filter(instance=instance, verb="backup").exists()
    assert AuditEvent.objects.get(action="instance.delete").payload == {"last_backup": False}


@pytest.mark.django_db
def test_a_protected_deployment_is_a_409_and_a_viewer_is_refused(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    services.instance_protect(actor=Actor(user=owner), instance=instance, on=True)

    protected = _delete(client, instance, _token(owner, tenant))
    viewer = _delete(client, instance, _token(owner, tenant, role="viewer", name="read"))

    assert protected.status_code == 409
    assert "protect" in protected.json()["error"].lower()
    assert viewer.status_code == 403
    assert not Operation.objects.filter(instance=instance, verb="delete").exists()


@pytest.mark.django_db
def test_another_organizations_deployment_cannot_be_deleted(client, owner, tenant, plan, make_user):
    instance = _running(owner, tenant)
    theirs = account_services.tenant_create(actor=Actor(user=make_user("x@example.com")), name="X")
    secret = account_services.api_token_create(
        actor=Actor(user=theirs.memberships.get().user), tenant=theirs, name="t", role="admin"
    )[1]

    response = _delete(client, instance, secret)

    assert response.status_code == 404
    assert not Operation.objects.filter(instance=instance, verb="delete").exists()


# --- cancel ---


@pytest.mark.django_db
def test_a_token_cancels_a_queued_operation_which_names_it(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    restart = Operation.objects.get(pk=_act(client, instance, "restart", secret).json()["id"])

    response = _cancel(client, restart, secret)
    again = _cancel(client, restart, secret)

    assert response.status_code == 202, response.json()
    assert response.json()["state"] == "cancelled"
    restart.refresh_from_db()
    assert restart.state == Operation.State.CANCELLED
    assert restart.error.startswith("Cancelled by API token “ci-deploy” (odt_")
    assert again.status_code == 409
    assert again.json() == {"error": "The operation has ended (Cancelled)."}
    event = AuditEvent.objects.get(action="operation.cancel")
    assert (event.actor_kind, event.result) == ("token", "ok")


@pytest.mark.django_db
def test_a_running_operation_stops_at_its_next_step(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    restart = Operation.objects.get(pk=_act(client, instance, "restart", secret).json()["id"])
    Operation.objects.filter(pk=restart.pk).update(state=Operation.State.RUNNING)

    response = _cancel(client, restart, secret)

    assert response.status_code == 202
    assert response.json()["state"] == "running"
    restart.refresh_from_db()
    assert restart.cancel_reason.startswith("Cancelled by API token “ci-deploy”")


@pytest.mark.django_db
def test_what_cannot_be_cancelled_is_a_409_and_a_viewer_is_refused(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    delete = Operation.objects.get(
        pk=_delete(client, instance, secret, query="?last_backup=false").json()["id"]
    )
    restart = _running(owner, tenant, name="billing")
    queued = Operation.objects.get(pk=_act(client, restart, "restart", secret).json()["id"])

    refused = _cancel(client, delete, secret)
    viewer = _cancel(client, queued, _token(owner, tenant, role="viewer", name="read"))

    assert refused.status_code == 409
    assert refused.json() == {"error": "A delete cannot be cancelled."}
    assert viewer.status_code == 403
    queued.refresh_from_db()
    assert queued.state == Operation.State.QUEUED


@pytest.mark.django_db
def test_an_operation_of_another_deployment_is_a_404(client, owner, tenant, plan):
    orders = _running(owner, tenant)
    billing = _running(owner, tenant, name="billing")
    secret = _token(owner, tenant)
    restart = Operation.objects.get(pk=_act(client, orders, "restart", secret).json()["id"])

    response = client.post(
        f"/api/v1/deployments/{billing.pk}/operations/{restart.pk}/cancel",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )

    assert response.status_code == 404
    restart.refresh_from_db()
    assert restart.state == Operation.State.QUEUED


# --- plans ---


@pytest.mark.django_db
def test_the_plans_say_what_a_create_can_send_and_where_it_can_run(client, owner, tenant, plan):
    Cell.objects.create(name="private", region="us-private", public=False, **BACKUPS)

    response = client.get("/api/v1/plans", HTTP_AUTHORIZATION=f"Bearer {_token(owner, tenant)}")

    assert response.status_code == 200
    (shown,) = response.json()["results"]
    assert (shown["key"], shown["version"]) == (plan.key, 1)
    assert shown["regions"] == [{"cell": "local", "region": "eu-local"}]
    parameters = {p["key"]: p for p in shown["parameters"]}
    assert parameters["instances"] | {"description": ""} == {
        "key": "instances", "name": "Servers", "description": "", "type": "Float64",
        "required": False, "modifiable": True, "default": 1, "options": None,
        "limits": {"min": 1, "max": 5},
    }  # fmt: skip
    passwords = [p for p in shown["parameters"] if p["type"] == "Password"]
    assert passwords and all(p["default"] is None for p in passwords)
    # What it lists is what a create takes.
    created = _create(
        client,
        _token(owner, tenant, name="tf"),
        {"name": "orders", "plan": shown["key"], "cell": shown["regions"][0]["cell"],
         "parameters": {"instances": parameters["instances"]["limits"]["max"]}},
    )  # fmt: skip
    assert created.status_code == 202, created.json()


# --- backups, restore, upgrade, roll back ---


def _completed_backup(instance, *, hours_ago=2):
    return Snapshot.objects.create(
        tenant=instance.tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-snap-{hours_ago}",
        status=Snapshot.Status.COMPLETED, created_at=timezone.now() - timedelta(hours=hours_ago),
        taken_at=timezone.now() - timedelta(hours=hours_ago), parameters=instance.parameters,
    )  # fmt: skip


def _restore(client, instance, snapshot, secret, body, *, key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(
        f"/api/v1/deployments/{instance.pk}/backups/{snapshot.pk}/restore",
        data=json.dumps(body), content_type="application/json", **headers,
    )  # fmt: skip


@pytest.mark.django_db
def test_the_backups_are_listed_newest_first_without_deleted_ones(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    older = _completed_backup(instance, hours_ago=5)
    newer = _completed_backup(instance, hours_ago=1)
    gone = _completed_backup(instance, hours_ago=3)
    Snapshot.objects.filter(pk=gone.pk).update(status=Snapshot.Status.DELETED)

    response = client.get(
        f"/api/v1/deployments/{instance.pk}/backups",
        HTTP_AUTHORIZATION=f"Bearer {_token(owner, tenant, role='viewer')}",
    )

    assert response.status_code == 200
    listed = response.json()["results"]
    assert [b["id"] for b in listed] == [newer.pk, older.pk]
    assert set(listed[0]) == {
        "id", "name", "status", "scheduled", "created_at", "taken_at", "expires_at"
    }  # fmt: skip


@pytest.mark.django_db
def test_a_member_token_restores_a_backup_into_a_new_deployment_once_per_key(
    client, owner, tenant, plan
):
    instance = _running(owner, tenant)
    backup = _completed_backup(instance)
    secret = _token(owner, tenant)
    body = {"name": "orders-copy", "parameters": {"instances": 2}}

    first = _restore(client, instance, backup, secret, body, key="restore-1")
    again = _restore(client, instance, backup, secret, body, key="restore-1")

    assert first.status_code == again.status_code == 202, first.json()
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["verb"] == "restore"
    copy = Instance.objects.get(pk=first.json()["deployment"])
    assert (copy.name, copy.parameters["instances"]) == ("orders-copy", 2)
    assert Instance.objects.filter(name="orders-copy").count() == 1
    event = AuditEvent.objects.get(action="instance.restore")
    assert (event.actor_kind, event.result) == ("token", "ok")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"name": ""}, {"name"}),
        ({"name": "copy", "target_time": "yesterday"}, {"target_time"}),
        ({"name": "copy", "target_time": "2026-11-30T12:00:00"}, {"target_time"}),
        ({"name": "copy", "target_time": "2000-01-01T00:00:00Z"}, {"target_time"}),
    ],
)
def test_a_restore_with_bad_input_names_the_field_and_makes_nothing(
    client, owner, tenant, plan, body, fields
):
    instance = _running(owner, tenant)
    backup = _completed_backup(instance)

    response = _restore(client, instance, backup, _token(owner, tenant), body)

    assert response.status_code == 400
    assert set(response.json()["fields"]) == fields, response.json()
    assert Instance.objects.count() == 1


@pytest.mark.django_db
def test_a_plan_that_cannot_recover_a_point_in_time_says_so(client, owner, tenant, plan):
    instance = _running(owner, tenant)
    plain = services.plan_load(
        text=SPEC.read_text().replace("$sys.restore.targetTime", "$sys.restore.snapshotTime")
    ).version
    assert not selectors.restores_to_point_in_time(plain)
    Instance.objects.filter(pk=instance.pk).update(plan_version=plain)
    backup = _completed_backup(Instance.objects.get(pk=instance.pk), hours_ago=2)
    moment = (timezone.now() - timedelta(hours=1)).isoformat()

    response = _restore(
        client, instance, backup, _token(owner, tenant), {"name": "copy", "target_time": moment}
    )

    assert response.status_code == 400
    assert response.json()["fields"] == {"target_time": services.NO_POINT_IN_TIME}
    assert Instance.objects.count() == 1


@pytest.mark.django_db
def test_a_viewer_cannot_restore_and_another_deployments_backup_is_a_404(
    client, owner, tenant, plan
):
    orders = _running(owner, tenant)
    billing = _running(owner, tenant, name="billing")
    backup = _completed_backup(orders)

    viewer = _restore(
        client, orders, backup, _token(owner, tenant, role="viewer"), {"name": "copy"}
    )
    elsewhere = _restore(client, billing, backup, _token(owner, tenant, name="x"), {"name": "c"})

    assert viewer.status_code == 403
    assert elsewhere.status_code == 404
    assert Instance.objects.count() == 2
    for missing in (backup.pk + 1000, 10**30):  # none, and none a database integer could hold
        response = client.post(
            f"/api/v1/deployments/{orders.pk}/backups/{missing}/restore",
            data="{}", content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {_token(owner, tenant, name=f'n{missing}')}",
        )  # fmt: skip
        assert response.status_code == 404, response.content


@pytest.mark.django_db
def test_a_token_upgrades_to_the_newest_version_and_rolls_back_after_a_failure(
    client, owner, tenant, plan
):
    instance = _running(owner, tenant)
    v2 = services.plan_load(text=_v2_text(SPEC.read_text())).version
    secret = _token(owner, tenant)

    upgrade = _act(client, instance, "upgrade", secret, key="up-1")
    with_values = _act(client, instance, "upgrade", secret, body={"parameters": {"cpu": 2}})

    assert upgrade.status_code == 202, upgrade.json()
    operation = Operation.objects.get(pk=upgrade.json()["id"])
    assert (operation.verb, operation.plan_version) == ("upgrade", v2)
    assert with_values.status_code == 400
    assert with_values.json() == {"error": "The upgrade takes no parameters: send {}."}
    # The upgrade fails: the instance holds what last ran, and a roll back applies it again.
    Operation.objects.filter(pk=operation.pk).update(state=Operation.State.FAILED)
    transitions.instance_state_set(instance, Instance.State.FAILED, operation=operation)
    rollback = _act(client, instance, "rollback", secret)
    assert rollback.status_code == 202, rollback.json()
    assert Operation.objects.get(pk=rollback.json()["id"]).verb == "rollback"


def _shown(client, instance, secret) -> dict:
    response = client.get(
        f"/api/v1/deployments/{instance.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}"
    )
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.django_db
def test_a_deployment_says_which_upgrade_it_offers_and_a_pinned_upgrade_takes_that_one_only(
    client, owner, tenant, plan
):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    assert _shown(client, instance, secret)["upgrade"] is None
    v2 = services.plan_load(text=_v2_text(SPEC.read_text())).version

    offered = _shown(client, instance, secret)["upgrade"]
    older = _act(client, instance, "upgrade", secret, body={"version": 1})
    not_a_number = _act(client, instance, "upgrade", secret, body={"version": "2"})
    rollback_pinned = _act(client, instance, "rollback", secret, body={"version": 1})

    assert offered == {"version": 2, "adds": ["maxConnections"], "removes": [], "refused": None}
    assert older.status_code == 409
    assert older.json()["error"].startswith("Version 2 is the plan's newest, not 1:")
    assert not_a_number.status_code == 400
    assert not_a_number.json()["fields"] == {
        "version": "Give the version number to upgrade to, e.g. 3."
    }
    assert rollback_pinned.status_code == 400
    assert not instance.operations.exclude(verb="create").exists()
    pinned = _act(client, instance, "upgrade", secret, body={"version": 2})
    assert pinned.status_code == 202, pinned.json()
    assert Operation.objects.get(pk=pinned.json()["id"]).plan_version == v2
    # Queued, the upgrade is still offered, and says why it cannot be asked for again now.
    assert _shown(client, instance, secret)["upgrade"]["refused"] == (
        "Operations are queued on this instance; upgrade once they have finished."
    )


@pytest.mark.django_db
def test_an_upgrade_with_nothing_newer_or_a_roll_back_with_nothing_failed_is_a_409(
    client, owner, tenant, plan
):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)

    upgrade = _act(client, instance, "upgrade", secret)
    rollback = _act(client, instance, "rollback", secret)

    assert upgrade.status_code == 409
    assert upgrade.json() == {"error": "The instance runs its plan's newest version already."}
    assert rollback.status_code == 409
    assert not instance.operations.exclude(verb="create").exists()
