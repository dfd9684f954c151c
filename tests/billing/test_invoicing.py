"""Closing a billing period into draft invoices, and staff finalizing (numbering, freezing),
voiding and settling them."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import DatabaseError, transaction
from django.urls import reverse

from accounts.audit import SYSTEM, Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Tenant
from billing import invoicing, usage
from billing.models import (
    BillingPeriod,
    Invoice,
    InvoiceLine,
    MeteredHour,
    Plan,
    PlanOverride,
    Price,
    Subscription,
    UsageRecord,
)
from billing.usage import UsageRow
from tests.concurrency import race

NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
DECEMBER = datetime(2026, 12, 1, tzinfo=UTC)
AFTER = DECEMBER + timedelta(hours=2)  # when the period may be closed


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    for dimension, unit, time_unit, price in [
        ("cpu", "core", "hour", "0.035"),
        ("storage", "GiB", "hour", "0.00014"),
        ("backupStorage", "GiB", "month", "0.02"),
    ]:
        Price.objects.create(
            plan=plan, dimension=dimension, unit=unit, time_unit=time_unit,
            unit_price=Decimal(price), currency="usd",
        )  # fmt: skip
    return plan


@pytest.fixture
def staff(make_user):
    user = make_user("finance@opsdeck.example")
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return Actor(user=user, staff=True)


def _metered(start=NOVEMBER, end=DECEMBER, *, skip=()):
    hours, hour = [], start
    while hour < end:
        if hour not in skip:
            hours.append(MeteredHour(hour=hour))
        hour += usage.HOUR
    MeteredHour.objects.bulk_create(hours, ignore_conflicts=True)


def _use(tenant, plan, hour, instance="inst-aaaaaaaa", **quantities):
    rows = [
        UsageRow(
            tenant_id=tenant.pk,
            plan_id=plan.pk,
            instance_id=instance,
            instance_name=f"db-{instance[-4:]}",
            dimension=dimension,
            unit="",
            quantity=Decimal(quantity),
        )
        for dimension, quantity in quantities.items()
    ]
    return usage.record(hour, rows)


def _line(invoice, dimension, instance="inst-aaaaaaaa", adjustment_of=""):
    return invoice.lines.get(dimension=dimension, instance_id=instance, adjustment_of=adjustment_of)


# --- closing a period ---


def test_a_closed_period_makes_one_draft_per_tenant_and_plan_with_a_line_per_instance_and_dimension(
    tenant, plan, make_user
):
    other = Tenant.objects.create(name="Other", slug="other-x1y2z3")
    # 2 cores for 10 hours and 3 hours at 1.5 cores: 24.5 core-hours; 10 GiB for 13 hours.
    for i in range(10):
        _use(tenant, plan, NOVEMBER + usage.HOUR * i, cpu="2", storage="10")
    for i in range(10, 13):
        _use(tenant, plan, NOVEMBER + usage.HOUR * i, cpu="1.5", storage="10")
    _use(tenant, plan, NOVEMBER + usage.HOUR * 14, instance="inst-bbbbbbbb", cpu="1", replica="1")
    _use(other, plan, NOVEMBER + usage.HOUR * 20, instance="inst-cccccccc", cpu="4")
    _metered()

    closed = invoicing.period_close("2026-11", now=AFTER)

    assert {(i.tenant, i.plan, i.status) for i in closed.invoices} == {
        (tenant, plan, "draft"), (other, plan, "draft"),
    }  # fmt: skip
    invoice = Invoice.objects.get(tenant=tenant)
    cpu = _line(invoice, "cpu")
    assert (cpu.quantity, cpu.unit, cpu.unit_price, cpu.amount) == (
        Decimal("24.5"), "core", Decimal("0.035"), Decimal("0.86"),  # 0.8575 rounded half up
    )  # fmt: skip
    storage = _line(invoice, "storage")
    assert (storage.quantity, storage.amount) == (Decimal(130), Decimal("0.02"))  # 0.0182
    assert _line(invoice, "cpu", "inst-bbbbbbbb").amount == Decimal("0.04")  # 0.035
    assert not invoice.lines.filter(dimension="replica").exists()  # not priced: free
    assert invoice.total == Decimal("0.92") == sum(line.amount for line in invoice.lines.all())
    assert Invoice.objects.get(tenant=other).total == Decimal("0.14")
    assert BillingPeriod.objects.get(key="2026-11").closed_at == AFTER


def test_a_monthly_price_is_spread_over_730_hours(tenant, plan):
    _use(tenant, plan, NOVEMBER, backupStorage="730000")  # 1,000 GiB-months in one hour
    _metered()

    invoice = invoicing.period_close("2026-11", now=AFTER).invoices[0]

    line = _line(invoice, "backupStorage")
    assert line.amount == Decimal("20.00")
    assert line.unit_price == (Decimal("0.02") / 730).quantize(Decimal("1e-12"))


def test_amounts_in_a_zero_decimal_currency_are_whole(tenant, plan):
    plan.prices.update(currency="jpy", unit_price=Decimal("5.5"))
    _use(tenant, plan, NOVEMBER, cpu="3")  # 16.5 yen
    _metered()

    invoice = invoicing.period_close("2026-11", now=AFTER).invoices[0]

    assert (invoice.currency, invoice.total) == ("jpy", Decimal(17))


def test_a_period_is_not_closed_before_it_ends(tenant, plan):
    with pytest.raises(ValidationError, match="not ended yet: it can be closed from 2026-12-01"):
        invoicing.period_close("2026-11", now=DECEMBER - timedelta(minutes=1))
    assert not BillingPeriod.objects.filter(closed_at__isnull=False).exists()


def test_a_period_with_an_unmetered_hour_is_not_closed(tenant, plan):
    _use(tenant, plan, NOVEMBER, cpu="1")
    gap = NOVEMBER + timedelta(days=3, hours=5)
    _metered(skip={gap, gap + usage.HOUR})

    missing = r"2 hours of 2026-11 are not metered yet \(the first: 2026-11-04 05:00 UTC\)"
    with pytest.raises(ValidationError, match=missing):
        invoicing.period_close("2026-11", now=AFTER)

    assert not Invoice.objects.exists()
    assert not BillingPeriod.objects.filter(closed_at__isnull=False).exists()


def test_a_period_stripe_bills_is_not_closed_where_stripe_is_not_configured(tenant, plan, settings):
    """Its records not yet sent to Stripe's meters would be invoiced here and charged again by
    Stripe once the workers, which have the Stripe settings, sent them."""
    settings.STRIPE_API_KEY = ""
    other = Tenant.objects.create(name="Other", slug="other-x1y2z3")
    Subscription.objects.filter(tenant=tenant, plan=plan).update(stripe_subscription_id="sub_1")
    _use(tenant, plan, NOVEMBER, cpu="1")
    _use(other, plan, NOVEMBER, instance="inst-cccccccc", cpu="4")
    _metered()

    with pytest.raises(ValidationError, match=r"Stripe bills 1 subscription with usage in 2026-11, "
                       r"but Stripe is not configured here"):  # fmt: skip
        invoicing.period_close("2026-11", now=AFTER)

    assert not Invoice.objects.exists()
    assert not BillingPeriod.objects.filter(closed_at__isnull=False).exists()
    # Once that subscription is billed locally again, the period closes here.
    Subscription.objects.filter(tenant=tenant, plan=plan).update(stripe_subscription_id="")
    assert len(invoicing.period_close("2026-11", now=AFTER).invoices) == 2


def test_a_period_closes_once(tenant, plan):
    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)

    with pytest.raises(ValidationError, match="The period 2026-11 was closed on 2026-12-01"):
        invoicing.period_close("2026-11", now=AFTER)
    assert Invoice.objects.count() == 1


def test_two_closes_at_once_make_one_set_of_invoices(transactional_db, tenant, plan):
    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()

    results = race(lambda: invoicing.period_close("2026-11", now=AFTER))

    assert sum(isinstance(r, invoicing.Closed) for r in results) == 1
    assert all(isinstance(r, invoicing.Closed | ValidationError) for r in results), results
    assert Invoice.objects.count() == 1


def test_usage_metered_after_its_period_closed_is_an_adjustment_line_of_the_next_one(tenant, plan):
    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    # The last hour of November is metered again with an instance it had missed.
    late = DECEMBER - usage.HOUR
    _use(tenant, plan, late, instance="inst-dddddddd", cpu="2")
    _use(tenant, plan, DECEMBER, instance="inst-dddddddd", cpu="2")
    _metered(DECEMBER, datetime(2027, 1, 1, tzinfo=UTC))

    (invoice,) = invoicing.period_close("2026-12", now=datetime(2027, 1, 1, 1, tzinfo=UTC)).invoices

    assert invoice.period == "2026-12"
    adjustment = _line(invoice, "cpu", "inst-dddddddd", adjustment_of="2026-11")
    assert (adjustment.quantity, adjustment.amount) == (Decimal(2), Decimal("0.07"))
    assert _line(invoice, "cpu", "inst-dddddddd").quantity == Decimal(2)
    assert Invoice.objects.get(period="2026-11").total == Decimal("0.04")  # unchanged


def test_the_beat_task_closes_the_month_just_ended_once_it_is_metered(tenant, plan, caplog):
    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered(skip={DECEMBER - usage.HOUR})

    assert invoicing.period_close_due(now=AFTER) == []  # an hour is still unmetered
    assert "still open" not in caplog.text  # the last hours' metering may still come
    assert invoicing.period_close_due(now=DECEMBER + timedelta(hours=7)) == []
    assert "billing period 2026-11 is still open: 1 hour of 2026-11 is not metered" in (caplog.text)
    _metered()
    assert [closed.period for closed in invoicing.period_close_due(now=AFTER)] == ["2026-11"]
    assert invoicing.period_close_due(now=AFTER) == []  # closed already


def test_a_month_left_open_is_closed_by_a_later_run_once_metered(tenant, plan, caplog):
    # November's last hour was never metered, so November stayed open while December ended.
    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered(skip={DECEMBER - usage.HOUR})
    january = datetime(2027, 1, 1, tzinfo=UTC)
    _use(tenant, plan, DECEMBER, cpu="2")
    _metered(DECEMBER, january)
    in_january = january + timedelta(hours=7)

    assert [c.period for c in invoicing.period_close_due(now=in_january)] == ["2026-12"]
    assert "billing period 2026-11 is still open: 1 hour of 2026-11 is not metered" in caplog.text

    _metered()  # the missing hour, backfilled
    (closed,) = invoicing.period_close_due(now=in_january + usage.HOUR)

    assert closed.period == "2026-11"
    assert [invoice.total for invoice in closed.invoices] == [Decimal("0.04")]
    assert invoicing.period_close_due(now=in_january + 2 * usage.HOUR) == []


@pytest.mark.parametrize(
    "bad",
    ["2026-13", "2026-1", "november", "", "2026-11-01", "\uff12\uff10\uff12\uff16-11",
     "\u0662\u0660\u0662\u0666-11"],  # and the year in fullwidth, or Arabic-Indic, digits
)  # fmt: skip
def test_a_period_must_be_a_month(bad, db):
    with pytest.raises(ValidationError, match="not a billing period: write the month as YYYY-MM"):
        invoicing.period_close(bad, now=AFTER)


def test_the_command_closes_a_period_and_says_what_it_made(tenant, plan, capsys):
    october = datetime(2026, 10, 1, tzinfo=UTC)
    _use(tenant, plan, october, cpu="10")
    _metered(october, NOVEMBER)
    BillingPeriod.objects.create(key="2026-09", closed_at=october)

    with pytest.raises(CommandError, match="The period 2026-09 was closed on 2026-10-01"):
        call_command("close_billing_period", "--period", "2026-09")
    with pytest.raises(CommandError, match="is not a billing period"):
        call_command("close_billing_period", "--period", "October")
    call_command("close_billing_period", "--period", "2026-10")

    out = capsys.readouterr().out
    assert "Closed 2026-10: 1 draft invoice(s)." in out
    assert f"{tenant.slug} · pg: 0.35 USD" in out


# --- finalize, void, paid ---


@pytest.fixture
def drafts(tenant, plan):
    tenants = [tenant] + [
        Tenant.objects.create(name=f"T{i}", slug=f"t{i}-abcdef") for i in range(3)
    ]
    for i, owner in enumerate(tenants):
        _use(owner, plan, NOVEMBER, instance=f"inst-{i:08d}", cpu=str(i + 1))
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    return list(Invoice.objects.order_by("tenant_id"))


def test_finalized_invoices_are_numbered_in_order_without_gaps(drafts, staff):
    first = invoicing.invoice_finalize(actor=staff, invoice=drafts[0])
    with pytest.raises(ValidationError, match="is finalized"):
        invoicing.invoice_finalize(actor=staff, invoice=drafts[0])  # takes no number
    invoicing.invoice_void(actor=staff, invoice=drafts[1])  # a voided draft takes none either
    second = invoicing.invoice_finalize(actor=staff, invoice=drafts[2])

    assert (first.number, first.status) == ("2026-000001", "open")
    assert second.number == "2026-000002"
    event = AuditEvent.objects.get(action="invoice.finalize", target_id=str(first.pk))
    assert event.payload == {"number": "2026-000001", "total": "0.04"}
    assert event.actor_kind == "staff"


def test_invoices_finalized_at_once_take_consecutive_numbers(transactional_db, drafts, staff):
    pending = iter(drafts)

    results = race(lambda: invoicing.invoice_finalize(actor=staff, invoice=next(pending)))

    assert sorted(r.number for r in results) == [f"2026-00000{i}" for i in range(1, 5)]


def test_a_finalized_invoice_is_frozen_by_the_database(drafts, staff):
    invoice = invoicing.invoice_finalize(actor=staff, invoice=drafts[0])
    line = invoice.lines.get()

    for change in (
        lambda: Invoice.objects.filter(pk=invoice.pk).update(total=Decimal("0.01")),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(number="2026-000099"),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(discount=Decimal("0.01")),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(tax=Decimal("0.01")),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(status="draft"),
        lambda: Invoice.objects.filter(pk=invoice.pk).delete(),
        lambda: InvoiceLine.objects.filter(pk=line.pk).update(amount=Decimal(0)),
        lambda: InvoiceLine.objects.filter(pk=line.pk).delete(),
        lambda: InvoiceLine.objects.create(
            invoice=invoice, dimension="cpu", quantity=1, unit_price=1, amount=1
        ),
    ):
        with pytest.raises(DatabaseError, match="finalized"), transaction.atomic():
            change()

    invoice.refresh_from_db()
    assert (invoice.total, invoice.number, invoice.lines.count()) == (
        Decimal("0.04"), "2026-000001", 1,
    )  # fmt: skip
    # A draft stays editable (staff may correct one before finalizing).
    InvoiceLine.objects.filter(invoice=drafts[1]).update(amount=Decimal(1))


def test_a_finalized_invoice_can_be_paid_or_voided_but_a_paid_one_not_voided(drafts, staff):
    paid = invoicing.invoice_finalize(actor=staff, invoice=drafts[0])
    invoicing.invoice_mark_paid(actor=staff, invoice=paid)
    voided = invoicing.invoice_finalize(actor=staff, invoice=drafts[1])
    invoicing.invoice_void(actor=staff, invoice=voided)

    with pytest.raises(ValidationError, match="only a draft or an unpaid invoice can be voided"):
        invoicing.invoice_void(actor=staff, invoice=paid)
    with pytest.raises(ValidationError, match="only a finalized, unpaid invoice can be marked"):
        invoicing.invoice_mark_paid(actor=staff, invoice=drafts[2])
    assert Invoice.objects.get(pk=paid.pk).status == "paid"
    assert Invoice.objects.get(pk=voided.pk).number == "2026-000002"  # a voided one keeps it


@pytest.mark.parametrize("who", ["member", "system"])
def test_only_staff_finalize_and_the_refusal_is_audited(drafts, owner, who):
    actor = Actor(user=owner) if who == "member" else SYSTEM

    with pytest.raises(ActionDenied, match="Only platform staff"):
        invoicing.invoice_finalize(actor=actor, invoice=drafts[0])

    assert Invoice.objects.get(pk=drafts[0].pk).status == "draft"
    assert AuditEvent.objects.filter(action="invoice.finalize", result="denied").count() == 1


def test_usage_records_are_untouched_by_closing(tenant, plan):
    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    before = list(UsageRecord.objects.values_list("pk", "period", "quantity"))

    invoicing.period_close("2026-11", now=AFTER)

    assert list(UsageRecord.objects.values_list("pk", "period", "quantity")) == before


def test_staff_finalize_drafts_from_the_admin_and_cannot_edit_them(client, drafts, make_user):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    url = reverse("admin:billing_invoice_changelist")

    listing = client.get(url)
    response = client.post(
        url,
        {"action": "finalize", "_selected_action": [drafts[0].pk, drafts[1].pk]},
        follow=True,
    )
    detail = client.get(reverse("admin:billing_invoice_change", args=[drafts[0].pk]))

    assert listing.status_code == 200 and "Draft 2026-11" in listing.content.decode()
    assert "Finalized: 2." in response.content.decode()
    assert sorted(Invoice.objects.exclude(number=None).values_list("number", flat=True)) == [
        "2026-000001", "2026-000002",
    ]  # fmt: skip
    assert AuditEvent.objects.filter(action="invoice.finalize", actor_kind="staff").count() == 2
    assert b'type="submit" value="Save"' not in detail.content
    assert "inst-00000000" in detail.content.decode()  # the lines, read-only


# --- overrides ---


def _override(tenant, plan, starts, **prices):
    return PlanOverride.objects.create(
        tenant=tenant, plan=plan, effective_from=starts, prices=prices
    )


def test_usage_billed_late_is_priced_at_the_override_in_effect_when_it_was_used(tenant, plan):
    from billing import reports

    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    _override(tenant, plan, DECEMBER, cpu="0")  # free from December on
    # November's last hour, metered again after it closed: 10 cores at November's price.
    _use(tenant, plan, DECEMBER - usage.HOUR, instance="inst-dddddddd", cpu="10")
    _use(tenant, plan, DECEMBER, instance="inst-dddddddd", cpu="10")
    _metered(DECEMBER, datetime(2027, 1, 1, tzinfo=UTC))
    so_far = reports.period_cost(tenant, "2026-12")

    (invoice,) = invoicing.period_close("2026-12", now=datetime(2027, 1, 1, 1, tzinfo=UTC)).invoices

    late = _line(invoice, "cpu", "inst-dddddddd", adjustment_of="2026-11")
    assert (late.unit_price, late.amount) == (Decimal("0.035"), Decimal("0.35"))
    assert _line(invoice, "cpu", "inst-dddddddd").amount == Decimal(0)
    (usd,) = so_far.currencies
    assert invoice.total == usd.total == Decimal("0.35")


def test_the_cost_so_far_rounds_late_usage_apart_as_the_invoice_does(tenant, plan):
    from billing import reports

    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    # 0.1 core-hour of November billed late and 0.1 of December: 0.0035 USD each, which rounds
    # to 0.00 on each of the invoice's two lines, but to 0.01 once added up.
    _use(tenant, plan, DECEMBER - usage.HOUR, instance="inst-dddddddd", cpu="0.1")
    _use(tenant, plan, DECEMBER, instance="inst-dddddddd", cpu="0.1")
    _metered(DECEMBER, datetime(2027, 1, 1, tzinfo=UTC))
    (usd,) = reports.period_cost(tenant, "2026-12").currencies

    (invoice,) = invoicing.period_close("2026-12", now=datetime(2027, 1, 1, 1, tzinfo=UTC)).invoices

    assert invoice.lines.count() == 2
    assert usd.total == invoice.total == Decimal("0.00")


def test_the_chart_shows_usage_billed_late_in_a_column_of_its_own(tenant, plan):
    from billing import reports

    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    # 10 core-hours of November's last hour, metered after it closed (0.35), and one of the
    # 2nd of December (0.035 → 0.04 on its own line).
    _use(tenant, plan, DECEMBER - usage.HOUR, instance="inst-dddddddd", cpu="10")
    _use(tenant, plan, DECEMBER + timedelta(days=1), instance="inst-dddddddd", cpu="1")
    _metered(DECEMBER, datetime(2027, 1, 1, tzinfo=UTC))

    (usd,) = reports.period_cost(tenant, "2026-12").currencies

    assert usd.total == Decimal("0.39")
    assert usd.chart["labels"][:3] == ["Used earlier", "01 Dec", "02 Dec"]
    assert len(usd.chart["labels"]) == 32
    (cpu,) = usd.chart["series"]
    # Each column holds what was used in it: the late hour is not spread over December's days.
    assert cpu["values"][:3] == [0.35, 0.0, 0.04] and sum(cpu["values"][3:]) == 0
    assert usd.chart["rows"][0] == ["Used earlier", ["0.35"]]


def test_a_period_of_late_usage_alone_charts_it_and_no_day(tenant, plan):
    from billing import reports

    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    _use(tenant, plan, DECEMBER - usage.HOUR, instance="inst-dddddddd", cpu="10")
    _metered(DECEMBER, datetime(2027, 1, 1, tzinfo=UTC))

    (usd,) = reports.period_cost(tenant, "2026-12").currencies

    (cpu,) = usd.chart["series"]
    assert cpu["values"][0] == 0.35 and not any(cpu["values"][1:])


def test_a_period_without_late_usage_has_no_earlier_column(tenant, plan):
    from billing import reports

    _use(tenant, plan, NOVEMBER + timedelta(days=1), cpu="1")

    (usd,) = reports.period_cost(tenant, "2026-11").currencies

    assert usd.chart["labels"][0] == "01 Nov" and len(usd.chart["labels"]) == 30


JANUARY = datetime(2027, 1, 1, tzinfo=UTC)
FEBRUARY = datetime(2027, 2, 1, tzinfo=UTC)


def _prices(plan, at, **unit_prices):
    """The plan's prices replaced at `at`, as `load_specs` replaces them (each hourly)."""
    from billing import services

    units = {"cpu": "core", "storage": "GiB", "memory": "GiB"}
    prices = [{"dimension": d, "unit": units[d], "unit_price": v} for d, v in unit_prices.items()]
    return services.plan_prices_replace(plan=plan, currency="usd", at=at, prices=prices)


