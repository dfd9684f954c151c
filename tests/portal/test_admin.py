import re
import threading
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from accounts import services
from accounts.admin import ServiceOwnedAdmin
from accounts.audit import Actor
from accounts.models import AuditEvent, Membership

SERVICE_OWNED = [  # the ones with rows in these tests; every ServiceOwnedAdmin is checked below
    "accounts.tenant",
    "accounts.membership",
    "accounts.invitation",
    "accounts.auditevent",
]


def _url(model, view, *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def one_of_everything(tenant, owner):
    """Rows for the plan and deployment models too: a plan loaded from the shipped spec."""
    from pathlib import Path

    from deployments import services as deployment_services
    from deployments.models import FleetRun, PlatformSecret

    spec = Path(__file__).resolve().parents[2] / "specs" / "postgres-cnpg.yaml"
    deployment_services.plan_load(text=spec.read_text())
    PlatformSecret.objects.create(name="TOKEN", value="s3cret")
    FleetRun.objects.create(
        request_id="f" * 32, verb="restart", requested_by=owner,
        selection=[["inst-abcdefgh", None]], handled=1, refused=[["orders", "It is stopped."]],
    )  # fmt: skip
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="member"
    )


@pytest.mark.django_db
def test_every_admin_list_and_detail_page_loads(staff_client, one_of_everything):
    for model in admin.site._registry:
        assert staff_client.get(_url(model, "changelist")).status_code == 200, model
        obj = model._default_manager.first()
        if obj is not None:
            page = staff_client.get(_url(model, "change", obj.pk))
            assert page.status_code == 200, model
            assert b"s3cret" not in page.content  # secrets are never rendered back


SERVICE_OWNED_ADMINS = [
    model._meta.label_lower
    for model, model_admin in admin.site._registry.items()
    if isinstance(model_admin, ServiceOwnedAdmin)
]


@pytest.mark.django_db
@pytest.mark.parametrize("label", SERVICE_OWNED_ADMINS)
def test_no_service_owned_model_can_be_added_in_the_admin(staff_client, label):
    model = next(m for m in admin.site._registry if m._meta.label_lower == label)

    assert staff_client.get(_url(model, "add")).status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("label", SERVICE_OWNED)
def test_service_owned_models_cannot_be_added_edited_or_deleted_directly(
    staff_client, tenant, owner, label
):
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="member"
    )
    model = next(m for m in admin.site._registry if m._meta.label_lower == label)
    obj = model._default_manager.first()

    assert staff_client.get(_url(model, "add")).status_code == 403
    assert staff_client.post(_url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    before = model._default_manager.count()
    changed = staff_client.post(
        _url(model, "change", obj.pk), {"role": "viewer", "name": "Hacked", "action": "x"}
    )
    assert changed.status_code == 403
    assert model._default_manager.count() == before
    obj_after = model._default_manager.get(pk=obj.pk)
    assert getattr(obj_after, "name", "") != "Hacked"
    assert getattr(obj_after, "role", "") != "viewer"


@pytest.mark.django_db
def test_a_role_change_from_the_admin_goes_through_the_service(staff_client, tenant, add_member):
    bob = add_member("bob@example.com", "member")
    membership = Membership.objects.get(user=bob)

    response = staff_client.post(
        _url(Membership, "changelist"),
        {"action": "make_viewer", "_selected_action": [membership.pk]},
        follow=True,
    )

    assert b"Changed to viewer: 1." in response.content
    membership.refresh_from_db()
    assert membership.role == "viewer"
    event = AuditEvent.objects.get(action="member.change_role")
    assert (event.actor_email, event.actor_kind, event.tenant) == (
        "staff@example.com",
        "staff",
        tenant,
    )


@pytest.mark.django_db
def test_the_admin_keeps_the_last_owner_rule(staff_client, tenant, owner):
    membership = Membership.objects.get(user=owner)

    response = staff_client.post(
        _url(Membership, "changelist"),
        {"action": "make_member", "_selected_action": [membership.pk]},
        follow=True,
    )

    assert b"needs at least one owner" in response.content
    assert f"Not done for {membership}: ".encode() in response.content  # its address as written
    membership.refresh_from_db()
    assert membership.role == "owner"


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["make_member", "remove_memberships"])
def test_the_admin_keeps_an_owner_who_can_sign_in_beside_a_closed_owner(
    staff_client, tenant, owner, add_member, action
):
    """A second owner whose account staff closed counted as the owner that remains: staff
    could demote or remove the one owner who can sign in, leaving no one to manage Acme."""
    closed = add_member("closed@example.com", "owner")
    closed.is_active = False
    closed.save(update_fields=["is_active"])
    membership = Membership.objects.get(user=owner)

    response = staff_client.post(
        _url(Membership, "changelist"),
        {"action": action, "_selected_action": [membership.pk]},
        follow=True,
    )

    assert b"needs at least one owner" in response.content
    assert Membership.objects.get(pk=membership.pk).role == "owner"


@pytest.mark.django_db
def test_the_admin_is_for_staff_only(client, owner):
    client.force_login(owner)

    response = client.get("/admin/")

    assert response.status_code == 302
    assert response.url.startswith("/admin/login/")


