"""Hostile and concurrent inputs against accounts: each answers with a clear result, never a 500."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from accounts import services
from accounts.audit import Actor, audit_record, audited_action
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Membership, Tenant, User
from tests.conftest import PASSWORD


@pytest.mark.django_db
def test_the_audit_log_filters_by_a_date_range(owner_client, tenant):
    today = timezone.now().date()

    inside = owner_client.get(
        f"/t/{tenant.slug}/audit/", {"since": str(today), "until": str(today)}
    )
    before = owner_client.get(
        f"/t/{tenant.slug}/audit/",
        {"since": str(today - timedelta(days=9)), "until": str(today - timedelta(days=8))},
    )
    export = owner_client.get(f"/t/{tenant.slug}/audit/export.csv", {"since": str(today)})

    assert b"<code>tenant.create</code>" in inside.content
    assert b"No events match." in before.content
    assert b"tenant.create" in b"".join(export.streaming_content)


@pytest.mark.django_db
def test_the_admin_sign_in_is_the_portals_so_mfa_and_rate_limits_apply(client):
    response = client.get("/admin/login/?next=/admin/")

    assert response.status_code == 302
    assert response.url.startswith("/accounts/login/")


@pytest.mark.django_db
def test_sign_up_with_a_very_long_address_names_the_organization_within_limits(client):
    email = "x" * 120 + "@example.com"

    response = client.post(
        "/accounts/signup/", {"email": email, "password1": PASSWORD, "password2": PASSWORD}
    )

    assert response.status_code == 302
    tenant = Tenant.objects.for_user(User.objects.get(email=email)).get()
    assert tenant.name.endswith("'s organization")
    assert len(tenant.name) <= 100


@pytest.mark.django_db
def test_an_organization_name_cannot_smuggle_line_breaks_into_emails(owner_client):
    owner_client.post("/organizations/new/", {"name": "Evil\r\nBcc: victim@example.com"})

    assert Tenant.objects.filter(name="Evil Bcc: victim@example.com").exists()


@pytest.mark.django_db
def test_staff_who_may_only_view_memberships_cannot_run_admin_actions(
    client, make_user, tenant, add_member
):
    from django.contrib.auth.models import Permission

    staff = make_user("viewer-staff@example.com", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_membership"))
    bob = Membership.objects.get(user=add_member("bob@example.com", "member"))
    client.force_login(staff)

    page = client.get("/admin/accounts/membership/")
    client.post(
        "/admin/accounts/membership/",
        {"action": "make_owner", "_selected_action": [bob.pk]},
    )

    assert page.status_code == 200
    assert b"make_owner" not in page.content
    bob.refresh_from_db()
    assert bob.role == "member"


@pytest.mark.django_db
def test_htmx_invitations_show_their_errors_in_the_panel(owner_client, tenant, add_member):
    add_member("bob@example.com", "member")

    response = owner_client.post(
        f"/t/{tenant.slug}/team/invite/",
        {"email": "bob@example.com", "role": "member"},
        headers={"HX-Request": "true"},
    )

    assert response.status_code == 200  # htmx swaps only 2xx answers
    assert b'id="team-panel"' in response.content
    assert b"bob@example.com is already a member." in response.content


@pytest.mark.django_db
def test_accepting_another_addresss_invitation_is_recorded_as_denied(
    client, tenant, owner, make_user
):
    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="member"
    )
    client.force_login(make_user("other@example.com"))

    client.post(f"/invitations/{services.invitation_token(invitation)}/")

    event = AuditEvent.objects.get(action="member.join")
    assert (event.result, event.actor_email) == ("denied", "other@example.com")


@pytest.mark.django_db
def test_a_role_refusal_on_a_page_is_recorded(client, tenant, add_member):
    client.force_login(add_member("vic@example.com", "viewer"))

    client.get(f"/t/{tenant.slug}/audit/")

    event = AuditEvent.objects.get(action="audit.view")
    assert event.result == "denied"
    assert event.payload["reason"] == "Your role (Viewer) does not allow viewing the audit log."


@pytest.mark.django_db(transaction=True)
def test_a_refusal_rolls_back_what_the_action_already_wrote(tenant, owner):
    actor = Actor(user=owner)

    with (
        pytest.raises(ActionDenied),
        audited_action(actor=actor, action="test.action", tenant=tenant),
    ):
        audit_record(actor=actor, action="test.half-done", tenant=tenant)
        Tenant.objects.filter(pk=tenant.pk).update(name="Changed")
        raise ActionDenied("No.")

    tenant.refresh_from_db()
    assert tenant.name == "Acme"
    assert not AuditEvent.objects.filter(action="test.half-done").exists()
    assert AuditEvent.objects.get(action="test.action").result == "denied"


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner_and_no_error(
    tenant, owner, make_user
):
    second = make_user("second@example.com")
    Membership.objects.create(tenant=tenant, user=second, role="owner")
    first_m = Membership.objects.get(user=owner)
    second_m = Membership.objects.get(user=second)
    barrier = threading.Barrier(2)
    outcomes = []

    def demote(actor_user, target):
        try:
            barrier.wait()
            services.membership_change_role(
                actor=Actor(user=actor_user), membership=target, role="admin"
            )
            outcomes.append("ok")
        except ActionDenied as exc:
            outcomes.append(exc.reason)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=demote, args=(owner, second_m)),
        threading.Thread(target=demote, args=(second, first_m)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert len(outcomes) == 2  # neither call died (a deadlock would raise, not append)
    assert outcomes.count("ok") == 1
    assert Membership.objects.filter(tenant=tenant, role="owner").count() == 1


@pytest.mark.django_db
def test_a_double_submitted_new_organization_form_creates_one(owner_client, owner, tenant):
    form = {"name": "Globex", "request_id": "req-42"}

    first = owner_client.post("/organizations/new/", form)
    again = owner_client.post("/organizations/new/", form)

    assert again.url == first.url == f"/t/{Tenant.objects.get(name='Globex').slug}/"
    assert Tenant.objects.filter(name="Globex").count() == 1


@pytest.mark.django_db
def test_the_new_organization_form_sent_again_after_leaving_what_it_made_says_so(
    owner_client, owner, make_user
):
    form = {"name": "Globex", "request_id": "req-43"}
    owner_client.post("/organizations/new/", form)
    globex = Tenant.objects.get(name="Globex")
    Membership.objects.create(tenant=globex, user=make_user("ada@example.com"), role="owner")
    services.membership_remove(
        actor=Actor(user=owner), membership=globex.memberships.get(user=owner)
    )

    again = owner_client.post("/organizations/new/", form)

    assert again.status_code == 200  # the form again: not "created", nor a way into Globex
    said = "This form was sent before and made “Globex”, which you have left since."
    assert said in again.content.decode()
    assert Tenant.objects.filter(name="Globex").count() == 1
    made = owner_client.post("/organizations/new/", {"name": "Globex", "request_id": "req-44"})
    assert made.status_code == 302 and Tenant.objects.filter(name="Globex").count() == 2


@pytest.mark.django_db
def test_an_invite_form_sent_again_after_its_invitation_was_withdrawn_says_nothing_was_sent(
    owner_client, tenant
):
    form = {"email": "new@example.com", "role": "member", "request_id": "inv-8"}
    owner_client.post(f"/t/{tenant.slug}/team/invite/", form, follow=True)
    invitation = tenant.invitations.get()
    owner_client.post(f"/t/{tenant.slug}/team/invitations/{invitation.pk}/revoke/", follow=True)

    again = owner_client.post(f"/t/{tenant.slug}/team/invite/", form, follow=True)

    page = again.content.decode()
    assert "Invitation sent" not in page
    assert "that invitation to new@example.com has been withdrawn or replaced since" in page
    assert [i.status for i in tenant.invitations.all()] == ["revoked"]


@pytest.mark.django_db
def test_the_new_organization_form_again_after_back_says_what_it_made(owner_client, tenant):
    url = "/organizations/new/?request=" + "c" * 32
    owner_client.post(url, {"name": "Globex", "request_id": "c" * 32})
    globex = Tenant.objects.get(name="Globex")

    back = owner_client.get(url).content.decode()  # Back fetches the form again, same id

    assert f'already made <a href="/t/{globex.slug}/">Globex</a>' in back
    assert '<a href="/organizations/new/">Start a new form</a>' in back
    assert 'name="request_id"' not in back  # nothing to send a second time
    fresh = owner_client.get("/organizations/new/?request=" + "d" * 32).content.decode()
    assert 'id="form-made"' not in fresh and 'name="request_id"' in fresh


@pytest.mark.django_db
def test_a_double_submitted_invitation_is_sent_once(
    owner_client, tenant, django_capture_on_commit_callbacks
):
    form = {"email": "new@example.com", "role": "member", "request_id": "inv-7"}

    with django_capture_on_commit_callbacks() as sent:
        owner_client.post(f"/t/{tenant.slug}/team/invite/", form)
        owner_client.post(f"/t/{tenant.slug}/team/invite/", form)

    assert tenant.invitations.count() == 1
    assert tenant.invitations.get().status == "pending"
    assert len(sent) == 1  # one email dispatched


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("htmx", [True, False])
def test_an_admin_removed_while_removing_another_is_refused_and_sent_home(tenant, add_member, htmx):
    """Ada removes Bob while Bob's removal of Ada waits for the organization's lock: Bob
    read his role before Ada's change committed, yet is refused once it has."""
    from django.test import Client

    from accounts.services import tenant_lock
    from tests.concurrency import beside_a_lock

    ada, bob = add_member("ada@example.com", "admin"), add_member("bob@example.com", "admin")
    ada_m, bob_m = (Membership.objects.get(user=user) for user in (ada, bob))
    bobs_browser = Client()
    bobs_browser.force_login(bob)

    removed_bob, answer = beside_a_lock(
        lock=lambda: tenant_lock(tenant.pk),
        write=lambda: services.membership_remove(actor=Actor(user=ada), membership=bob_m),
        act=lambda: bobs_browser.post(
            f"/t/{tenant.slug}/team/{ada_m.pk}/remove/",
            headers={"HX-Request": "true"} if htmx else {},
        ),
    )

    assert removed_bob == "committed"
    # Not a 500, nor a 404 for the team page: Bob's page is gone, he is sent home.
    if htmx:
        assert (answer.status_code, answer.headers["HX-Redirect"]) == (204, "/")
    else:
        assert (answer.status_code, answer.url) == (302, "/")
    home = bobs_browser.get("/", follow=True).content.decode()
    assert "You are not a member of this organization." in home
    assert list(tenant.memberships.filter(user__in=[ada, bob]).values_list("user", flat=True)) == [
        ada.pk
    ]
    refused = AuditEvent.objects.get(action="member.remove", result="denied")
    assert refused.actor_id == bob.pk


