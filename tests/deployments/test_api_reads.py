"""The API's reads: a token's organization's deployments and their operations, as JSON."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import ApiToken, AuditEvent
from deployments.models import Instance
from tests.deployments import factories


@pytest.fixture
def version(db):
    return factories.postgres_version()


@pytest.fixture
def cell(db):
    return factories.cell()


def _token(owner, tenant, role="member", **extra) -> str:
    return account_services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name="ci", role=role, **extra
    )[1]


def _get(client, path, secret):
    return client.get(f"/api/v1/{path}", HTTP_AUTHORIZATION=f"Bearer {secret}")


@pytest.mark.django_db
def test_the_list_holds_the_tokens_organizations_deployments(
    client, owner, tenant, version, cell, make_user
):
    factories.make_instances(tenant, version, cell, 2, name="orders")
    theirs = account_services.tenant_create(actor=Actor(user=make_user("x@example.com")), name="X")
    factories.make_instances(theirs, version, cell, 1, name="theirs")

    response = _get(client, "deployments", _token(owner, tenant))

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert [row["name"] for row in body["results"]] == ["orders-1", "orders-0"]
    row = body["results"][0]
    assert row["state"] == "running" and row["health"] == "healthy"
    assert row["plan"]["version"] == version.number and row["plan"]["key"] == version.plan.key
    assert (row["region"], row["cell"]) == ("eu-west", "eu-1")


@pytest.mark.django_db
def test_the_list_is_filtered_by_name_and_state_as_the_page_filters_it(
    client, owner, tenant, version, cell
):
    orders = factories.make_instances(tenant, version, cell, 2, name="orders")
    factories.make_instances(tenant, version, cell, 1, name="billing")
    Instance.objects.filter(pk=orders[0].pk).update(state=Instance.State.STOPPED)
    Instance.objects.filter(pk=orders[1].pk).update(state=Instance.State.DELETED)
    secret = _token(owner, tenant)

    def names(query):
        response = _get(client, f"deployments?{query}", secret)
        assert response.status_code == 200, response.json()
        return [row["name"] for row in response.json()["results"]]

    assert names("search=ORD") == ["orders-0"]  # any part of a name, any case; not deleted ones
    assert names(f"search={orders[0].pk[5:]}") == ["orders-0"]  # an id, without its "inst-"
    assert names("state=stopped") == ["orders-0"]
    assert names("state=deleted") == ["orders-1"]
    assert names("search=nothing-like-it") == []
    unknown = _get(client, "deployments?state=sleeping", secret)
    assert unknown.status_code == 400
    assert set(unknown.json()["fields"]) == {"state"}


@pytest.mark.django_db
def test_the_list_reads_in_the_same_queries_for_1_and_20(client, owner, tenant, version, cell):
    secret = _token(owner, tenant)
    factories.make_instances(tenant, version, cell, 1, name="a")
    _get(client, "deployments", secret)  # the token's first use is noted once a minute

    with CaptureQueriesContext(connection) as one:
        assert _get(client, "deployments", secret).json()["count"] == 1
    factories.make_instances(tenant, version, cell, 19, name="b")
    with CaptureQueriesContext(connection) as twenty:
        assert len(_get(client, "deployments", secret).json()["results"]) == 20

    assert len(twenty) == len(one)


@pytest.mark.django_db
def test_a_deployment_shows_what_its_page_shows_and_no_secret(client, owner, tenant, version, cell):
    instance = factories.make_instances(tenant, version, cell, 1, name="orders")[0]
    Instance.objects.filter(pk=instance.pk).update(
        parameters=factories.PARAMETERS,
        secret_parameters='{"password": "hunter2-secret"}',
        outputs={"host": "orders-rw"},
    )

    response = _get(client, f"deployments/{instance.pk}", _token(owner, tenant))

    body = response.json()
    assert response.status_code == 200
    assert body["id"] == instance.pk and body["name"] == "orders-0"
    assert body["outputs"] == {"host": "orders-rw"}
    assert body["parameters"]["instances"]["value"] == "3"
    assert "hunter2" not in response.content.decode()
    hidden = [p for p in body["parameters"].values() if p["value"] == "set, hidden"]
    assert hidden  # the password is said to be set, never shown


@pytest.mark.django_db
def test_another_organizations_deployment_is_404(client, owner, tenant, version, cell, make_user):
    theirs = account_services.tenant_create(actor=Actor(user=make_user("x@example.com")), name="X")
    instance = factories.make_instances(theirs, version, cell, 1, name="theirs")[0]
    operation = factories.make_operation(instance)
    secret = _token(owner, tenant)

    for path in (
        f"deployments/{instance.pk}",
        f"deployments/{instance.pk}/operations",
        f"deployments/{instance.pk}/operations/{operation.pk}",
    ):
        response = _get(client, path, secret)
        assert response.status_code == 404, path
        assert response.json() == {"error": "No such deployment."}


@pytest.mark.django_db
def test_operations_list_and_one(client, owner, tenant, version, cell):
    instance = factories.make_instances(tenant, version, cell, 1, name="orders")[0]
    failed = factories.make_operation(instance, verb="restart", state="failed", error="it broke")
    secret = _token(owner, tenant, role="viewer")

    listed = _get(client, f"deployments/{instance.pk}/operations", secret).json()
    one = _get(client, f"deployments/{instance.pk}/operations/{failed.pk}", secret).json()

    assert [o["id"] for o in listed["results"]] == [str(failed.pk)]
    assert one["verb"] == "restart" and one["state"] == "failed" and one["error"] == "it broke"
    assert one["finished_at"] is not None


@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "Bearer odt_nope", "Bearer", "Basic dXNlcjpwYXNz"])
def test_no_valid_token_is_401_in_json(client, header):
    extra = {"HTTP_AUTHORIZATION": header} if header else {}

    response = client.get("/api/v1/deployments", **extra)

    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.django_db
def test_a_revoked_or_expired_token_is_401(client, owner, tenant):
    secret = _token(owner, tenant)
    token = ApiToken.objects.get()
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _get(client, "deployments", secret).status_code == 401

    ApiToken.objects.filter(pk=token.pk).update(expires_at=None)
    assert _get(client, "deployments", secret).status_code == 200
    account_services.api_token_revoke(actor=Actor(user=owner), token=token)

    response = _get(client, "deployments", secret)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]


@pytest.mark.django_db
def test_a_session_does_not_open_the_api(owner_client):
    assert owner_client.get("/api/v1/deployments").status_code == 401


@pytest.mark.django_db
def test_an_unknown_address_is_a_json_404(client, owner, tenant):
    response = _get(client, "nothing/here", _token(owner, tenant))

    assert response.status_code == 404
    assert response.json() == {"error": "No such API endpoint."}


@pytest.mark.django_db
def test_the_token_records_when_it_was_used(client, owner, tenant):
    secret = _token(owner, tenant)
    assert ApiToken.objects.get().last_used_at is None

    _get(client, "deployments", secret)

    assert ApiToken.objects.get().last_used_at is not None
    assert not AuditEvent.objects.filter(result=AuditEvent.Result.DENIED).exists()


@pytest.mark.django_db
def test_a_method_an_address_does_not_take_is_a_json_405(client, owner, tenant):
    secret = _token(owner, tenant)

    for method in ("put", "patch", "options"):
        response = getattr(client, method)(
            "/api/v1/deployments", HTTP_AUTHORIZATION=f"Bearer {secret}"
        )
        assert response.status_code == 405, method
        assert response.json()["error"]


@pytest.mark.django_db
def test_a_fault_of_ours_is_a_json_500_logged_with_its_traceback(
    client, owner, tenant, version, cell, caplog
):
    """A script reading the API got the portal's HTML error page, which it cannot parse."""
    factories.make_instances(tenant, version, cell, 1)
    secret = _token(owner, tenant)
    with connection.cursor() as cursor:  # the database fails the list's query
        cursor.execute("ALTER TABLE deployments_instance RENAME TO deployments_instance_gone")

    with caplog.at_level("ERROR", logger="django.request"):
        response = _get(client, "deployments", secret)

    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert "went wrong on our side" in response.json()["error"]
    (logged,) = [r for r in caplog.records if r.name == "django.request"]
    assert logged.getMessage() == "Internal Server Error: /api/v1/deployments"
    assert "deployments_instance" in str(logged.exc_info[1])