@pytest.mark.django_db
def test_the_organization_list_makes_as_many_queries_for_many_organizations_as_for_few(
    staff_client, owner, make_user
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import Tenant

    def organizations(count):
        for i in range(Tenant.objects.count(), count):
            tenant = services.tenant_create(actor=Actor(user=owner), name=f"Org {i:02}")
            for j in range(i % 3):
                member = make_user(f"m{i}-{j}@x.example")
                Membership.objects.create(tenant=tenant, user=member, role="member")

    by_members = {"o": "-3"}  # the Members column (after the action checkbox), most first
    organizations(3)
    staff_client.get(_url(Tenant, "changelist"), by_members)
    with CaptureQueriesContext(connection) as few:
        staff_client.get(_url(Tenant, "changelist"), by_members)
    organizations(15)
    with CaptureQueriesContext(connection) as many:
        page = staff_client.get(_url(Tenant, "changelist"), by_members)

    assert len(many.captured_queries) == len(few.captured_queries)
    counts = re.findall(r'<td class="field-member_count">(\d+)</td>', page.content.decode())
    assert counts == ["3"] * 5 + ["2"] * 5 + ["1"] * 5
    # A search by members' addresses joins them again: each organization still counts once.
    found = staff_client.get(_url(Tenant, "changelist"), {**by_members, "q": "x.example"})
    counts = re.findall(r'<td class="field-member_count">(\d+)</td>', found.content.decode())
    assert counts == ["3"] * 5 + ["2"] * 5


def _audited(action):
    return list(
        AuditEvent.objects.filter(action=action).values_list("actor_kind", "target_id", "payload")
    )


@pytest.mark.django_db
def test_staff_put_a_user_in_the_billing_team_from_the_admin_and_it_is_audited(
    staff_client, make_user
):
    from django.contrib.auth.models import Group

    team, _ = Group.objects.get_or_create(name="Billing team")
    finance = make_user("finance@example.com")

    response = staff_client.post(
        _url(type(finance), "change", finance.pk),
        {"email": finance.email, "is_active": "on", "is_staff": "on", "groups": [team.pk]},
    )

    assert response.status_code == 302
    assert list(finance.groups.all()) == [team]
    [(kind, target, payload)] = _audited("user.update")
    assert (kind, target) == ("staff", str(finance.pk))
    assert payload["groups"] == ["Billing team"] and "groups" in payload["changed"]


@pytest.mark.django_db
def test_a_password_staff_set_in_the_admin_is_audited_and_a_refused_one_is_not(
    staff_client, make_user
):
    user = make_user("kim@example.com")
    url = reverse("admin:auth_user_password_change", args=[user.pk])
    usable = {"usable_password": "true"}

    refused = staff_client.post(
        url, {"password1": "a-New-pass-123", "password2": "other", **usable}
    )
    changed = staff_client.post(
        url,
        {
            "password1": "a-New-pass-123",
            "password2": "a-New-pass-123",
            "set_usable_password": "true",
        },
    )

    assert (refused.status_code, changed.status_code) == (200, 302)
    user.refresh_from_db()
    assert user.check_password("a-New-pass-123")
    assert _audited("user.password") == [("staff", str(user.pk), {"email": "kim@example.com"})]


@pytest.mark.django_db
def test_a_group_permission_change_and_who_a_cell_is_offered_to_are_audited(staff_client, tenant):
    from django.contrib.auth.models import Group, Permission

    from tests.deployments import factories

    team, _ = Group.objects.get_or_create(name="Billing team")
    view = Permission.objects.get(codename="view_invoice")
    cell = factories.cell()

    staff_client.post(_url(Group, "change", team.pk), {"name": team.name, "permissions": [view.pk]})
    staff_client.post(_url(type(cell), "change", cell.pk), {"tenants": [tenant.pk]})

    [(_, _, group)] = _audited("group.update")
    assert group == {
        "name": "Billing team",
        "permissions": ["view_invoice"],
        "changed": ["permissions"],
    }
    [(_, _, offered)] = _audited("cell.update")
    assert offered == {"public": False, "tenants": [tenant.slug], "changed": ["public", "tenants"]}


@pytest.mark.django_db
def test_disabling_or_editing_a_beat_task_in_the_admin_is_audited(staff_client):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=1, period="hours")
    task = PeriodicTask.objects.create(name="usage-meter", task="x.y", interval=every)

    staff_client.post(
        _url(PeriodicTask, "changelist"), {"action": "disable_tasks", "_selected_action": [task.pk]}
    )
    staff_client.post(_url(PeriodicTask, "delete", task.pk), {"post": "yes"})

    assert not PeriodicTask.objects.exists()
    assert _audited("periodictask.disable") == [("staff", str(task.pk), {"name": "usage-meter"})]
    assert [p["name"] for _, _, p in _audited("periodictask.delete")] == ["usage-meter"]