def test_a_price_change_applies_from_the_next_month_and_never_to_the_one_under_way(tenant, plan):
    _use(tenant, plan, NOVEMBER, cpu="100")
    _metered()
    # After November ended, before it closed: doubled, from January on.
    _prices(plan, DECEMBER + timedelta(minutes=30), cpu="0.07", storage="0.00014")
    _use(tenant, plan, DECEMBER, instance="inst-bbbbbbbb", cpu="100")
    _use(tenant, plan, DECEMBER + timedelta(days=20), instance="inst-bbbbbbbb", cpu="100")
    _use(tenant, plan, JANUARY, instance="inst-bbbbbbbb", cpu="100")

    (november,) = invoicing.period_close("2026-11", now=AFTER).invoices
    _metered(DECEMBER, FEBRUARY)
    (december,) = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices
    (january,) = invoicing.period_close("2027-01", now=FEBRUARY + usage.HOUR).invoices

    assert november.total == Decimal("3.50")  # 100 x 0.035, not 0.07
    # December, under way when the price changed, is billed at the price it began with.
    assert [(line.quantity, line.unit_price) for line in december.lines.all()] == [
        (Decimal(200), Decimal("0.035"))
    ]
    assert december.total == Decimal("7.00")
    assert [(line.quantity, line.unit_price) for line in january.lines.all()] == [
        (Decimal(100), Decimal("0.07"))
    ]


