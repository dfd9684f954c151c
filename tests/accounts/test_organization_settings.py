"""An organization's settings: an owner renames or deletes it, any member leaves it."""

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import resolve

from accounts import selectors, services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Invitation, Membership, Tenant
from billing.models import Invoice, Plan, Subscription
from deployments.models import Instance, Operation
from tests.accounts.test_tenant_isolation import TENANT_ROUTES, _concrete
from tests.concurrency import race
from tests.deployments import factories


def _events(tenant, action, result=AuditEvent.Result.OK):
    return AuditEvent.objects.filter(tenant=tenant, action=action, result=result)


def _name(tenant) -> str:
    return Tenant.objects.get(pk=tenant.pk).name


# --- rename ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_owner_renames_the_organization(owner, tenant):
    services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="  Acme   Labs ")

    assert _name(tenant) == "Acme Labs"
    event = _events(tenant, "tenant.rename").get()
    assert event.payload == {"name": "Acme Labs", "from": "Acme"}
    assert event.target_shown == f"tenant {tenant.pk} (Acme Labs)"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("   ", "Give the organization a name."),
        ("Acme\u200bLabs", "Use letters, digits, spaces and punctuation only."),
        ("\u202eemcA", "Use letters, digits, spaces and punctuation only."),  # shown reversed
        ("\u3164", "Give the organization a name people can see."),  # a Hangul filler
        ("\u2800 \u2800", "Give the organization a name people can see."),  # blank Braille
        ("x" * 101, "Use at most 100 characters"),
        ("other org", "You already belong to an organization called “other org”"),
    ],
)
def test_a_new_name_is_checked_as_at_creation(owner, tenant, name, said):
    services.tenant_create(actor=Actor(user=owner), name="Other Org")

    with pytest.raises(ValidationError, match=said):
        services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name=name)

    assert _name(tenant) == "Acme"
    assert not _events(tenant, "tenant.rename").exists()


@pytest.mark.django_db
def test_a_rename_to_a_name_a_member_has_for_another_organization_is_refused(
    owner, tenant, add_member, make_user
):
    bob = add_member("bob@example.com", "member")
    bobs = services.tenant_create(actor=Actor(user=bob), name="Bob's organization")
    services.tenant_create(actor=Actor(user=make_user("eve@example.com")), name="Eve's")

    with pytest.raises(ValidationError) as refused:
        services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="BOB'S ORGANIZATION")

    assert refused.value.message_dict["name"] == [
        "A member of Acme already belongs to another organization called “BOB'S ORGANIZATION”: "
        "choose another name."
    ]
    assert _name(tenant) == "Acme"
    # One that no member has, or one only a deleted organization had, may be taken.
    services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="Eve's")
    services.tenant_delete(actor=Actor(user=bob), tenant=bobs, confirm_name="Bob's organization")
    services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="Bob's organization")
    assert _name(tenant) == "Bob's organization"


@pytest.mark.django_db(transaction=True)
def test_a_member_making_an_organization_while_the_name_is_taken_by_a_rename_makes_one_of_them(
    owner, tenant, add_member
):
    bob = add_member("bob@example.com", "member")
    calls = iter(
        [
            lambda: services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="Zeta"),
            lambda: services.tenant_create(actor=Actor(user=bob), name="zeta"),
        ]
    )

    results = race(lambda: next(calls)(), times=2)

    refused = [r for r in results if isinstance(r, ValidationError)]
    assert len(refused) == 1, results
    names = Tenant.objects.for_user(bob).values_list("name", flat=True)
    assert sorted(name.lower() for name in names).count("zeta") == 1


@pytest.mark.django_db
def test_a_rename_may_change_only_the_case_and_the_same_name_records_nothing(owner, tenant):
    services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="Acme")
    assert not _events(tenant, "tenant.rename").exists()

    services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="ACME")
    assert _name(tenant) == "ACME"


@pytest.mark.django_db
def test_a_deleted_organizations_name_may_be_taken_again(owner, tenant):
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    other = services.tenant_create(actor=Actor(user=owner), name="Other")

    services.tenant_rename(actor=Actor(user=owner), tenant=other, name="Acme")

    assert _name(other) == "Acme"


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["admin", "member", "viewer", "billing"])
def test_only_an_owner_may_rename(tenant, add_member, role):
    user = add_member(f"{role}@example.com", role)

    with pytest.raises(ActionDenied, match="does not allow renaming the organization"):
        services.tenant_rename(actor=Actor(user=user), tenant=tenant, name="Mine now")

    assert _name(tenant) == "Acme"
    assert _events(tenant, "tenant.rename", AuditEvent.Result.DENIED).exists()


