"""Changing plan: a tenant's instances move from one plan to another of the same service, each
through an upgrade to the other plan's newest version — and an upgrade is measured by the usage
rules of the version it moves to. With a real worker and the sandbox where a run matters."""

import uuid

import pytest
from django.core.exceptions import ValidationError

from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from billing.models import Subscription
from deployments import services
from deployments.models import Cell, Instance, Operation
from tests.concurrency import race
from tests.deployments import factories
from tests.deployments.conftest import SPEC, wait_done
from tests.deployments.factories import BACKUPS


def _small_text(*, max_instances: int = 10, max_replicas: int = 5) -> str:
    """The shipped spec as another plan of the same service, with its own limits."""
    text = SPEC.read_text()
    text = text.replace("  plan: postgres-cnpg\n", "  plan: postgres-small\n", 1)
    text = text.replace("name: PostgreSQL\n", "name: PostgreSQL Small\n", 1)
    text = text.replace(
        "maxNumberOfInstancesAllowed: 10", f"maxNumberOfInstancesAllowed: {max_instances}"
    )
    return text.replace(
        "maxPerInstance: {replica: 5}", f"maxPerInstance: {{replica: {max_replicas}}}"
    )


def _create(owner, tenant, plan, name: str, **parameters) -> Instance:
    """An instance as a finished create leaves it (no worker: nothing is sent)."""
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=create.instance_id)


def _change(user, tenant, source, target, request_id=None):
    return services.plan_change(
        actor=Actor(user=user), tenant=tenant, source=source, target=target,
        request_id=request_id or uuid.uuid4().hex,
    )  # fmt: skip


@pytest.fixture
def plans(db):
    large = services.plan_load(text=SPEC.read_text()).plan
    small = services.plan_load(text=_small_text(max_instances=2, max_replicas=2)).plan
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return large, small


# --- with a worker and the sandbox cluster ---


def test_a_change_of_plan_runs_an_upgrade_that_leaves_the_instance_on_the_other_plan(
    worker, cell, plan, tenant, owner
):
    small = services.plan_load(text=_small_text()).plan
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="c-1",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error

    (move,) = _change(owner, tenant, plan, small).operations

    assert wait_done(move).state == Operation.State.SUCCEEDED, move.error
    instance = Instance.objects.select_related("plan_version__plan").get(pk=create.instance_id)
    assert instance.plan_version.plan == small and instance.state == Instance.State.RUNNING
    assert instance.parameters["instances"] == 2


# --- the service, without a worker ---


def test_each_instance_is_queued_an_upgrade_onto_the_other_plan_once(plans, tenant, owner):
    large, small = plans
    first = _create(owner, tenant, large, "orders", instances="2")
    second = _create(owner, tenant, large, "billing", instances="1")

    change = _change(owner, tenant, large, small, request_id="move-1")
    again = _change(owner, tenant, large, small, request_id="move-1")

    version = small.versions.get()
    assert [(op.instance_id, op.verb, op.plan_version) for op in change.operations] == [
        (first.pk, "upgrade", version),
        (second.pk, "upgrade", version),
    ]
    assert change.operations[0].arguments["plan"] == {"from": large.key, "to": small.key}
    assert [op.pk for op in again.operations] == [op.pk for op in change.operations]
    assert Operation.objects.filter(verb="upgrade").count() == 2
    assert AuditEvent.objects.filter(action="plan.change", result="ok").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_id_queue_one_move(tenant, owner):
    large = services.plan_load(text=SPEC.read_text()).plan
    small = services.plan_load(text=_small_text()).plan
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    _create(owner, tenant, large, "orders")

    results = race(lambda: _change(owner, tenant, large, small, request_id="move-race"))

    assert all(isinstance(r, services.PlanChange) for r in results), results
    assert {r.operations[0].pk for r in results} == {Operation.objects.get(verb="upgrade").pk}


def test_the_change_is_refused_whole_when_the_other_plan_cannot_take_every_instance(
    plans, tenant, owner
):
    large, small = plans  # small: at most 2 instances
    for name in ("a", "b", "c"):
        _create(owner, tenant, large, name)

    with pytest.raises(ActionDenied, match=r"^c: The PostgreSQL Small plan allows at most 2"):
        _change(owner, tenant, large, small)

    assert not Operation.objects.filter(verb="upgrade").exists()
    assert AuditEvent.objects.filter(action="plan.change", result="denied").exists()


def test_sizes_are_measured_by_the_other_plans_rules(plans, tenant, owner):
    large, small = plans  # small: at most 2 servers (replicas) per instance
    _create(owner, tenant, large, "orders", instances="3")

    with pytest.raises(ActionDenied, match="at most 2 servers per instance and this asks for 3"):
        _change(owner, tenant, large, small)


