import importlib
import re
import threading
import time
import uuid
from datetime import timedelta

import pytest
from allauth.account.models import EmailAddress
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.test import Client
from django.utils import timezone

from accounts import services
from accounts.audit import Actor
from accounts.errors import InvitationInvalid
from accounts.models import AuditEvent, Invitation, Membership, User
from tests.concurrency import beside_a_lock, race


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
def test_inviting_an_address_again_says_the_earlier_link_stops_working_and_the_role_changed(
    owner_client, tenant, invite
):
    earlier, _ = invite("new@example.com", role="viewer")

    def send(role):
        response = owner_client.post(
            f"/t/{tenant.slug}/team/invite/",
            {"email": "new@example.com", "role": role},
            follow=True,
        )
        return response.content.decode()

    changed, same = send("admin"), send("admin")

    assert (
        "Invitation sent again to new@example.com: the earlier link no longer works. "
        "It invites them as Admin now, not as Viewer."
    ) in changed
    assert "Invitation sent again to new@example.com: the earlier link no longer works." in same
    assert "not as" not in same
    earlier.refresh_from_db()
    assert earlier.status == "revoked"
    # An expired invitation's link worked no more: sending a new one is a first send.
    Invitation.objects.filter(revoked_at=None).update(
        created_at=timezone.now() - timedelta(days=60)
    )
    assert "Invitation sent to new@example.com." in send("member")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "sent, message",
    [
        ({"email": "", "role": "member"}, "Enter the email address of the person to invite."),
        ({"email": "someone@", "role": "member"}, "Enter an email address, like name@example.com."),
        ({"email": "new@example.com", "role": "god"}, "Choose one of the roles listed."),
        ({"email": "x@localhost", "role": "member"}, "Enter an address at an internet domain"),
        ({"email": "x@[127.0.0.1]", "role": "member"}, "Enter an address at an internet domain"),
    ],
)
def test_the_invite_form_says_what_to_correct_and_invites_no_one(
    owner_client, tenant, sent, message
):
    response = owner_client.post(f"/t/{tenant.slug}/team/invite/", sent)

    page = response.content.decode()
    assert message in page
    assert not Invitation.objects.exists()
    # Beside its field, and in the summary above the form, which leads to that field.
    field = "invite-role" if "role" in message else "invite-email"
    assert "There is a problem" in page and f'<a href="#{field}">' in page
    assert f'id="{field}"' in page


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
@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_an_invitation_link_answers_another_method_with_405_and_joins_no_one(
    client, invite, make_user, tenant, method
):
    invitation, link = invite()
    client.force_login(make_user("new@example.com"))

    assert getattr(client, method)(link).status_code == 405
    invitation.refresh_from_db()
    assert invitation.status == "pending"
    assert not Membership.objects.filter(tenant=tenant, user__email="new@example.com").exists()


@pytest.mark.django_db
def test_two_organizations_of_one_name_are_told_apart_in_the_switcher(
    client, invite, make_user, tenant
):
    newcomer = make_user("new@example.com")
    theirs = services.tenant_create(actor=Actor(user=newcomer), name="ACME")
    _, link = invite()
    client.force_login(newcomer)

    client.post(link)  # they join another organization called Acme
    page = client.get(f"/t/{tenant.slug}/").content.decode()

    switcher = page[page.index("tenant-switcher") : page.index("New organization")]
    assert f"Acme <small>· Member · {tenant.slug}</small>" in switcher
    assert f"ACME <small>· Owner · {theirs.slug}</small>" in switcher
    # Names told apart by themselves show no address.
    services.tenant_rename(actor=Actor(user=newcomer), tenant=theirs, name="Initech")
    switcher = client.get(f"/t/{tenant.slug}/").content.decode()
    assert "Acme <small>· Member</small>" in switcher
    assert "Initech <small>· Owner</small>" in switcher


def _invitations_on_landing(client) -> list[str]:
    """The invitation links on the page a signed-in user lands on."""
    page = client.get("/", follow=True)
    assert page.status_code == 200
    return re.findall(r'<a href="(/invitations/[^"]+/)">Join ', page.content.decode())