def test_prices_changed_twice_in_a_month_leave_it_at_its_first_and_the_last_applies_next(
    tenant, plan
):
    from billing import reports
    from billing.models import PastPrice

    tenth, twentieth = NOVEMBER + timedelta(days=9), NOVEMBER + timedelta(days=19)
    for hour in (NOVEMBER, tenth, twentieth, DECEMBER):
        _use(tenant, plan, hour, cpu="10")
    _prices(plan, tenth, cpu="0.05", storage="0.00014")
    _prices(plan, twentieth, cpu="0.07", storage="0.00014")
    _metered(NOVEMBER, JANUARY)

    (november,) = invoicing.period_close("2026-11", now=AFTER).invoices
    (december,) = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices

    assert [(line.quantity, line.unit_price) for line in november.lines.all()] == [
        (Decimal(30), Decimal("0.035"))
    ]
    # 0.05 never applied to an hour: only the price November began with is kept.
    assert list(PastPrice.objects.filter(dimension="cpu").values_list("unit_price", "until")) == [
        (Decimal("0.035"), DECEMBER)
    ]
    assert [(line.quantity, line.unit_price) for line in december.lines.all()] == [
        (Decimal(10), Decimal("0.07"))
    ]
    assert reports.period_cost(tenant, "2026-12").currencies[0].total == Decimal("0.70")