@pytest.mark.django_db
def test_a_beat_schedule_a_task_runs_on_is_not_deleted_and_a_change_to_one_is_audited(
    staff_client,
):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    hourly = IntervalSchedule.objects.create(every=1, period="hours")
    PeriodicTask.objects.create(name="usage-meter", task="x.y", interval=hourly)
    spare = IntervalSchedule.objects.create(every=5, period="minutes")

    refused = staff_client.post(_url(IntervalSchedule, "delete", hourly.pk), {"post": "yes"})
    in_bulk = staff_client.post(
        _url(IntervalSchedule, "changelist"),
        {"action": "delete_selected", "_selected_action": [hourly.pk, spare.pk], "post": "yes"},
    )
    staff_client.post(
        _url(IntervalSchedule, "change", hourly.pk),
        {"every": 2, "period": "hours", "periodictask_set-TOTAL_FORMS": 1,
         "periodictask_set-INITIAL_FORMS": 1, "periodictask_set-0-id":
         PeriodicTask.objects.get().pk, "periodictask_set-0-interval": hourly.pk},
    )  # fmt: skip
    staff_client.post(_url(IntervalSchedule, "delete", spare.pk), {"post": "yes"})

    said = "Task usage-meter runs on it: delete the task, or give it another schedule, first."
    assert said in refused.content.decode() and said in in_bulk.content.decode()
    assert PeriodicTask.objects.get().interval == hourly
    assert not IntervalSchedule.objects.filter(pk=spare.pk).exists()
    assert [p["changed"] for _, _, p in _audited("intervalschedule.update")] == [["every"]]
    assert [p["schedule"] for _, _, p in _audited("intervalschedule.delete")] == ["every 5 minutes"]


@pytest.mark.django_db
@pytest.mark.parametrize("typed", ["DEMO@Example.com", "demo@\uff45xample.com"])
def test_staff_cannot_add_a_second_account_for_an_address_in_another_case_or_form(
    staff_client, make_user, typed
):
    from accounts.models import User

    make_user("demo@example.com")

    page = staff_client.post(
        reverse("admin:accounts_user_add"),
        {"email": typed, "password1": "a-New-pass-123", "password2": "a-New-pass-123",
         "usable_password": "true"},
    )  # fmt: skip

    assert page.status_code == 200
    assert "Another account signs in with this address or confirmed it." in page.content.decode()
    assert sorted(User.objects.values_list("email", flat=True)) == [
        "demo@example.com",
        "staff@example.com",
    ]


@pytest.mark.django_db
def test_a_new_account_staff_add_is_stored_as_the_sign_up_stores_it(staff_client):
    from accounts.models import User

    staff_client.post(
        reverse("admin:accounts_user_add"),
        {"email": "Kim@Example.COM", "password1": "a-New-pass-123",
         "password2": "a-New-pass-123", "usable_password": "true"},
    )  # fmt: skip

    assert User.objects.filter(email="kim@example.com").exists()


@pytest.mark.django_db
def test_an_accounts_address_is_not_changed_in_the_admin_nor_stored_twice_in_any_case(
    staff_client, make_user
):
    from django.db import IntegrityError, transaction

    from accounts.models import User

    kim = make_user("kim@example.com")
    make_user("lee@example.com")

    staff_client.post(_url(User, "change", kim.pk), {"email": "LEE@example.com", "is_active": "on"})
    with pytest.raises(IntegrityError), transaction.atomic():
        User.objects.filter(pk=kim.pk).update(email="LEE@example.com")

    kim.refresh_from_db()
    assert kim.email == "kim@example.com"


