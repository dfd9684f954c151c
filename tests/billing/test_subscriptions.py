"""Subscriptions: subscribing, the transitions staff and the system make, each audited and
mailed to the tenant's owners and billing members; overrides never reach a closed period."""

import importlib
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone

from accounts.audit import SYSTEM, Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Membership, Tenant
from billing import periods, services
from billing.models import Plan, PlanOverride, Price, Subscription
from tests.concurrency import race
from tests.conftest import mail_forget
from tests.deployments import factories

pytestmark = pytest.mark.unsubscribed


@pytest.fixture(autouse=True)
def _mail_now(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the mail is sent in-process, after commit


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))
    return plan


@pytest.fixture
def gated(db):
    return Plan.objects.create(
        key="business", name="Business", service="postgresql", limits={"auto_approve": False}
    )


@pytest.fixture
def staff(make_user):
    return Actor(user=make_user("staff@opsdeck.example", is_staff=True), staff=True)


@pytest.fixture
def billing_member(add_member):
    return add_member("billing@example.com", "billing")


def _events(tenant, action):
    return AuditEvent.objects.filter(tenant=tenant, action=action)


def test_subscribing_to_an_auto_approved_plan_is_active_at_once(
    tenant, owner, plan, billing_member, add_member, django_capture_on_commit_callbacks
):
    add_member("member@example.com", "member")
    with django_capture_on_commit_callbacks(execute=True):
        subscription = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)

    assert subscription.status == "active"
    assert subscription.requested_by == owner
    assert subscription.current_period_start == periods.current_start()
    assert _events(tenant, "subscription.create").get().payload == {
        "plan": "hobby",
        "status": "active",
    }
    (message,) = mail.outbox
    assert sorted(message.to) == ["billing@example.com", "owner@example.com"]  # no members
    assert message.subject == "[Opsdeck] Your subscription to Hobby is active"
    assert f"/t/{tenant.slug}/billing/" in message.body


def test_a_plan_that_does_not_auto_approve_waits_for_staff(
    tenant, owner, gated, staff, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        pending = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=gated)
        approved = services.subscription_approve(actor=staff, subscription=pending)

    assert pending.status == "pending"
    assert approved.status == "active"
    event = _events(tenant, "subscription.approve").get()
    assert (event.actor_kind, event.payload["from"], event.payload["to"]) == (
        "staff",
        "pending",
        "active",
    )
    assert [m.subject for m in mail.outbox] == [
        "[Opsdeck] Your subscription to Business awaits approval",
        "[Opsdeck] Your subscription to Business is approved",
    ]


def test_a_tenant_cannot_approve_or_reactivate_its_own_subscription(tenant, owner, gated):
    pending = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=gated)

    with pytest.raises(ActionDenied, match="Only the platform team"):
        services.subscription_approve(actor=Actor(user=owner), subscription=pending)

    assert Subscription.objects.get().status == "pending"
    assert _events(tenant, "subscription.approve").get().result == "denied"


def test_members_and_viewers_cannot_subscribe(tenant, plan, add_member):
    member = add_member("member@example.com", "member")

    with pytest.raises(ActionDenied, match="does not allow managing billing"):
        services.subscribe(actor=Actor(user=member), tenant=tenant, plan=plan)

    assert not Subscription.objects.exists()
    assert _events(tenant, "subscription.create").get().result == "denied"


def test_subscribing_again_returns_the_open_subscription(tenant, owner, plan):
    first = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    again = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)

    assert again.pk == first.pk


@pytest.mark.django_db(transaction=True)
def test_a_double_submitted_subscribe_makes_one_subscription(tenant, owner, plan):
    results = race(
        lambda: services.subscribe(
            actor=Actor(user=owner), tenant=tenant, plan=plan, request_id="sub-1"
        )
    )

    assert all(isinstance(r, Subscription) for r in results), results
    assert Subscription.objects.count() == 1
    assert _events(tenant, "subscription.create").count() == 1