def test_a_price_change_taken_back_within_the_month_leaves_nothing_coming(tenant, plan):
    from billing.models import PastPrice

    _use(tenant, plan, NOVEMBER, cpu="10")
    _prices(plan, NOVEMBER + timedelta(days=9), cpu="0.07", storage="0.00014")
    _prices(plan, NOVEMBER + timedelta(days=19), cpu="0.035", storage="0.00014")

    # Only the end of backup storage's price is still coming (neither change priced it).
    assert list(PastPrice.objects.values_list("dimension", flat=True)) == ["backupStorage"]
    assert Price.objects.get(plan=plan, dimension="cpu").unit_price == Decimal("0.035")


def test_a_plan_not_used_yet_takes_changed_prices_at_once(tenant, plan):
    from billing.models import PastPrice

    _prices(plan, NOVEMBER + timedelta(days=9), cpu="0.07", storage="0.00014")
    _use(tenant, plan, NOVEMBER, cpu="10")  # metered late: priced as the plan is now
    _metered()

    (invoice,) = invoicing.period_close("2026-11", now=AFTER).invoices

    assert not PastPrice.objects.exists()
    assert invoice.total == Decimal("0.70")


def test_a_plans_new_currency_applies_from_the_month_its_new_prices_do(tenant, plan):
    from billing import services

    _use(tenant, plan, NOVEMBER, cpu="10")
    services.plan_prices_replace(
        plan=plan, currency="eur", at=NOVEMBER + timedelta(days=9),
        prices=[{"dimension": "cpu", "unit": "core", "unit_price": "0.035"}],
    )  # fmt: skip
    _use(tenant, plan, DECEMBER, cpu="10")
    _metered(NOVEMBER, JANUARY)

    (november,) = invoicing.period_close("2026-11", now=AFTER).invoices
    (december,) = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices

    assert (november.currency, november.total) == ("usd", Decimal("0.35"))
    assert (december.currency, december.total) == ("eur", Decimal("0.35"))