@pytest.mark.django_db(transaction=True)
def test_an_admin_demoted_while_changing_a_role_is_refused_under_the_lock(tenant, add_member):
    from accounts.services import tenant_lock
    from tests.concurrency import beside_a_lock

    ada, bob = add_member("ada@example.com", "admin"), add_member("bob@example.com", "admin")
    carol = add_member("carol@example.com", "viewer")
    bob_m, carol_m = (Membership.objects.get(user=user) for user in (bob, carol))

    demoted_bob, outcome = beside_a_lock(
        lock=lambda: tenant_lock(tenant.pk),
        write=lambda: services.membership_change_role(
            actor=Actor(user=ada), membership=bob_m, role="viewer"
        ),
        act=lambda: services.membership_change_role(
            actor=Actor(user=bob), membership=carol_m, role="admin"
        ),
    )

    assert demoted_bob == "committed"
    assert isinstance(outcome, ActionDenied)
    carol_m.refresh_from_db()
    assert carol_m.role == "viewer"


def test_an_organization_posted_without_any_field_shows_the_form_with_what_to_give(owner_client):
    before = Tenant.objects.count()

    response = owner_client.post("/organizations/new/")

    assert response.status_code == 200
    assert "Give the organization a name." in response.content.decode()
    assert Tenant.objects.count() == before