def test_the_lifecycle_past_due_suspended_reactivated_cancelled(
    tenant, owner, plan, staff, django_capture_on_commit_callbacks
):
    subscription = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    mail_forget()
    with django_capture_on_commit_callbacks(execute=True):
        services.subscription_mark_past_due(actor=SYSTEM, subscription=subscription)
        services.subscription_suspend(actor=staff, subscription=subscription, reason="fraud")
        services.subscription_reactivate(actor=staff, subscription=subscription)
        services.subscription_cancel(actor=Actor(user=owner), subscription=subscription)

    subscription.refresh_from_db()
    assert subscription.status == "cancelled"
    assert subscription.cancelled_at is not None
    assert subscription.suspended_at is None
    actions = list(
        AuditEvent.objects.filter(tenant=tenant, action__startswith="subscription.")
        .order_by("pk")
        .values_list("action", "actor_kind")
    )
    assert actions == [
        ("subscription.create", "user"),
        ("subscription.mark_past_due", "system"),
        ("subscription.suspend", "staff"),
        ("subscription.reactivate", "staff"),
        ("subscription.cancel", "user"),
    ]
    assert [m.subject.split(" is ")[-1] for m in mail.outbox] == [
        "past due",
        "suspended",
        "active again",
        "cancelled",
    ]
    # A cancelled subscription leaves room for a new one.
    assert services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan).pk != (
        subscription.pk
    )


def test_a_transition_its_status_does_not_allow_is_refused_and_audited(tenant, owner, plan, staff):
    subscription = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)

    with pytest.raises(ActionDenied) as refused:
        services.subscription_reactivate(actor=staff, subscription=subscription)

    assert refused.value.reason == "A subscription that is active cannot be reactivated."
    assert _events(tenant, "subscription.reactivate").get().result == "denied"


def test_cancelling_is_refused_while_instances_run(tenant, owner):
    version = factories.postgres_version()
    subscription = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=version.plan)
    made = factories.make_instances(tenant, version, factories.cell(), 2)

    with pytest.raises(ActionDenied) as refused:
        services.subscription_cancel(actor=Actor(user=owner), subscription=subscription)

    assert refused.value.reason == (
        "2 instances still run on the PostgreSQL plan; delete them before cancelling."
    )
    made[0].delete()
    with pytest.raises(
        ActionDenied, match=r"^1 instance still runs on the PostgreSQL plan; delete it before"
    ):
        services.subscription_cancel(actor=Actor(user=owner), subscription=subscription)
    assert Subscription.objects.get().status == "active"


def test_only_staff_lift_a_suspension_staff_made(tenant, owner, gated, make_user):
    subscription = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=gated)
    staff = Actor(user=make_user("staff@example.com", is_staff=True), staff=True)
    services.subscription_approve(actor=staff, subscription=subscription)
    services.subscription_suspend(actor=staff, subscription=subscription, reason="abuse")

    with pytest.raises(ActionDenied, match="only they can reactivate it"):
        services.subscription_reactivate(actor=SYSTEM, subscription=subscription)  # Stripe: paid

    subscription.refresh_from_db()
    assert subscription.status == "suspended"
    services.subscription_reactivate(actor=staff, subscription=subscription)
    subscription.refresh_from_db()
    assert subscription.status == "active" and not subscription.suspended_by_staff


def test_cancelling_a_suspension_staff_made_does_not_lift_it(tenant, owner, plan, staff):
    held = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    services.subscription_suspend(actor=staff, subscription=held, reason="abuse")
    services.subscription_cancel(actor=Actor(user=owner), subscription=held)

    with pytest.raises(ActionDenied, match="The platform team suspended your Hobby subscription"):
        services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)

    assert list(Subscription.objects.values_list("status", flat=True)) == ["cancelled"]
    assert _events(tenant, "subscription.create").filter(result="denied").exists()
    assert Subscription.objects.get().status_text() == "Cancelled while suspended by staff"
    with pytest.raises(ActionDenied, match="Only the platform team"):
        services.subscription_hold_lift(actor=Actor(user=owner), subscription=held)
    services.subscription_hold_lift(actor=staff, subscription=held)
    again = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    assert again.status == "active"
    assert (
        _events(tenant, "subscription.hold_lift").exclude(result="denied").get().actor == staff.user
    )


