"""Why an organization cannot create on each plan, said on the catalog's cards: the same
sentence the create service refuses with, read for every plan at once in a constant number of
queries."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.errors import ActionDenied
from billing.models import Plan, PlanOverride, Subscription
from deployments import services
from deployments.entitlement_usage import create_refusal, create_refusals, entitlement_require
from deployments.models import Cell, Operation
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS, make_instances

pytestmark = pytest.mark.unsubscribed


def _load(key: str, *, service: str = "postgresql") -> Plan:
    """A plan of `service` keyed `key`, loaded from the PostgreSQL spec (at most 10 instances)."""
    return services.plan_load(
        text=SPEC.read_text()
        .replace("name: PostgreSQL\n", f"name: PG {key}\n", 1)
        .replace("plan: postgres-cnpg", f"plan: {key}")
        .replace("service: postgresql", f"service: {service}")
    ).plan


@pytest.fixture
def cell(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)


def _subscribe(tenant, plan, status=Subscription.Status.ACTIVE, **fields) -> Subscription:
    return Subscription.objects.create(tenant=tenant, plan=plan, status=status, **fields)


def _at_limit(tenant, plan, cell) -> None:
    """Subscribed, with as many instances as the organization's override of the plan allows."""
    _subscribe(tenant, plan)
    PlanOverride.objects.create(tenant=tenant, plan=plan, limits={"max_instances": 1})
    make_instances(tenant, plan.versions.get(), cell, 1, name=plan.key)


def _ended(tenant, plan, cell) -> None:
    _subscribe(tenant, plan, Subscription.Status.CANCELLED)


def _unsubscribed(tenant, plan, cell) -> None:
    """No open subscription: one ended, on pg-1 and pg-3 after staff suspended it."""
    held = plan.key in {"pg-1", "pg-3"}
    _subscribe(tenant, plan, Subscription.Status.CANCELLED, suspended_by_staff=held)


def _subscribed(tenant, plan, cell) -> None:
    _subscribe(tenant, plan)
    make_instances(tenant, plan.versions.get(), cell, 2, name=plan.key)


# --- the catalog's query count --------------------------------------------------------------


def _catalog_queries(client, tenant) -> list[dict]:
    url = f"/t/{tenant.slug}/deployments/new/"
    client.get(url)  # each process reads a plan version's usage rules once
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return queries.captured_queries


@pytest.mark.parametrize("standing", [_subscribed, _unsubscribed, _at_limit])
def test_the_catalog_reads_as_many_queries_for_five_plans_as_for_two(
    owner_client, tenant, cell, standing
):
    plans = [_load(f"pg-{n}") for n in range(2)]
    for plan in plans:
        standing(tenant, plan, cell)
    few = _catalog_queries(owner_client, tenant)
    for n in range(2, 5):
        standing(tenant, _load(f"pg-{n}", service="postgresql" if n % 2 else "other"), cell)

    many = _catalog_queries(owner_client, tenant)

    assert len(many) == len(few), "\n".join(q["sql"][:150] for q in many)


# --- the same answer as the create service's check --------------------------------------------


def _instances_up_to(limit):
    def made(tenant, plan, cell):
        _subscribe(tenant, plan)
        make_instances(tenant, plan.versions.get(), cell, limit, name=plan.key)

    return made


def _override(limits, *, starts=None, instances=1, state="running"):
    def made(tenant, plan, cell):
        _subscribe(tenant, plan)
        PlanOverride.objects.create(
            tenant=tenant, plan=plan, limits=limits, effective_from=starts or timezone.now()
        )
        make_instances(tenant, plan.versions.get(), cell, instances, name=plan.key, state=state)

    return made


def _past_due(days):
    def made(tenant, plan, cell):
        since = timezone.now() - timedelta(days=days)
        _subscribe(tenant, plan, Subscription.Status.PAST_DUE, past_due_since=since)

    return made


def _held_by_staff(tenant, plan, cell):
    _subscribe(tenant, plan, Subscription.Status.CANCELLED, suspended_by_staff=True)


