"""Input no script should send, each answered with a 4xx saying what was wrong (it was a 500),
and nothing done."""

import json

import pytest

from accounts.models import AuditEvent
from deployments.models import Instance, Operation
from tests.deployments.test_api_actions import _act, _token
from tests.deployments.test_api_lifecycle import (
    _completed_backup,
    _create,
    _restore,
    plan,  # noqa: F401 - the fixture, by name
)
from tests.deployments.test_instance_lifecycle_actions import _running

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("plan")]


def _post(client, instance, secret, data: str):
    return client.post(
        f"/api/v1/deployments/{instance.pk}/actions/restart", data=data,
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}",
    )  # fmt: skip


def test_a_restore_to_a_moment_that_does_not_exist_is_a_400(client, owner, tenant):
    instance = _running(owner, tenant)
    backup = _completed_backup(instance)
    body = {"name": "copy", "target_time": "2026-02-30T12:00:00Z"}

    response = _restore(client, instance, backup, _token(owner, tenant), body)

    assert response.status_code == 400, response.content
    assert response.json()["fields"] == {
        "target_time": "There is no such moment as 2026-02-30T12:00:00Z."
    }
    assert not Instance.objects.filter(name="copy").exists()


@pytest.mark.parametrize("field", ["cell", "plan", "name"])
def test_text_holding_a_nul_character_is_a_400(client, owner, tenant, field):
    body = {"name": "orders", "plan": "postgres-cnpg", "parameters": {}, field: "local\u0000"}

    response = _create(client, _token(owner, tenant), body)

    assert response.status_code == 400, response.content
    assert response.json() == {"error": "Text may not hold a NUL character (\\u0000)."}
    assert not Instance.objects.exists()


def test_a_body_nested_too_deeply_is_a_400(client, owner, tenant):
    instance = _running(owner, tenant)

    response = _post(client, instance, _token(owner, tenant), "[" * 100_000)

    assert response.status_code == 400, response.content
    assert response.json() == {"error": "JSON parse error - nested too deeply."}


def test_a_body_too_large_is_a_413(client, owner, tenant, settings):
    instance = _running(owner, tenant)
    body = json.dumps({"parameters": {}, "pad": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE})

    response = _post(client, instance, _token(owner, tenant), body)

    assert response.status_code == 413, response.content
    assert response.json() == {"error": "The body is larger than 2,621,440 bytes."}
    assert not Operation.objects.filter(instance=instance, verb="restart").exists()


def test_a_cancel_with_an_unusable_idempotency_key_is_a_400(client, owner, tenant):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    queued = _act(client, instance, "restart", secret).json()

    response = client.post(
        f"/api/v1/deployments/{instance.pk}/operations/{queued['id']}/cancel",
        HTTP_IDEMPOTENCY_KEY="k" * 65, HTTP_AUTHORIZATION=f"Bearer {secret}",
    )  # fmt: skip

    assert response.status_code == 400, response.content
    assert response.json()["fields"] == {
        "request_id": "The request id is longer than 64 characters."
    }
    assert Operation.objects.get(pk=queued["id"]).state == Operation.State.QUEUED


def test_a_token_whose_role_forbids_the_action_is_refused_for_it_whatever_its_key(
    client, owner, tenant
):
    """A viewer's token sending a key Opsdeck keeps for itself was told about the key (400)
    before being refused for its role, and no refusal was audited."""
    instance = _running(owner, tenant)

    response = _act(
        client, instance, "stop", _token(owner, tenant, role="viewer"), key="schedule-1"
    )

    assert response.status_code == 403, response.content
    assert AuditEvent.objects.filter(action="instance.stop", result="denied").exists()
