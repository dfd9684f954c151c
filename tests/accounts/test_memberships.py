import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Membership


def _membership(tenant, user):
    return Membership.objects.get(tenant=tenant, user=user)


def _close(user):
    """As staff close an account in the admin (Active unticked)."""
    user.is_active = False
    user.save(update_fields=["is_active"])


@pytest.mark.django_db
def test_an_admin_changes_a_members_role_from_the_team_page(client, tenant, add_member):
    admin = add_member("admin@example.com", "admin")
    bob = add_member("bob@example.com", "member")
    client.force_login(admin)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, bob).pk}/role/",
        {"role": "viewer"},
        headers={"HX-Request": "true"},
    )

    assert response.status_code == 200
    assert b'id="team-panel"' in response.content
    assert b"bob@example.com is now Viewer." in response.content
    assert _membership(tenant, bob).role == "viewer"
    event = AuditEvent.objects.get(tenant=tenant, action="member.change_role", result="ok")
    assert event.payload == {"email": "bob@example.com", "from": "member", "to": "viewer"}


@pytest.mark.django_db
def test_an_admin_cannot_grant_the_owner_role(tenant, add_member):
    admin = add_member("admin@example.com", "admin")
    bob = add_member("bob@example.com", "member")

    with pytest.raises(ActionDenied, match="granting or revoking the owner role"):
        services.membership_change_role(
            actor=Actor(user=admin), membership=_membership(tenant, bob), role="owner"
        )

    assert _membership(tenant, bob).role == "member"


@pytest.mark.django_db
def test_an_admin_setting_an_owners_role_to_owner_is_refused_not_told_it_is_done(
    client, owner, tenant, add_member
):
    client.force_login(add_member("admin@example.com", "admin"))

    answer = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/role/",
        {"role": "owner"},
        follow=True,
    )

    assert "is now Owner" not in answer.content.decode()
    assert "granting or revoking the owner role" in answer.content.decode()


@pytest.mark.django_db
def test_the_last_owner_cannot_be_demoted(owner, tenant):
    with pytest.raises(ActionDenied, match="needs at least one owner"):
        services.membership_change_role(
            actor=Actor(user=owner), membership=_membership(tenant, owner), role="admin"
        )

    assert _membership(tenant, owner).role == "owner"


@pytest.mark.django_db
def test_the_only_owner_stepping_down_is_refused_at_once_not_asked_first(client, owner, tenant):
    client.force_login(owner)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/role/", {"role": "viewer"},
        follow=True,
    )  # fmt: skip

    assert b"needs at least one owner" in response.content
    assert b"Give up the Owner role?" not in response.content
    assert _membership(tenant, owner).role == "owner"


@pytest.mark.django_db
def test_the_last_owner_cannot_leave_while_others_remain(client, owner, tenant, add_member):
    add_member("bob@example.com", "admin")
    client.force_login(owner)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/remove/", follow=True
    )

    assert "You are the only owner of Acme: make someone else an owner first, then leave." in (
        response.content.decode()
    )
    assert Membership.objects.filter(tenant=tenant, user=owner).exists()
    denied = AuditEvent.objects.get(tenant=tenant, action="member.leave")
    assert denied.result == AuditEvent.Result.DENIED


@pytest.mark.django_db
def test_an_owner_cannot_leave_when_the_only_other_owner_is_a_closed_account(
    owner, tenant, add_member
):
    """Two owners, one of whose accounts staff closed: the other left, and the organization
    (with members and whatever runs) was left with no owner who can sign in: nobody can
    manage its members, rename, delete it or make a new owner."""
    closed = add_member("closed@example.com", "owner")
    add_member("bob@example.com", "admin")
    _close(closed)

    with pytest.raises(ActionDenied) as refused:
        services.membership_leave(actor=Actor(user=owner), tenant=tenant)

    assert refused.value.reason == (
        "You are the only owner of Acme: make someone else an owner first, then leave."
    )
    assert _membership(tenant, owner).role == "owner"
    assert services.leave_refusal(_membership(tenant, owner)) == refused.value.reason


