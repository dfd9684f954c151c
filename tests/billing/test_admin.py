"""Staff manage subscriptions and overrides in the admin, through the billing services."""

import html
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from accounts.models import AuditEvent
from billing import periods
from billing.models import (
    Invoice,
    PastPrice,
    Plan,
    PlanOverride,
    Price,
    Subscription,
    UsageRecord,
)
from billing.services import plan_prices_replace
from tests.concurrency import race

pytestmark = pytest.mark.unsubscribed


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))
    return plan


def _changelist(model):
    return reverse(f"admin:billing_{model._meta.model_name}_changelist")


def _act(staff_client, action, *subscriptions):
    return staff_client.post(
        _changelist(Subscription),
        {"action": action, "_selected_action": [s.pk for s in subscriptions]},
        follow=True,
    )


def test_staff_approve_suspend_reactivate_and_cancel_through_the_services(
    staff_client, tenant, plan
):
    subscription = Subscription.objects.create(tenant=tenant, plan=plan, status="pending")

    for action in ["approve", "suspend", "reactivate", "cancel"]:
        page = _act(staff_client, action, subscription)
        assert page.status_code == 200

    assert Subscription.objects.get().status == "cancelled"
    events = AuditEvent.objects.filter(action__startswith="subscription.").order_by("pk")
    assert [(e.action, e.actor_kind, e.result) for e in events] == [
        ("subscription.approve", "staff", "ok"),
        ("subscription.suspend", "staff", "ok"),
        ("subscription.reactivate", "staff", "ok"),
        ("subscription.cancel", "staff", "ok"),
    ]


@pytest.mark.parametrize(
    ("model", "action", "status"),
    [(Subscription, "suspend", "active"), (Subscription, "cancel", "active"),
     (Invoice, "finalize", "draft"), (Invoice, "void", "draft")],
)  # fmt: skip
def test_staff_who_may_only_view_billing_rows_are_offered_no_action_and_a_forged_one_does_nothing(
    client, make_user, tenant, plan, model, action, status
):
    viewer = make_user("viewer@opsdeck.example", is_staff=True)
    for name in ["view_subscription", "view_invoice"]:
        viewer.user_permissions.add(Permission.objects.get(codename=name))
    client.force_login(viewer)
    if model is Subscription:
        row = Subscription.objects.create(tenant=tenant, plan=plan, status=status)
    else:
        row = Invoice.objects.create(tenant=tenant, plan=plan, period="2026-10", currency="usd")

    listed = client.get(_changelist(model)).content.decode()
    client.post(_changelist(model), {"action": action, "_selected_action": [row.pk]})

    assert client.get(_changelist(model)).status_code == 200  # they do see the rows
    assert f'value="{action}"' not in listed and 'name="action"' not in listed
    assert model.objects.get().status == status
    assert not AuditEvent.objects.filter(action__endswith=f".{action}").exists()


def test_an_action_the_status_does_not_allow_is_reported_not_applied(staff_client, tenant, plan):
    subscription = Subscription.objects.create(tenant=tenant, plan=plan, status="active")

    page = _act(staff_client, "approve", subscription)

    assert "A subscription that is active cannot be approved." in page.content.decode()
    assert Subscription.objects.get().status == "active"


def test_the_subscription_list_filters_by_status_and_plan(staff_client, tenant, plan):
    Subscription.objects.create(tenant=tenant, plan=plan, status="suspended")

    page = staff_client.get(_changelist(Subscription) + "?status__exact=suspended")

    assert page.status_code == 200
    assert "Acme" in page.content.decode()


def _add_override(
    staff_client, tenant, plan, effective_from, limits='{"max_instances": 9}',
    prices='{"cpu": "0.02"}',
):  # fmt: skip
    return staff_client.post(
        reverse("admin:billing_planoverride_add"),
        {
            "tenant": tenant.pk,
            "plan": plan.pk,
            "effective_from_0": effective_from.strftime("%Y-%m-%d"),
            "effective_from_1": effective_from.strftime("%H:%M:%S"),
            "limits": limits,
            "prices": prices,
            "note": "pilot",
        },
    )