def _upgrade_queued_onto(tenant, plan, cell):
    """At its override's one instance, counting one still on another plan whose upgrade onto
    this one is queued."""
    _override({"max_instances": 1}, instances=0)(tenant, plan, cell)
    other = Plan.objects.get(key="pg-b")
    (moving,) = make_instances(tenant, other.versions.get(), cell, 1, name="moving")
    Operation.objects.create(
        instance=moving, verb="upgrade", request_id="up", plan_version=plan.versions.get()
    )


CASES = {
    "none": (lambda t, p, c: None, "Subscribe to the PG pg-a plan on the Billing page"),
    "ended": (_ended, "Subscribe to the PG pg-a plan on the Billing page"),
    "held by staff": (_held_by_staff, "The platform team suspended your PG pg-a subscription"),
    "awaiting approval": (
        lambda t, p, c: _subscribe(t, p, Subscription.Status.PENDING),
        "is awaiting approval by the platform team",
    ),
    "suspended": (
        lambda t, p, c: _subscribe(t, p, Subscription.Status.SUSPENDED),
        "Your subscription to the PG pg-a plan is suspended",
    ),
    "past due beyond its grace": (_past_due(30), "plan is suspended, so its instances"),
    "past due within its grace": (_past_due(1), None),
    "active": (lambda t, p, c: _subscribe(t, p), None),
    "below the plan's limit": (_instances_up_to(9), None),
    "at the plan's limit": (
        _instances_up_to(10),
        "allows at most 10 instances per organization and you have 10; delete one or change plan",
    ),
    "at the override's limit": (_override({"max_instances": 1}), "you have 1"),
    "an override lifting the limit": (_override({"max_instances": None}, instances=10), None),
    "an override not started yet": (
        _override({"max_instances": 1}, starts=timezone.now() + timedelta(days=1)),
        None,
    ),
    "deleted instances": (_override({"max_instances": 1}, state="deleted"), None),
    "an upgrade queued onto it": (_upgrade_queued_onto, "you have 1"),
    "create denied by the override": (
        _override({"denied_verbs": ["create"]}, instances=0),
        "The PG pg-a plan does not include the create action; change plan on the Billing page",
    ),
}


def _required(tenant, plan) -> str | None:
    """What the create service's check refuses a create with."""
    try:
        entitlement_require(tenant=tenant, plan=plan, action="create")
    except ActionDenied as exc:
        return exc.reason
    return None


@pytest.mark.parametrize("case", CASES)
def test_each_plans_refusal_read_at_once_is_the_one_the_create_service_gives(tenant, cell, case):
    target, neighbour, alone = _load("pg-a"), _load("pg-b"), _load("solo", service="solo")
    _subscribe(tenant, neighbour)
    make_instances(tenant, neighbour.versions.get(), cell, 10, name="full")  # its limit
    PlanOverride.objects.create(tenant=tenant, plan=alone, limits={"max_instances": 0})
    _subscribe(tenant, alone)
    made, said = CASES[case]
    made(tenant, target, cell)
    plans = [target, neighbour, alone]

    refusals = create_refusals(tenant, plans)

    assert refusals == {plan.key: create_refusal(tenant, plan) for plan in plans}
    assert refusals == {plan.key: _required(tenant, plan) for plan in plans}
    assert (refusals[target.key] is None) if said is None else (said in refusals[target.key])
    assert refusals["solo"].endswith("delete one or ask the platform team for more.")


def test_a_plan_awaiting_payment_on_stripes_checkout_is_said_so_with_the_others(
    tenant, cell, settings
):
    settings.STRIPE_API_KEY = "sk_test_opsdeck_refusals"
    priced, free = _load("pg-a"), _load("pg-free")
    free.prices.all().delete()
    for plan in (priced, free):
        _subscribe(tenant, plan, Subscription.Status.PENDING)
    plans = list(Plan.objects.filter(pk__in=[priced.pk, free.pk]))

    refusals = create_refusals(tenant, plans)

    assert refusals == {plan.key: _required(tenant, plan) for plan in plans}
    assert "is awaiting payment: finish it on the Billing page" in refusals["pg-a"]
    assert "is awaiting approval by the platform team" in refusals["pg-free"]
