import itertools
import re
import threading

import pytest
from allauth.account.models import EmailAddress, EmailConfirmationHMAC
from django.core import mail
from django.test import Client
from django.urls import reverse

from accounts.audit import Actor
from accounts.models import AuditEvent, Membership, Tenant, User
from accounts.services import invitation_create
from tests.concurrency import race
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
@pytest.mark.parametrize("organization", ["Zero\u200bWidth", "Bell\x07Corp"])
def test_an_organization_name_with_an_invisible_character_is_said_next_to_the_field(
    client, organization
):
    response = _signup(client, organization=organization)

    assert response.status_code == 200
    assert "Use letters, digits, spaces and punctuation only." in response.content.decode()
    assert not User.objects.filter(email="new@example.com").exists()
    assert not Tenant.objects.exists()


SHORT = "This password is too short. It must contain at least 8 characters."
DIFFERENT = "You must type the same password each time."


def _field(page: str, name: str) -> str:
    start = page.index(f'<div class="field" id="field-{name}">')
    return page[start : page.index("</div>", start)]


@pytest.mark.django_db
def test_each_sign_up_error_is_said_beside_its_field_and_in_a_summary_linking_to_it(client):
    response = _signup(client, email="not-an-address", password1="Zq8#vK", password2="Zq8#vL")

    page = response.content.decode()
    assert response.status_code == 200
    summary = page[page.index('<div class="error-summary"') : page.index("<form")]
    assert '<a href="#id_email">Email: Enter a valid email address.</a>' in summary
    assert f'<a href="#id_password1">Password: {SHORT}</a>' in summary
    assert f'<a href="#id_password2">Password (again): {DIFFERENT}</a>' in summary
    password = _field(page, "password1")  # label, then its error, then the input it describes
    label, error = password.index('<label for="id_password1">'), password.index(SHORT)
    assert label < error < password.index('<input type="password" name="password1"')
    assert f'<small class="field-error" id="id_password1_error">{SHORT}</small>' in password
    assert 'aria-describedby="id_password1_helptext id_password1_error"' in password
    assert 'aria-invalid="true"' in _field(page, "email")
    assert "Zq8#v" not in page  # a password typed is never sent back
    assert not User.objects.exists()


@pytest.mark.django_db
def test_passwords_that_differ_are_said_with_the_first_ones_other_errors(client):
    response = _signup(client, password1="Zq8#vK", password2="Zq8#vL")

    page = response.content.decode()
    assert f'id="id_password1_error">{SHORT}</small>' in page
    assert f'id="id_password2_error">{DIFFERENT}</small>' in page
    assert not User.objects.exists()


@pytest.mark.django_db
def test_a_password_typed_the_same_twice_says_nothing_of_the_second(client):
    page = _signup(client, password1="Zq8#vK", password2="Zq8#vK").content.decode()

    assert f'id="id_password1_error">{SHORT}</small>' in page
    assert 'id="id_password2_error"' not in page and DIFFERENT not in page


# One character NFKC writes as 18: six of them pass a 100-character field and make a name of 108.
LONG_ONCE_WRITTEN_OUT = "\ufdfa" * 6


@pytest.mark.django_db
def test_an_organization_name_too_long_once_written_out_is_said_next_to_the_field(owner_client):
    response = _signup(Client(), organization=LONG_ONCE_WRITTEN_OUT)
    page = owner_client.post("/organizations/new/", {"name": LONG_ONCE_WRITTEN_OUT})

    said = "Use at most 100 characters (this has 108 once written out)."
    assert response.status_code == page.status_code == 200
    assert said in response.content.decode() and said in page.content.decode()
    assert "There is a problem" in page.content.decode()  # summed up above the form too
    assert '<a href="#id_name">' in page.content.decode()
    assert not User.objects.filter(email="new@example.com").exists()
    assert not Tenant.objects.filter(name__startswith="\u0635").exists()


@pytest.mark.django_db
def test_an_address_with_a_character_no_one_can_see_is_refused_at_sign_up(client):
    response = _signup(client, email='"bell\x07"@example.com', organization="")

    assert response.status_code == 200
    assert "Use letters, digits and punctuation only." in response.content.decode()
    assert not User.objects.exists()