@pytest.mark.django_db
def test_an_invitee_who_belongs_nowhere_finds_the_invitation_where_they_land(
    client, invite, make_user, tenant
):
    # Confirmed in another browser: the link's page never opened in this session.
    invite(role="admin")
    client.force_login(make_user("New@Example.com"))

    page = client.get("/", follow=True)
    (link,) = _invitations_on_landing(client)
    response = client.post(link)

    assert b"Invitations for you" in page.content
    assert b"Join Acme</a> as Admin" in page.content
    assert response.url == f"/t/{tenant.slug}/"
    joined = Membership.objects.get(tenant=tenant, user__email__iexact="new@example.com")
    assert joined.role == "admin"
    assert _invitations_on_landing(client) == []  # the new-organization form lists it no more


@pytest.mark.django_db
def test_the_landing_lists_no_invitation_to_an_unconfirmed_or_other_address_nor_a_closed_one(
    client, invite, make_user, tenant, owner_client, settings
):
    invite("unconfirmed@example.com")
    withdrawn, _ = invite("withdrawn@example.com")
    owner_client.post(f"/t/{tenant.slug}/team/invitations/{withdrawn.pk}/revoke/")
    expired, _ = invite("expired@example.com")
    Invitation.objects.filter(pk=expired.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE + 1)
    )

    for email, verified in [
        ("unconfirmed@example.com", False),
        ("withdrawn@example.com", True),
        ("expired@example.com", True),
        ("someone@example.com", True),
    ]:
        client.force_login(make_user(email, verified=verified))
        assert _invitations_on_landing(client) == [], email


@pytest.mark.django_db
def test_an_invitation_to_a_second_address_the_invitee_confirmed_is_theirs_to_accept(
    client, invite, make_user, tenant
):
    from allauth.account.models import EmailAddress

    user = make_user("first@example.com")
    EmailAddress.objects.create(user=user, email="second@example.com", verified=True)
    EmailAddress.objects.create(user=user, email="third@example.com", verified=False)
    invite("Second@Example.com")
    _, unconfirmed = invite("third@example.com")
    client.force_login(user)

    # They sign in with either address: one they confirmed is theirs, as the first is.
    (link,) = _invitations_on_landing(client)
    refused = client.post(unconfirmed)
    assert refused.status_code == 400
    assert "Confirm third@example.com first" in refused.content.decode()
    joined = client.post(link)

    assert joined.status_code == 302 and joined.url == f"/t/{tenant.slug}/"
    assert tenant.memberships.filter(user=user, role="member").exists()
    denied = AuditEvent.objects.get(action="member.join", result="denied")
    assert denied.payload["reason"].startswith("Confirm third@example.com first")


@pytest.mark.django_db
def test_an_invitation_link_works_only_once(client, invite, make_user, tenant):
    _, link = invite()
    client.force_login(make_user("new@example.com"))
    client.post(link)

    again = client.post(link)  # a second tab, or the link followed again
    opened = client.get(link, follow=True)
    signed_out = Client().get(link)

    # The one who accepted it is led to what they joined; anyone else is told it was used.
    assert again.status_code == 302 and again.url == f"/t/{tenant.slug}/"
    assert "You have joined Acme." in opened.content.decode()
    assert "already been used" not in opened.content.decode()
    assert signed_out.status_code == 400
    assert b"already been used" in signed_out.content
    assert Membership.objects.filter(tenant=tenant, user__email="new@example.com").count() == 1


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
def test_an_invitation_says_when_on_its_last_day_it_stops_working(
    client, invite, make_user, owner_client, tenant
):
    # Sent at 02:00 UTC, it stops working at 02:00 UTC seven days later: "expires on 8 March"
    # reads as the whole of the 8th, and in New York the link is dead from 21:00 on the 7th.
    invitation, link = invite()
    sent = timezone.now().replace(hour=2, minute=0, second=0, microsecond=0) - timedelta(days=1)
    Invitation.objects.filter(pk=invitation.pk).update(created_at=sent)
    last_day = sent + timedelta(days=7)

    services.invitation_email_send(invitation_pk=invitation.pk)
    team = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    client.force_login(make_user("new@example.com"))
    page = client.get(link).content.decode()
    landing = client.get("/", follow=True).content.decode()

    assert f"expires on {last_day:%-d %B %Y} at 02:00 UTC." in mail.outbox[-1].body
    assert f"expires {last_day:%-d %B %Y} at 02:00 UTC." in page
    assert f"until {last_day:%-d %B %Y} at 02:00 UTC." in landing
    assert f"{last_day:%-d %b %Y}, 02:00 UTC" in team


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
@pytest.mark.parametrize(
    "email, verified, said",
    [
        ("other@example.com", True, "This invitation was sent to new@example.com, but you are "
         "signed in as other@example.com."),
        ("new@example.com", False, "Confirm new@example.com first"),
    ],
)  # fmt: skip
def test_the_invitation_page_says_why_the_signed_in_user_cannot_accept_before_any_click(
    client, invite, make_user, email, verified, said
):
    _, link = invite()
    client.force_login(make_user(email, verified=verified))

    page = client.get(link).content.decode()

    assert said in page
    assert "Accept and join" not in page
    assert ("Sign out, then sign in as new@example.com" in page) is (email != "new@example.com")
    if email != "new@example.com":  # signed out, the page offers to sign in or up
        assert client.post("/accounts/logout/", {"next": link})["Location"] == link


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
    # The account it offers to create is for the invited address, filled in.
    signup = re.search(r'href="(/accounts/signup/[^"]+)"', page.content.decode())[1]
    form = client.get(signup.replace("&amp;", "&")).content.decode()
    assert re.search(r'<input[^>]+name="email"[^>]+value="new@example.com"', form)


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


