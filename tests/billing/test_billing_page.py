"""The Billing page: each plan with the tenant's subscription and its usage against the limits;
subscribe and cancel from it."""

import re

import pytest

from accounts.audit import SYSTEM
from billing import services
from billing.models import Plan, PlanOverride, Subscription
from deployments.models import Cell, Instance
from tests.concurrency import race
from tests.deployments import factories

pytestmark = pytest.mark.unsubscribed


@pytest.fixture
def version(db):
    return factories.postgres_version()


@pytest.fixture
def plan(version):
    return version.plan


@pytest.fixture
def subscribed(tenant, plan):
    return services.subscription_create_active(actor=SYSTEM, tenant=tenant, plan=plan)


def _url(tenant, suffix=""):
    return f"/t/{tenant.slug}/billing/{suffix}"


def _request_id(page) -> str:
    return re.search(r'name="request_id" value="([^"]+)"', page.content.decode()).group(1)


@pytest.mark.parametrize("role", ["owner", "admin", "billing"])
def test_owners_admins_and_billing_members_see_usage_against_each_limit(
    client, tenant, owner, add_member, version, subscribed, role
):
    user = owner if role == "owner" else add_member(f"{role}@example.com", role)
    params = {"instances": 2, "storageGi": 60, "cpu": 1, "memoryGi": 2}
    for n in range(3):
        factories.make_instances(tenant, version, factories.cell(f"c{n}"), 1, name=f"db{n}")
        Instance.objects.filter(name=f"db{n}-0").update(parameters=params)
    client.force_login(user)

    page = client.get(_url(tenant))

    text = page.content.decode()
    assert page.status_code == 200
    assert "3 of 10 instances" in text
    assert "360 of 10000 GiB of storage" in text
    assert "At most 5 servers per instance" in text
    assert "Backups kept at most 365 days" in text
    assert '<span class="badge badge-ok">Active</span>' in text


@pytest.mark.parametrize(
    ("storage", "shown"),
    [(10**28, "0 of 10000000000000000000000000000 GiB"), (2.5e-7, "0 of 0.00000025 GiB"),
     (1.5e29, "0 of 150000000000000000000000000000 GiB")],
)  # fmt: skip
def test_a_limit_staff_set_very_large_or_very_small_is_shown_as_written(
    owner_client, tenant, plan, subscribed, storage, shown
):
    limits = {"max_total": {"storage": storage}}
    PlanOverride.objects.create(tenant=tenant, plan=plan, limits=limits)

    page = owner_client.get(_url(tenant))

    assert page.status_code == 200
    assert f"{shown} of storage" in page.content.decode()


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_may_not_see_billing(client, tenant, add_member, role):
    client.force_login(add_member(f"{role}@example.com", role))

    assert client.get(_url(tenant)).status_code == 403


def test_another_organizations_billing_is_not_found(client, tenant, make_user):
    client.force_login(make_user("stranger@example.com"))

    assert client.get(_url(tenant)).status_code == 404


def test_a_plan_not_subscribed_offers_subscribe_and_it_subscribes(owner_client, tenant, plan):
    page = owner_client.get(_url(tenant))
    assert "Not subscribed" in page.content.decode()

    done = owner_client.post(
        _url(tenant, f"subscribe/{plan.key}/"), {"request_id": _request_id(page)}, follow=True
    )

    assert Subscription.objects.get(tenant=tenant, plan=plan).status == "active"
    assert "You are subscribed to PostgreSQL." in done.content.decode()
    assert "Cancel my PostgreSQL subscription" in done.content.decode()


def test_a_plan_whose_subscription_was_cancelled_under_a_staff_suspension_offers_no_subscribe(
    owner_client, tenant, plan, subscribed, make_user
):
    from accounts.audit import Actor

    staff = Actor(user=make_user("staff@example.com", is_staff=True), staff=True)
    services.subscription_suspend(actor=staff, subscription=subscribed, reason="abuse")
    services.subscription_cancel(actor=staff, subscription=subscribed)

    text = owner_client.get(_url(tenant)).content.decode()

    assert '<span class="badge badge-error">Suspended by staff</span>' in text
    assert "Contact them to subscribe again." in text
    assert f"Subscribe to {plan.name}" not in text


def test_a_plan_to_move_to_that_staff_hold_says_so_rather_than_to_subscribe_below(
    owner_client, tenant, plan, version, subscribed, make_user
):
    from accounts.audit import Actor

    factories.make_instances(tenant, version, factories.cell(), 1, name="orders")
    large = Plan.objects.create(key="pg-large", name="PostgreSQL Large", service=plan.service)
    held = services.subscription_create_active(actor=SYSTEM, tenant=tenant, plan=large)
    staff = Actor(user=make_user("staff@example.com", is_staff=True), staff=True)
    services.subscription_suspend(actor=staff, subscription=held, reason="abuse")
    services.subscription_cancel(actor=staff, subscription=held)

    text = owner_client.get(_url(tenant)).content.decode()

    assert "PostgreSQL Large: suspended by the platform team" in text
    assert "PostgreSQL Large: subscribe to it first" not in text


