"""How many requests one API token may make: past the rate, a 429 says when to try again, and
nothing is done; each token has its own count."""

import json

import pytest

from deployments.models import Cell
from tests.deployments.factories import BACKUPS
from tests.deployments.test_api_actions import _act, _token
from tests.deployments.test_instance_lifecycle_actions import _running
from tests.portal.test_settings import _keys, _manage, _services


@pytest.fixture
def instance(owner, tenant):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return _running(owner, tenant)


def _get(client, secret):
    return client.get("/api/v1/deployments", HTTP_AUTHORIZATION=f"Bearer {secret}")


@pytest.mark.django_db
def test_changes_past_the_write_rate_are_refused_with_when_to_try_again(
    client, owner, tenant, instance, settings
):
    settings.OPSDECK_API_WRITE_RATE = "2/min"
    secret = _token(owner, tenant)

    first, second, third = (_act(client, instance, "restart", secret) for _ in range(3))

    assert (first.status_code, second.status_code, third.status_code) == (202, 202, 429)
    assert 1 <= int(third["Retry-After"]) <= 60
    assert third.json()["error"].startswith("Too many requests with this API token: try again")
    assert instance.operations.filter(verb="restart").count() == 2
    # Reads have their own, larger count; another token its own.
    assert _get(client, secret).status_code == 200
    other = _token(owner, tenant, name="nightly")
    assert _act(client, instance, "backup", other).status_code == 202


@pytest.mark.django_db
def test_reads_past_the_rate_are_refused(client, owner, tenant, settings):
    settings.OPSDECK_API_RATE = "3/min"
    secret = _token(owner, tenant)

    answers = [_get(client, secret).status_code for _ in range(4)]

    assert answers == [200, 200, 200, 429]


@pytest.mark.django_db
def test_a_request_without_a_valid_token_is_refused_before_it_is_counted(
    client, owner, tenant, settings
):
    settings.OPSDECK_API_RATE = "1/min"
    secret = _token(owner, tenant)

    bad = [_get(client, "odt_not-a-token").status_code for _ in range(3)]

    assert bad == [401, 401, 401]
    assert _get(client, secret).status_code == 200


@pytest.mark.parametrize("value", ["lots", "0/min", "10/fortnight"])
def test_a_rate_that_cannot_be_read_stops_the_start(value):
    result = _manage("check", **_keys(), **_services(), DEBUG="1", OPSDECK_API_WRITE_RATE=value)

    assert result.returncode != 0
    assert "OPSDECK_API_WRITE_RATE must be a number of requests per second" in result.stderr
    assert json.dumps(value) in result.stderr or repr(value) in result.stderr