@pytest.mark.django_db(transaction=True)
def test_invitations_sent_to_one_address_at_once_leave_only_the_last_one_open(
    tenant, owner, make_user, monkeypatch
):
    full_clean = Invitation.full_clean

    def slow_full_clean(self, *args, **kwargs):
        time.sleep(0.2)  # a slow request: the others reach their own invitation meanwhile
        return full_clean(self, *args, **kwargs)

    monkeypatch.setattr(Invitation, "full_clean", slow_full_clean)
    # Each thread takes a signed-in browser and a form: roles alternate, request ids differ.
    browsers = []
    for role, request_id in [
        ("admin", "r-1"),
        ("viewer", "r-2"),
        ("admin", "r-3"),
        ("viewer", "r-4"),
    ]:
        browser = Client()
        browser.force_login(owner)
        browsers.append((browser, role, request_id))
    taking = threading.Lock()

    def submit():
        with taking:
            browser, role, request_id = browsers.pop()
        return browser.post(
            f"/t/{tenant.slug}/team/invite/",
            {"email": "carol@x.example", "role": role, "request_id": request_id},
        )

    results = race(submit)

    assert [getattr(r, "status_code", r) for r in results] == [302] * 4, results
    sent = list(Invitation.objects.filter(tenant=tenant).order_by("created_at", "pk"))
    assert len(sent) == 4
    assert [i.status for i in sent] == ["revoked"] * 3 + ["pending"]
    browser = Client()
    browser.force_login(owner)
    team = browser.get(f"/t/{tenant.slug}/team/").content.decode()
    assert team.count("<td>carol@x.example</td>") == 1
    assert AuditEvent.objects.filter(tenant=tenant, action="member.invite").count() == 4
    browser.force_login(make_user("carol@x.example"))
    replaced = browser.post(f"/invitations/{services.invitation_token(sent[0])}/")
    assert replaced.status_code == 400
    assert b"replaced by a newer one" in replaced.content
    joined = browser.post(f"/invitations/{services.invitation_token(sent[-1])}/")
    assert joined.status_code == 302
    assert Membership.objects.get(tenant=tenant, user__email="carol@x.example").role == (
        sent[-1].role
    )


@pytest.mark.django_db
def test_a_replaced_invitation_says_so_and_the_newer_one_joins_with_its_role(
    client, invite, make_user, tenant
):
    _, first = invite(email="carol@x.example", role="viewer")
    _, second = invite(email="Carol@X.example", role="admin")
    client.force_login(make_user("carol@x.example"))

    response = client.post(first, follow=True)

    assert response.status_code == 400
    assert b"replaced by a newer one" in response.content
    assert b"Welcome" not in response.content
    assert not Membership.objects.filter(tenant=tenant, user__email="carol@x.example").exists()
    client.post(second)
    assert Membership.objects.get(tenant=tenant, user__email="carol@x.example").role == "admin"