def test_a_pending_subscription_says_it_awaits_approval(owner_client, tenant, plan):
    Plan.objects.filter(pk=plan.pk).update(limits={**plan.limits, "auto_approve": False})
    page = owner_client.get(_url(tenant))

    done = owner_client.post(
        _url(tenant, f"subscribe/{plan.key}/"), {"request_id": _request_id(page)}, follow=True
    )

    text = done.content.decode()
    assert "awaits approval by the platform team" in text
    assert '<span class="badge badge-op-queued">Awaiting approval</span>' in text


def test_billing_members_subscribe_but_members_cannot(client, tenant, plan, add_member):
    client.force_login(add_member("member@example.com", "member"))

    refused = client.post(_url(tenant, f"subscribe/{plan.key}/"), {"request_id": "r"})

    assert refused.status_code == 403
    assert not Subscription.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_double_submitted_subscribe_form_makes_one_subscription(client, tenant, owner, plan):
    from django.test import Client

    def submit():
        browser = Client()
        browser.force_login(owner)
        return browser.post(_url(tenant, f"subscribe/{plan.key}/"), {"request_id": "twice"})

    results = race(submit)

    assert [r.status_code for r in results] == [302] * 4, results
    assert Subscription.objects.filter(tenant=tenant).count() == 1


def test_cancelling_is_refused_while_instances_run_and_says_why(
    owner_client, tenant, version, subscribed
):
    factories.make_instances(tenant, version, factories.cell(), 2)

    done = owner_client.post(_url(tenant, f"subscriptions/{subscribed.pk}/cancel/"), follow=True)

    assert "2 instances still run on the PostgreSQL plan" in done.content.decode()
    assert Subscription.objects.get(pk=subscribed.pk).status == "active"


@pytest.mark.parametrize(
    ("count", "said"), [(1, "1 instance still runs"), (2, "2 instances still run")]
)
def test_the_cancel_section_says_how_many_instances_still_run(
    owner_client, tenant, version, subscribed, count, said
):
    factories.make_instances(tenant, version, factories.cell(), count)

    page = owner_client.get(_url(tenant, "")).content.decode()

    assert f"{said} on this plan" in page
    # The button is there, for the plan's page reads the same, but it does nothing until then.
    key = subscribed.plan.key
    assert (
        f'<button type="submit" class="secondary" disabled aria-describedby="why-cancel-{key}">'
        f"Cancel my PostgreSQL subscription</button>"
    ) in page


def test_without_instances_the_cancel_button_is_live(owner_client, tenant, subscribed):
    page = owner_client.get(_url(tenant, "")).content.decode()

    assert '<button type="submit" class="secondary">Cancel my PostgreSQL subscription' in page


def test_cancelling_without_instances_cancels(owner_client, tenant, subscribed):
    done = owner_client.post(_url(tenant, f"subscriptions/{subscribed.pk}/cancel/"), follow=True)

    assert "Your subscription to PostgreSQL is cancelled." in done.content.decode()
    assert Subscription.objects.get(pk=subscribed.pk).status == "cancelled"


def test_another_tenants_subscription_cannot_be_cancelled(owner_client, tenant, plan, make_user):
    from accounts import services as account_services
    from accounts.audit import Actor

    other = account_services.tenant_create(actor=Actor(user=make_user("x@example.com")), name="X")
    theirs = services.subscription_create_active(actor=SYSTEM, tenant=other, plan=plan)

    response = owner_client.post(_url(tenant, f"subscriptions/{theirs.pk}/cancel/"))

    assert response.status_code == 404
    assert Subscription.objects.get(pk=theirs.pk).status == "active"


def test_creating_without_a_subscription_points_to_the_billing_page(owner_client, tenant, plan):
    Cell.objects.create(name="local", region="eu-local", is_default=True)
    import uuid

    page = owner_client.post(
        f"/t/{tenant.slug}/deployments/new/{plan.key}/?request={uuid.uuid4().hex}",
        {"name": "orders", "request_id": uuid.uuid4().hex},
    )

    html = page.content.decode()
    assert "Acme is not subscribed to the PostgreSQL plan" in html
    assert f'<a href="/t/{tenant.slug}/billing/#plan-{plan.key}">Subscribe' in html


