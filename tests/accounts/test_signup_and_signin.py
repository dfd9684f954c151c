import re

import pytest
from django.core import mail

from accounts.models import AuditEvent, Membership, Tenant, User
from tests.conftest import PASSWORD


def _signup(client, email="new@example.com", organization="Initech", **extra):
    return client.post(
        "/accounts/signup/",
        {
            "email": email,
            "password1": PASSWORD,
            "password2": PASSWORD,
            "organization": organization,
            **extra,
        },
    )


@pytest.mark.django_db
def test_signup_creates_the_first_organization_with_the_user_as_owner(client):
    response = _signup(client)

    assert response.status_code == 302
    user = User.objects.get(email="new@example.com")
    membership = Membership.objects.get(user=user)
    assert membership.role == "owner"
    assert membership.tenant.name == "Initech"
    assert re.fullmatch(r"initech-[a-z0-9]{6}", membership.tenant.slug)
    assert AuditEvent.objects.filter(
        tenant=membership.tenant, action="tenant.create", actor=user
    ).exists()


@pytest.mark.django_db
def test_signup_without_an_organization_name_names_one_after_the_user(client):
    _signup(client, email="lee@example.com", organization="")

    assert Tenant.objects.for_user(User.objects.get(email="lee@example.com")).get().name == (
        "lee's organization"
    )


@pytest.mark.django_db
def test_signup_requires_email_verification_then_signs_in(client):
    response = _signup(client)

    assert response["Location"] == "/accounts/confirm-email/"
    assert len(mail.outbox) == 1
    link = re.search(r"https?://\S+/accounts/confirm-email/\S+/", mail.outbox[0].body).group(0)
    # Not signed in until the address is confirmed.
    assert client.get("/").status_code == 302
    assert client.get("/").url == "/accounts/login/"

    confirm = client.post(link.split("testserver", 1)[1])
    assert confirm.status_code == 302
    home = client.get("/", follow=True)
    assert home.request["PATH_INFO"] == f"/t/{Tenant.objects.get(name='Initech').slug}/"
    assert b"Initech" in home.content


@pytest.mark.django_db
def test_signup_with_a_taken_email_changes_nothing_and_warns_the_owner(client, owner, tenant):
    before = (User.objects.count(), Tenant.objects.count())

    response = _signup(client, email="owner@example.com")

    # The page does not reveal that the address has an account; the mail to it does.
    assert response["Location"] == "/accounts/confirm-email/"
    assert (User.objects.count(), Tenant.objects.count()) == before
    assert mail.outbox[-1].to == ["owner@example.com"]
    assert "already" in mail.outbox[-1].body


@pytest.mark.django_db
def test_sign_in_with_a_verified_email_lands_on_the_dashboard(client, tenant):
    response = client.post(
        "/accounts/login/", {"login": "owner@example.com", "password": PASSWORD}, follow=True
    )

    assert response.request["PATH_INFO"] == f"/t/{tenant.slug}/"
    assert b"Acme" in response.content
    assert AuditEvent.objects.filter(action="user.login", actor_email="owner@example.com").exists()


@pytest.mark.django_db
def test_sign_in_with_a_wrong_password_is_refused(client, tenant):
    response = client.post("/accounts/login/", {"login": "owner@example.com", "password": "nope"})

    assert response.status_code == 200
    assert b"not correct" in response.content
    assert client.get("/").url == "/accounts/login/"


@pytest.mark.django_db
def test_a_user_without_an_organization_is_sent_to_create_one(client, make_user):
    client.force_login(make_user("solo@example.com"))

    response = client.get("/")

    assert response.url == "/organizations/new/"


@pytest.mark.django_db
def test_new_organization_page_creates_an_organization_owned_by_the_user(
    owner_client, owner, tenant
):
    response = owner_client.post("/organizations/new/", {"name": "Acme"}, follow=True)

    second = Tenant.objects.for_user(owner).exclude(pk=tenant.pk).get()
    assert response.request["PATH_INFO"] == f"/t/{second.slug}/"
    assert Membership.objects.get(tenant=second, user=owner).role == "owner"
    # The switcher offers both.
    assert f'href="/t/{tenant.slug}/"'.encode() in response.content
    assert f'href="/t/{second.slug}/"'.encode() in response.content


@pytest.mark.django_db
def test_a_slug_never_tells_that_another_organization_has_the_name(client, make_user, tenant):
    client.force_login(make_user("rival@example.com"))

    response = client.post("/organizations/new/", {"name": "Acme"}, follow=True)

    theirs = response.request["PATH_INFO"].split("/")[2]
    # Both slugs have the same shape: nothing like "acme-2" says an "Acme" exists.
    assert re.fullmatch(r"acme-[a-z0-9]{6}", tenant.slug)
    assert re.fullmatch(r"acme-[a-z0-9]{6}", theirs)
    assert theirs != tenant.slug


@pytest.mark.django_db
def test_a_slug_transliterates_non_ascii_letters(owner_client):
    response = owner_client.post("/organizations/new/", {"name": "Ünïcødé"}, follow=True)

    assert re.fullmatch(r"/t/unicode-[a-z0-9]{6}/", response.request["PATH_INFO"])
    assert "Ünïcødé".encode() in response.content


@pytest.mark.django_db
def test_new_organization_with_a_blank_name_shows_an_error_and_creates_nothing(owner_client):
    before = Tenant.objects.count()

    response = owner_client.post("/organizations/new/", {"name": "   "})

    assert response.status_code == 200
    assert b"This field is required" in response.content
    assert Tenant.objects.count() == before