@pytest.mark.django_db
def test_the_database_holds_one_open_invitation_per_address_whatever_its_case(tenant):
    Invitation.objects.create(tenant=tenant, email="carol@x.example", role="viewer")

    with pytest.raises(IntegrityError):
        Invitation.objects.create(tenant=tenant, email="Carol@x.example", role="admin")


@pytest.mark.django_db
def test_the_migration_withdraws_all_but_the_newest_open_invitation_to_an_address(tenant):
    from django.apps import apps
    from django.db import connection

    migration = importlib.import_module("accounts.migrations.0007_invitations_open_apart")
    with connection.cursor() as cursor:  # as before the constraint (the test's rollback undoes it)
        cursor.execute("DROP INDEX invitation_open_once")
    now = timezone.now()
    made = [
        Invitation.objects.create(
            tenant=tenant, email=email, role="member", created_at=now - timedelta(minutes=age)
        )
        for email, age in [("carol@x.example", 3), ("Carol@x.example", 2), ("bob@x.example", 1)]
    ]
    made.append(
        Invitation.objects.create(
            tenant=tenant, email="carol@x.example", role="member", accepted_at=now
        )
    )

    migration.older_open_invitations_revoke(apps, None)

    statuses = [Invitation.objects.get(pk=i.pk).status for i in made]
    assert statuses == ["revoked", "pending", "pending", "accepted"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("before", "said"),
    [
        ({"accepted_at": timezone.now()}, "was already accepted."),
        ({"revoked_at": timezone.now()}, "was already withdrawn."),
        ({"created_at": timezone.now() - timedelta(days=400)}, "has already expired."),
    ],
)
def test_withdrawing_an_invitation_no_longer_pending_says_why_and_changes_nothing(
    owner_client, invite, tenant, before, said
):
    invitation, _ = invite(email="bob@x.example")
    Invitation.objects.filter(pk=invitation.pk).update(**before)
    unchanged = Invitation.objects.get(pk=invitation.pk)

    response = owner_client.post(
        f"/t/{tenant.slug}/team/invitations/{invitation.pk}/revoke/", follow=True
    )

    page = response.content.decode()
    assert f"The invitation to bob@x.example {said}" in page
    assert "Invitation to bob@x.example withdrawn." not in page
    assert Invitation.objects.get(pk=invitation.pk).revoked_at == unchanged.revoked_at
    assert not AuditEvent.objects.filter(tenant=tenant, action="invitation.revoke").exists()


@pytest.mark.django_db
def test_withdrawing_a_pending_invitation_says_so_and_records_it(owner_client, invite, tenant):
    invitation, _ = invite(email="bob@x.example")

    response = owner_client.post(
        f"/t/{tenant.slug}/team/invitations/{invitation.pk}/revoke/", follow=True
    )

    assert "Invitation to bob@x.example withdrawn." in response.content.decode()
    assert Invitation.objects.get(pk=invitation.pk).status == "revoked"
    assert AuditEvent.objects.filter(tenant=tenant, action="invitation.revoke").count() == 1


@pytest.mark.django_db(transaction=True)
def test_inviting_someone_again_while_they_accept_leaves_a_member_or_an_open_invitation_not_both(
    tenant, owner
):
    """Swept over the moments the second invitation may come while the first is accepted."""
    for n, delay in enumerate(x / 1000 for x in range(0, 40, 3)):
        email = f"carol{n}@x.example"
        first = services.invitation_create(
            actor=Actor(user=owner), tenant=tenant, email=email, role="member"
        )
        invitee = User.objects.create_user(email=email, password=None)
        EmailAddress.objects.create(user=invitee, email=email, verified=True, primary=True)
        page = Client()
        page.force_login(invitee)
        turns, turn = iter(["accept", "invite"]), threading.Lock()

        def accept_or_invite(first=first, page=page, email=email, turns=turns, turn=turn,
                             delay=delay):  # fmt: skip
            with turn:
                action = next(turns)
            if action == "accept":
                return page.post(f"/invitations/{services.invitation_token(first)}/").status_code
            time.sleep(delay)
            try:
                return services.invitation_create(
                    actor=Actor(user=owner), tenant=tenant, email=email, role="admin"
                ).status
            except ValidationError as exc:  # the refusal, when they joined first
                return exc.messages

        results = race(accept_or_invite, times=2)

        joined = Membership.objects.filter(tenant=tenant, user=invitee).first()
        still_open = Invitation.objects.filter(tenant=tenant, email=email, accepted_at=None,
                                               revoked_at=None)  # fmt: skip
        if joined is not None:  # they joined first: the second invitation was refused
            assert joined.role == "member" and not still_open.exists(), (delay, results)
            assert f"{email} is already a member." in str(results)
        else:  # the invitation was sent first: the older link no longer works, the new one does
            assert [i.role for i in still_open] == ["admin"], (delay, results)


