from datetime import timedelta

import pytest
from django.utils import timezone

from accounts import services
from accounts.audit import Actor
from accounts.models import AuditEvent, Invitation, Membership


@pytest.fixture
def invite(tenant, owner):
    def make(email="new@example.com", role="member"):
        invitation = services.invitation_create(
            actor=Actor(user=owner), tenant=tenant, email=email, role=role
        )
        return invitation, f"/invitations/{services.invitation_token(invitation)}/"

    return make


@pytest.mark.django_db
def test_invite_form_creates_an_invitation_and_records_it(owner_client, tenant):
    response = owner_client.post(
        f"/t/{tenant.slug}/team/invite/",
        {"email": "New@Example.com", "role": "viewer"},
        follow=True,
    )

    assert b"Invitation sent to new@example.com" in response.content
    invitation = Invitation.objects.get(tenant=tenant)
    assert (invitation.email, invitation.role, invitation.status) == (
        "new@example.com",
        "viewer",
        "pending",
    )
    event = AuditEvent.objects.get(tenant=tenant, action="member.invite")
    assert event.payload == {"email": "new@example.com", "role": "viewer"}


@pytest.mark.django_db
def test_accepting_a_valid_invitation_joins_with_the_invited_role(
    client, invite, make_user, tenant
):
    invitation, link = invite(role="admin")
    client.force_login(make_user("new@example.com"))

    page = client.get(link)
    assert b"Join Acme" in page.content
    response = client.post(link)

    assert response.url == f"/t/{tenant.slug}/"
    member = Membership.objects.get(tenant=tenant, user__email="new@example.com")
    assert member.role == "admin"
    invitation.refresh_from_db()
    assert invitation.status == "accepted"
    assert AuditEvent.objects.filter(tenant=tenant, action="member.join").exists()


@pytest.mark.django_db
def test_an_invitation_link_works_only_once(client, invite, make_user):
    _, link = invite()
    client.force_login(make_user("new@example.com"))
    client.post(link)

    again = client.post(link)

    assert again.status_code == 400
    assert b"already been used" in again.content


@pytest.mark.django_db
def test_an_expired_invitation_is_refused(client, invite, make_user, settings, tenant):
    invitation, link = invite()
    client.force_login(make_user("new@example.com"))
    settings.OPSDECK_INVITATION_MAX_AGE = 60
    Invitation.objects.filter(pk=invitation.pk).update(
        created_at=timezone.now() - timedelta(minutes=5)
    )

    response = client.post(link)

    assert response.status_code == 400
    assert b"expired" in response.content
    assert not Membership.objects.filter(tenant=tenant, user__email="new@example.com").exists()


@pytest.mark.django_db
def test_an_invitation_is_refused_to_someone_signed_in_with_another_address(
    client, invite, make_user, tenant
):
    _, link = invite()
    client.force_login(make_user("other@example.com"))

    response = client.post(link)

    assert response.status_code == 400
    assert b"sent to new@example.com" in response.content
    assert b"signed in as other@example.com" in response.content
    assert not Membership.objects.filter(tenant=tenant, user__email="other@example.com").exists()


@pytest.mark.django_db
def test_a_tampered_link_is_refused(client, invite, make_user):
    _, link = invite()
    client.force_login(make_user("new@example.com"))

    response = client.post(link.replace("/invitations/", "/invitations/x"))

    assert response.status_code == 400
    assert b"not valid" in response.content


@pytest.mark.django_db
def test_a_withdrawn_invitation_is_refused(client, invite, make_user, owner_client, tenant):
    invitation, link = invite()
    owner_client.post(f"/t/{tenant.slug}/team/invitations/{invitation.pk}/revoke/")
    client.force_login(make_user("new@example.com"))

    response = client.post(link)

    assert response.status_code == 400
    assert b"withdrawn" in response.content


@pytest.mark.django_db
def test_signed_out_visitor_is_offered_sign_in_and_sign_up(client, invite):
    _, link = invite()

    page = client.get(link)

    assert page.status_code == 200
    assert b"/accounts/login/?next=" in page.content
    assert b"/accounts/signup/?next=" in page.content


@pytest.mark.django_db
def test_inviting_an_existing_member_is_a_clear_error(owner_client, tenant, add_member):
    add_member("bob@example.com", "member")

    response = owner_client.post(
        f"/t/{tenant.slug}/team/invite/", {"email": "bob@example.com", "role": "member"}
    )

    assert response.status_code == 400
    assert b"bob@example.com is already a member." in response.content
    assert not Invitation.objects.filter(tenant=tenant).exists()


@pytest.mark.django_db
def test_a_member_cannot_invite_and_the_refusal_is_recorded(client, tenant, add_member):
    member = add_member("bob@example.com", "member")
    client.force_login(member)

    response = client.post(
        f"/t/{tenant.slug}/team/invite/",
        {"email": "eve@example.com", "role": "member"},
        follow=True,
    )

    assert b"Your role (Member) does not allow inviting members." in response.content
    assert not Invitation.objects.filter(tenant=tenant).exists()
    denied = AuditEvent.objects.get(tenant=tenant, action="member.invite")
    assert denied.result == "denied"
    assert denied.actor == member


@pytest.mark.django_db
def test_an_unverified_address_cannot_accept_until_it_is_confirmed(
    client, invite, make_user, tenant
):
    _, link = invite()
    client.force_login(make_user("new@example.com", verified=False))

    response = client.post(link)

    assert response.status_code == 400
    assert b"Confirm new@example.com first" in response.content
    assert not Membership.objects.filter(tenant=tenant, user__email="new@example.com").exists()