# --- delete ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_owner_deletes_the_organization_and_it_is_gone_for_its_members(
    owner, tenant, add_member
):
    bob = add_member("bob@example.com", "member")
    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="ann@example.com", role="member"
    )

    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name=" Acme ")

    tenant.refresh_from_db()
    assert tenant.deleted_at is not None
    for user in (owner, bob):
        assert selectors.membership_get(user=user, tenant_slug=tenant.slug) is None
        assert not selectors.memberships_for_user(user).exists()
        assert not Tenant.objects.for_user(user).exists()
    # Kept for the records: its members and its log.
    assert tenant.memberships.count() == 2
    assert Invitation.objects.get(pk=invitation.pk).status == "revoked"
    event = _events(tenant, "tenant.delete").get()
    assert event.payload == {
        "name": "Acme", "slug": tenant.slug, "members": 2, "invitations_withdrawn": 1,
        "api_access_revoked": 0,
    }  # fmt: skip


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_the_other_members_are_told_by_email_who_deleted_it_and_when(
    owner, tenant, add_member, django_capture_on_commit_callbacks
):
    add_member("bob@example.com", "member")
    add_member("ann@example.com", "admin")

    with django_capture_on_commit_callbacks(execute=True):
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    tenant.refresh_from_db()
    assert sorted(m.to[0] for m in mail.outbox) == ["ann@example.com", "bob@example.com"]
    told = {m.to[0]: m for m in mail.outbox}
    assert told["bob@example.com"].subject == "[Opsdeck] Acme was deleted"
    body = told["ann@example.com"].body
    on = f"{tenant.deleted_at:%-d %B %Y} at {tenant.deleted_at:%H:%M} UTC"
    assert f"owner@example.com deleted the organization Acme on Opsdeck on {on}." in body
    assert "You were one of its members (Admin)." in body
    assert "ask the platform team: they can restore it" in body


@pytest.mark.django_db
@pytest.mark.usefixtures("mail_at_commit")
def test_a_closed_account_is_not_mailed_that_its_organization_was_deleted(
    owner, tenant, add_member, django_capture_on_commit_callbacks
):
    """Every other email of an organization skips an account staff closed (it signs in no
    more, and its owner asked to hear nothing more); the deletion email still went to it."""
    gone = add_member("gone@example.com", "admin")
    add_member("bob@example.com", "member")
    gone.is_active = False
    gone.save(update_fields=["is_active"])

    with django_capture_on_commit_callbacks(execute=True):
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    assert [m.to for m in mail.outbox] == [["bob@example.com"]]


@pytest.mark.django_db
def test_a_refused_delete_emails_no_one(
    owner, tenant, add_member, django_capture_on_commit_callbacks
):
    add_member("bob@example.com", "member")

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ValidationError):
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme Labs")

    assert mail.outbox == []


@pytest.mark.django_db
@pytest.mark.parametrize("typed", ["", "acme", "Acme Labs"])
def test_deleting_needs_the_name_typed(owner, tenant, typed):
    with pytest.raises(ValidationError, match="Type the organization's name, Acme, to delete it"):
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name=typed)

    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["admin", "member", "viewer", "billing"])
def test_only_an_owner_may_delete(tenant, add_member, role):
    user = add_member(f"{role}@example.com", role)

    with pytest.raises(ActionDenied, match="does not allow deleting the organization"):
        services.tenant_delete(actor=Actor(user=user), tenant=tenant, confirm_name="Acme")

    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None
    assert _events(tenant, "tenant.delete", AuditEvent.Result.DENIED).exists()