def test_an_override_and_a_price_change_in_one_month_each_price_what_they_set(tenant, plan):
    from billing import reports

    other = Tenant.objects.create(name="Other", slug="other-x1y2z3")
    tenth, twentieth = NOVEMBER + timedelta(days=9), NOVEMBER + timedelta(days=19)
    for hour in (NOVEMBER, tenth, twentieth, DECEMBER):
        _use(tenant, plan, hour, cpu="10", storage="1000")
        _use(other, plan, hour, instance="inst-cccccccc", cpu="10", storage="1000")
    _override(tenant, plan, tenth, cpu="0.02")  # the tenant's cpu from the 10th
    _prices(plan, twentieth, cpu="0.07", storage="0.00028")  # everyone's list prices, December
    _metered(NOVEMBER, JANUARY)
    both = (tenant, other)
    so_far = {who: reports.period_cost(who, "2026-11").currencies[0].total for who in both}

    invoicing.period_close("2026-11", now=AFTER)
    invoicing.period_close("2026-12", now=JANUARY + usage.HOUR)

    def lines(who, period):
        invoice = Invoice.objects.get(tenant=who, period=period)
        return sorted(
            (line.dimension, line.quantity, line.unit_price.normalize())
            for line in invoice.lines.all()
        )

    assert lines(tenant, "2026-11") == [
        ("cpu", Decimal(10), Decimal("0.035")),  # the 1st: the list price
        ("cpu", Decimal(20), Decimal("0.02")),  # the 10th and the 20th: its override
        ("storage", Decimal(3000), Decimal("0.00014")),  # the list price all month
    ]
    assert lines(other, "2026-11") == [
        ("cpu", Decimal(30), Decimal("0.035")),
        ("storage", Decimal(3000), Decimal("0.00014")),
    ]
    # The cost so far, before the close, said as much as each invoice.
    assert {who: Invoice.objects.get(tenant=who, period="2026-11").total for who in both} == (
        so_far
    )
    # December: the new list prices, and the tenant's override where it sets one.
    assert lines(tenant, "2026-12") == [
        ("cpu", Decimal(10), Decimal("0.02")),
        ("storage", Decimal(1000), Decimal("0.00028")),
    ]
    assert lines(other, "2026-12") == [
        ("cpu", Decimal(10), Decimal("0.07")),
        ("storage", Decimal(1000), Decimal("0.00028")),
    ]