@pytest.mark.parametrize("email", ["kim@localhost", "kim@[127.0.0.1]"])
@pytest.mark.django_db
def test_an_address_mail_cannot_reach_is_refused_at_sign_up_and_on_the_email_page(
    client, make_user, email
):
    response = _signup(client, email=email)

    assert response.status_code == 200
    assert "Enter an address at an internet domain" in response.content.decode()
    assert not User.objects.exists() and not mail.outbox

    page = Client()
    user = make_user("kim@example.com")
    page.force_login(user)
    refused = page.post("/accounts/email/", {"email": email, "action_add": ""})

    assert refused.status_code == 200
    assert "Enter an address at an internet domain" in refused.content.decode()
    assert list(EmailAddress.objects.filter(user=user).values_list("email", flat=True)) == [
        "kim@example.com"
    ]


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_a_refused_sign_up_leaves_the_address_in_its_email_cooldown(make_user):
    """A sign-up refused after the address's checks (its organization name) changes nothing:
    the other account's copy stays, and allauth still mails the address once per cooldown, so
    that signing up again and again cannot flood it."""
    adder = make_user("adder@example.com")
    page = Client()
    page.force_login(adder)
    page.post("/accounts/email/", {"email": "racer@example.com", "action_add": ""})

    for _ in range(3):
        refused = _signup(Client(), email="racer@example.com", organization=LONG_ONCE_WRITTEN_OUT)
        assert refused.status_code == 200
        page.post("/accounts/email/", {"email": "racer@example.com", "action_send": ""})

    assert not User.objects.filter(email="racer@example.com").exists()
    assert adder.emailaddress_set.filter(email="racer@example.com").exists()
    assert len(_confirmation_links("racer@example.com")) == 1  # the add's, and no more