@pytest.mark.django_db
def test_deleting_is_refused_while_deployments_run_or_operations_are_under_way(owner, tenant):
    version = factories.postgres_version()  # the tests' default subscribes the tenant to it
    cell = factories.cell()
    orders, cache = factories.make_instances(tenant, version, cell, 2, name="orders")
    factories.make_operation(cache, verb="restart", state="queued")

    with pytest.raises(ActionDenied) as refused:
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    assert refused.value.reason == (
        "Acme cannot be deleted yet. 2 deployments are not deleted (orders-0, orders-1): "
        "delete them first. 1 operation is queued or running: wait for it to finish. "
        f"Its subscription to {version.plan.name} is active: cancel it on the Billing page first."
    )
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None
    denied = _events(tenant, "tenant.delete", AuditEvent.Result.DENIED).get()
    assert denied.payload["reason"] == refused.value.reason

    Instance.objects.filter(pk__in=[orders.pk, cache.pk]).update(state=Instance.State.DELETED)
    Subscription.objects.filter(tenant=tenant).update(status=Subscription.Status.CANCELLED)
    with pytest.raises(ActionDenied, match=r"^Acme cannot be deleted yet. 1 operation is queued"):
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    Operation.objects.filter(instance=cache).update(state=Operation.State.SUCCEEDED)
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is not None


@pytest.mark.django_db
@pytest.mark.unsubscribed
def test_deleting_is_refused_while_an_invoice_is_unpaid(owner, tenant):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-10", status="open", number="2026-000007",
        total="12.50",
    )  # fmt: skip

    with pytest.raises(ActionDenied) as refused:
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    assert refused.value.reason == (
        "Acme cannot be deleted yet. Invoice 2026-000007 (12.50 USD) is unpaid: pay it first."
    )
    Invoice.objects.filter(pk=invoice.pk).update(status="paid")
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    assert Invoice.objects.filter(tenant=tenant).count() == 1  # kept for the records


@pytest.mark.django_db
@pytest.mark.unsubscribed
@pytest.mark.parametrize("status", ["pending", "past_due", "suspended"])
def test_deleting_is_refused_while_a_subscription_is_open(owner, tenant, status):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Subscription.objects.create(tenant=tenant, plan=plan, status=status)

    with pytest.raises(ActionDenied, match=r"Its subscription to PostgreSQL is .*: cancel it"):
        services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")


@pytest.mark.django_db
def test_a_deleted_organization_refuses_what_its_members_try_next(owner, tenant):
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    with pytest.raises(ActionDenied, match=r"Acme has been deleted\."):
        services.invitation_create(
            actor=Actor(user=owner), tenant=tenant, email="x@example.com", role="member"
        )
    with pytest.raises(ActionDenied, match=r"Acme has been deleted\."):
        services.tenant_rename(actor=Actor(user=owner), tenant=tenant, name="Back")


@pytest.mark.django_db(transaction=True)
def test_two_deletes_at_once_delete_it_once(owner, tenant):
    results = race(
        lambda: services.tenant_delete(
            actor=Actor(user=owner), tenant=Tenant.objects.get(pk=tenant.pk), confirm_name="Acme"
        ),
        times=2,
    )

    deleted = [r for r in results if isinstance(r, Tenant)]
    refused = [r for r in results if isinstance(r, ActionDenied)]
    assert (len(deleted), len(refused)) == (1, 1), results
    assert refused[0].reason == "Acme has been deleted."
    assert _events(tenant, "tenant.delete").count() == 1