@pytest.mark.django_db
def test_an_invitation_to_a_deleted_organization_says_so(client, invite, make_user, owner):
    from accounts import services
    from accounts.audit import Actor

    invitation, link = invite()
    services.tenant_delete(actor=Actor(user=owner), tenant=invitation.tenant, confirm_name="Acme")
    client.force_login(make_user("new@example.com"))

    response = client.post(link)

    assert response.status_code == 400
    assert "Acme has been deleted: this invitation can no longer be used." in (
        response.content.decode()
    )
    assert not Membership.objects.filter(user__email="new@example.com").exists()


@pytest.mark.django_db(transaction=True)
def test_an_invitation_accepted_as_the_organization_is_deleted_says_it_was_deleted(
    owner, tenant, make_user
):
    """Bob opens his invitation as the owner deletes Acme, the delete first to take Acme's
    lock: Bob was told "This invitation can no longer be used.", which reads as if someone
    withdrew it on purpose, not that Acme was deleted (what the link says a moment later)."""
    bob = make_user("bob@example.com")
    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="bob@example.com", role="member"
    )
    token = services.invitation_token(invitation)

    deleted, accepted = beside_a_lock(
        lambda: services.tenant_lock(tenant.pk),
        lambda: services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme"),
        lambda: services.invitation_accept(actor=Actor(user=bob), token=token),
    )

    assert deleted == "committed"
    assert isinstance(accepted, InvitationInvalid), accepted
    assert str(accepted) == "Acme has been deleted: this invitation can no longer be used."
    assert not Membership.objects.filter(user=bob).exists()


@pytest.mark.django_db
def test_an_address_a_member_confirmed_cannot_be_invited(owner_client, tenant, add_member):
    bob = add_member("bob@example.com", "viewer")
    EmailAddress.objects.create(user=bob, email="bob@work.example.com", verified=True)

    response = owner_client.post(
        f"/t/{tenant.slug}/team/invite/", {"email": "Bob@Work.example.com", "role": "admin"}
    )

    assert "bob@work.example.com is already a member." in response.content.decode()
    assert not Invitation.objects.filter(tenant=tenant).exists()


@pytest.mark.django_db
def test_a_member_opening_an_invitation_is_told_it_cannot_change_their_role(
    client, invite, tenant, add_member
):
    invitation, link = invite(email="bob@example.com", role="admin")
    bob = add_member("bob@example.com", "viewer")  # joined meanwhile, by another invitation
    client.force_login(bob)

    page = client.get(link).content.decode()
    answer = client.post(link)

    said = "You are already a member of Acme: an invitation cannot change your role."
    assert said in page and said in answer.content.decode()
    assert "Welcome" not in answer.content.decode()
    assert Membership.objects.get(tenant=tenant, user=bob).role == "viewer"
    invitation.refresh_from_db()
    assert invitation.status == "pending"


@pytest.mark.django_db
def test_an_admin_can_neither_withdraw_nor_replace_an_owners_invitation_to_be_owner(
    client, invite, tenant, add_member
):
    invitation, _ = invite(email="heir@example.com", role="owner")
    invite(email="clerk@example.com", role="viewer")
    client.force_login(add_member("admin@example.com", "admin"))
    team = client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert team.count(">Withdraw</button>") == 1  # the viewer's invitation only

    withdrawn = client.post(
        f"/t/{tenant.slug}/team/invitations/{invitation.pk}/revoke/", follow=True
    )
    replaced = client.post(
        f"/t/{tenant.slug}/team/invite/", {"email": "heir@example.com", "role": "viewer"},
        follow=True,
    )  # fmt: skip

    for answer in (withdrawn, replaced):
        assert "Your role (Admin) does not allow" in answer.content.decode()
    invitation.refresh_from_db()
    assert invitation.status == "pending"
    assert Invitation.objects.get(email="heir@example.com", revoked_at=None).role == "owner"
    assert AuditEvent.objects.filter(action="invitation.revoke", result="denied").exists()
    assert AuditEvent.objects.filter(action="member.invite", result="denied").exists()