@pytest.mark.django_db
def test_the_last_owner_who_can_sign_in_cannot_step_down_beside_a_closed_owner(
    client, owner, tenant, add_member
):
    """As leaving: the one active owner made themselves an admin, since a closed account
    still counted as "another owner", and no one left could manage owners. The team page
    refuses it at once, as for the only owner, rather than asking to confirm first."""
    _close(add_member("closed@example.com", "owner"))
    mine = _membership(tenant, owner)

    with pytest.raises(ActionDenied, match="needs at least one owner"):
        services.membership_change_role(actor=Actor(user=owner), membership=mine, role="admin")
    client.force_login(owner)
    answer = client.post(f"/t/{tenant.slug}/team/{mine.pk}/role/", {"role": "admin"}, follow=True)

    assert b"needs at least one owner" in answer.content
    assert b"Give up the Owner role?" not in answer.content
    assert _membership(tenant, owner).role == "owner"


@pytest.mark.django_db
def test_an_owner_may_step_down_or_leave_beside_another_owner_who_can_sign_in(
    owner, tenant, add_member
):
    """A closed owner beside them changes nothing while a third owner can still sign in; and
    the closed owner may be demoted or removed, as the organization keeps an owner."""
    closed = add_member("closed@example.com", "owner")
    other = add_member("other@example.com", "owner")
    _close(closed)

    services.membership_change_role(
        actor=Actor(user=other), membership=_membership(tenant, closed), role="viewer"
    )
    services.membership_remove(actor=Actor(user=other), membership=_membership(tenant, closed))
    services.membership_leave(actor=Actor(user=owner), tenant=tenant)

    assert list(tenant.memberships.values_list("user__email", "role")) == [
        ("other@example.com", "owner")
    ]


@pytest.mark.django_db
def test_the_team_page_says_why_the_last_owner_cannot_leave_instead_of_offering_it(
    client, owner, tenant, add_member
):
    second = add_member("second@example.com", "admin")
    client.force_login(owner)
    own = f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/remove/"

    page = client.get(f"/t/{tenant.slug}/team/").content.decode()

    assert own not in page  # no Leave on their own row, nor a role to step down to, ...
    assert f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/role/" not in page
    assert "You are the only owner of Acme: make someone else an owner first" in page
    assert f"/t/{tenant.slug}/team/{_membership(tenant, second).pk}/remove/" in page
    assert f"/t/{tenant.slug}/team/{_membership(tenant, second).pk}/role/" in page

    services.membership_change_role(
        actor=Actor(user=owner), membership=_membership(tenant, second), role="owner"
    )
    page = client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert own in page and "You are the only owner" not in page  # ... until another owner
    assert f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/role/" in page


@pytest.mark.django_db
def test_the_only_members_team_page_links_to_deleting_the_organization(
    client, owner, tenant, add_member
):
    """The Team page said to delete the organization "from its Settings page", which the
    Settings page said of itself too: the Team page links to its section."""
    client.force_login(owner)
    link = f'<a href="/t/{tenant.slug}/settings/#organization-delete">Delete it from Settings</a>'

    alone = client.get(f"/t/{tenant.slug}/team/").content.decode()
    add_member("bob@example.com", "member")
    with_bob = client.get(f"/t/{tenant.slug}/team/").content.decode()

    refused = alone.split('id="leave-refused">', 1)[1].split("</small>", 1)[0]
    assert refused == f"You are the only member of Acme: delete the organization instead. {link}"
    assert link not in with_bob  # the only owner, not the only member: no deleting offered


@pytest.mark.django_db
def test_the_only_member_is_pointed_to_deleting_the_organization(client, owner, tenant):
    client.force_login(owner)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/remove/", follow=True
    )

    assert "You are the only member of Acme: delete the organization instead" in (
        response.content.decode()
    )
    assert Membership.objects.filter(tenant=tenant, user=owner).exists()


