"""The API's actions: a token stops, starts, restarts and backs up deployments through the
portal's services, with its role's rights, one operation per Idempotency-Key, and the audit
log and the instance's timeline naming the token."""

import json

import pytest
from django.test import Client

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments.models import Cell, Operation
from tests.concurrency import race
from tests.deployments.factories import BACKUPS
from tests.deployments.test_instance_lifecycle_actions import _running


@pytest.fixture
def instance(owner, tenant):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return _running(owner, tenant)


def _token(owner, tenant, role="member", name="ci-deploy") -> str:
    return account_services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name=name, role=role
    )[1]


def _act(client, instance, verb, secret, *, key=None, body=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(
        f"/api/v1/deployments/{instance.pk}/actions/{verb}",
        data=json.dumps(body if body is not None else {}),
        content_type="application/json",
        **headers,
    )


def _ops(instance, verb):
    return Operation.objects.filter(instance=instance, verb=verb)


@pytest.mark.django_db
def test_a_member_token_stops_a_deployment_and_the_log_names_the_token(
    client, owner_client, owner, tenant, instance
):
    secret = _token(owner, tenant)

    response = _act(client, instance, "stop", secret)

    assert response.status_code == 202
    body = response.json()
    operation = _ops(instance, "stop").get()
    assert body["id"] == str(operation.pk)
    assert (body["verb"], body["state"]) == ("stop", "queued")
    assert body["requested_by"].startswith("API token “ci-deploy” (odt_")
    event = AuditEvent.objects.get(action="instance.stop")
    assert (event.actor_kind, event.result, event.actor) == ("token", "ok", None)
    assert event.ip == "127.0.0.1"
    assert event.actor_email == body["requested_by"]
    # The portal says so too: the Operations tab's timeline and the Activity tab.
    page = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/?tab=operations")
    assert f"by {body['requested_by']}" in page.content.decode()
    activity = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/?tab=activity")
    assert body["requested_by"] in activity.content.decode()
    listed = client.get(
        f"/api/v1/deployments/{instance.pk}/operations", HTTP_AUTHORIZATION=f"Bearer {secret}"
    ).json()
    assert listed["results"][0]["requested_by"] == body["requested_by"]


@pytest.mark.django_db
def test_a_viewer_token_cannot_stop_and_the_refusal_is_audited(client, owner, tenant, instance):
    secret = _token(owner, tenant, role="viewer", name="dashboards")

    response = _act(client, instance, "stop", secret)

    assert response.status_code == 403
    assert response.json() == {
        "error": "Your role (Viewer) does not allow stopping, starting or restarting deployments."
    }
    assert not _ops(instance, "stop").exists()
    denied = AuditEvent.objects.get(action="instance.stop")
    assert (denied.result, denied.actor_kind) == ("denied", "token")
    assert "dashboards" in denied.actor_email


@pytest.mark.django_db
def test_what_the_state_forbids_is_a_409_with_the_services_reason(client, owner, tenant, instance):
    response = _act(client, instance, "start", _token(owner, tenant))

    assert response.status_code == 409
    assert response.json()["error"]
    assert not _ops(instance, "start").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("verb", "body", "said"),
    [
        ("explode", {}, "This plan has no explode action."),
        ("delete", {}, "Deleting an instance is an action of its own."),
        ("stop", [], 'Send a JSON object, e.g. {"parameters": {}}.'),
    ],
)
def test_bad_requests_are_400_with_the_services_words(
    client, owner, tenant, instance, verb, body, said
):
    response = _act(client, instance, verb, _token(owner, tenant), body=body)

    assert response.status_code == 400
    assert response.json()["error"] == said
    assert Operation.objects.filter(instance=instance).count() == 1  # its create


@pytest.mark.django_db
def test_a_body_that_is_not_json_is_a_400(client, owner, tenant, instance):
    response = client.post(
        f"/api/v1/deployments/{instance.pk}/actions/stop",
        data="{not json",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {_token(owner, tenant)}",
    )

    assert response.status_code == 400
    assert "JSON" in response.json()["error"]


@pytest.mark.django_db
def test_a_repeated_key_returns_the_first_operation_and_another_action_is_409(
    client, owner, tenant, instance
):
    secret = _token(owner, tenant)

    first = _act(client, instance, "restart", secret, key="deploy-42")
    again = _act(client, instance, "restart", secret, key="deploy-42")
    other = _act(client, instance, "backup", secret, key="deploy-42")

    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert _ops(instance, "restart").count() == 1
    assert other.status_code == 409
    assert "Idempotency-Key" in other.json()["error"]
    assert not _ops(instance, "backup").exists()


@pytest.mark.django_db(transaction=True)
def test_two_requests_with_one_key_at_once_make_one_operation(owner, tenant, instance):
    secret = _token(owner, tenant)

    results = race(lambda: _act(Client(), instance, "restart", secret, key="same-key"), times=2)

    assert [r.status_code for r in results] == [202, 202], results
    assert len({r.json()["id"] for r in results}) == 1
    assert _ops(instance, "restart").count() == 1


@pytest.mark.django_db
def test_another_organizations_deployment_cannot_be_acted_on(
    client, owner, tenant, instance, make_user
):
    theirs = account_services.tenant_create(actor=Actor(user=make_user("x@example.com")), name="X")
    secret = account_services.api_token_create(
        actor=Actor(user=theirs.memberships.get().user), tenant=theirs, name="t", role="admin"
    )[1]

    response = _act(client, instance, "stop", secret)

    assert response.status_code == 404
    assert not _ops(instance, "stop").exists()


@pytest.mark.django_db
def test_a_revoked_token_cannot_act(client, owner, tenant, instance):
    secret = _token(owner, tenant)
    token = tenant.api_tokens.get()
    account_services.api_token_revoke(actor=Actor(user=owner), token=token)

    response = _act(client, instance, "stop", secret)

    assert response.status_code == 401
    assert not _ops(instance, "stop").exists()


@pytest.mark.django_db
def test_a_modify_takes_its_values_and_bad_ones_are_named(client, owner, tenant, instance):
    secret = _token(owner, tenant)

    bad = _act(client, instance, "modify", secret, body={"parameters": {"instances": 9}})
    good = _act(client, instance, "modify", secret, body={"parameters": {"instances": 2}})

    assert bad.status_code == 400
    assert set(bad.json()["fields"]) == {"instances"}
    assert good.status_code == 202
    assert _ops(instance, "modify").get().requested == {"instances": 2}


@pytest.mark.django_db
@pytest.mark.parametrize("verb", ["restart", "backup", "reloadConfiguration"])
def test_a_member_token_queues_the_portals_actions(client, owner, tenant, instance, verb):
    response = _act(client, instance, verb, _token(owner, tenant))

    assert response.status_code == 202, response.json()
    assert response.json()["verb"] == verb
    assert _ops(instance, verb).count() == 1
    assert AuditEvent.objects.get(action=f"instance.{verb}").actor_kind == "token"