@pytest.mark.django_db
def test_a_look_alike_of_an_address_is_that_address(client, owner, tenant, make_user):
    """A full-width letter, or an invisible one, in an address reaches the same mailbox as the
    plain address (the mail server reads its domain as IDNA writes it): it is the same address,
    and the rules about who owns one hold for the other."""
    make_user("vee@example.com")
    squatter = make_user("squatter@example.com")
    page = Client()
    page.force_login(squatter)

    refused = page.post("/accounts/email/", {"email": "vee@\uff45xample.com", "action_add": ""})
    also = page.post("/accounts/email/", {"email": "vee@exa\u00admple.com", "action_add": ""})
    _signup(client, email="\uff56ee@example.com")  # a full-width "v"
    invitation = invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="Kim@\uff45xample.com", role="member"
    )

    for response in (refused, also):
        assert "This address belongs to another account: add one only you use." in (
            response.content.decode()
        )
    assert not squatter.emailaddress_set.exclude(email="squatter@example.com").exists()
    assert User.objects.filter(email__icontains="ee@").count() == 1  # no second vee
    assert invitation.email == "kim@example.com"


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_a_sign_up_never_confirmed_gives_its_address_back_after_a_week(make_user, settings):
    """Someone signs up with an address another account had added and not confirmed yet: the
    sign-up takes it (the sign-in address is its own to confirm). If no one ever confirms the
    sign-up, the account is closed after OPSDECK_UNCONFIRMED_SIGN_UP_DAYS and the address is
    free again: the other account adds it and confirms it."""
    from datetime import timedelta

    from django.core.cache import cache
    from django.utils import timezone

    from accounts.services import unconfirmed_sign_ups_close
    from accounts.tasks import unconfirmed_sign_ups_close as unconfirmed_sign_ups_close_task

    owner = make_user("owner@example.com")
    _added_unconfirmed(owner, "second@example.com")
    _signup(Client(), email="second@example.com")
    squatter = User.objects.get(email="second@example.com")
    page = Client()
    page.force_login(owner)
    refused = page.post("/accounts/email/", {"email": "second@example.com", "action_add": ""})
    kept = [  # a week old but confirmed, signed in, or only a day old: kept
        make_user("confirmed@example.com"),
        make_user("signed-in@example.com", verified=False, last_login=timezone.now()),
        make_user("new@example.com", verified=False),
        User.objects.create_superuser(email="admin@example.com", password=PASSWORD),
    ]
    week_ago = timezone.now() - timedelta(days=settings.OPSDECK_UNCONFIRMED_SIGN_UP_DAYS, hours=1)
    User.objects.exclude(email="new@example.com").update(date_joined=week_ago)
    mail.outbox.clear()
    cache.clear()  # a week later: allauth's email cooldowns are long over

    assert settings.CELERY_BEAT_SCHEDULE["unconfirmed-sign-ups-close"]["task"] == (
        unconfirmed_sign_ups_close_task.name
    )
    assert unconfirmed_sign_ups_close_task.apply().get() == 1  # as beat runs it, daily
    assert unconfirmed_sign_ups_close() == 0  # once

    assert "This address belongs to another account" in refused.content.decode()
    squatter.refresh_from_db()
    assert not squatter.is_active and squatter.email != "second@example.com"
    assert not Client().login(email="second@example.com", password=PASSWORD)
    closed = AuditEvent.objects.get(action="user.close")
    assert closed.target_id == str(squatter.pk) and closed.payload["email"] == "second@example.com"
    for user in kept:
        user.refresh_from_db()
        assert user.is_active and "@example.com" in user.email
    _added_unconfirmed(owner, "second@example.com")
    [link] = _confirmation_links("second@example.com")
    page.post(link)
    assert owner.emailaddress_set.get(email="second@example.com").verified


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_signup_requires_email_verification_then_signs_in(client):
    response = _signup(client)

    assert response["Location"] == "/accounts/confirm-email/"
    assert len(mail.outbox) == 1
    link = re.search(r"https?://\S+(/accounts/confirm-email/\S+/)", mail.outbox[0].body).group(1)
    # Not signed in until the address is confirmed.
    assert client.get("/").status_code == 302
    assert client.get("/").url == "/accounts/login/"

    confirm = client.post(link)
    assert confirm.status_code == 302
    home = client.get("/", follow=True)
    assert home.request["PATH_INFO"] == f"/t/{Tenant.objects.get(name='Initech').slug}/"
    assert b"Initech" in home.content
    # The account's beginning is in the audit log: made, then its address confirmed.
    user = User.objects.get()
    assert [(e.action, e.payload) for e in AuditEvent.objects.filter(actor=user).order_by("pk")
            if e.action.startswith("user.") and e.action != "user.login"] == [
        ("user.signup", {"email": user.email}), ("user.email_confirm", {"email": user.email}),
    ]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("typed", ["kim@\uff45xample.com", " KIM@Example.com "])
def test_an_address_signs_in_typed_as_sign_up_takes_it(client, make_user, typed):
    from tests.conftest import PASSWORD

    make_user("kim@example.com")

    signed_in = client.post("/accounts/login/", {"login": typed, "password": PASSWORD})
    wrong = Client().post("/accounts/login/", {"login": typed, "password": "not-it-at-all"})
    not_an_address = Client().post("/accounts/login/", {"login": "kim@", "password": PASSWORD})

    assert signed_in.status_code == 302
    assert client.get("/", follow=True).request["PATH_INFO"] != "/accounts/login/"
    assert wrong.status_code == 200 and "not correct" in wrong.content.decode()
    assert not_an_address.status_code == 200


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_signup_with_a_taken_email_changes_nothing_and_warns_the_owner(client, owner, tenant):
    before = (User.objects.count(), Tenant.objects.count())

    response = _signup(client, email="owner@example.com")

    # The page does not reveal that the address has an account; the mail to it does.
    assert response["Location"] == "/accounts/confirm-email/"
    assert (User.objects.count(), Tenant.objects.count()) == before
    assert mail.outbox[-1].to == ["owner@example.com"]
    assert "already" in mail.outbox[-1].body


@pytest.mark.django_db(transaction=True)
def test_sign_ups_racing_for_one_address_make_one_account_and_no_error(settings):
    settings.ACCOUNT_RATE_LIMITS = False  # four sign-ups at once from one address

    def sign_up():
        return _signup(Client(raise_request_exception=False), email="twice@example.com")

    answers = race(sign_up)

    assert [a.status_code for a in answers] == [302] * 4
    assert {a["Location"] for a in answers} == {"/accounts/confirm-email/"}
    assert User.objects.filter(email="twice@example.com").count() == 1
    assert Tenant.objects.count() == 1