# --- leave -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_owner_leaves_once_another_owner_remains(owner, tenant, add_member):
    add_member("olga@example.com", "owner")

    services.membership_leave(actor=Actor(user=owner), tenant=tenant)

    assert not Membership.objects.filter(tenant=tenant, user=owner).exists()
    assert _events(tenant, "member.leave").get().payload == {
        "email": "owner@example.com", "role": "owner",
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_last_two_owners_leaving_at_once_leave_one_owner(owner, tenant, add_member):
    olga = add_member("olga@example.com", "owner")
    add_member("vic@example.com", "viewer")
    leavers = iter([owner, olga])

    results = race(
        lambda: services.membership_leave(actor=Actor(user=next(leavers)), tenant=tenant),
        times=2,
    )

    refused = [r for r in results if isinstance(r, ActionDenied)]
    assert len(refused) == 1, results
    assert "make someone else an owner first" in refused[0].reason
    assert tenant.memberships.filter(role="owner").count() == 1
    assert _events(tenant, "member.leave").count() == 1


# --- pages -------------------------------------------------------------------------------


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_an_owner_sees_rename_and_delete_on_the_settings_page(owner_client, tenant):
    page = owner_client.get(f"/t/{tenant.slug}/settings/").content.decode()

    assert 'id="rename-name"' in page
    assert 'value="Acme"' in page
    assert "Type <strong>Acme</strong> to confirm" in page
    assert 'id="delete-blockers"' not in page
    assert f'href="/t/{tenant.slug}/settings/"' in page  # in the sidebar


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["admin", "member", "viewer", "billing"])
def test_other_roles_see_the_name_and_leave_but_no_rename_or_delete(tenant, add_member, role):
    client = _client(add_member(f"{role}@example.com", role))

    page = client.get(f"/t/{tenant.slug}/settings/").content.decode()

    assert 'id="organization-name-shown"' in page
    assert 'id="rename-name"' not in page
    assert 'id="organization-delete"' not in page
    assert "Leave Acme" in page


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["admin", "member", "viewer", "billing"])
def test_a_forged_rename_or_delete_by_another_role_is_refused(tenant, add_member, role):
    client = _client(add_member(f"{role}@example.com", role))

    renamed = client.post(f"/t/{tenant.slug}/settings/rename/", {"name": "Mine"})
    deleted = client.post(f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"})

    assert (renamed.status_code, deleted.status_code) == (403, 403)
    assert b"does not allow renaming the organization" in renamed.content
    assert b"does not allow deleting the organization" in deleted.content
    tenant.refresh_from_db()
    assert (tenant.name, tenant.deleted_at) == ("Acme", None)
    assert _events(tenant, "tenant.rename", AuditEvent.Result.DENIED).exists()
    assert _events(tenant, "tenant.delete", AuditEvent.Result.DENIED).exists()


@pytest.mark.django_db
def test_a_non_member_gets_404_for_the_settings_and_its_forms(tenant, make_user):
    client = _client(make_user("stranger@example.com"))

    assert client.get(f"/t/{tenant.slug}/settings/").status_code == 404
    assert client.post(f"/t/{tenant.slug}/settings/rename/", {"name": "X"}).status_code == 404
    delete = client.post(f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"})
    assert delete.status_code == 404
    assert client.post(f"/t/{tenant.slug}/settings/leave/").status_code == 404
    tenant.refresh_from_db()
    assert (tenant.name, tenant.deleted_at) == ("Acme", None)


@pytest.mark.django_db
def test_renaming_from_the_page_says_so_and_a_bad_name_is_said_beside_its_field(
    owner_client, tenant
):
    bad = owner_client.post(f"/t/{tenant.slug}/settings/rename/", {"name": "a\u200bb"})
    assert bad.status_code == 400
    assert 'aria-invalid="true"' in bad.content.decode()
    assert "Use letters, digits, spaces and punctuation only." in bad.content.decode()
    assert 'class="error-summary" role="alert" tabindex="-1" autofocus' in bad.content.decode()
    assert _name(tenant) == "Acme"

    done = owner_client.post(
        f"/t/{tenant.slug}/settings/rename/", {"name": "Acme Labs"}, follow=True
    )
    page = done.content.decode()
    assert "Acme is now called Acme Labs." in page
    assert "<summary>Acme Labs</summary>" in page  # the switcher
    assert _name(tenant) == "Acme Labs"


@pytest.mark.django_db
def test_deleting_from_the_page_lands_on_another_organization(owner_client, owner, tenant):
    other = services.tenant_create(actor=Actor(user=owner), name="Beta")
    owner_client.get(f"/t/{tenant.slug}/")  # the last organization opened

    response = owner_client.post(
        f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"}, follow=True
    )

    assert response.redirect_chain[-1][0] == f"/t/{other.slug}/"
    page = response.content.decode()
    assert "Organization Acme deleted." in page
    assert f'href="/t/{tenant.slug}/"' not in page  # gone from the switcher
    assert owner_client.get(f"/t/{tenant.slug}/").url == "/"  # told so, on the home page


@pytest.mark.django_db
def test_deleting_ones_only_organization_lands_where_a_user_with_none_does(owner_client, tenant):
    response = owner_client.post(
        f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"}, follow=True
    )

    assert resolve(response.redirect_chain[-1][0].split("?")[0]).url_name == ("organization_create")
    assert "Organization Acme deleted." in response.content.decode()


@pytest.mark.django_db
def test_the_page_says_what_stands_in_the_way_before_and_after_trying(owner_client, tenant):
    version = factories.postgres_version()
    factories.make_instances(tenant, version, factories.cell(), 1, name="orders")

    page = owner_client.get(f"/t/{tenant.slug}/settings/").content.decode()
    assert 'id="delete-blockers"' in page
    assert "1 deployment is not deleted (orders-0): delete it first." in page

    refused = owner_client.post(f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"})
    assert refused.status_code == 400
    said = refused.content.decode()
    assert said.count("1 deployment is not deleted (orders-0): delete it first.") == 1
    assert 'id="delete-blockers"' in said
    assert Tenant.objects.get(pk=tenant.pk).deleted_at is None

    mistyped = owner_client.post(f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "acme"})
    assert mistyped.status_code == 400
    assert "Type the organization&#x27;s name, Acme, to delete it." in mistyped.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("route", TENANT_ROUTES)
def test_every_page_of_a_deleted_organization_sends_its_members_home_told_so(
    owner_client, owner, tenant, route, make_user
):
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    path = _concrete(route, tenant.slug)
    stranger = _client(make_user("stranger@example.com"))
    if not path.startswith("/t/"):  # the billing team's page of the tenant: staff only
        assert owner_client.get(path).status_code == 404
        return

    assert owner_client.get(path).url == "/"
    assert owner_client.post(path, {"name": "x", "confirm_name": "Acme"}).url == "/"
    assert owner_client.post(path, headers={"HX-Request": "true"})["HX-Redirect"] == "/"
    assert stranger.get(path).status_code == 404  # no one else learns it existed
    assert stranger.post(path, {"name": "x"}).status_code == 404


@pytest.mark.django_db
def test_a_member_leaves_from_the_settings_page(tenant, add_member):
    bob = add_member("bob@example.com", "member")
    client = _client(bob)

    response = client.post(f"/t/{tenant.slug}/settings/leave/", follow=True)

    assert "You left Acme." in response.content.decode()
    assert not Membership.objects.filter(tenant=tenant, user=bob).exists()
    assert client.get(f"/t/{tenant.slug}/settings/").status_code == 404


@pytest.mark.django_db
def test_the_only_owner_leaving_from_the_settings_page_is_told_why_not(owner_client, tenant):
    response = owner_client.post(
        f"/t/{tenant.slug}/settings/leave/", headers={"HX-Request": "true"}
    )

    assert (response.status_code, response["HX-Redirect"]) == (204, f"/t/{tenant.slug}/settings/")
    page = owner_client.get(f"/t/{tenant.slug}/settings/").content.decode()
    assert "You are the only member of Acme: delete the organization instead" in page


@pytest.mark.django_db
def test_staff_still_find_a_deleted_organization_in_the_admin_marked(
    client, make_user, owner, tenant
):
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))

    listed = client.get("/admin/accounts/tenant/").content.decode()
    deleted_only = client.get("/admin/accounts/tenant/?deleted=yes").content.decode()
    live_only = client.get("/admin/accounts/tenant/?deleted=no").content.decode()

    assert "Acme" in listed and "Deleted 20" in listed
    assert "Acme" in deleted_only
    assert "Acme" not in live_only
    assert client.get(f"/admin/accounts/tenant/{tenant.pk}/change/").status_code == 200


