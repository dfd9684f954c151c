"""The API sets what a deployment's page sets beside its verbs: its deletion protection, as
the page's switch does, and its backup schedule, as the Backups tab's Save does, with the
same role rules and the same refusals."""

import json

import pytest
from django.test import Client

from accounts.models import AuditEvent
from deployments import lifecycle
from deployments.models import BackupSchedule, Cell, Operation
from tests.concurrency import race
from tests.deployments.factories import BACKUPS
from tests.deployments.test_api_actions import _token
from tests.deployments.test_api_lifecycle import _delete
from tests.deployments.test_instance_lifecycle_actions import _running


@pytest.fixture(autouse=True)
def cell(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)


def _patch(client, path, secret, body, *, key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.patch(path, data=json.dumps(body), content_type="application/json", **headers)


def _schedule(instance) -> str:
    return f"/api/v1/deployments/{instance.pk}/backup-schedule"


# --- deletion protection ---


@pytest.mark.django_db
def test_an_admin_token_protects_a_deployment_from_deletion_and_lifts_it(client, owner, tenant):
    instance = _running(owner, tenant)
    admin = _token(owner, tenant, role="admin", name="terraform")

    on = _patch(client, f"/api/v1/deployments/{instance.pk}", admin, {"deletion_protected": True})
    refused = _delete(client, instance, admin)
    off = _patch(client, f"/api/v1/deployments/{instance.pk}", admin, {"deletion_protected": False})

    assert on.status_code == 200, on.json()
    assert on.json()["deletion_protected"] is True and on.json()["id"] == instance.pk
    assert refused.status_code == 409
    assert off.status_code == 200 and off.json()["deletion_protected"] is False
    instance.refresh_from_db()
    assert instance.deletion_protected is False
    assert AuditEvent.objects.filter(action="instance.protect", result="ok").count() == 2


@pytest.mark.django_db
def test_protection_takes_true_or_false_from_an_admin_and_nothing_else(client, owner, tenant):
    instance = _running(owner, tenant)
    path = f"/api/v1/deployments/{instance.pk}"
    admin = _token(owner, tenant, role="admin", name="terraform")
    member = _token(owner, tenant, name="ci")

    by_a_member = _patch(client, path, member, {"deletion_protected": True})
    not_a_boolean = _patch(client, path, admin, {"deletion_protected": "yes"})
    another_field = _patch(client, path, admin, {"name": "renamed"})

    assert by_a_member.status_code == 403
    assert not_a_boolean.status_code == 400
    assert not_a_boolean.json()["fields"] == {"deletion_protected": "Send true or false."}
    assert another_field.status_code == 400
    assert set(another_field.json()["fields"]) == {"name"}
    instance.refresh_from_db()
    assert (instance.name, instance.deletion_protected) == ("orders", False)


# --- backup schedule ---


@pytest.mark.django_db
def test_a_token_reads_the_plans_default_schedule_and_changes_its_timing(client, owner, tenant):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    shown = client.get(_schedule(instance), HTTP_AUTHORIZATION=f"Bearer {secret}")

    to_cron = _patch(
        client, _schedule(instance), secret, {"cron": "0 3 * * *", "retention_count": 7}
    )
    back_to_hours = _patch(client, _schedule(instance), secret, {"interval_hours": 12})

    assert shown.status_code == 200
    default = shown.json()
    assert (default["interval_hours"], default["cron"], default["retention_days"]) == (24, "", 30)
    assert default["enabled"] is True and default["next_run_at"]
    assert to_cron.status_code == 200, to_cron.json()
    assert (to_cron.json()["cron"], to_cron.json()["interval_hours"]) == ("0 3 * * *", None)
    assert to_cron.json()["next_run_at"].endswith("03:00:00Z")
    assert back_to_hours.status_code == 200, back_to_hours.json()
    saved = BackupSchedule.objects.get(instance=instance)
    assert (saved.interval_hours, saved.cron, saved.retention_count) == (12, "", 7)
    read = client.get(_schedule(instance), HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert read == back_to_hours.json()
    # A timing alone leaves the cluster as it is: no operation.
    assert not instance.operations.exclude(verb="create").exists()


@pytest.mark.django_db
def test_a_changed_retention_is_queued_to_the_cluster_once_per_key(client, owner, tenant):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)

    first = _patch(client, _schedule(instance), secret, {"retention_days": 14}, key="keep-14")
    again = _patch(client, _schedule(instance), secret, {"retention_days": 14}, key="keep-14")

    assert first.status_code == again.status_code == 200
    assert first.json()["retention_days"] == 14 == again.json()["retention_days"]
    applied = Operation.objects.filter(instance=instance, verb=lifecycle.RETENTION_APPLY)
    assert applied.count() == 1


@pytest.mark.django_db
def test_a_bad_schedule_names_each_field_and_changes_nothing(client, owner, tenant):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    viewer = _token(owner, tenant, role="viewer", name="read")

    cases = {
        "hours as text": {"interval_hours": "12"},
        "both timings": {"cron": "0 3 * * *", "interval_hours": 12},
        "bad cron": {"cron": "every day"},
        "no days": {"retention_days": 0},
        "enabled as text": {"enabled": "yes"},
        "unknown": {"colour": "blue"},
    }
    answers = {
        case: _patch(client, _schedule(instance), secret, body) for case, body in cases.items()
    }
    by_a_viewer = _patch(client, _schedule(instance), viewer, {"interval_hours": 6})

    fields = {case: set(answer.json().get("fields", {})) for case, answer in answers.items()}
    assert {answer.status_code for answer in answers.values()} == {400}
    assert fields == {
        "hours as text": {"interval_hours"},
        "both timings": {"interval_hours"},
        "bad cron": {"cron"},
        "no days": {"retention_days"},
        "enabled as text": {"enabled"},
        "unknown": {"colour"},
    }
    assert by_a_viewer.status_code == 403
    assert not BackupSchedule.objects.filter(instance=instance).exclude(interval_hours=24).exists()
    assert not instance.operations.exclude(verb="create").exists()


@pytest.mark.django_db(transaction=True)
def test_one_key_sent_at_once_queues_one_retention_change(owner, tenant):
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)

    results = race(
        lambda: _patch(Client(), _schedule(instance), secret, {"retention_days": 14}, key="k-14"),
        times=3,
    )

    assert [r.status_code for r in results] == [200, 200, 200], results
    applied = Operation.objects.filter(instance=instance, verb=lifecycle.RETENTION_APPLY)
    assert applied.count() == 1


@pytest.mark.django_db(transaction=True)
def test_changes_sent_at_once_never_undo_one_another(owner, tenant):
    """Each request reads the schedule, then writes it with its own field changed: one that
    read it before another's write would have put the other's field back."""
    instance = _running(owner, tenant)
    secret = _token(owner, tenant)
    changes = iter([{"retention_count": 5}, {"interval_hours": 6}, {"enabled": False}])
    bodies = {}

    def send():
        body = next(changes)
        response = _patch(Client(), _schedule(instance), secret, body)
        bodies[id(response)] = body
        return response

    results = race(send, times=3)

    assert {r.status_code for r in results} <= {200, 409}, results
    saved = BackupSchedule.objects.get(instance=instance)
    for response in results:
        if response.status_code == 200:  # what was acknowledged holds
            for name, value in bodies[id(response)].items():
                assert getattr(saved, name) == value, (name, results)
        else:
            assert "nothing was saved" in response.json()["error"]