def test_staff_add_an_override_from_now_on_and_it_is_audited(staff_client, tenant, plan):
    response = _add_override(staff_client, tenant, plan, timezone.now() + timedelta(hours=1))

    assert response.status_code == 302
    override = PlanOverride.objects.get()
    assert override.limits == {"max_instances": 9}
    assert override.created_by.email == "staff@example.com"
    assert AuditEvent.objects.get(action="plan_override.create").actor_kind == "staff"


def test_an_override_in_a_closed_period_or_with_unknown_limits_is_refused_beside_the_field(
    staff_client, tenant, plan
):
    closed = _add_override(staff_client, tenant, plan, periods.current_start() - timedelta(days=3))
    unknown = _add_override(
        staff_client, tenant, plan, timezone.now() + timedelta(hours=1), limits='{"bogus": 1}'
    )

    assert "closed billing period" in closed.content.decode()
    assert "Unknown limit bogus" in unknown.content.decode()
    assert not PlanOverride.objects.exists()


@pytest.mark.parametrize(
    "price,why",
    [("1e20", "plain digits"), ("1_000", "plain digits"), ("-1", "plain digits"),
     ("99999999999", "no more than 10 digits before the decimal point"),
     ("0.0000000001", "no more than 8 decimal places")],
)  # fmt: skip
def test_an_override_price_that_invoices_could_not_hold_is_refused_beside_the_field(
    staff_client, tenant, plan, price, why
):
    # Accepted, 1e20 made the month's close fail for every organization: no invoices.
    refused = _add_override(
        staff_client,
        tenant,
        plan,
        timezone.now() + timedelta(hours=1),
        prices=f'{{"cpu": "{price}"}}',
    )

    page = html.unescape(refused.content.decode())
    assert refused.status_code == 200
    assert f'"{price}" for cpu is not a price' in page and why in page
    assert not PlanOverride.objects.exists()
    # A number as JSON writes it, within bounds, is a price.
    taken = _add_override(
        staff_client, tenant, plan, timezone.now() + timedelta(hours=1), prices='{"cpu": 0.0125}'
    )
    assert taken.status_code == 302 and PlanOverride.objects.get().prices == {"cpu": "0.0125"}


def test_a_second_override_from_the_same_moment_or_pricing_what_the_plan_does_not_is_refused(
    staff_client, tenant, plan
):
    moment = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    _add_override(staff_client, tenant, plan, moment)

    again = _add_override(staff_client, tenant, plan, moment, limits='{"max_instances": 3}')
    unpriced = _add_override(
        staff_client, tenant, plan, moment + timedelta(hours=1), prices='{"storage": "0.01"}'
    )

    assert "Another override of this organization&#x27;s plan starts at this moment" in (
        again.content.decode()
    )
    assert "The Hobby plan does not price storage; it prices cpu." in unpriced.content.decode()
    assert PlanOverride.objects.get().limits == {"max_instances": 9}


@pytest.mark.django_db(transaction=True)
def test_a_double_submitted_override_adds_one_and_the_other_says_only_why_it_was_not(
    make_user, tenant, plan
):
    staff = make_user("staff@example.com", is_staff=True, is_superuser=True)
    moment = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)

    def submit():
        page = Client()
        page.force_login(staff)
        response = _add_override(page, tenant, plan, moment)
        return (
            page.get(response["Location"]).content.decode()
            if response.status_code == 302
            else (response.content.decode())
        )

    pages = race(submit, times=2)

    assert PlanOverride.objects.count() == 1
    added = [p for p in pages if "was added successfully" in p]
    refused = [p for p in pages if "starts at this moment" in p]
    assert len(added) + len(refused) == 2, pages
    assert not [p for p in refused if "was added successfully" in p]
    # Nothing is logged as added but the one override.
    assert list(LogEntry.objects.values_list("object_id", flat=True)) == [
        str(PlanOverride.objects.get().pk)
    ]