def test_suspensions_staff_made_before_the_flag_existed_are_held_as_theirs(
    tenant, owner, gated, make_user
):
    from django.apps import apps

    migration = importlib.import_module(
        "billing.migrations.0012_subscription_suspended_by_staff_fill"
    )
    staff = Actor(user=make_user("staff@example.com", is_staff=True), staff=True)
    held = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=gated)
    services.subscription_approve(actor=staff, subscription=held)
    services.subscription_suspend(actor=staff, subscription=held)
    overdue = Subscription.objects.create(
        tenant=tenant, plan=Plan.objects.create(key="o", name="O", service="pg"), status="active"
    )
    services.subscription_suspend(actor=SYSTEM, subscription=overdue, reason="past due")
    Subscription.objects.update(suspended_by_staff=False)  # as they were before the flag

    migration.fill(apps, None)

    assert Subscription.objects.get(pk=held.pk).suspended_by_staff
    assert not Subscription.objects.get(pk=overdue.pk).suspended_by_staff


def test_the_sweep_suspends_past_due_subscriptions_beyond_their_grace(
    tenant, owner, plan, django_capture_on_commit_callbacks
):
    late = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    services.subscription_mark_past_due(
        actor=SYSTEM, subscription=late, since=timezone.now() - timedelta(days=8)
    )
    other = Plan.objects.create(key="pro", name="Pro", service="postgresql")
    recent = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=other)
    services.subscription_mark_past_due(
        actor=SYSTEM, subscription=recent, since=timezone.now() - timedelta(days=6)
    )
    mail_forget()

    with django_capture_on_commit_callbacks(execute=True):
        assert services.subscriptions_suspend_overdue() == 1
    assert services.subscriptions_suspend_overdue() == 0

    assert Subscription.objects.get(pk=late.pk).status == "suspended"
    assert Subscription.objects.get(pk=recent.pk).status == "past_due"
    event = _events(tenant, "subscription.suspend").get()
    assert (event.actor_kind, event.payload["reason"]) == (
        "system",
        "past due beyond the grace period",
    )
    assert [m.subject for m in mail.outbox] == ["[Opsdeck] Your subscription to Hobby is suspended"]


def test_one_open_subscription_per_tenant_and_plan_is_enforced_by_the_database(tenant, plan):
    from django.db import IntegrityError, transaction

    Subscription.objects.create(tenant=tenant, plan=plan, status="suspended")
    Subscription.objects.create(tenant=tenant, plan=plan, status="cancelled")
    with pytest.raises(IntegrityError), transaction.atomic():
        Subscription.objects.create(tenant=tenant, plan=plan, status="pending")


# --- overrides ---


def test_an_override_in_a_closed_period_is_refused(tenant, plan, staff):
    last_month = periods.current_start() - timedelta(days=1)

    with pytest.raises(ValidationError) as refused:
        services.plan_override_create(
            actor=staff, tenant=tenant, plan=plan, effective_from=last_month,
            limits={"max_instances": 9},
        )  # fmt: skip

    assert "closed billing period" in refused.value.message_dict["effective_from"][0]
    assert not PlanOverride.objects.exists()


def test_an_override_from_now_on_is_saved_and_audited(tenant, plan, staff):
    override = services.plan_override_create(
        actor=staff, tenant=tenant, plan=plan, effective_from=timezone.now(),
        limits={"max_instances": 9}, prices={"cpu": "0.02"}, note="pilot customer",
    )  # fmt: skip

    event = _events(tenant, "plan_override.create").get()
    assert event.actor_kind == "staff"
    assert event.payload["limits"] == {"max_instances": 9}
    assert override.prices == {"cpu": "0.02"}


def test_an_override_with_unknown_limits_or_bad_prices_is_refused(tenant, plan, staff):
    with pytest.raises(ValidationError) as refused:
        services.plan_override_create(
            actor=staff, tenant=tenant, plan=plan, effective_from=timezone.now(),
            limits={"max_instance": 9}, prices={"cpu": "cheap"},
        )  # fmt: skip

    assert set(refused.value.message_dict) == {"limits", "prices"}