@pytest.mark.django_db
def test_an_organizations_page_makes_as_many_queries_for_many_members_as_for_one(
    staff_client, tenant, make_user
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts.models import Tenant

    url = _url(Tenant, "change", tenant.pk)
    staff_client.get(url)
    with CaptureQueriesContext(connection) as one:
        staff_client.get(url)
    for n in range(20):
        Membership.objects.create(tenant=tenant, user=make_user(f"m{n}@x.example"), role="member")
    with CaptureQueriesContext(connection) as many:
        page = staff_client.get(url).content.decode()

    assert len(many.captured_queries) == len(one.captured_queries)
    assert "m19@x.example" in page


@pytest.mark.django_db
def test_staff_see_peoples_email_addresses_but_cannot_change_them(staff_client, owner):
    from allauth.account.models import EmailAddress

    address = EmailAddress.objects.get(user=owner)
    url = _url(EmailAddress, "change", address.pk)

    shown = staff_client.get(url)
    changed = staff_client.post(url, {"user": owner.pk, "email": "changed@example.com",
                                      "verified": "on", "primary": "on"})  # fmt: skip

    assert shown.status_code == 200 and "owner@example.com" in shown.content.decode()
    assert changed.status_code == 403
    assert EmailAddress.objects.get(pk=address.pk).email == "owner@example.com"
    assert staff_client.get(_url(EmailAddress, "add")).status_code == 403


@pytest.mark.django_db
def test_staff_can_delete_an_account_that_belongs_to_no_organization(
    staff_client, tenant, add_member
):
    """Asked to delete an account (a person may delete their own, `test_account_delete`),
    staff could not: the admin refused to delete any account with an email address ("your account
    doesn't have permission to delete ... email address"), even one in no organization, so an
    address, name and sign-in history were kept for ever. Its addresses and second factors go
    with it; the audit log still names it."""
    from allauth.account.models import EmailAddress
    from allauth.mfa.models import Authenticator

    from accounts.models import User

    leaver = add_member("leaver@example.com", "member")
    Authenticator.objects.create(user=leaver, type=Authenticator.Type.TOTP, data={})
    services.membership_leave(actor=Actor(user=leaver), tenant=tenant)
    url = _url(User, "delete", leaver.pk)

    asked = staff_client.get(url).content.decode()
    response = staff_client.post(url, {"post": "yes"})

    assert "leaver@example.com" in asked and "permission" not in asked
    assert response.status_code == 302, response.status_code
    assert not User.objects.filter(pk=leaver.pk).exists()
    assert not EmailAddress.objects.filter(email="leaver@example.com").exists()
    assert not Authenticator.objects.exists()
    assert AuditEvent.objects.get(action="user.delete").payload["email"] == "leaver@example.com"
    left = AuditEvent.objects.get(action="member.leave")
    assert (left.actor, left.actor_email) == (None, "leaver@example.com")


@pytest.mark.django_db
def test_an_account_still_in_an_organization_is_not_deleted_from_the_admin(
    staff_client, owner, tenant
):
    """Deleting it would take its memberships with it, past the rule that keeps an owner who
    can sign in: the page names them, and the account leaves or is removed first."""
    from accounts.models import User

    url = _url(User, "delete", owner.pk)

    asked = staff_client.post(url, {"post": "yes"})

    assert asked.status_code == 200
    page = asked.content.decode()
    assert "would require deleting the following protected related objects" in page
    assert "owner@example.com in Acme (owner)" in page
    assert User.objects.filter(pk=owner.pk).exists()


@pytest.mark.django_db
def test_staff_who_may_delete_users_cannot_delete_staff_who_may_do_more(client, make_user):
    """As changing one (`test_staff_who_may_change_users_cannot_take_over_staff_who_may_do_
    more`): only a superuser deletes another staff account."""
    from django.contrib.auth.models import Permission

    from accounts.models import User

    clerk = make_user("clerk@example.com", is_staff=True)
    clerk.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_user", "delete_user"])
    )
    client.force_login(clerk)
    leaver = make_user("leaver@example.com")
    boss = make_user("boss@example.com", is_staff=True, is_superuser=True)

    kept = client.post(_url(User, "delete", boss.pk), {"post": "yes"})
    both = client.post(
        _url(User, "changelist"),
        {"action": "delete_selected", ACTION_CHECKBOX_NAME: [leaver.pk, boss.pk], "post": "yes"},
    )
    left = client.post(_url(User, "delete", leaver.pk), {"post": "yes"})

    assert kept.status_code == 403 and both.status_code == 403
    assert User.objects.filter(pk=boss.pk).exists()
    assert left.status_code == 302 and not User.objects.filter(pk=leaver.pk).exists()


@pytest.mark.django_db
def test_staff_removing_a_persons_second_factor_is_recorded_as_theirs_is(staff_client, owner):
    from allauth.mfa.models import Authenticator

    from accounts.models import AuditEvent

    totp = Authenticator.objects.create(user=owner, type=Authenticator.Type.TOTP, data={})

    response = staff_client.post(_url(Authenticator, "delete", totp.pk), {"post": "yes"})

    assert response.status_code == 302 and not Authenticator.objects.exists()
    event = AuditEvent.objects.get(action="mfa.remove")
    assert (event.actor_kind, event.target_id, event.payload) == (
        "staff", str(owner.pk), {"type": "totp"},
    )  # fmt: skip


@pytest.mark.django_db
def test_staff_removing_a_persons_last_second_factor_removes_their_recovery_codes_too(
    staff_client, owner
):
    """As the person's own removal does: codes that may have leaked with the lost device must
    not keep working beside the next one."""
    from allauth.mfa.models import Authenticator

    from accounts.models import AuditEvent

    totp = Authenticator.objects.create(user=owner, type=Authenticator.Type.TOTP, data={})
    Authenticator.objects.create(user=owner, type=Authenticator.Type.RECOVERY_CODES, data={})

    staff_client.post(_url(Authenticator, "delete", totp.pk), {"post": "yes"})

    assert not Authenticator.objects.filter(user=owner).exists()
    removed = AuditEvent.objects.filter(action="mfa.remove").order_by("pk")
    assert [e.payload["type"] for e in removed] == ["totp", "recovery_codes"]


@pytest.mark.django_db
def test_a_beat_task_is_saved_only_with_arguments_celery_can_call_it_with(staff_client):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=1, period="hours")
    task = PeriodicTask.objects.create(name="usage-meter", task="x.y", interval=every)
    form = {"name": "usage-meter", "task": "x.y", "interval": every.pk, "enabled": "on",
            "args": "[]", "kwargs": "{}", "expire_seconds": "", "priority": "",
            "headers": "{}", "description": ""}  # fmt: skip

    def save(**changes):
        return staff_client.post(_url(PeriodicTask, "change", task.pk), {**form, **changes})

    as_list = save(kwargs="[1, 2]")
    as_object = save(args='{"a": 1}')
    shaped = save(args='[1, "a"]', kwargs='{"hours": 2}')

    assert "Write them as a JSON object" in as_list.content.decode()
    assert "Write them as a JSON list" in as_object.content.decode()
    assert shaped.status_code == 302
    task.refresh_from_db()
    assert (task.args, task.kwargs) == ('[1, "a"]', '{"hours": 2}')


