"""A person deletes their own account from their account pages: refused while an organization
would be left with no owner who can sign in, or with something to pay; else they leave their
organizations, the empty ones they alone are in go with them, and their address is free again."""

from decimal import Decimal

import pytest
from allauth.account.models import EmailAddress
from allauth.mfa.models import Authenticator
from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts import selectors, services
from accounts.audit import Actor
from accounts.errors import ActionDenied, InvitationInvalid
from accounts.models import AuditEvent, Invitation, Membership, OutgoingEmail, Tenant, User
from billing.models import Invoice, Plan
from tests.concurrency import beside_a_lock, race
from tests.conftest import PASSWORD
from tests.deployments import factories

URL = "/accounts/delete/"


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _form(client) -> dict:
    """The form as the page fills it (which organizations it said go with the account)."""
    page = client.get(URL)
    assert page.status_code == 200
    return {"organizations_deleted": page.context["deleting"]}


def _delete(client, user, **typed):
    data = {**_form(client), "password": PASSWORD, "confirm_email": user.email, **typed}
    return client.post(URL, data)


def _gone(user) -> bool:
    return not User.objects.filter(pk=user.pk, is_active=True).exists()


@pytest.mark.django_db
def test_the_account_menu_leads_to_the_page_that_says_what_deleting_does(owner, tenant, add_member):
    bob = add_member("bob@example.com", "admin")
    client = _client(bob)

    menu = client.get("/accounts/email/").content.decode()
    page = client.get(URL).content.decode()

    assert f'href="{URL}"' in menu
    assert 'id="account-delete-section"' in menu
    assert "Delete your account" in page
    assert "You leave Acme" in page
    assert "bob@example.com can sign up again" in page
    assert "Type bob@example.com to confirm" in page
    assert 'name="password"' in page and 'name="confirm_email"' in page
    assert 'name="code"' not in page  # no second factor to ask for


