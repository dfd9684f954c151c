"""`billing.entitlements.check`: plain values in, a decision with a one-sentence reason out."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import entitlements
from billing.entitlements import Request, Usage, check
from billing.models import Plan, PlanOverride, Subscription

pytestmark = pytest.mark.unsubscribed


@pytest.fixture
def plan(db):
    return Plan.objects.create(
        key="hobby",
        name="Hobby",
        service="postgresql",
        limits={
            "max_instances": 3,
            "max_total": {"storage": 100},
            "max_per_instance": {"replica": 2},
            "cells": ["eu-1"],
            "denied_verbs": ["failover", "restore.pointInTime"],
            "max_backup_retention_days": 14,
            "grace_days": 7,
        },
    )


@pytest.fixture
def active(tenant, plan):
    return Subscription.objects.create(tenant=tenant, plan=plan, status="active")


def _check(tenant, plan, action="create", usage=None, **request):
    return check(tenant=tenant, plan=plan, action=action, usage=usage, request=Request(**request))


def test_a_plan_staff_hold_says_to_contact_them_not_to_subscribe(tenant, plan):
    Subscription.objects.create(
        tenant=tenant, plan=plan, status="cancelled", suspended_by_staff=True
    )

    decision = _check(tenant, plan)

    assert not decision.allowed
    assert decision.reason == (
        f"The platform team suspended your {plan.name} subscription: contact them to create "
        "instances on it."
    )


def test_no_subscription_says_where_to_subscribe(tenant, plan):
    decision = _check(tenant, plan)

    assert not decision.allowed
    assert decision.reason == (
        "Subscribe to the Hobby plan on the Billing page to create instances on it."
    )


def test_a_cancelled_subscription_is_no_subscription(tenant, plan):
    Subscription.objects.create(tenant=tenant, plan=plan, status="cancelled")

    assert "Subscribe to the Hobby plan" in _check(tenant, plan, "backup").reason


def test_a_pending_subscription_awaits_approval(tenant, plan):
    Subscription.objects.create(tenant=tenant, plan=plan, status="pending")

    assert "awaiting approval" in _check(tenant, plan).reason


@pytest.mark.parametrize("action", ["stop", "delete", "deleteBackup"])
def test_a_suspended_subscription_still_stops_deletes_and_forgets_backups(tenant, plan, action):
    Subscription.objects.create(tenant=tenant, plan=plan, status="suspended")

    assert _check(tenant, plan, action).allowed


@pytest.mark.parametrize(
    "action", ["create", "start", "restore", "modify", "backup", "upgrade", "rollback", "rotate"]
)
def test_a_suspended_subscription_refuses_everything_else(tenant, plan, action):
    Subscription.objects.create(tenant=tenant, plan=plan, status="suspended")

    decision = _check(tenant, plan, action)

    assert not decision.allowed
    assert "is suspended" in decision.reason


def test_past_due_runs_within_its_grace_period_and_not_after(tenant, plan):
    subscription = Subscription.objects.create(
        tenant=tenant, plan=plan, status="past_due", past_due_since=timezone.now()
    )
    assert _check(tenant, plan, "start").allowed

    subscription.past_due_since = timezone.now() - timedelta(days=7, minutes=1)
    subscription.save()
    assert "is suspended" in _check(tenant, plan, "start").reason


def test_max_instances(tenant, plan, active):
    assert _check(tenant, plan, usage=Usage(instances=2)).allowed

    decision = _check(tenant, plan, usage=Usage(instances=3))

    assert decision.reason == (
        "The Hobby plan allows at most 3 instances per organization and you have 3; "
        "delete one or ask the platform team for more."
    )
    assert _check(tenant, plan, "modify", usage=Usage(instances=3)).allowed  # not a new one


def test_a_limit_points_to_another_plan_of_the_service_when_there_is_one(tenant, plan, active):
    Plan.objects.create(key="pro", name="Pro", service="postgresql")
    Plan.objects.create(key="cache", name="Cache", service="valkey")  # another service's

    instances = _check(tenant, plan, usage=Usage(instances=3))
    size = _check(tenant, plan, "modify", quantities={"replica": Decimal(3)})
    verb = _check(tenant, plan, "failover")

    assert instances.reason.endswith("; delete one or change plan on the Billing page.")
    assert size.reason.endswith("; change plan on the Billing page for more.")
    assert verb.reason.endswith("; change plan on the Billing page to use it.")


def test_max_total_across_the_tenant(tenant, plan, active):
    usage = Usage(instances=1, totals={"storage": Decimal(90)})

    refused = _check(tenant, plan, usage=usage, delta={"storage": Decimal(20)})
    shrink = _check(tenant, plan, "modify", usage=usage, delta={"storage": Decimal(-5)})

    assert "at most 100 GiB of storage across" in refused.reason
    assert "would make 110 GiB of storage" in refused.reason
    assert _check(tenant, plan, usage=usage, delta={"storage": Decimal(10)}).allowed
    assert shrink.allowed


def test_max_per_instance(tenant, plan, active):
    decision = _check(tenant, plan, "modify", quantities={"replica": Decimal(3)})

    assert decision.reason == (
        "The Hobby plan allows at most 2 servers per instance and this asks for 3 servers; "
        "ask the platform team if you need more."
    )


def test_cells(tenant, plan, active):
    assert _check(tenant, plan, cell="eu-1").allowed
    assert _check(tenant, plan, cell="us-1").reason == (
        "The Hobby plan does not run in the us-1 cell; choose one of: eu-1."
    )


def test_denied_verbs(tenant, plan, active):
    assert "does not include the failover action" in _check(tenant, plan, "failover").reason
    assert _check(tenant, plan, "restart").allowed


def test_point_in_time_restore_denied_plain_restore_allowed(tenant, plan, active):
    assert _check(tenant, plan, "restore").allowed
    assert "point-in-time restore" in _check(tenant, plan, "restore", point_in_time=True).reason


def test_backup_retention(tenant, plan, active):
    assert _check(tenant, plan, "backup.schedule", retention_days=14).allowed
    assert _check(tenant, plan, "backup.schedule", retention_days=15).reason == (
        "The Hobby plan keeps backups for at most 14 days; choose 14 or fewer, "
        "or ask the platform team for longer."
    )


def test_entitlement_denied_for_callers_that_raise(tenant, plan):
    with pytest.raises(entitlements.EntitlementDenied, match="Subscribe to the Hobby plan"):
        entitlements.require(tenant=tenant, plan=plan, action="create")


# --- overrides ---


def test_an_override_in_effect_replaces_a_limit_and_merges_dimensions(tenant, plan, active):
    PlanOverride.objects.create(
        tenant=tenant,
        plan=plan,
        limits={"max_instances": 5, "max_total": {"cpu": 8}, "denied_verbs": []},
    )

    limits = entitlements.limits_for(tenant, plan)

    assert limits.max_instances == 5
    assert limits.max_total == {"storage": Decimal(100), "cpu": Decimal(8)}
    assert limits.denied_verbs == frozenset()
    assert _check(tenant, plan, usage=Usage(instances=4)).allowed


def test_the_latest_override_that_has_started_wins(tenant, plan, active, other_tenant):
    now = timezone.now()
    PlanOverride.objects.create(
        tenant=tenant,
        plan=plan,
        effective_from=now - timedelta(days=2),
        limits={"max_instances": 4},
    )
    PlanOverride.objects.create(
        tenant=tenant,
        plan=plan,
        effective_from=now - timedelta(days=1),
        limits={"max_instances": 6},
    )
    PlanOverride.objects.create(
        tenant=tenant,
        plan=plan,
        effective_from=now + timedelta(days=1),
        limits={"max_instances": 9},
    )

    assert entitlements.limits_for(tenant, plan).max_instances == 6
    assert entitlements.limits_for(tenant, plan, now - timedelta(hours=36)).max_instances == 4
    assert entitlements.limits_for(tenant, plan, now + timedelta(days=2)).max_instances == 9
    assert entitlements.limits_for(other_tenant, plan).max_instances == 3  # theirs alone


@pytest.fixture
def other_tenant(make_user):
    from accounts import services
    from accounts.audit import Actor

    return services.tenant_create(actor=Actor(user=make_user("o@example.com")), name="Other")