@pytest.mark.django_db
def test_running_a_beat_task_while_the_broker_is_down_says_so(staff_client, broker):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = IntervalSchedule.objects.create(every=1, period="hours")
    task = PeriodicTask.objects.create(
        name="sweep", task="deployments.tasks.operations_sweep", interval=every
    )
    broker.down()

    response = staff_client.post(
        _url(PeriodicTask, "changelist"),
        {"action": "run_tasks", "_selected_action": [task.pk]},
        follow=True,
    )

    assert response.status_code == 200
    assert "The broker could not be reached, so nothing was run" in response.content.decode()
    assert not _audited("periodictask.run")


def _year_filters(model_admin) -> list[str]:
    """Filters on a year the calendar's dates cannot bound, on each date the list has."""
    dates = [
        f.name for f in model_admin.model._meta.get_fields()
        if getattr(f, "get_internal_type", lambda: "")() in {"DateTimeField", "DateField"}
    ]  # fmt: skip
    queries = [f"{name}__year=10000" for name in dates] + [f"{name}__year=0" for name in dates]
    if model_admin.date_hierarchy:  # its drill-down reads up to the next year's start
        hierarchy = model_admin.date_hierarchy
        queries += [f"{hierarchy}__year=9999", f"{hierarchy}__year=9999&{hierarchy}__month=12"]
    return queries


@pytest.mark.django_db
def test_a_year_filter_out_of_the_calendar_sends_every_list_back_unfiltered(
    staff_client, one_of_everything
):
    asked = 0
    for model, model_admin in admin.site._registry.items():
        url = _url(model, "changelist")
        for query in _year_filters(model_admin):
            response = staff_client.get(f"{url}?{query}")
            assert response.status_code == 302, (url, query)
            assert response["Location"] == f"{url}?e=1", (url, query)
            asked += 1
        assert staff_client.get(f"{url}?e=1").status_code == 200, url
    assert asked > 40  # every list with a date was asked
    # A year within it filters as before.
    events = _url(AuditEvent, "changelist")
    assert staff_client.get(f"{events}?created_at__year=2026").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("selected", ["abc", "\x00", "1.5"])
def test_an_action_posted_with_an_id_of_no_item_changes_nothing_and_says_so(staff_client, selected):
    from django.contrib.auth.models import Group

    kept = Group.objects.create(name="operators")
    url = _url(Group, "changelist")

    response = staff_client.post(
        url, {"action": "delete_selected", ACTION_CHECKBOX_NAME: [str(kept.pk), selected]},
        follow=True,
    )  # fmt: skip

    assert response.status_code == 200
    assert "The selection names no item of this list, so nothing was changed." in (
        response.content.decode()
    )
    assert Group.objects.filter(pk=kept.pk).exists()
    # The same action on ids of the list asks to confirm, as Django's does.
    confirm = staff_client.post(
        url, {"action": "delete_selected", ACTION_CHECKBOX_NAME: [str(kept.pk)]}
    )
    assert confirm.status_code == 200
    assert "Are you sure you want to delete the selected group?" in confirm.content.decode()


@pytest.mark.django_db
def test_staff_who_may_only_view_platform_secrets_open_one_without_its_value(client, make_user):
    from django.contrib.auth.models import Permission

    from deployments.models import PlatformSecret

    viewer = make_user("viewer@example.com", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_platformsecret"))
    client.force_login(viewer)
    secret = PlatformSecret.objects.create(name="TOKEN", value="s3cret-value")

    listed = client.get("/admin/deployments/platformsecret/")
    page = client.get(f"/admin/deployments/platformsecret/{secret.pk}/change/")

    assert listed.status_code == 200 and "TOKEN" in listed.content.decode()
    assert page.status_code == 200 and "TOKEN" in page.content.decode()
    assert "s3cret-value" not in page.content.decode()


@pytest.fixture
def user_clerk(client, make_user):
    """Staff, not a superuser, who may view and change users and groups."""
    from django.contrib.auth.models import Permission

    clerk = make_user("clerk@example.com", is_staff=True)
    clerk.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_user", "change_user", "view_group", "change_group"]
        )
    )
    client.force_login(clerk)
    return clerk


@pytest.mark.django_db
def test_staff_who_may_change_users_cannot_grant_themselves_more(client, user_clerk, owner):
    """Django lets whoever changes users set what they may do: a clerk ticked "superuser" on
    their own account, or gave a group they are in every permission."""
    from django.contrib.auth.models import Group, Permission

    team = Group.objects.create(name="Clerks")
    user_clerk.groups.add(team)
    own = f"/admin/accounts/user/{user_clerk.pk}/change/"
    form = {"first_name": "Clerk", "last_name": "", "is_active": "on", "is_staff": "on",
            "is_superuser": "on", "user_permissions": [p.pk for p in Permission.objects.all()],
            "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00"}  # fmt: skip

    saved = client.post(own, form)
    client.post(
        f"/admin/auth/group/{team.pk}/change/",
        {"name": "Clerks", "permissions": [p.pk for p in Permission.objects.all()]},
    )

    assert saved.status_code == 302  # their name is theirs to change
    user_clerk.refresh_from_db()
    assert (user_clerk.first_name, user_clerk.is_superuser) == ("Clerk", False)
    assert user_clerk.user_permissions.count() == 4
    assert not team.permissions.exists()
    assert not user_clerk.has_perm("accounts.delete_user")