def test_the_override_list_makes_as_many_queries_for_many_overrides_as_for_few(
    staff_client, make_user, tenant, plan
):
    def overrides(count):
        for n in range(PlanOverride.objects.count(), count):
            PlanOverride.objects.create(
                tenant=tenant, plan=plan, effective_from=timezone.now() + timedelta(days=n + 1),
                created_by=make_user(f"staff{n}@example.com", is_staff=True), note=f"n{n}",
            )  # fmt: skip

    overrides(2)
    staff_client.get(_changelist(PlanOverride))
    with CaptureQueriesContext(connection) as few:
        staff_client.get(_changelist(PlanOverride))
    overrides(8)
    with CaptureQueriesContext(connection) as many:
        page = staff_client.get(_changelist(PlanOverride)).content.decode()

    assert len(many.captured_queries) == len(few.captured_queries)
    assert all(f"staff{n}@example.com" in page for n in range(8))


def test_with_stripe_billing_an_override_sets_limits_but_no_prices(staff_client, tenant, plan,
                                                                   settings):  # fmt: skip
    settings.STRIPE_API_KEY = "sk_test_opsdeck_admin"
    later = timezone.now() + timedelta(hours=1)

    priced = _add_override(staff_client, tenant, plan, later)
    limits_only = _add_override(staff_client, tenant, plan, later, prices="{}")

    assert "never on its invoices" in priced.content.decode()
    assert limits_only.status_code == 302
    assert PlanOverride.objects.get().prices == {}


def test_an_override_moved_onto_anothers_moment_is_refused_beside_the_field(
    staff_client, tenant, plan
):
    first = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    _add_override(staff_client, tenant, plan, first)
    _add_override(staff_client, tenant, plan, first + timedelta(hours=1), prices="{}")
    later = PlanOverride.objects.get(effective_from=first + timedelta(hours=1))

    response = staff_client.post(
        reverse("admin:billing_planoverride_change", args=[later.pk]),
        {
            "effective_from_0": first.strftime("%Y-%m-%d"),
            "effective_from_1": first.strftime("%H:%M:%S"),
            "limits": "{}", "prices": "{}", "note": "moved",
        },
    )  # fmt: skip

    html = response.content.decode()
    assert response.status_code == 200 and "was changed successfully" not in html
    assert "Another override of this organization&#x27;s plan starts at this moment" in html
    later.refresh_from_db()
    assert later.effective_from == first + timedelta(hours=1) and later.note == "pilot"


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ('{"max_instances": -5}', "max_instances must be a whole number of at least 0"),
        ('{"max_instances": 1.5}', "max_instances must be a whole number of at least 0"),
        ('{"max_instances": true}', "max_instances must be a whole number of at least 0"),
        ('{"max_instances": NaN}', "max_instances must be a whole number of at least 0"),
        ('{"max_total": {"storage": 1e400}}', "the Hobby plan has no dimension storage"),
        ('{"max_total": {"cpu": 1e400}}', "max_total.cpu must be a number of at least 0"),
        ('{"max_per_instance": {"cpu": -1}}', "max_per_instance.cpu must be a number of at least"),
        ('{"max_backup_retention_days": -3}', "max_backup_retention_days must be a whole number"),
        ('{"denied_verbs": ["delete"]}', "delete cannot be denied"),
        ('{"denied_verbs": ["modify", "stop", "deleteBackup"]}', "deleteBackup, stop cannot be"),
        ('{"cells": "eu"}', "cells must be a list of cell names"),
        ('{"cells": []}', "cells must name at least one cell"),
    ],
)
def test_an_override_with_limits_billing_cannot_hold_is_refused_beside_the_field(
    staff_client, tenant, plan, limits, said
):
    response = _add_override(
        staff_client, tenant, plan, timezone.now() + timedelta(hours=1), limits=limits
    )

    assert response.status_code == 200 and said in response.content.decode()
    assert not PlanOverride.objects.exists()


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ('{"denied_verbs": ["frobnicate"]}', "the PostgreSQL plan has no verb frobnicate; it has"),
        ('{"denied_verbs": ["Stop"]}', "the PostgreSQL plan has no verb Stop"),
        ('{"cells": ["nowhere"]}', "cells: there is no cell nowhere; there are eu-1."),
    ],
)
def test_an_override_naming_verbs_or_cells_the_plan_lacks_is_refused(
    staff_client, tenant, limits, said
):
    from tests.deployments import factories

    plan = factories.postgres_version().plan
    factories.cell("eu-1")

    response = _add_override(
        staff_client, tenant, plan, timezone.now() + timedelta(hours=1), limits=limits, prices="{}"
    )

    assert response.status_code == 200 and said in response.content.decode()
    assert not PlanOverride.objects.exists()
    accepted = _add_override(
        staff_client, tenant, plan, timezone.now() + timedelta(hours=2),
        limits='{"denied_verbs": ["failover", "restore.pointInTime"], "cells": ["eu-1"]}',
        prices="{}",
    )  # fmt: skip
    assert accepted.status_code == 302, accepted.content.decode()[-2000:]