def test_is_closed_means_before_the_current_month():
    now = timezone.now()
    assert not periods.is_closed(now)
    assert not periods.is_closed(periods.current_start(now))
    assert periods.is_closed(periods.current_start(now) - timedelta(seconds=1))


# --- existing tenants keep working ---


def test_the_data_migration_subscribes_tenants_to_the_plans_they_run(tenant, owner, make_user):
    from accounts import services as account_services
    from deployments.models import Cell, Instance, PlanVersion

    migration = importlib.import_module("deployments.migrations.0010_subscribe_running_tenants")
    used = Plan.objects.create(key="used", name="Used", service="pg")
    gone = Plan.objects.create(key="gone", name="Gone", service="pg")
    unused = Plan.objects.create(key="unused", name="Unused", service="pg")
    versions = {
        plan: PlanVersion.objects.create(plan=plan, number=1, spec_text="x", parsed={}, digest="d")
        for plan in (used, gone, unused)
    }
    other = account_services.tenant_create(actor=Actor(user=make_user("b@example.com")), name="B")
    cell = Cell.objects.create(name="eu-1")
    for owner_, name, plan_, state in [
        (tenant, "a", used, "running"),
        (tenant, "b", used, "stopped"),
        (tenant, "c", gone, "deleted"),
        (other, "d", used, "failed"),
    ]:
        Instance.objects.create(
            tenant=owner_, name=name, plan_version=versions[plan_], cell=cell, state=state
        )
    Subscription.objects.create(tenant=other, plan=used, status="suspended")  # kept as it is

    made = migration.subscribe_running_tenants(Instance, Subscription)

    assert made == 1
    assert sorted(Subscription.objects.values_list("tenant__name", "plan__key", "status")) == [
        ("Acme", "used", "active"),
        ("B", "used", "suspended"),
    ]
    assert migration.subscribe_running_tenants(Instance, Subscription) == 0


def test_seed_demo_subscribes_the_demo_tenant_to_the_loaded_plans(plan, gated):
    call_command("seed_demo", production=True)
    call_command("seed_demo", production=True)

    demo = Tenant.objects.get(name="Demo Company")
    assert sorted(Subscription.objects.filter(tenant=demo).values_list("plan__key", "status")) == [
        ("business", "active"),
        ("hobby", "active"),
    ]
    assert Membership.objects.filter(tenant=demo).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_overrides_from_one_moment_saved_at_once_keep_one_and_say_why_to_the_other(
    tenant, plan, staff
):
    moment = timezone.now() + timedelta(hours=1)

    def add():
        return services.plan_override_create(
            actor=staff, tenant=tenant, plan=plan, effective_from=moment,
            limits={"max_instances": 9},
        )  # fmt: skip

    results = race(add)

    refused = [r for r in results if isinstance(r, ValidationError)]
    assert len(refused) == 3 and PlanOverride.objects.count() == 1, results
    assert all("starts at this moment" in str(r) for r in refused)


@pytest.mark.django_db(transaction=True)
def test_a_suspension_waits_for_a_create_under_way_in_the_organization(
    tenant, owner, plan, make_user
):
    """A create holds the organization's lock from its permission and entitlement checks to its
    commit (`permission_require`); a suspension committed meanwhile let an instance be created
    on a suspended subscription. It waits for the create instead, as a cancel does."""
    from accounts.services import tenant_lock
    from tests.concurrency import beside_a_lock

    subscription = services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    staff = Actor(user=make_user("staff@example.com", is_staff=True), staff=True)
    order = []

    def suspend():
        services.subscription_suspend(actor=staff, subscription=subscription, reason="staff")
        order.append("suspended")

    held, suspended = beside_a_lock(
        lock=lambda: tenant_lock(tenant.pk),  # a create, checked, not committed yet
        write=lambda: order.append("created"),
        act=suspend,
    )

    assert (held, suspended) == ("committed", None)
    assert order == ["created", "suspended"]
    assert Subscription.objects.get(pk=subscription.pk).status == "suspended"