def _sign_in(client, email, password):
    return client.post("/accounts/login/", {"login": email, "password": password})


@pytest.mark.django_db
def test_one_account_hammered_does_not_lock_out_others_behind_the_same_address(client, make_user):
    make_user("alice@example.com")
    make_user("bob@example.com")

    for _ in range(12):
        _sign_in(client, "alice@example.com", "not-her-password")
    locked = _sign_in(client, "alice@example.com", PASSWORD)
    bob = _sign_in(client, "bob@example.com", PASSWORD)

    assert b"Too many failed login attempts" in locked.content
    assert bob.status_code == 302


@pytest.mark.django_db
def test_many_accounts_tried_from_one_address_are_still_refused(client, make_user):
    for n in range(11):
        make_user(f"user{n}@example.com")

    answers = [_sign_in(client, f"user{n}@example.com", "a-guess") for n in range(11)]

    assert all(b"Too many failed login attempts" not in a.content for a in answers[:10])
    assert b"Too many failed login attempts" in answers[10].content


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["put", "patch", "delete", "options"])
def test_the_new_organization_form_answers_another_method_with_405(owner_client, method):
    answer = getattr(owner_client, method)(f"/organizations/new/?request={'a' * 32}")

    assert answer.status_code == 405
    assert b"<form" not in answer.content