@pytest.mark.django_db
def test_an_owner_demoted_to_admin_takes_back_the_invitation_to_be_owner_they_sent(
    client, owner_client, tenant, add_member, make_user
):
    """An invitation gives no more than its sender may still give: the owner who invited an
    heir to be owner, once an admin, cannot make owners, nor can the invitation they sent."""
    former = add_member("former@example.com", "owner")
    sent = {
        role: services.invitation_create(
            actor=Actor(user=former), tenant=tenant, email=f"{role}.invitee@example.com", role=role
        )
        for role in ("owner", "viewer")
    }

    page = owner_client.post(
        f"/t/{tenant.slug}/team/{Membership.objects.get(user=former).pk}/role/",
        {"role": "admin"},
        follow=True,
    ).content.decode()

    assert (
        "former@example.com is now Admin. The invitation they had sent to "
        "owner.invitee@example.com was withdrawn."
    ) in page
    assert {role: Invitation.objects.get(pk=i.pk).status for role, i in sent.items()} == {
        "owner": "revoked",
        "viewer": "pending",  # an admin may still invite viewers
    }
    event = AuditEvent.objects.get(action="invitation.revoke")
    assert event.payload == {
        "email": "owner.invitee@example.com",
        "reason": "its sender became Admin",
    }
    client.force_login(make_user("owner.invitee@example.com"))
    link = f"/invitations/{services.invitation_token(sent['owner'])}/"
    assert "This invitation was withdrawn." in client.get(link).content.decode()


@pytest.mark.django_db
def test_a_member_removed_or_leaving_takes_the_invitations_they_sent_with_them(
    client, owner_client, tenant, add_member
):
    removed, leaving = (
        add_member("gone@example.com", "admin"),
        add_member("quit@example.com", "admin"),
    )
    for sender in (removed, leaving):
        for n in range(5):
            services.invitation_create(
                actor=Actor(user=sender), tenant=tenant, email=f"{n}.{sender.email}", role="member"
            )
    kept = services.invitation_create(
        actor=Actor(user=leaving), tenant=tenant, email="kept@example.com", role="member"
    )
    Invitation.objects.filter(pk=kept.pk).update(invited_by=None)  # sent by no one left

    removal = owner_client.post(
        f"/t/{tenant.slug}/team/{Membership.objects.get(user=removed).pk}/remove/", follow=True
    ).content.decode()
    client.force_login(leaving)
    departure = client.post(f"/t/{tenant.slug}/settings/leave/", follow=True).content.decode()

    assert (
        "gone@example.com was removed. The invitations they had sent to 0.gone@example.com, "
        "1.gone@example.com, 2.gone@example.com and 2 more were withdrawn."
    ) in removal
    assert "You left Acme. The invitations you had sent to 0.quit@example.com" in departure
    pending = Invitation.objects.filter(revoked_at=None).values_list("email", flat=True)
    assert list(pending) == ["kept@example.com"]
    reasons = AuditEvent.objects.filter(action="invitation.revoke").values_list(
        "payload__reason", flat=True
    )
    assert list(reasons) == ["its sender left the organization"] * 10


@pytest.mark.django_db
def test_a_demotion_that_leaves_inviting_withdraws_nothing_it_may_still_send(
    owner_client, tenant, add_member
):
    admin = add_member("admin@example.com", "admin")
    invitation = services.invitation_create(
        actor=Actor(user=admin), tenant=tenant, email="new@example.com", role="admin"
    )

    page = owner_client.post(
        f"/t/{tenant.slug}/team/{Membership.objects.get(user=admin).pk}/role/",
        {"role": "owner"},
        follow=True,
    ).content.decode()

    assert "admin@example.com is now Owner." in page
    assert "withdrawn" not in page
    invitation.refresh_from_db()
    assert invitation.status == "pending"