@pytest.mark.django_db
def test_an_owner_can_step_down_once_there_is_another_owner(owner, tenant, add_member):
    second = add_member("second@example.com", "owner")

    services.membership_change_role(
        actor=Actor(user=second), membership=_membership(tenant, owner), role="member"
    )

    assert _membership(tenant, owner).role == "member"


@pytest.mark.django_db
def test_an_admin_removes_a_member(client, tenant, add_member):
    admin = add_member("admin@example.com", "admin")
    bob = add_member("bob@example.com", "member")
    client.force_login(admin)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, bob).pk}/remove/", follow=True
    )

    assert b"bob@example.com was removed." in response.content
    assert not Membership.objects.filter(tenant=tenant, user=bob).exists()
    event = AuditEvent.objects.get(tenant=tenant, action="member.remove")
    assert event.payload == {"email": "bob@example.com", "role": "member"}


@pytest.mark.django_db
def test_a_member_can_leave_but_not_remove_others(client, tenant, add_member, owner):
    bob = add_member("bob@example.com", "member")
    client.force_login(bob)

    refused = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/remove/", follow=True
    )
    assert b"does not allow removing members" in refused.content
    assert Membership.objects.filter(tenant=tenant, user=owner).exists()

    left = client.post(f"/t/{tenant.slug}/team/{_membership(tenant, bob).pk}/remove/")
    assert left.status_code == 302
    assert not Membership.objects.filter(tenant=tenant, user=bob).exists()
    event = AuditEvent.objects.get(tenant=tenant, action="member.leave")
    assert (event.actor, event.payload) == (bob, {"email": "bob@example.com", "role": "member"})
    assert client.get(f"/t/{tenant.slug}/").status_code == 404


@pytest.mark.django_db
def test_a_viewer_sees_the_team_without_controls(client, tenant, add_member):
    client.force_login(add_member("vic@example.com", "viewer"))

    page = client.get(f"/t/{tenant.slug}/team/")

    assert page.status_code == 200
    assert b"owner@example.com" in page.content
    assert b"Send invitation" not in page.content
    assert b'name="role"' not in page.content


@pytest.mark.django_db
def test_the_team_page_says_which_member_s_account_was_closed(owner_client, tenant, add_member):
    """Owners saw a closed account listed as any other owner or admin: nothing told them it
    can no longer act, or that the organization's other owner is gone in all but name."""
    closed = add_member("closed@example.com", "owner")
    add_member("open@example.com", "admin")
    _close(closed)

    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()

    rows = {
        email: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row))
        for row in re.findall(r'<tr id="member-.*?</tr>', page, re.S)
        for email in re.findall(r"[\w.]+@example\.com", row)[:1]
    }
    assert "closed@example.com account closed" in rows["closed@example.com"]
    assert "account closed" not in rows["open@example.com"]
    assert "account closed" not in rows["owner@example.com"]


@pytest.mark.django_db
def test_the_team_page_reads_no_members_password_hash(client, tenant, add_member):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(add_member("vic@example.com", "viewer"))

    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/t/{tenant.slug}/team/")

    assert b"owner@example.com" in page.content and b"vic@example.com" in page.content
    members = [q["sql"] for q in queries.captured_queries if "accounts_membership" in q["sql"]]
    # The members' accounts are read for their addresses and whether they are closed alone
    # (the session reads its own).
    assert members and not [sql for sql in members if '"accounts_user"."password"' in sql]


@pytest.mark.django_db
def test_an_unknown_role_is_refused_without_change(client, tenant, add_member):
    bob = add_member("bob@example.com", "member")
    client.force_login(tenant.memberships.get(role="owner").user)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, bob).pk}/role/",
        {"role": "operator"},
        follow=True,
    )

    assert b"Choose one of the listed roles." in response.content
    assert _membership(tenant, bob).role == "member"