def _added_unconfirmed(user, email):
    """What a user's Email page does when they add an address: stored, not confirmed yet."""
    page = Client()
    page.force_login(user)
    page.post("/accounts/email/", {"email": email, "action_add": ""})
    assert EmailAddress.objects.get(user=user, email=email).verified is False


def _confirmation_links(to):
    sent = [m for m in mail.outbox if m.to == [to]]
    return [
        re.search(r"https?://\S+?(/accounts/confirm-email/\S+/)", m.body).group(1)
        for m in sent
        if "/accounts/confirm-email/" in m.body
    ]


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_an_address_another_user_added_without_confirming_it_does_not_stop_its_owner(
    client, make_user
):
    squatter = make_user("viewer@example.com")
    _added_unconfirmed(squatter, "racer@example.com")
    [squatters_link] = _confirmation_links("racer@example.com")
    mail.outbox.clear()

    # Adding it mailed the address a moment ago, and allauth mails one address once every 3
    # minutes: the sign-up's confirmation is sent all the same.
    response = _signup(client, email="racer@example.com")

    racer = User.objects.get(email="racer@example.com")
    assert response["Location"] == "/accounts/confirm-email/"
    [link] = _confirmation_links("racer@example.com")
    # The copy the squatter typed is gone, with the link it mailed: followed by the address's
    # owner, it would have confirmed the address for the squatter's account.
    assert not squatter.emailaddress_set.filter(email__iexact="racer@example.com").exists()
    dropped = AuditEvent.objects.get(action="user.email_remove", target_id=str(squatter.pk))
    assert dropped.payload == {
        "email": "racer@example.com",
        "reason": "another account signed up with it",
    }
    assert "link expired or is invalid" in client.get(squatters_link).content.decode()
    assert client.post(squatters_link).status_code == 404
    assert client.post(link).status_code == 302
    assert EmailAddress.objects.get(email__iexact="racer@example.com").user == racer
    assert EmailAddress.objects.get(email__iexact="racer@example.com").verified


@pytest.mark.django_db
def test_confirming_an_address_drops_other_accounts_unconfirmed_copies(client, make_user):
    squatter = make_user("viewer@example.com")
    _added_unconfirmed(squatter, "second@example.com")
    owner = make_user("owner@example.com")
    _added_unconfirmed(owner, "second@example.com")
    copy = owner.emailaddress_set.get(email="second@example.com")
    link = reverse("account_confirm_email", args=[EmailConfirmationHMAC(copy).key])

    assert client.post(link).status_code == 302

    assert EmailAddress.objects.get(email="second@example.com").user == owner
    dropped = AuditEvent.objects.get(action="user.email_remove", target_id=str(squatter.pk))
    assert dropped.payload == {
        "email": "second@example.com",
        "reason": "another account confirmed it",
    }


@pytest.mark.django_db(transaction=True)
def test_an_address_added_while_its_owner_signs_up_cannot_be_confirmed_for_the_adder(
    make_user,
):
    squatter = make_user("viewer@example.com")
    turns, turn = itertools.cycle(["sign up", "add"]), threading.Lock()

    def sign_up_or_add():
        with turn:
            action = next(turns)
        if action == "sign up":
            return _signup(Client(), email="kim@example.com")
        adder = Client()
        adder.force_login(squatter)
        return adder.post("/accounts/email/", {"email": "kim@example.com", "action_add": ""})

    race(sign_up_or_add)

    kim = User.objects.get(email="kim@example.com")
    links = _confirmation_links("kim@example.com")
    mailed_to = {  # the accounts whose copy of the address each link confirms
        confirmation.email_address.user
        for confirmation in (EmailConfirmationHMAC.from_key(link.split("/")[-2]) for link in links)
        if confirmation  # (the link of a copy the sign-up dropped confirms nothing)
    }
    for link in links:  # every link the address received, followed by the address's owner
        Client().post(link)
    assert (
        not EmailAddress.objects.filter(email="kim@example.com", verified=True)
        .exclude(user=kim)
        .exists()
    )
    if kim in mailed_to:  # (an add mailed between the sign-up's commit and its email holds
        #  the address's cooldown: its owner asks for another link a few minutes later)
        assert kim.emailaddress_set.get(email="kim@example.com").verified


