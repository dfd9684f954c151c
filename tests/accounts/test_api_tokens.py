"""Organization API tokens on the Settings page: made by owners and admins, with a role no
higher than theirs, the secret shown once and kept only as a hash; revoked; audited."""

import hashlib
import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import ApiToken, AuditEvent, Membership

SECRET = re.compile(r'<code id="new-token-secret">(odt_[A-Za-z0-9]+)</code>')


def _settings(tenant) -> str:
    return f"/t/{tenant.slug}/settings/"


def _create(client, tenant, **data):
    return client.post(
        f"/t/{tenant.slug}/settings/tokens/",
        {"name": "ci-deploy", "role": "member", "expires": "90", **data},
    )


@pytest.mark.django_db
def test_the_secret_is_shown_once_and_only_its_hash_is_kept(owner_client, owner, tenant):
    response = _create(owner_client, tenant)

    page = response.content.decode()
    assert response.status_code == 200
    secret = SECRET.search(page).group(1)
    assert "shown only this once" in page
    token = ApiToken.objects.get()
    assert (token.name, token.role, token.created_by, token.tenant) == (
        "ci-deploy", "member", owner, tenant
    )  # fmt: skip
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret.startswith(token.prefix) and len(token.prefix) < len(secret) // 2
    stored = " ".join(str(v) for v in ApiToken.objects.values().get().values())
    assert secret not in stored
    assert timedelta(days=89) < token.expires_at - timezone.now() <= timedelta(days=90)

    again = owner_client.get(_settings(tenant)).content.decode()
    assert secret not in again
    assert "ci-deploy" in again and f"{token.prefix}…" in again and "owner@example.com" in again
    # Its expiry as a date: "2 months, 4 weeks from now" read otherwise ten seconds later.
    assert f">{token.expires_at:%-d %b %Y}</time>" in again and "from now" not in again
    event = AuditEvent.objects.get(action="token.create")
    assert (event.actor, event.target_named, event.payload["role"]) == (
        owner,
        "ci-deploy",
        "member",
    )


@pytest.mark.django_db
def test_a_token_that_never_expires(owner_client, tenant):
    _create(owner_client, tenant, expires="")

    assert ApiToken.objects.get().expires_at is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"name": "  "}, "Enter a name that says what the token is for."),
        ({"role": "owner"}, "Choose one of the roles listed."),
        ({"expires": "7000"}, "Choose one of the expiries listed."),
    ],
)
def test_bad_input_is_said_and_makes_no_token(owner_client, tenant, data, said):
    response = _create(owner_client, tenant, **data)

    assert response.status_code == 400
    assert said in response.content.decode()
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_an_admin_makes_tokens_up_to_admin_and_a_member_none(client, tenant, add_member):
    admin = add_member("admin@example.com", "admin")
    client.force_login(admin)

    assert _create(client, tenant, role="admin").status_code == 200
    assert ApiToken.objects.get().role == "admin"

    client.force_login(add_member("member@example.com", "member"))
    assert 'id="api-tokens"' not in client.get(_settings(tenant)).content.decode()
    assert _create(client, tenant).status_code == 403
    assert ApiToken.objects.count() == 1
    denied = AuditEvent.objects.get(action="tenant.tokens", result=AuditEvent.Result.DENIED)
    assert denied.actor_email == "member@example.com"


@pytest.mark.django_db
def test_the_service_refuses_a_role_above_the_creators(tenant, add_member):
    admin = add_member("admin@example.com", "admin")

    with pytest.raises(ValidationError) as refused:
        services.api_token_create(actor=Actor(user=admin), tenant=tenant, name="x", role="owner")

    assert refused.value.message_dict["role"] == ["Choose one of: Admin, Member, Viewer."]
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_revoking_a_token_lists_it_revoked_and_is_audited(owner_client, owner, tenant):
    token, secret = services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name="ci-deploy", role="member"
    )

    response = owner_client.post(f"/t/{tenant.slug}/settings/tokens/{token.pk}/revoke/")

    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert services.api_token_authenticate(secret) is None
    page = owner_client.get(_settings(tenant)).content.decode()
    assert "API token “ci-deploy” revoked" in page
    assert ">revoked<" in page
    event = AuditEvent.objects.get(action="token.revoke")
    assert (event.actor, event.target_named) == (owner, "ci-deploy")


@pytest.mark.django_db
def test_a_token_outlives_its_creator_leaving_but_not_its_organization(owner, tenant, add_member):
    admin = add_member("admin@example.com", "admin")
    token, secret = services.api_token_create(
        actor=Actor(user=admin), tenant=tenant, name="ci", role="member"
    )

    services.membership_leave(actor=Actor(user=admin), tenant=tenant)

    assert not Membership.objects.filter(user=admin).exists()
    assert services.api_token_authenticate(secret) == token
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    assert services.api_token_authenticate(secret) is None
    token.refresh_from_db()
    assert token.revoked_at is not None  # dead for good, should staff restore the organization
    deleted = AuditEvent.objects.get(action="tenant.delete")
    assert deleted.payload["api_access_revoked"] == 1


@pytest.mark.django_db
def test_an_expired_token_authenticates_no_more(owner, tenant):
    token, secret = services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name="ci", role="member",
        expires_in_days=1,
    )  # fmt: skip
    assert services.api_token_authenticate(secret) == token

    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert services.api_token_authenticate(secret) is None
    with pytest.raises(ActionDenied):
        services.permission_require(actor=Actor(token=token), tenant=tenant, action="instance.view")