@pytest.mark.django_db
def test_staff_who_may_rename_groups_cannot_make_their_own_group_the_billing_team(
    client, user_clerk
):
    """The billing team is the group of that name: a clerk renamed it away, then their own
    group to it, and reached every organization's invoices."""
    from django.contrib.auth.models import Group

    team = Group.objects.get_or_create(name="Billing team")[0]
    own = Group.objects.create(name="Clerks")
    user_clerk.groups.add(own)
    assert client.get("/billing-team/").status_code == 404

    client.post(f"/admin/auth/group/{team.pk}/change/", {"name": "Former billing team"})
    client.post(f"/admin/auth/group/{own.pk}/change/", {"name": "Billing team"})

    assert set(Group.objects.values_list("name", flat=True)) == {"Billing team", "Clerks"}
    assert Group.objects.get(name="Billing team") == team
    assert client.get("/billing-team/").status_code == 404


@pytest.mark.django_db
def test_staff_who_may_change_users_cannot_change_a_superuser(client, user_clerk, make_user):
    """A superuser's password set by a clerk would let the clerk in as them."""
    root = make_user("root@example.com", is_staff=True, is_superuser=True)

    page = client.get(f"/admin/accounts/user/{root.pk}/change/")
    password = client.post(
        f"/admin/accounts/user/{root.pk}/password/",
        {"password1": "an0ther-Secret!", "password2": "an0ther-Secret!"},
    )

    assert page.status_code == 200 and 'name="first_name"' not in page.content.decode()
    assert password.status_code == 403
    root.refresh_from_db()
    assert not root.check_password("an0ther-Secret!")


@pytest.mark.django_db
def test_a_platform_secret_renamed_or_given_a_new_value_is_audited_with_what_changed(
    staff_client,
):
    """The audit log named a renamed secret by its new name alone, and did not say whether its
    value changed: which secret was which, and when a value was rotated, was lost."""
    from deployments.models import PlatformSecret

    secret = PlatformSecret.objects.create(name="TOKEN", value="s3cret", description="")
    page = f"/admin/deployments/platformsecret/{secret.pk}/change/"

    staff_client.post(page, {"name": "API_TOKEN", "value": "", "description": ""})
    staff_client.post(page, {"name": "API_TOKEN", "value": "n3w-s3cret", "description": ""})

    payloads = [e.payload for e in AuditEvent.objects.filter(action="secret.update").order_by("pk")]
    assert payloads == [
        {"name": "API_TOKEN", "from": "TOKEN", "changed": ["name"]},
        {"name": "API_TOKEN", "changed": ["value"]},
    ]
    secret.refresh_from_db()
    assert secret.value == "n3w-s3cret"


@pytest.mark.django_db
def test_staff_who_may_change_users_cannot_take_over_staff_who_may_do_more(
    client, user_clerk, make_user
):
    """The clerk set the password of another staff member, one allowed what the clerk is not,
    and could sign in as them; nor do they remove that member's second factor, one at a time
    or chosen on the list."""
    from allauth.mfa.models import Authenticator
    from django.contrib.auth.models import Permission

    operator = make_user("operator@example.com", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename="delete_user"))
    user_clerk.user_permissions.add(*Permission.objects.filter(codename="delete_authenticator"))
    totp = Authenticator.objects.create(user=operator, type=Authenticator.Type.TOTP, data={})
    customer = make_user("customer@example.com")
    theirs = Authenticator.objects.create(user=customer, type=Authenticator.Type.TOTP, data={})

    password = client.post(
        f"/admin/accounts/user/{operator.pk}/password/",
        {"password1": "an0ther-Secret!", "password2": "an0ther-Secret!"},
    )
    one = client.post(_url(Authenticator, "delete", totp.pk), {"post": "yes"})
    listed = client.post(
        _url(Authenticator, "changelist"),
        {"action": "delete_selected", "post": "yes", ACTION_CHECKBOX_NAME: [totp.pk, theirs.pk]},
        follow=True,
    )

    assert password.status_code == 403 and one.status_code == 403
    operator.refresh_from_db()
    assert not operator.check_password("an0ther-Secret!")
    assert listed.status_code == 403  # chosen on the list among others: refused whole
    assert sorted(Authenticator.objects.values_list("pk", flat=True)) == [totp.pk, theirs.pk]


@pytest.mark.django_db
def test_staff_closing_an_account_withdraw_the_invitations_it_had_sent(
    staff_client, tenant, add_member
):
    """A closed account (a leaver's, a compromised one) kept its invitations working: whoever
    it had invited could still join its organizations."""
    from accounts.models import Invitation

    admin_user = add_member("admin@example.com", "admin")
    sent = services.invitation_create(
        actor=Actor(user=admin_user), tenant=tenant, email="friend@example.com", role="member"
    )

    closed = staff_client.post(
        _url(type(admin_user), "change", admin_user.pk), {"email": admin_user.email}, follow=True
    )

    admin_user.refresh_from_db()
    assert not admin_user.is_active
    assert Invitation.objects.get(pk=sent.pk).status == "revoked"
    assert "friend@example.com" in closed.content.decode()
    event = AuditEvent.objects.get(action="invitation.revoke")
    assert event.payload["reason"] == "its sender's account was closed"