@pytest.mark.django_db
def test_an_address_another_account_signs_in_with_is_not_confirmed_by_an_older_link(
    client, make_user
):
    squatter = make_user("viewer@example.com")
    kim = make_user("kim@example.com", verified=False)
    # A copy that slipped in beside the sign-up (the add form refuses it afterwards).
    copy = EmailAddress.objects.create(user=squatter, email="kim@example.com")
    link = reverse("account_confirm_email", args=[EmailConfirmationHMAC(copy).key])

    response = client.post(link, follow=True)

    assert "Unable to confirm kim@example.com: it belongs to another account" in (
        response.content.decode()
    )
    assert not EmailAddress.objects.filter(email="kim@example.com", verified=True).exists()
    assert kim.emailaddress_set.get(email="kim@example.com").verified is False


@pytest.mark.django_db
def test_no_one_can_add_an_address_another_account_signs_in_with_or_confirmed(client, make_user):
    make_user("vee@example.com", verified=False)  # signed up, not confirmed yet
    other = make_user("other@example.com")
    _added_unconfirmed(other, "shared@example.com")
    EmailAddress.objects.filter(email="shared@example.com").update(verified=True)
    squatter = make_user("squatter@example.com")
    page = Client()
    page.force_login(squatter)
    mail.outbox.clear()

    for email in ("vee@example.com", "SHARED@example.com"):
        refused = page.post("/accounts/email/", {"email": email, "action_add": ""})
        assert "This address belongs to another account: add one only you use." in (
            refused.content.decode()
        ), email
    assert not squatter.emailaddress_set.exclude(email="squatter@example.com").exists()
    assert mail.outbox == []
    _added_unconfirmed(squatter, "free@example.com")  # an address no one owns: added


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_a_password_reset_goes_only_to_an_address_the_account_signs_in_with_or_confirmed(
    client, make_user
):
    squatter = make_user("viewer@example.com")
    _added_unconfirmed(squatter, "racer@example.com")
    _added_unconfirmed(squatter, "second@example.com")
    EmailAddress.objects.filter(email="second@example.com").update(verified=True)
    mail.outbox.clear()

    def reset_links_to(email):
        client.post("/accounts/password/reset/", {"email": email})
        sent = [m for m in mail.outbox if m.to == [email]]
        return [m for m in sent if "/accounts/password/reset/key/" in m.body]

    assert reset_links_to("racer@example.com") == []  # never confirmed: not the account's
    assert len(reset_links_to("second@example.com")) == 1
    assert len(reset_links_to("viewer@example.com")) == 1
    # Typed as sign-up and sign-in take it (a full-width e is an e): it was told, at the
    # look-alike, that it had no account.
    client.post("/accounts/password/reset/", {"email": "viewer@\uff45xample.com"})
    assert "/accounts/password/reset/key/" in mail.outbox[-1].body
    assert mail.outbox[-1].to == ["viewer@example.com"]


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
    response = owner_client.post("/organizations/new/", {"name": "Acme Labs"}, follow=True)

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
    long = owner_client.post("/organizations/new/", {"name": "x" * 101})

    assert response.status_code == long.status_code == 200
    assert b"Give the organization a name." in response.content
    assert b"Use at most 100 characters (this has 101)." in long.content
    assert Tenant.objects.count() == before


@pytest.mark.django_db
def test_signup_with_a_taken_email_looks_exactly_like_a_new_one(client, owner, tenant):
    before = (User.objects.count(), Tenant.objects.count(), Membership.objects.count())

    taken = _signup(client, email="owner@example.com", organization="Initech")
    taken_page = client.get(taken["Location"])
    fresh = _signup(Client(), email="fresh@example.com", organization="Initech")

    assert taken.status_code == fresh.status_code == 302
    assert taken["Location"] == fresh["Location"] == "/accounts/confirm-email/"
    assert b"Verify Your Email Address" in taken_page.content
    assert b"already" not in taken_page.content
    # The taken address got no second account and no organization.
    assert User.objects.filter(email="owner@example.com").count() == 1
    assert (User.objects.count(), Tenant.objects.count(), Membership.objects.count()) == (
        before[0] + 1,
        before[1] + 1,
        before[2] + 1,
    )