def test_a_dimension_priced_anew_or_no_longer_is_so_from_the_next_month(tenant, plan):
    tenth = NOVEMBER + timedelta(days=9)
    for hour in (NOVEMBER, tenth, DECEMBER):
        _use(tenant, plan, hour, cpu="10", memory="10", storage="1000")
    # From December: memory priced, storage and backups no longer, cpu as it was.
    _prices(plan, tenth, cpu="0.035", memory="0.005")
    _metered(NOVEMBER, JANUARY)

    (november,) = invoicing.period_close("2026-11", now=AFTER).invoices
    (december,) = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices

    assert {(line.dimension, line.quantity, line.amount) for line in november.lines.all()} == {
        ("cpu", Decimal(20), Decimal("0.70")),
        ("storage", Decimal(2000), Decimal("0.28")),  # memory was not priced yet
    }
    assert {(line.dimension, line.quantity, line.amount) for line in december.lines.all()} == {
        ("cpu", Decimal(10), Decimal("0.35")),
        ("memory", Decimal(10), Decimal("0.05")),
    }


def test_a_plan_used_while_free_is_priced_from_the_month_after_it_gains_prices(tenant, plan):
    from billing import reports

    plan.prices.all().delete()  # a free plan, used from the 1st
    tenth = NOVEMBER + timedelta(days=9)
    for hour in (NOVEMBER, tenth, DECEMBER):
        _use(tenant, plan, hour, cpu="10")
    _prices(plan, tenth, cpu="0.035")  # priced from December on
    _metered(NOVEMBER, JANUARY)
    so_far = reports.period_cost(tenant, "2026-11").currencies

    (november,) = invoicing.period_close("2026-11", now=AFTER).invoices
    (december,) = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices

    # November was free when it was used; December is billed.
    assert so_far == [] and november.total == Decimal(0) and not november.lines.exists()
    assert [(line.quantity, line.amount) for line in december.lines.all()] == [
        (Decimal(10), Decimal("0.35"))
    ]