@pytest.fixture
def invited_twice(tenant, invite, make_user):
    """One person invited at their work address as a viewer and at their home address as an
    admin, who confirmed both on their account and joined through the first."""
    _, work = invite("bob@work.example.com", "viewer")
    home, home_url = invite("bob@home.example.com", "admin")
    bob = make_user("bob@work.example.com")
    EmailAddress.objects.create(user=bob, email="Bob@Home.example.com", verified=True)
    bob_client = Client()
    bob_client.force_login(bob)
    bob_client.post(work)
    assert Membership.objects.get(tenant=tenant, user=bob).role == "viewer"
    return bob, bob_client, home, home_url


def test_joining_withdraws_the_invitations_left_to_the_members_other_addresses(
    tenant, invited_twice
):
    """The admin invitation stayed open beside the member, listed on the team page; once they
    were removed (or left), it let them back as admin without anyone inviting them again."""
    _, _, home, _ = invited_twice

    home.refresh_from_db()
    assert home.status == "revoked"
    assert AuditEvent.objects.filter(
        action="invitation.revoke",
        target_id=str(home.pk),
        payload__reason="its recipient joined through another invitation",
    ).exists()


@pytest.mark.parametrize("how", ["removed", "left"])
def test_a_member_removed_or_leaving_cannot_come_back_through_an_invitation_to_another_address(
    tenant, owner, owner_client, invited_twice, how
):
    bob, bob_client, home, home_url = invited_twice
    # Opened again as it stood before joining withdrew it (an invitation left from before).
    Invitation.objects.filter(pk=home.pk).update(revoked_at=None)

    if how == "removed":
        membership = Membership.objects.get(tenant=tenant, user=bob)
        said = owner_client.post(f"/t/{tenant.slug}/team/{membership.pk}/remove/", follow=True)
        # The owner sent it: they are told it went (it left the team page without a word).
        assert (
            "The invitation to bob@home.example.com, an address of theirs, was withdrawn."
            in said.content.decode()
        )
    else:
        bob_client.post(f"/t/{tenant.slug}/settings/leave/")
    assert not Membership.objects.filter(tenant=tenant, user=bob).exists()
    bob_client.post(home_url)

    assert not Membership.objects.filter(tenant=tenant, user=bob).exists()
    assert Invitation.objects.get(pk=home.pk).status == "revoked"


def test_an_organization_sends_so_many_invitations_a_day_in_all_and_to_one_address(
    owner_client, tenant, settings
):
    """Each invitation mails someone, with a name the organization chose: an owner could make
    the portal mail any number of strangers, or one address fifty times."""
    settings.OPSDECK_INVITATIONS_PER_DAY = 8
    url = f"/t/{tenant.slug}/team/invite/"

    def invite(email):
        return owner_client.post(
            url, {"email": email, "role": "viewer", "request_id": uuid.uuid4().hex}, follow=True
        ).content.decode()

    for _ in range(5):
        invite("again@example.com")
    again = invite("again@example.com")
    for n in range(3):
        invite(f"stranger{n}@example.com")
    beyond = invite("one-more@example.com")

    assert "again@example.com was invited 5 times in the last 24 hours" in again
    assert "has sent 8 invitations in the last 24 hours, the most it may" in beyond
    assert Invitation.objects.filter(tenant=tenant).count() == 8
    assert not Invitation.objects.filter(email="one-more@example.com").exists()


@pytest.mark.django_db
def test_the_team_page_follows_an_invitation_email_until_it_is_sent(owner_client, tenant, invite):
    """It said "Being sent" for as long as the page stayed open: only a reload said it went."""
    import re

    from django.utils import timezone

    invitation, _ = invite()
    cell = re.compile(rf'<td id="invitation-mail-{invitation.pk}"[^>]*>')

    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    following = cell.search(page).group(0)
    Invitation.objects.filter(pk=invitation.pk).update(emailed_at=timezone.now())
    polled = owner_client.get(
        f"/t/{tenant.slug}/team/",
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"invitation-mail-{invitation.pk}",
    ).content.decode()

    assert "Being sent" in page and 'hx-trigger="every 3s"' in following
    assert f'hx-select="#invitation-mail-{invitation.pk}"' in following
    assert cell.search(polled).group(0) == f'<td id="invitation-mail-{invitation.pk}">'  # done
    assert "Being sent" not in polled and "Sent " in polled