@pytest.mark.django_db
def test_stepping_down_shows_the_panel_for_the_new_role_at_once(client, owner, tenant, add_member):
    add_member("second@example.com", "owner")
    client.force_login(owner)

    response = client.post(
        f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/role/",
        {"role": "viewer", "confirm": "true"},
        headers={"HX-Request": "true"},
    )

    assert _membership(tenant, owner).role == "viewer"
    assert b"Send invitation" not in response.content
    assert b'name="role"' not in response.content


def _row(response, membership) -> str:
    html = response.content.decode()
    return re.search(rf'<tr id="member-{membership.pk}">.*?</tr>', html, re.S).group(0)


@pytest.mark.django_db
def test_an_admin_is_offered_only_what_the_role_may_do(client, owner, tenant, add_member):
    admin = add_member("admin@example.com", "admin")
    bob = add_member("bob@example.com", "member")
    client.force_login(admin)

    page = client.get(f"/t/{tenant.slug}/team/")

    # No "Owner" anywhere: not for a member's role, not for an invitation.
    assert b'<option value="owner"' not in page.content
    assert b'<option value="admin"' in page.content
    # The owner's row shows the role as text, with neither a role select nor Remove.
    owner_row = _row(page, _membership(tenant, owner))
    assert "Owner" in owner_row
    assert "<select" not in owner_row
    assert "Remove" not in owner_row
    bob_row = _row(page, _membership(tenant, bob))
    assert "<select" in bob_row
    assert "Remove" in bob_row


@pytest.mark.django_db
def test_an_owner_is_offered_the_owner_role_and_controls_on_other_owners(
    client, owner, tenant, add_member
):
    second = add_member("second@example.com", "owner")
    client.force_login(owner)

    page = client.get(f"/t/{tenant.slug}/team/")

    assert b'<option value="owner"' in page.content
    second_row = _row(page, _membership(tenant, second))
    assert "<select" in second_row
    assert "Remove" in second_row


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "plain"])
def test_an_owner_stepping_down_is_asked_to_confirm_first(client, owner, tenant, add_member, htmx):
    add_member("second@example.com", "owner")
    client.force_login(owner)
    url = f"/t/{tenant.slug}/team/{_membership(tenant, owner).pk}/role/"
    headers = {"HX-Request": "true"} if htmx else {}

    asked = client.post(url, {"role": "admin"}, headers=headers)

    assert asked.status_code == 200
    assert b"You are about to give up the Owner role in Acme and become Admin." in asked.content
    assert b"granting or revoking the owner role" in asked.content
    assert b'name="confirm" value="true"' in asked.content
    assert b"Cancel" in asked.content
    assert _membership(tenant, owner).role == "owner"
    assert not AuditEvent.objects.filter(action="member.change_role").exists()

    confirmed = client.post(url, {"role": "admin", "confirm": "true"}, headers=headers, follow=True)

    assert _membership(tenant, owner).role == "admin"
    assert b"owner@example.com is now Admin." in confirmed.content
    assert b"You are about to give up" not in confirmed.content


@pytest.mark.django_db
def test_an_owner_changing_another_owner_is_not_asked_to_confirm(client, owner, tenant, add_member):
    second = add_member("second@example.com", "owner")
    client.force_login(owner)

    client.post(f"/t/{tenant.slug}/team/{_membership(tenant, second).pk}/role/", {"role": "admin"})

    assert _membership(tenant, second).role == "admin"


@pytest.mark.django_db
def test_the_team_page_reads_its_members_in_the_same_queries_however_many(
    owner_client, tenant, add_member
):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert owner_client.get(f"/t/{tenant.slug}/team/").status_code == 200
        return len(captured)

    add_member("m0@example.com", "member")
    queries()  # the first request of a session reads what later ones find cached
    few = queries()
    for n in range(1, 6):
        add_member(f"m{n}@example.com", "viewer")
    _close(add_member("closed@example.com", "viewer"))  # said on its row, read with it

    assert queries() == few