@pytest.mark.django_db
def test_staff_closing_the_only_owner_of_an_organization_are_told_it_has_no_owner_left(
    staff_client, owner, tenant, add_member, make_user
):
    """Staff close an account (a leaver's, a compromised one) that is the only owner of Acme,
    where an admin remains. The admin said nothing: Acme now has no owner who can sign in, so
    no one can make an owner, cancel its subscription or delete it, until staff happen to
    notice. Organizations where another owner can still sign in, or deleted ones, are not
    named."""
    add_member("ann@example.com", "admin")
    shared = services.tenant_create(actor=Actor(user=owner), name="Shared")
    Membership.objects.create(tenant=shared, user=make_user("co@example.com"), role="owner")
    gone = services.tenant_create(actor=Actor(user=owner), name="Gone")
    services.tenant_delete(actor=Actor(user=owner), tenant=gone, confirm_name="Gone")
    solo = services.tenant_create(actor=Actor(user=owner), name="Solo")

    closed = staff_client.post(
        _url(type(owner), "change", owner.pk), {"email": owner.email}, follow=True
    ).content.decode()

    owner.refresh_from_db()
    assert not owner.is_active
    assert (
        f"Left with no owner who can sign in: {tenant.name}, {solo.name} (owner@example.com was "
        "the only one). Make one of their members owner from the Memberships list, or make "
        "this account active again."
    ) in closed
    assert "Shared" not in closed and "Gone" not in closed


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["remove_memberships", "make_viewer"])
def test_staff_removing_or_demoting_a_member_are_told_which_invitations_went_with_them(
    staff_client, tenant, add_member, action
):
    """The portal's team page names the invitations a removal withdraws; the admin's actions
    withdrew them without a word."""
    admin_user = add_member("admin@example.com", "admin")
    services.invitation_create(
        actor=Actor(user=admin_user), tenant=tenant, email="friend@example.com", role="member"
    )

    done = staff_client.post(
        _url(Membership, "changelist"),
        {"action": action, "_selected_action": [Membership.objects.get(user=admin_user).pk]},
        follow=True,
    ).content.decode()

    assert f"The invitations admin@example.com had sent to {tenant.name} were withdrawn: " in done
    assert "friend@example.com." in done


@pytest.mark.django_db
def test_an_organization_a_cell_is_offered_to_or_withdrawn_from_reads_it_in_its_audit_log(
    staff_client, client, owner, tenant
):
    """The change was recorded with no organization: the organization's own audit log never
    said where it may now create deployments, or no longer may."""
    from tests.deployments import factories

    cell = factories.cell("private-eu")
    type(cell).objects.filter(pk=cell.pk).update(public=False)  # offered to no one
    page = _url(type(cell), "change", cell.pk)

    staff_client.post(page, {"tenants": [tenant.pk]})
    staff_client.post(page, {"tenants": []})

    events = AuditEvent.objects.filter(tenant=tenant, action__startswith="cell.").order_by("pk")
    assert [(e.action, e.payload) for e in events] == [
        ("cell.offer", {"cell": "private-eu"}),
        ("cell.withdraw", {"cell": "private-eu"}),
    ]
    client.force_login(owner)
    log = client.get(f"/t/{tenant.slug}/audit/").content.decode()
    assert "cell.offer" in log and "cell.withdraw" in log


@pytest.mark.django_db
def test_a_public_cell_made_private_is_withdrawn_only_from_those_it_no_longer_serves(
    staff_client, owner, tenant
):
    """Only the list of organizations was compared: Acme, which lost the cell, read nothing of
    it, and Globex read it was offered the cell it could always use."""
    from deployments.models import Cell
    from tests.deployments import factories

    cell = factories.cell("eu-1")  # public: every organization may create there
    globex = services.tenant_create(actor=Actor(user=owner), name="Globex")

    staff_client.post(_url(Cell, "change", cell.pk), {"tenants": [globex.pk]})  # not public

    assert list(Cell.objects.offered_to(tenant)) == []
    logs = {
        organization.name: list(
            AuditEvent.objects.filter(tenant=organization, action__startswith="cell.")
            .order_by("pk")
            .values_list("action", flat=True)
        )
        for organization in (tenant, globex)
    }
    assert logs == {tenant.name: ["cell.withdraw"], "Globex": []}


@pytest.mark.django_db
def test_a_private_cell_made_public_is_offered_to_those_it_did_not_serve(
    staff_client, owner, tenant
):
    from deployments.models import Cell
    from tests.deployments import factories

    cell = factories.cell("eu-1")
    globex = services.tenant_create(actor=Actor(user=owner), name="Globex")
    Cell.objects.filter(pk=cell.pk).update(public=False)
    cell.tenants.add(globex)

    staff_client.post(_url(Cell, "change", cell.pk), {"public": "on", "tenants": [globex.pk]})

    offered = AuditEvent.objects.filter(action="cell.offer").values_list("tenant", flat=True)
    assert list(offered) == [tenant.pk]