def _invitation_path(tenant, owner, email="ivy@example.com"):
    from accounts import services
    from accounts.audit import Actor

    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email=email, role="member"
    )
    return f"/invitations/{services.invitation_token(invitation)}/"


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_an_invitee_who_leaves_the_organization_blank_gets_none(client, owner, tenant):
    invitation = _invitation_path(tenant, owner)
    page = client.get(invitation)
    signup_link = re.search(rb'href="(/accounts/signup/\?next=[^"]+)"', page.content).group(1)

    response = client.post(
        signup_link.decode().replace("&amp;", "&"),
        {"email": "ivy@example.com", "password1": PASSWORD, "password2": PASSWORD},
    )

    assert response.status_code == 302
    ivy = User.objects.get(email="ivy@example.com")
    assert not Tenant.objects.for_user(ivy).exists()
    # Once the address is confirmed, the invitation makes Ivy a member of Acme only.
    link = re.search(r"https?://\S+(/accounts/confirm-email/\S+/)", mail.outbox[-1].body).group(1)
    client.post(link)
    joined = client.post(invitation, follow=True)
    assert b"Welcome to Acme." in joined.content
    assert list(Tenant.objects.for_user(ivy)) == [tenant]


@pytest.mark.django_db
def test_an_invitee_who_names_an_organization_gets_it(client, owner, tenant):
    invitation = _invitation_path(tenant, owner)

    client.post(
        f"/accounts/signup/?next={invitation}",
        {
            "email": "ivy@example.com",
            "password1": PASSWORD,
            "password2": PASSWORD,
            "organization": "Ivy Labs",
        },
    )

    assert Tenant.objects.for_user(User.objects.get(email="ivy@example.com")).get().name == (
        "Ivy Labs"
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_an_invitee_who_signs_up_without_the_link_finds_the_invitation_not_an_own_organization(
    client, owner, tenant
):
    invitation = _invitation_path(tenant, owner)

    _signup(client, email="Ivy@Example.com", organization="")

    ivy = User.objects.get(email__iexact="ivy@example.com")
    assert not Tenant.objects.for_user(ivy).exists()
    [link] = _confirmation_links(ivy.email)
    landed = client.post(link, follow=True).content.decode()
    assert "<h1>New organization</h1>" in landed
    # (a link of its own: the token carries the time it was signed)
    assert re.search(r'<a href="/invitations/[^"]+/">Join Acme</a> as Member', landed)
    assert b"Welcome to Acme." in client.post(invitation, follow=True).content
    assert list(Tenant.objects.for_user(ivy)) == [tenant]


@pytest.mark.django_db
def test_a_member_invited_to_another_organization_finds_the_invitation_on_the_dashboard(
    client, owner, tenant, make_user
):
    from accounts import services
    from accounts.audit import Actor

    ivy = make_user("ivy@example.com")
    own = services.tenant_create(actor=Actor(user=ivy), name="Ivy Labs")
    invitation = _invitation_path(tenant, owner)
    client.force_login(ivy)

    dashboard = client.get(f"/t/{own.slug}/").content.decode()

    assert "Invitations for you" in dashboard
    assert re.search(r'<a href="/invitations/[^"]+/">Join Acme</a> as Member', dashboard)
    assert "Or make an organization of your own." not in dashboard
    client.post(invitation)
    assert "Invitations for you" not in client.get(f"/t/{own.slug}/").content.decode()


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_signup_emails_name_opsdeck_not_the_host(client, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1", "testserver"]
    _signup(client, HTTP_HOST="127.0.0.1")

    body = mail.outbox[0].body
    assert "Hello from Opsdeck!" in body
    assert "register an account on Opsdeck." in body
    assert "Thank you for using Opsdeck!" in body
    assert "on 127.0.0.1" not in body and "\n127.0.0.1\n" not in body
    assert body.rstrip().endswith(settings.OPSDECK_BASE_URL)


@pytest.mark.django_db
def test_the_new_organization_form_keeps_its_request_id_in_the_address(owner_client, owner):
    opened = owner_client.get("/organizations/new/")
    url = opened["Location"]
    request_id = re.fullmatch(r"/organizations/new/\?request=([0-9a-f]{32})", url).group(1)

    # What a browser's Back re-fetches is the same address, so the same id: sent again (a
    # page kept from before, a double click), it makes nothing more.
    form = owner_client.get(url)
    assert f'name="request_id" value="{request_id}"'.encode() in form.content
    for _ in range(2):
        owner_client.post(url, {"name": "Globex", "request_id": request_id})

    assert Tenant.objects.filter(name="Globex").count() == 1
    assert b"This form already made" in owner_client.get(url).content  # Back, once it made one


@pytest.mark.django_db
def test_a_resent_organization_form_with_other_values_says_so_and_can_be_sent_anew(
    owner_client, owner
):
    url = owner_client.get("/organizations/new/")["Location"]
    request_id = url.rsplit("=", 1)[1]
    owner_client.post(url, {"name": "First", "request_id": request_id})

    # Back, another name, the same form sent again: refused with a message, nothing made.
    refused = owner_client.post(url, {"name": "Second", "request_id": request_id})
    assert refused.status_code == 200
    assert b"already sent with different values" in refused.content
    first = Tenant.objects.get(name="First")
    assert f'already made <a href="/t/{first.slug}/">First</a>'.encode() in refused.content
    assert not Tenant.objects.filter(name="Second").exists()

    fresh = re.search(rb'name="request_id" value="([0-9a-f]{32})"', refused.content).group(1)
    assert fresh.decode() != request_id
    # Sent with its name left out, from the same stale page: corrected, it makes another too.
    empty = owner_client.post(url, {"name": "", "request_id": request_id})
    assert b"Sent now, it makes another organization." in empty.content
    assert f'value="{request_id}"'.encode() not in empty.content
    owner_client.post(url, {"name": "Second", "request_id": fresh.decode()})
    assert Tenant.objects.filter(name="Second").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_accounts_confirming_one_address_at_once_leave_one_owner_and_a_clear_refusal(
    make_user,
):
    for user in (make_user("first@example.com"), make_user("second@example.com")):
        _added_unconfirmed(user, "shared@example.com")
    links = [
        reverse("account_confirm_email", args=[EmailConfirmationHMAC(copy).key])
        for copy in EmailAddress.objects.filter(email="shared@example.com")
    ]
    turn = threading.Lock()

    def follow():
        with turn:
            link = links.pop()
        response = Client().post(link, follow=True)
        return response.status_code, response.content.decode()

    results = race(follow, times=2)

    assert not [r for r in results if isinstance(r, Exception)], results  # no error page
    assert EmailAddress.objects.filter(email="shared@example.com", verified=True).count() == 1
    said = sorted(
        "confirmed" if "You have confirmed shared@example.com" in page
        else "refused" if "Unable to confirm shared@example.com: it belongs to another" in page
        # (the later one's copy went with the earlier's confirmation: its link confirms nothing)
        else "refused" if status == 404
        else page
        for status, page in results
    )  # fmt: skip
    assert said == ["confirmed", "refused"]


@pytest.mark.django_db
def test_an_address_a_letter_of_which_reads_as_another_in_capitals_is_refused(client):
    """PostgreSQL compares addresses in capitals, where a dotless i (U+0131) is an I: whoever
    held victim@f\u0131ntech.com (a domain of its own) kept the owner of victim@fintech.com from
    ever confirming it ("it belongs to another account")."""
    look_alike = "victim@f\u0131ntech.com"

    refused = _signup(client, look_alike)

    assert refused.status_code == 200 and not EmailAddress.objects.exists()
    assert "reads as “I” in capitals" in refused.content.decode()
    _signup(Client(), "victim@fintech.com")
    real = EmailAddress.objects.get(email="victim@fintech.com")
    Client().post(reverse("account_confirm_email", args=[EmailConfirmationHMAC(real).key]))
    real.refresh_from_db()
    assert real.verified