@pytest.mark.django_db
def test_the_token_list_reads_in_the_same_queries_however_many(
    owner_client, owner, tenant, django_assert_max_num_queries
):
    def make(n):
        for i in range(n):
            services.api_token_create(
                actor=Actor(user=owner), tenant=tenant, name=f"t{i}", role="viewer"
            )

    make(1)
    with CaptureQueriesContext(connection) as one:
        owner_client.get(_settings(tenant))
    make(20)
    with django_assert_max_num_queries(len(one)):
        page = owner_client.get(_settings(tenant)).content.decode()
    assert len(re.findall(r'id="api-token-\d', page)) == 21


@pytest.mark.django_db
def test_the_form_sent_again_makes_no_second_token_and_says_its_secret_was_shown(
    owner_client, tenant
):
    """A reload of the page that showed the secret sent the form again: a second token, the
    first one left behind unnamed by anyone."""
    page = owner_client.get(_settings(tenant)).content.decode()
    request_id = re.search(r'name="request_id" value="([0-9a-f]{32})"', page).group(1)

    first = _create(owner_client, tenant, request_id=request_id)
    again = _create(owner_client, tenant, request_id=request_id)

    assert SECRET.search(first.content.decode())
    assert again.status_code == 302 and ApiToken.objects.count() == 1
    said = owner_client.get(again["Location"]).content.decode()
    assert "This form was sent before: the API token “ci-deploy” was made then" in said
    assert not SECRET.search(said)


@pytest.mark.django_db
def test_the_form_sent_again_a_day_later_still_makes_no_second_token(
    owner_client, tenant, monkeypatch
):
    """A reload of the page the next day sent the form again: "in 90 days" was then another
    day than the first sending's, so the form read as another one sent with the same id (a
    500, below)."""
    first = _create(owner_client, tenant, request_id="a" * 32)
    now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: now() + timedelta(days=1))

    again = _create(owner_client, tenant, request_id="a" * 32)

    assert SECRET.search(first.content.decode())
    assert again.status_code == 302 and ApiToken.objects.count() == 1


@pytest.mark.django_db
def test_the_form_sent_again_with_other_values_is_refused_and_can_be_sent_anew(
    owner_client, tenant
):
    """The page's form sent after Back, its name changed: a 500 (the refusal of its request
    id names no field)."""
    _create(owner_client, tenant, request_id="b" * 32)

    again = _create(owner_client, tenant, name="ci-deploy-2", request_id="b" * 32)

    page = again.content.decode()
    assert again.status_code == 400 and ApiToken.objects.count() == 1
    assert "This form was already sent with different values." in page
    fresh = re.search(r'name="request_id" value="([0-9a-f]{32})"', page).group(1)
    assert fresh != "b" * 32  # corrected, it is sent anew
    assert SECRET.search(
        _create(owner_client, tenant, name="ci-deploy-2", request_id=fresh).content.decode()
    )
    assert ApiToken.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_one_token_for_a_request_id_sent_from_several_threads_at_once(owner, tenant):
    from tests.concurrency import race

    results = race(
        lambda: services.api_token_create(
            actor=Actor(user=owner), tenant=tenant, name="ci", role="member", request_id="tok-1"
        )
    )

    assert ApiToken.objects.count() == 1
    assert all(not isinstance(r, Exception) for r in results), results
    assert sum(secret is not None for _, secret in results) == 1  # shown to one of them


@pytest.mark.django_db
def test_staff_find_a_token_by_its_first_characters_and_revoke_it_in_the_admin(
    staff_client, owner, tenant
):
    """A secret leaked in a build log: the platform team, not the organization's owners, is
    the first to hear of it, and could neither see the organization's tokens nor revoke one."""
    leaked, secret = services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name="ci-deploy", role="member"
    )
    _, other_secret = services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name="backup-job", role="viewer"
    )
    url = "/admin/accounts/apitoken/"

    found = staff_client.get(url, {"q": secret[: len(leaked.prefix)]}).content.decode()
    assert "ci-deploy" in found and "backup-job" not in found
    assert "Acme" in found and "owner@example.com" in found
    detail = staff_client.get(f"{url}{leaked.pk}/change/").content.decode()
    assert leaked.digest not in detail and secret not in detail

    done = staff_client.post(
        url, {"action": "revoke", "_selected_action": [leaked.pk]}, follow=True
    ).content.decode()

    assert "Revoked: 1." in done
    assert services.api_token_authenticate(secret) is None
    assert services.api_token_authenticate(other_secret) is not None
    event = AuditEvent.objects.get(action="token.revoke")
    assert (event.actor_kind, event.target_named) == ("staff", "ci-deploy")
    revoked = staff_client.get(url, {"status": "revoked"}).content.decode()
    assert "ci-deploy" in revoked and "backup-job" not in revoked


@pytest.mark.django_db
def test_the_admins_token_list_reads_in_the_same_queries_however_many(staff_client, owner, tenant):
    def listed() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert staff_client.get("/admin/accounts/apitoken/").status_code == 200
        (rows,) = [q["sql"] for q in queries if 'FROM "accounts_apitoken"' in q["sql"]
                   and "COUNT" not in q["sql"]]  # fmt: skip
        assert '"digest"' not in rows  # a column it does not show
        return len(queries)

    services.api_token_create(actor=Actor(user=owner), tenant=tenant, name="a", role="member")
    one = listed()
    for n in range(5):
        services.api_token_create(
            actor=Actor(user=owner), tenant=tenant, name=f"b{n}", role="viewer"
        )

    assert listed() == one