@pytest.mark.django_db(transaction=True)
def test_a_cell_staff_offer_keeps_what_add_cell_wrote_while_the_page_was_saved(staff_client):
    """add_cell rotated the cell's credentials and changed its settings after the page's
    request read the cell, before it saved it: the save put back the old ones."""
    from django.db.models.signals import pre_save

    from deployments.models import Cell
    from tests.deployments import factories

    cell = factories.cell("eu-1")

    def add_cell_meanwhile(sender, instance, **kwargs) -> None:
        def register() -> None:
            try:
                Cell.objects.filter(pk=cell.pk).update(
                    kubeconfig="rotated", region="eu-west-2", settings_generation=1
                )
            finally:
                connection.close()

        thread = threading.Thread(target=register)  # committed on a connection of its own
        thread.start()
        thread.join(30)

    pre_save.connect(add_cell_meanwhile, sender=Cell)
    try:
        saved = staff_client.post(_url(Cell, "change", cell.pk), {"tenants": []})  # private
    finally:
        pre_save.disconnect(add_cell_meanwhile, sender=Cell)

    assert saved.status_code == 302
    cell.refresh_from_db()
    assert (cell.public, cell.kubeconfig, cell.region) == (False, "rotated", "eu-west-2")
    assert cell.guard_rails_behind


def _stored_by_an_older_opsdeck():
    """A plan version stored by an Opsdeck that matched `regex` with Python's `re`: this one
    no longer loads it (RE2 has no lookahead; `deployments.W001` warns of it)."""
    from deployments.models import PlanVersion
    from tests.deployments.factories import SPEC, postgres_version

    version = postgres_version()
    text = SPEC.read_text()
    old = text.replace('regex: "^[a-z][a-z0-9_]*$"', 'regex: "^(?!postgres$)[a-z][a-z0-9_]*$"', 1)
    assert old != text
    return PlanVersion.objects.create(plan=version.plan, number=version.number + 1, spec_text=old)


@pytest.mark.django_db
def test_the_operations_list_opens_while_a_stored_plan_version_no_longer_loads(
    staff_client, tenant
):
    """A 500 for every staff member, the very list the check's hint sends them to."""
    from tests.deployments.factories import cell, make_instances, make_operation

    old = _stored_by_an_older_opsdeck()
    [instance] = make_instances(tenant, old, cell("eu-1"), 1)
    make_operation(instance, verb="vacuumAll")  # a verb of its own spec

    page = staff_client.get("/admin/deployments/operation/")

    assert page.status_code == 200
    verbs = page.content.decode()
    assert "?verb=vacuumAll" in verbs and "?verb=restart" in verbs  # filters, as before


@pytest.mark.django_db
def test_an_override_of_a_plan_whose_newest_version_no_longer_loads_is_saved(staff_client, tenant):
    from billing.models import PlanOverride

    old = _stored_by_an_older_opsdeck()

    saved = staff_client.post(
        "/admin/billing/planoverride/add/",
        {
            "tenant": tenant.pk, "plan": old.plan.pk,
            "effective_from_0": "2099-01-01", "effective_from_1": "00:00:00",
            "limits": '{"max_instances": 20}', "prices": "{}", "note": "",
        },
    )  # fmt: skip

    assert saved.status_code == 302
    assert PlanOverride.objects.get().limits == {"max_instances": 20}


@pytest.mark.django_db
def test_staff_read_in_the_cells_list_and_on_its_page_whose_guard_rails_are_behind(staff_client):
    """A cell whose settings changed since add_cell last applied its guard rails everywhere."""
    from deployments.models import Cell
    from tests.deployments import factories

    behind, current = factories.cell("eu-1"), factories.cell("eu-2")
    Cell.objects.filter(pk=behind.pk).update(settings_generation=2, guard_rails_generation=1)

    listing = staff_client.get(_url(Cell, "changelist")).content.decode()

    rows = re.findall(r"<tr>.*?</tr>", listing, re.S)
    current_of = {
        name: re.search(r'class="field-guard_rails_current"><img [^>]*alt="(\w+)"', row)[1]
        for row in rows[1:]
        for name in re.findall(r">(eu-\d)</a>", row)
    }
    assert current_of == {"eu-1": "False", "eu-2": "True"}
    page = staff_client.get(_url(Cell, "change", behind.pk)).content.decode()
    assert "Not all applied again since the cell&#x27;s settings last changed" in page
    assert "The cell watcher applies them again within minutes" in page
    page = staff_client.get(_url(Cell, "change", current.pk)).content.decode()
    assert "Applied in every instance&#x27;s namespace" in page
    assert "Guard rails pass until" not in page  # said in words, not as a time

    soon = timezone.now() + timedelta(minutes=5)
    Cell.objects.filter(pk=behind.pk).update(guard_rails_pass_until=soon)  # a pass holds it
    page = staff_client.get(_url(Cell, "change", behind.pk)).content.decode()
    assert "A run is applying them now." in page
    assert "The cell watcher applies them again" not in page