def test_an_override_prices_the_hours_from_when_it_takes_effect(tenant, plan):
    tenth = NOVEMBER + timedelta(days=9)
    for hour in (
        NOVEMBER,
        NOVEMBER + usage.HOUR,
        tenth,
        tenth + usage.HOUR,
        tenth + timedelta(days=5),
    ):
        _use(tenant, plan, hour, cpu="10", storage="100")
    _override(tenant, plan, tenth, cpu="0.02")
    _metered()

    invoice = invoicing.period_close("2026-11", now=AFTER).invoices[0]

    cpu = invoice.lines.filter(dimension="cpu").order_by("unit_price")
    assert [(line.quantity, line.unit_price, line.amount) for line in cpu] == [
        (Decimal(30), Decimal("0.02"), Decimal("0.60")),  # from the 10th
        (Decimal(20), Decimal("0.035"), Decimal("0.70")),  # before it
    ]
    # The override sets no storage price: the plan's applies all month.
    (storage,) = invoice.lines.filter(dimension="storage")
    assert (storage.quantity, storage.amount) == (Decimal(500), Decimal("0.07"))
    assert invoice.total == Decimal("1.37")


def test_an_override_in_effect_before_the_period_prices_all_of_it_and_only_its_tenant(tenant, plan):
    other = Tenant.objects.create(name="Other", slug="other-x1y2z3")
    _use(tenant, plan, NOVEMBER, cpu="10")
    _use(other, plan, NOVEMBER, instance="inst-cccccccc", cpu="10")
    _override(tenant, plan, NOVEMBER - timedelta(days=40), cpu="0.01")
    _override(tenant, plan, NOVEMBER - timedelta(days=20), cpu="0.02")  # replaces the first
    _metered()

    invoicing.period_close("2026-11", now=AFTER)

    assert Invoice.objects.get(tenant=tenant).total == Decimal("0.20")
    assert Invoice.objects.get(tenant=other).total == Decimal("0.35")


def test_a_monthly_price_override_is_spread_over_730_hours_too(tenant, plan):
    _use(tenant, plan, NOVEMBER, backupStorage="730")
    _override(tenant, plan, NOVEMBER - timedelta(days=1), backupStorage="1.46")
    _metered()

    invoice = invoicing.period_close("2026-11", now=AFTER).invoices[0]

    assert invoice.total == Decimal("1.46")


def test_beat_closes_the_month_just_ended_through_its_task(tenant, plan, settings):
    from billing.tasks import billing_period_close

    entry = settings.CELERY_BEAT_SCHEDULE["billing-period-close"]
    assert entry["task"] == "billing.tasks.billing_period_close"
    this_month = usage.period_bounds(usage.period_key(datetime.now(UTC)))[0]
    last_month = usage.period_bounds(usage.period_key(this_month - usage.HOUR))[0]
    _use(tenant, plan, last_month, cpu="10")
    _metered(last_month, this_month)

    assert billing_period_close.apply().get() == f"closed {last_month:%Y-%m}: 1 invoice(s)"
    assert billing_period_close.apply().get() == ""


def test_a_month_billed_late_in_the_plans_old_currency_is_invoiced_apart_from_the_new_one(
    tenant, plan
):
    from billing import services

    _use(tenant, plan, NOVEMBER, cpu="1")
    _metered()
    invoicing.period_close("2026-11", now=AFTER)
    # Before December, the plan moved to euros from December on (the next period).
    prices = [{"dimension": "cpu", "unit": "core", "unit_price": "0.04"}]
    services.plan_prices_replace(plan=plan, currency="eur", prices=prices, at=NOVEMBER)
    _use(tenant, plan, DECEMBER, cpu="100")  # December's use, at 0.04 EUR: 4.00 EUR
    _use(tenant, plan, DECEMBER - usage.HOUR, cpu="100")  # November's, late, at 0.035 USD: 3.50
    _metered(DECEMBER, JANUARY)

    closed = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices

    totals = sorted((invoice.currency, invoice.total) for invoice in closed)
    assert totals == [("eur", Decimal("4.00")), ("usd", Decimal("3.50"))]
    usd = next(invoice for invoice in closed if invoice.currency == "usd")
    assert _line(usd, "cpu", adjustment_of="2026-11").amount == Decimal("3.50")