@pytest.mark.django_db
def test_staff_restore_a_deleted_organization_from_the_admin(
    client, make_user, owner, tenant, add_member
):
    bob = add_member("bob@example.com", "member")
    live = services.tenant_create(actor=Actor(user=owner), name="Initech")
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    staff = make_user("staff@example.com", is_staff=True, is_superuser=True)
    client.force_login(staff)

    response = client.post(
        "/admin/accounts/tenant/",
        {"action": "restore", "_selected_action": [tenant.pk, live.pk]},
        follow=True,
    )

    page = response.content.decode()
    assert "Restored (their withdrawn invitations stay withdrawn): 1." in page
    assert "Not done for Initech: Initech is not deleted." in page
    tenant.refresh_from_db()
    assert tenant.deleted_at is None
    assert _client(bob).get(f"/t/{tenant.slug}/").status_code == 200  # back for its members
    event = AuditEvent.objects.get(tenant=tenant, action="tenant.restore")
    assert event.actor == staff and event.payload["name"] == "Acme"


@pytest.mark.django_db
def test_an_organization_none_of_whose_members_can_sign_in_is_not_restored(client, make_user):
    """Alice deleted Acme, then her account (kept, as a deleted organization's member, with
    nothing of her): restored, Acme would be open to no one."""
    alice = make_user("alice@example.com")
    acme = services.tenant_create(actor=Actor(user=alice), name="Acme")
    services.tenant_delete(actor=Actor(user=alice), tenant=acme, confirm_name="Acme")
    services.user_delete(actor=Actor(user=alice), confirm_email=alice.email)
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))

    response = client.post(
        "/admin/accounts/tenant/", {"action": "restore", "_selected_action": [acme.pk]},
        follow=True,
    )  # fmt: skip

    assert (
        "Not done for Acme: No member of Acme can sign in any more (their accounts were deleted "
        "or closed): restored, no one could open it." in response.content.decode()
    )
    assert Tenant.objects.get(pk=acme.pk).deleted_at is not None