def _plans_in_use(tenant, version, keys, status=Subscription.Status.PENDING):
    """A plan of the version's service per key, with a price and the tenant's override, an
    ended subscription beside one in `status` (awaiting approval), and two instances."""
    from decimal import Decimal

    from billing.models import Price
    from deployments.models import PlanVersion

    cell = Cell.objects.get_or_create(name="eu-1", defaults={"region": "eu-west"})[0]
    for key in keys:
        plan = Plan.objects.create(key=key, name=key.upper(), service=version.plan.service)
        Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))
        on_it = PlanVersion.objects.create(
            plan=plan, number=1, digest=version.digest, spec_text=version.spec_text
        )
        ended = services.subscription_create_active(actor=SYSTEM, tenant=tenant, plan=plan)
        Subscription.objects.filter(pk=ended.pk).update(status=Subscription.Status.CANCELLED)
        Subscription.objects.create(tenant=tenant, plan=plan, status=status)
        PlanOverride.objects.create(tenant=tenant, plan=plan, limits={"max_instances": 4})
        factories.make_instances(tenant, on_it, cell, 2, name=key)


@pytest.mark.parametrize(
    ("status", "stripe", "said"),
    [
        ("pending", False, "Awaiting approval"),
        ("pending", True, "Awaiting payment"),  # each plan has a price to pay at checkout
        ("active", True, "Active"),
        ("past_due", True, "Payment is past due."),
        ("suspended", False, "This subscription is suspended"),
    ],
)
def test_the_page_reads_in_as_many_queries_whatever_the_plans_in_use(
    owner_client, tenant, version, subscribed, settings, status, stripe, said
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if stripe:
        settings.STRIPE_API_KEY = "sk_test_opsdeck_billing_page"
    _plans_in_use(tenant, version, ["one"], status)
    with CaptureQueriesContext(connection) as few:
        page = owner_client.get(_url(tenant)).content.decode()
    assert page.count("2 of 4 instances") == 1
    shown = page.count(said)
    more = [f"more-{n}" for n in range(8)]
    _plans_in_use(tenant, version, more, status)
    # Each process reads a plan version's usage rules once (versions never change).
    owner_client.get(_url(tenant))
    with CaptureQueriesContext(connection) as many:
        page = owner_client.get(_url(tenant)).content.decode()

    assert page.count("2 of 4 instances") == 1 + len(more)
    assert page.count(said) == shown + len(more)
    assert len(many) == len(few), "\n".join(q["sql"][:150] for q in many)


# --- last month's cost, until an invoice the organization can open bills it -----------------


def _last_month_used(tenant, plan, cores="4"):
    """Ten hours of last month's last day used (the last of them metered after midnight)."""
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from billing import usage
    from billing.models import Price
    from billing.usage import UsageRow

    Price.objects.get_or_create(
        plan=plan, dimension="cpu", defaults={"unit": "core", "unit_price": Decimal("0.035")}
    )
    this_month = usage.period_bounds(usage.period_key(timezone.now()))[0]
    for n in range(1, 11):
        usage.record(
            this_month - n * usage.HOUR,
            [UsageRow(tenant.pk, plan.pk, "inst-orders00", "orders", "cpu", "", Decimal(cores))],
        )
    return usage.period_key(this_month - timedelta(days=1))


def _last_month_section(page: str) -> str:
    if 'id="last-period-cost"' not in page:
        return ""
    return page.split('id="last-period-cost"', 1)[1].split("</section>", 1)[0]


def test_last_months_cost_stays_on_the_page_until_its_invoice_is_issued(owner_client, tenant, plan):
    """At 00:30 on the 1st the page said only "This month so far": last month's cost was on no
    page of the organization's until staff issued its invoice, days later maybe, and its last
    hour, metered after midnight, nowhere at all."""
    from billing.models import Invoice

    period = _last_month_used(tenant, plan)  # 40 core-hours: 1.40 USD
    open_ = _last_month_section(owner_client.get(_url(tenant)).content.decode())
    invoice = Invoice.objects.create(tenant=tenant, plan=plan, period=period, total="1.40")
    drafted = _last_month_section(owner_client.get(_url(tenant)).content.decode())
    Invoice.objects.filter(pk=invoice.pk).update(status=Invoice.Status.OPEN, number="INV-1")
    issued = owner_client.get(_url(tenant)).content.decode()

    assert "Last month, invoice to come" in open_ and "1.40 USD" in open_
    assert "metered in the period" in open_  # it has ended
    assert "1.40 USD" in drafted  # a draft is not shown to the organization
    assert _last_month_section(issued) == ""  # its invoice says it now
    assert 'id="last-daily-cost-usd"' not in issued and 'id="daily-cost-usd"' not in issued


def test_a_month_whose_usage_was_free_is_not_shown_again(owner_client, tenant, plan):
    from billing.models import Price

    _last_month_used(tenant, plan)
    Price.objects.filter(plan=plan).delete()

    page = owner_client.get(_url(tenant)).content.decode()

    assert _last_month_section(page) == "" and "This month so far" in page


def test_the_months_shown_are_said_to_be_utc_months(owner_client, tenant, plan):
    _last_month_used(tenant, plan)

    page = owner_client.get(_url(tenant)).content.decode()

    headings = re.findall(r'<h2 id="(?:last-)?period-cost">(.*?)</h2>', page, re.S)
    assert len(headings) == 2 and all(", UTC)</small>" in h for h in headings), headings