def test_staff_see_a_plans_past_prices_in_as_many_queries_for_many_as_for_few(
    staff_client, plan, tenant
):
    hour = datetime(2026, 1, 5, tzinfo=UTC)
    UsageRecord.objects.create(
        tenant=tenant, plan=plan, instance_id="inst-aaaaaaaa", instance_name="a",
        dimension="cpu", hour=hour, quantity=Decimal(1), period="2026-01",
    )  # fmt: skip
    months = iter(range(1, 12))

    def change(cents, dimension="cpu"):  # one a month: each applies from the next
        return plan_prices_replace(
            plan=plan, currency="usd", at=hour.replace(month=next(months)),
            prices=[{"dimension": dimension, "unit": "core", "unit_price": f"0.{cents:02d}"}],
        )  # fmt: skip

    assert change(6) and change(7, dimension="memory")  # cpu 0.05 -> 0.06; memory priced anew
    staff_client.get(_changelist(PastPrice))
    with CaptureQueriesContext(connection) as few:
        staff_client.get(_changelist(PastPrice))
    for cents in range(8, 14):
        change(cents, dimension="memory")
    with CaptureQueriesContext(connection) as many:
        page = staff_client.get(_changelist(PastPrice)).content.decode()

    assert len(many.captured_queries) == len(few.captured_queries)
    assert PastPrice.objects.count() == 9
    assert "0.05000000" in page and "0.12000000" in page  # what cpu, then memory, cost before
    assert "free (not priced)" in page  # memory before the plan priced it
    # Kept by the services alone: staff read them, and change nothing.
    assert staff_client.get(reverse("admin:billing_pastprice_add")).status_code == 403


@pytest.mark.django_db
def test_the_subscription_list_makes_as_many_queries_for_many_awaiting_payment_as_for_few(
    staff_client, owner, settings
):
    """While Stripe bills tenants a pending subscription reads "Awaiting payment", which asks
    whether its plan has a price in effect: once for the page, not twice a row."""
    from accounts import services as account_services
    from accounts.audit import Actor

    settings.STRIPE_API_KEY = "sk_test_opsdeck_billing"
    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))

    def pending(count):
        for n in range(Subscription.objects.count(), count):
            tenant = account_services.tenant_create(actor=Actor(user=owner), name=f"Org {n:02}")
            Subscription.objects.create(tenant=tenant, plan=plan, status="pending")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            page = staff_client.get("/admin/billing/subscription/").content.decode()
        assert page.count("Awaiting payment") >= Subscription.objects.count()
        return len(captured)

    pending(2)
    few = queries()
    pending(12)

    assert queries() == few


@pytest.mark.django_db
def test_the_admins_invoice_list_writes_a_yen_total_in_whole_yen(staff_client, tenant):
    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    Invoice.objects.create(tenant=tenant, plan=plan, period="2026-10", currency="jpy", total=17)

    page = staff_client.get("/admin/billing/invoice/").content.decode()

    assert '<td class="field-amount">17</td>' in page