@pytest.mark.django_db
def test_staff_restoring_an_organization_whose_owners_left_are_told_to_make_one(
    client, make_user, owner, tenant, add_member
):
    """Acme's owner deleted it, then their account; Bob, a viewer, can still sign in. It is
    restored for him, and staff are told that no one can manage it until they make an owner,
    which the memberships' action does."""
    bob = add_member("bob@example.com", "viewer")
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")
    services.user_delete(actor=Actor(user=owner), confirm_email=owner.email)
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))

    restored = client.post(
        "/admin/accounts/tenant/",
        {"action": "restore", "_selected_action": [tenant.pk]},
        follow=True,
    ).content.decode()
    bobs = Membership.objects.get(tenant=tenant, user=bob)
    promoted = client.post(
        "/admin/accounts/membership/",
        {"action": "make_owner", "_selected_action": [bobs.pk]},
        follow=True,
    ).content.decode()

    assert "Restored (their withdrawn invitations stay withdrawn): 1." in restored
    assert (
        "No owner of Acme can sign in any more: make one of its members an owner (Memberships: "
        "&#x27;Change role to Owner&#x27;), or no one can manage it." in restored
    )
    assert "Changed to owner: 1." in promoted
    assert list(selectors.owners_active(tenant).values_list("user__email", flat=True)) == [
        "bob@example.com"
    ]


@pytest.mark.django_db
def test_only_staff_restore_an_organization(owner, tenant):
    services.tenant_delete(actor=Actor(user=owner), tenant=tenant, confirm_name="Acme")

    with pytest.raises(ActionDenied, match="Only platform staff"):
        services.tenant_restore(actor=Actor(user=owner), tenant=tenant)

    tenant.refresh_from_db()
    assert tenant.deleted_at is not None
    assert _events(tenant, "tenant.restore", AuditEvent.Result.DENIED).count() == 1


@pytest.mark.django_db
def test_a_second_delete_or_a_tab_left_open_is_told_the_organization_was_deleted(
    owner_client, tenant, add_member
):
    bob = _client(add_member("bob@example.com", "member"))
    first = owner_client.post(f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"})

    again = owner_client.post(
        f"/t/{tenant.slug}/settings/delete/", {"confirm_name": "Acme"}, follow=True
    )
    left_open = bob.get(f"/t/{tenant.slug}/deployments/", follow=True)

    assert first.status_code == 302
    said = f"Acme was deleted on {Tenant.objects.get(pk=tenant.pk).deleted_at:%-d %B %Y}."
    assert said in again.content.decode()
    assert said in left_open.content.decode()
    assert left_open.redirect_chain[0] == ("/", 302)


@pytest.mark.django_db
def test_the_settings_page_says_why_the_last_owner_cannot_leave_instead_of_offering_it(
    owner_client, tenant, add_member
):
    alone = owner_client.get(f"/t/{tenant.slug}/settings/").content.decode()
    bob = add_member("bob@example.com", "member")
    with_others = owner_client.get(f"/t/{tenant.slug}/settings/").content.decode()
    member_page = _client(bob).get(f"/t/{tenant.slug}/settings/").content.decode()

    assert "You are the only member of Acme: delete the organization instead" in alone
    assert "from its Settings page" not in alone  # this is that page: its section is below
    assert 'id="organization-delete"' in alone
    assert "You are the only owner of Acme: make someone else an owner first" in with_others
    assert "Leave Acme</button>" not in alone and "Leave Acme</button>" not in with_others
    assert "Leave Acme</button>" in member_page