def test_the_tenant_must_be_subscribed_to_the_other_plan(plans, tenant, owner):
    large, small = plans
    _create(owner, tenant, large, "orders")
    Subscription.objects.filter(tenant=tenant, plan=small).update(status="cancelled")

    with pytest.raises(ActionDenied, match="Subscribe"):
        _change(owner, tenant, large, small)


def test_an_instance_that_cannot_move_now_refuses_the_change(plans, tenant, owner):
    large, small = plans
    _create(owner, tenant, large, "orders")
    stopped = _create(owner, tenant, large, "archive")
    Instance.objects.filter(pk=stopped.pk).update(state=Instance.State.STOPPED)

    with pytest.raises(ActionDenied, match=r"^archive: .*needs it to be running"):
        _change(owner, tenant, large, small)
    assert not Operation.objects.filter(verb="upgrade").exists()


def test_only_plans_of_one_service_and_members_who_manage_billing(plans, tenant, owner, add_member):
    large, small = plans
    _create(owner, tenant, large, "orders")
    cache = factories.other_service_version("redis").plan

    with pytest.raises(ValidationError, match="not another plan of"):
        _change(owner, tenant, large, cache)
    with pytest.raises(ValidationError, match=f"other than {large.name}"):
        _change(owner, tenant, large, large)
    with pytest.raises(ValidationError, match="nothing to move"):
        _change(owner, tenant, small, large)
    with pytest.raises(ActionDenied):
        _change(add_member("dev@example.com", "member"), tenant, large, small)


def test_an_upgrade_is_measured_by_the_rules_of_the_version_it_moves_to(plans, tenant, owner):
    large, _ = plans  # at most 5 servers per instance
    instance = _create(owner, tenant, large, "orders", instances="2")
    # Version 2 counts each server three times: 2 servers are 6 there.
    services.plan_load(
        text=SPEC.read_text().replace(
            'replica: "double(var.instances)"', 'replica: "double(var.instances) * 3.0"'
        )
    )

    with pytest.raises(ActionDenied, match="at most 5 servers per instance and this asks for 6"):
        services.instance_upgrade(actor=Actor(user=owner), instance=instance, request_id="up-1")


# --- the Billing page ---


def test_the_billing_page_offers_the_move_and_queues_it(plans, tenant, owner, owner_client):
    large, small = plans
    _create(owner, tenant, large, "orders")
    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "Change plan" in page and "Move to PostgreSQL Small" in page

    response = owner_client.post(
        f"/t/{tenant.slug}/billing/plans/{large.key}/change/",
        {"plan": small.key, "request_id": "page-1"},
        follow=True,
    )

    assert "Moving 1 instance from PostgreSQL to PostgreSQL Small" in response.content.decode()
    assert Operation.objects.get(verb="upgrade").plan_version.plan == small
    refused = owner_client.post(
        f"/t/{tenant.slug}/billing/plans/{large.key}/change/",
        {"plan": "no-such-plan", "request_id": "page-2"},
        follow=True,
    )
    assert "Choose the plan to move your instances to." in refused.content.decode()
    # A key with a null character, which PostgreSQL compares with nothing, names no plan.
    nul = owner_client.post(
        f"/t/{tenant.slug}/billing/plans/{large.key}/change/",
        {"plan": f"{small.key}\x00", "request_id": "page-3"},
        follow=True,
    )
    assert "Choose the plan to move your instances to." in nul.content.decode()
    assert Operation.objects.filter(verb="upgrade").count() == 1


def test_another_tenants_page_is_not_found(plans, tenant, owner, make_user, client):
    large, small = plans
    _create(owner, tenant, large, "orders")
    client.force_login(make_user("stranger@example.com"))

    response = client.post(
        f"/t/{tenant.slug}/billing/plans/{large.key}/change/",
        {"plan": small.key, "request_id": "x-1"},
    )

    assert response.status_code == 404
    assert not Operation.objects.filter(verb="upgrade").exists()


def test_a_subscription_cannot_be_cancelled_while_instances_are_queued_to_move_onto_its_plan(
    plans, tenant, owner
):
    """The cancel counts the plan's instances under the tenant's lock; an instance whose move
    onto the plan is queued (the change of plan was accepted on the active subscription) is not
    on it yet, but will be once its upgrade runs: a cancel now leaves it running on a cancelled
    subscription."""
    from billing import services as billing_services

    large, small = plans
    _create(owner, tenant, large, "orders")
    (move,) = _change(owner, tenant, large, small).operations
    assert move.state == Operation.State.QUEUED
    subscription = Subscription.objects.get(tenant=tenant, plan=small)

    with pytest.raises(ActionDenied, match="1 instance still runs on the PostgreSQL Small plan"):
        billing_services.subscription_cancel(actor=Actor(user=owner), subscription=subscription)
    assert Subscription.objects.get(pk=subscription.pk).status == "active"