@pytest.mark.django_db
def test_a_member_deletes_their_account_leaves_and_can_sign_up_again(owner, tenant, add_member):
    bob = add_member("bob@example.com", "admin")
    invited = services.invitation_create(
        actor=Actor(user=bob), tenant=tenant, email="new@example.com", role="member"
    )
    elsewhere = _client(bob)  # another browser, signed in too
    client = _client(bob)

    response = _delete(client, bob)

    assert (response.status_code, response.url) == (302, "/accounts/login/")
    said = client.get(response.url).content.decode()
    assert "Your account bob@example.com has been deleted" in said
    assert not User.objects.filter(pk=bob.pk).exists()
    assert not EmailAddress.objects.filter(email="bob@example.com").exists()
    assert not Membership.objects.filter(tenant=tenant).exclude(user=owner).exists()
    left = AuditEvent.objects.get(tenant=tenant, action="member.leave")
    assert (left.actor, left.actor_email) == (None, "bob@example.com")
    deleted = AuditEvent.objects.get(action="user.delete")
    assert (deleted.actor_email, deleted.payload["email"]) == ("bob@example.com", "bob@example.com")
    # The invitations he sent no longer let anyone in: his account is gone.
    assert Invitation.objects.get(pk=invited.pk).status == "revoked"
    # Every session ended: the other browser is asked to sign in.
    assert elsewhere.get(f"/t/{tenant.slug}/").url.startswith("/accounts/login/")
    told = OutgoingEmail.objects.get(to=["bob@example.com"])
    assert told.subject == "[Opsdeck] Your account was deleted"
    assert "Acme" in told.body

    signed_up = Client().post(
        "/accounts/signup/",
        {"email": "bob@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert signed_up.status_code == 302
    assert User.objects.filter(email="bob@example.com").exists()


@pytest.mark.django_db
def test_the_only_owner_of_an_organization_with_members_is_refused_naming_it(
    owner, tenant, add_member
):
    add_member("bob@example.com", "admin")
    client = _client(owner)

    page = client.get(URL).content.decode()
    forged = client.post(URL, {"password": PASSWORD, "confirm_email": owner.email})

    assert "You are the only owner of Acme, which has other members" in page
    assert f'href="/t/{tenant.slug}/team/"' in page
    assert forged.status_code == 400
    assert "You are the only owner of Acme" in forged.content.decode()
    assert not _gone(owner)
    assert tenant.memberships.count() == 2
    refused = AuditEvent.objects.get(action="user.delete")
    assert refused.result == AuditEvent.Result.DENIED


@pytest.mark.django_db
def test_an_organization_they_alone_are_in_is_deleted_with_the_account(owner, tenant):
    elsewhere = _client(owner)
    client = _client(owner)

    page = client.get(URL).content.decode()
    response = _delete(client, owner)

    assert "Acme, where you are the only member, is deleted with your account" in page
    assert response.status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None
    assert AuditEvent.objects.get(tenant=tenant, action="tenant.delete").actor_email == (
        "owner@example.com"
    )
    # Kept with the deleted organization (a restore brings its members back), with nothing of
    # the person left: no address, no password, no sign-in.
    kept = User.objects.get(pk=owner.pk)
    assert (kept.email, kept.is_active, kept.has_usable_password()) == (
        f"deleted-{owner.pk}@deleted.invalid", False, False,
    )  # fmt: skip
    assert not EmailAddress.objects.filter(user=owner).exists()
    assert elsewhere.get("/").url == "/accounts/login/"  # its other sessions ended
    signed_in = Client().post("/accounts/login/", {"login": owner.email, "password": PASSWORD})
    assert signed_in.status_code == 200  # refused
    signed_up = Client().post(
        "/accounts/signup/",
        {"email": "owner@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert signed_up.status_code == 302
    assert User.objects.filter(email="owner@example.com").exists()


@pytest.mark.django_db
def test_an_organization_they_alone_are_in_with_something_to_pay_is_refused_with_its_settings(
    owner, tenant
):
    Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")  # subscribed
    client = _client(owner)

    page = client.get(URL).content.decode()
    refused = _delete(client, owner)

    assert "You are the only member of Acme, which cannot be deleted yet" in page
    assert "Its subscription to PostgreSQL is active" in page
    assert f'href="/t/{tenant.slug}/settings/"' in page
    assert refused.status_code == 400
    assert not _gone(owner)
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ({"password": "wrong-password-1"}, "Incorrect password."),
        ({"confirm_email": "bob@example.org"}, "Type your email address, bob@example.com"),
        ({"confirm_email": ""}, "Type your email address to delete your account."),
        ({"password": ""}, "Enter your password."),
    ],
)
def test_a_wrong_password_or_address_deletes_nothing_and_says_why(tenant, add_member, typed, said):
    bob = add_member("bob@example.com", "admin")
    client = _client(bob)

    response = _delete(client, bob, **typed)

    assert response.status_code == 400
    assert said in response.content.decode()
    assert not _gone(bob)
    assert Membership.objects.filter(user=bob).exists()
    assert not AuditEvent.objects.filter(action__in=["user.delete", "member.leave"]).exists()


@pytest.mark.django_db
def test_with_two_factor_a_code_is_asked_too(tenant, add_member):
    bob = add_member("bob@example.com", "admin")
    TOTP.activate(bob, generate_totp_secret())
    codes = RecoveryCodes.activate(bob).get_unused_codes()
    client = _client(bob)

    page = client.get(URL).content.decode()
    without = _delete(client, bob)
    wrong = _delete(client, bob, code="123456")
    done = _delete(client, bob, code=codes[0])

    assert 'name="code"' in page
    assert without.status_code == 400 and "Enter a code" in without.content.decode()
    assert wrong.status_code == 400 and "Incorrect code." in wrong.content.decode()
    assert done.status_code == 302
    assert not User.objects.filter(pk=bob.pk).exists()
    assert not Authenticator.objects.exists()


@pytest.mark.django_db
def test_a_page_shown_before_an_organization_became_theirs_alone_deletes_nothing(
    owner, tenant, add_member
):
    """The page said Acme would be left (Olga owned it too); Olga left since: the form sent
    from that page would now delete Acme, which it never said."""
    olga = add_member("olga@example.com", "owner")
    client = _client(owner)
    form = _form(client)
    services.membership_leave(actor=Actor(user=olga), tenant=tenant)

    stale = client.post(URL, {**form, "password": PASSWORD, "confirm_email": owner.email})

    assert stale.status_code == 400
    assert "would now delete Acme too" in stale.content.decode()
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None
    assert not _gone(owner)


@pytest.mark.django_db
def test_platform_staff_are_refused(make_user):
    staff = make_user("staff@example.com", is_staff=True)
    client = _client(staff)

    page = client.get(URL).content.decode()
    refused = _delete(client, staff)

    assert "platform staff account" in page
    assert refused.status_code == 400
    assert not _gone(staff)


@pytest.mark.django_db
def test_the_page_reads_the_organizations_left_in_the_same_queries_however_many(
    owner, tenant, add_member, make_user
):
    """Only an organization the person alone owns is asked what stands in its way."""
    bob = add_member("bob@example.com", "admin")
    client = _client(bob)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(URL).status_code == 200
        return len(captured)

    queries()  # the first request of a session reads what later ones find cached
    few = queries()
    for n in range(3):
        other = services.tenant_create(
            actor=Actor(user=make_user(f"o{n}@example.com")), name=f"O{n}"
        )
        Membership.objects.create(tenant=other, user=bob, role="member")

    assert queries() == few


@pytest.mark.django_db
def test_the_page_reads_what_holds_the_organizations_they_alone_are_in_in_the_same_queries(
    owner, tenant
):
    """Each organization they alone are in is asked what stands in its way (its deployments,
    operations, subscription, invoices, usage to come): all of them at once, not one by one."""
    version = factories.postgres_version()  # its plan: every organization is subscribed
    where = factories.cell()
    client = _client(owner)

    def holding(name: str, running: int) -> None:
        other = services.tenant_create(actor=Actor(user=owner), name=name)
        made = factories.make_instances(other, version, where, running, name=name.lower())
        factories.make_operation(made[0])
        factories.make_instances(other, version, where, 1, state="deleted", name="gone")
        Invoice.objects.create(
            tenant=other, plan=version.plan, period="2026-10", number=f"{name}-1",
            status=Invoice.Status.OPEN, currency="usd", total=Decimal("3.50"),
        )  # fmt: skip

    def queries() -> tuple[int, str]:
        with CaptureQueriesContext(connection) as captured:
            page = client.get(URL)
        assert page.status_code == 200
        return len(captured), page.content.decode()

    holding("Zeta", 7)
    queries()  # the first request of a session reads what later ones find cached
    few, _ = queries()
    for n, running in enumerate([1, 2, 3]):
        holding(f"Org{n}", running)
    many, page = queries()

    assert many == few
    assert (
        "7 deployments are not deleted (zeta-0, zeta-1, zeta-2, zeta-3, zeta-4 and 2 more)" in page
    )
    assert "1 deployment is not deleted (org0-0): delete it first." in page
    assert "3 deployments are not deleted (org2-0, org2-1, org2-2)" in page
    assert page.count("1 operation is queued or running") == 4
    assert page.count("Its subscription to PostgreSQL is active") == 5  # Acme's too
    assert "Invoice Org1-1 (3.50 USD) is unpaid" in page


# --- at once -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_tabs_deleting_at_once_delete_it_once(tenant, add_member):
    bob = add_member("bob@example.com", "admin")
    tabs = iter([_client(bob), _client(bob)])
    form = {"password": PASSWORD, "confirm_email": "bob@example.com"}

    answers = race(lambda: next(tabs).post(URL, form), times=2)

    assert [a.status_code for a in answers] == [302, 302], answers
    # Both to the sign-in page: a tab whose request came once the other's delete committed has
    # no session left, so it is sent there as any signed-out request is (with `next`).
    assert {a.url.split("?")[0] for a in answers} == {"/accounts/login/"}
    assert not User.objects.filter(pk=bob.pk).exists()
    assert AuditEvent.objects.filter(action="user.delete").count() == 1
    assert AuditEvent.objects.filter(action="member.leave").count() == 1


@pytest.mark.django_db(transaction=True)
def test_deleting_while_the_other_owner_leaves_keeps_an_owner(owner, tenant, add_member):
    olga = add_member("olga@example.com", "owner")
    add_member("vic@example.com", "viewer")
    calls = iter(
        [
            lambda: services.user_delete(actor=Actor(user=owner), confirm_email=owner.email),
            lambda: services.membership_leave(actor=Actor(user=olga), tenant=tenant),
        ]
    )

    results = race(lambda: next(calls)(), times=2)

    refused = [r for r in results if isinstance(r, ActionDenied)]
    assert len(refused) == 1, results
    assert [r for r in results if isinstance(r, Exception)] == refused
    assert selectors.owners_active(tenant).count() == 1


@pytest.mark.django_db(transaction=True)
def test_deleting_while_being_demoted_keeps_an_owner(owner, tenant, add_member):
    """Olga demotes Alice (the owner) at the moment Alice deletes her account, and Olga steps
    down at once too: whichever order they go in, Acme keeps an owner who can sign in."""
    olga = add_member("olga@example.com", "owner")
    add_member("vic@example.com", "viewer")
    alice_m, olga_m = (Membership.objects.get(tenant=tenant, user=u) for u in (owner, olga))
    calls = iter(
        [
            lambda: services.user_delete(actor=Actor(user=owner), confirm_email=owner.email),
            lambda: services.membership_change_role(
                actor=Actor(user=olga), membership=olga_m, role="admin"
            ),
            lambda: services.membership_change_role(
                actor=Actor(user=olga), membership=alice_m, role="admin"
            ),
        ]
    )

    results = race(lambda: next(calls)(), times=3)

    unexpected = [
        r
        for r in results
        if isinstance(r, Exception) and not isinstance(r, ActionDenied | ValidationError)
    ]
    assert not unexpected, results
    assert selectors.owners_active(tenant).count() == 1


@pytest.mark.django_db(transaction=True)
def test_deleting_while_someone_joins_the_organization_they_alone_were_in(owner, tenant, make_user):
    """The page said Acme goes with the account; Bob accepts an invitation to it at that
    moment, under Acme's lock: the deletion waits for it, then is refused (Acme has another
    member now), rather than deleting Acme with Bob in it."""
    bob = make_user("bob@example.com")
    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email=bob.email, role="member"
    )
    token = services.invitation_token(invitation)

    joined, deleting = beside_a_lock(
        lock=lambda: services.tenant_lock(tenant.pk),
        write=lambda: services.invitation_accept(actor=Actor(user=bob), token=token),
        act=lambda: services.user_delete(
            actor=Actor(user=owner), confirm_email=owner.email, deleting=[tenant.pk]
        ),
    )

    assert joined == "committed"
    assert isinstance(deleting, ActionDenied), deleting
    assert "You are the only owner of Acme, which has other members" in deleting.reason
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None
    assert not _gone(owner)


@pytest.mark.django_db(transaction=True)
def test_accepting_an_invitation_in_another_tab_while_the_account_is_deleted(
    owner, tenant, make_user
):
    """Bob deletes his account in one tab as he accepts an invitation to Acme in another: the
    acceptance failed with a database error (a membership of an account deleted meanwhile).
    It waits for the deletion, then says the account is gone; Acme gains no member."""
    bob = make_user("bob@example.com")
    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email=bob.email, role="member"
    )
    token = services.invitation_token(invitation)

    deleted, joining = beside_a_lock(
        lock=lambda: User.objects.select_for_update().get(pk=bob.pk),  # as the deletion does
        write=lambda: services.user_delete(actor=Actor(user=bob), confirm_email=bob.email),
        act=lambda: services.invitation_accept(actor=Actor(user=bob), token=token),
    )

    assert deleted == "committed"
    assert isinstance(joining, InvitationInvalid), joining
    assert str(joining) == "Your account has been deleted."
    assert not Membership.objects.filter(tenant=tenant).exclude(user=owner).exists()
    assert _gone(bob)


@pytest.mark.django_db
def test_a_form_whose_organizations_are_digits_by_the_thousand_deletes_nothing(owner, tenant):
    """The page's hidden list of organizations, forged to 5,000 nines: a 500 (more digits
    than int() takes)."""
    client = _client(owner)

    response = _delete(client, owner, organizations_deleted="9" * 5000)

    assert response.status_code == 400
    assert "it would now delete Acme too" in response.content.decode()
    assert not _gone(owner)