def test_a_free_plans_invoice_at_zero_left_a_draft_does_not_keep_an_issued_month_to_come(
    owner_client, tenant, plan, staff
):
    """The organization ran a database on a priced plan and one on a free plan (no prices) last
    month. The month closes: a draft per plan, the free plan's at 0.00 (`invoicing._drafts`).
    Staff issue the priced one; the one at 0.00 asks nothing (the deletion ignores such a
    draft: `selectors._uninvoiced`) and stays a draft. The page then shows the month's cost
    under "Last month, invoice to come" beside the issued invoice that bills every cent of it,
    for as long as nobody finalizes an invoice of nothing."""
    from django.utils import timezone

    from billing.models import Plan

    free = Plan.objects.create(key="free", name="Free", service="postgresql")
    this_month = usage.period_bounds(usage.period_key(timezone.now()))[0]
    start = usage.period_bounds(usage.period_key(this_month - timedelta(days=1)))[0]
    _use(tenant, plan, start + timedelta(days=3), cpu="40")  # 1.40 USD
    _use(tenant, free, start + timedelta(days=3), instance="inst-ffffffff", cpu="4")
    hours, hour = [], start
    while hour < this_month:
        hours.append(MeteredHour(hour=hour))
        hour += usage.HOUR
    MeteredHour.objects.bulk_create(hours, ignore_conflicts=True)
    closed = invoicing.period_close(usage.period_key(start), now=this_month + timedelta(hours=2))
    priced = next(i for i in closed.invoices if i.plan_id == plan.pk)
    nothing = next(i for i in closed.invoices if i.plan_id == free.pk)
    assert priced.total == Decimal("1.40") and nothing.total == 0
    invoicing.invoice_finalize(actor=staff, invoice=priced)

    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()

    priced.refresh_from_db()
    assert priced.number in page  # the issued invoice, in the list
    assert "Last month, invoice to come" not in page


def test_cost_by_deployment_says_what_each_plan_billed_an_instance_that_moved(tenant, plan):
    """An instance moved plans within the month: the Billing page listed one row under one
    of the two plans' names with both plans' cost, while two invoices billed each part."""
    from billing import reports

    small = Plan.objects.create(key="pg-small", name="PostgreSQL Small", service="postgresql")
    Price.objects.create(plan=small, dimension="cpu", unit="core", unit_price=Decimal("0.01"))
    _use(tenant, plan, NOVEMBER, cpu="100")  # 3.50 on PostgreSQL until it moved
    _use(tenant, small, NOVEMBER + timedelta(days=10), cpu="100")  # then 1.00 on Small
    _metered()
    (usd,) = reports.period_cost(tenant, "2026-11").currencies

    invoices = invoicing.period_close("2026-11", now=AFTER).invoices

    invoiced = {invoice.plan.name: invoice.total for invoice in invoices}
    assert invoiced == {"PostgreSQL": Decimal("3.50"), "PostgreSQL Small": Decimal("1.00")}
    shown = [(item.name, item.plan, item.amount) for item in usd.by_instance]
    assert shown == [
        ("db-aaaa", "PostgreSQL", Decimal("3.50")),
        ("db-aaaa", "PostgreSQL Small", Decimal("1.00")),
    ]


MONTHLY_CPU = [
    {"dimension": "cpu", "unit": "core", "time_unit": "month", "unit_price": "25.55"},
    {"dimension": "storage", "unit": "GiB", "unit_price": "0.00014"},
]


def test_a_price_override_keeps_its_meaning_when_the_plan_changes_its_time_unit(tenant, plan):
    """Staff gave the tenant cpu at 0.02 a core-hour; the spec then priced cpu per month (the
    same list price, 0.035 x 730): from the next month the override read 0.02 a core-month,
    10 core-hours costing 0.00 rather than 0.20. Such a change is refused while an override
    that applies then prices cpu; ended from that month, the change is taken."""
    from billing import services

    _override(tenant, plan, NOVEMBER + timedelta(days=9), cpu="0.02")
    _use(tenant, plan, NOVEMBER + timedelta(days=10), cpu="10")
    at = NOVEMBER + timedelta(days=19)

    refused = f"The price overrides of {tenant.name} price cpu"
    with pytest.raises(ValidationError, match=refused), transaction.atomic():
        services.plan_prices_replace(plan=plan, currency="usd", at=at, prices=MONTHLY_CPU)
    assert plan.prices.get(dimension="cpu").time_unit == "hour"

    _override(tenant, plan, DECEMBER)  # the list price from December
    assert services.plan_prices_replace(plan=plan, currency="usd", at=at, prices=MONTHLY_CPU)
    _use(tenant, plan, DECEMBER + timedelta(days=1), cpu="10")
    _metered(NOVEMBER, JANUARY)
    (november,) = invoicing.period_close("2026-11", now=AFTER).invoices
    (december,) = invoicing.period_close("2026-12", now=JANUARY + usage.HOUR).invoices

    assert (november.total, december.total) == (Decimal("0.20"), Decimal("0.35"))
