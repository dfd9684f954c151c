"""Prices from the spec's `pricing`, stored by load_specs, and what quantities cost on them."""

from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from billing.models import Plan, Price
from billing.pricing import HOURS_PER_MONTH, CostLine, cost
from tests.deployments.conftest import SPEC


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    Price.objects.create(plan=plan, dimension="storage", unit="GiB", unit_price=Decimal("0.00014"))
    Price.objects.create(
        plan=plan, dimension="backupStorage", unit="GiB", time_unit="month", unit_price=Decimal("2")
    )
    return plan


def test_a_month_is_730_hours():
    assert Decimal(730) == HOURS_PER_MONTH


def test_hourly_prices_cost_quantity_times_price_an_hour_and_730_times_that_a_month(plan):
    result = cost(plan, {"cpu": Decimal(2), "storage": Decimal(10)})

    assert [(line.dimension, line.per_hour, line.per_month) for line in result.lines] == [
        ("cpu", Decimal("0.0700"), Decimal("51.10")),
        ("storage", Decimal("0.0014"), Decimal("1.02")),  # 1.022 → cents
    ]
    assert result.per_hour == Decimal("0.0714")
    assert result.per_month == Decimal("52.12")  # 0.0714 * 730 = 52.122, from the exact sum
    assert all(isinstance(line.per_hour, Decimal) for line in result.lines)
    assert result.currency == "usd"


def test_a_monthly_price_is_spread_over_730_hours(plan):
    result = cost(plan, {"backupStorage": Decimal(73)}, hours=10)

    (line,) = result.lines
    assert line.per_month == Decimal("146.00")  # 73 GiB * 2 a month
    assert line.per_hour == Decimal("0.2000")  # 146 / 730
    assert line.amount == Decimal("2.00")  # ten hours of it
    assert result.amount == Decimal("2.00")


def test_amounts_round_half_up_once_from_exact_values(plan):
    # 0.00014 * 0.5 = 0.00007 an hour → 0.0001; a month 0.0511 → 0.05
    result = cost(plan, {"storage": Decimal("0.5")})

    assert result.per_hour == Decimal("0.0001")
    assert result.per_month == Decimal("0.05")
    assert cost(plan, {"storage": Decimal("0.5")}, hours=1000).amount == Decimal("0.07")


@pytest.mark.django_db
def test_an_estimate_in_a_currency_without_cents_rounds_to_whole_units_as_its_invoice_does():
    plan = Plan.objects.create(key="pg-jp", name="PostgreSQL", service="postgresql")
    Price.objects.create(
        plan=plan, dimension="cpu", unit="core", unit_price=Decimal("1.37"), currency="jpy"
    )

    result = cost(plan, {"cpu": Decimal(1)}, hours=3)

    assert result.per_month == Decimal("1000")  # 1.37 * 730 = 1000.1 yen
    assert result.amount == Decimal("4")  # 4.11 yen for three hours
    assert [line.per_month for line in result.lines] == [Decimal("1000")]


@pytest.mark.django_db
def test_an_estimate_in_a_currency_of_thousandths_rounds_to_them_and_its_invoice_keeps_them():
    """A Kuwaiti dinar has 1,000 fils: rounded to hundredths, 0.041 KWD was billed as 0.04."""
    from billing.models import Invoice
    from billing.templatetags.billing_format import amount

    plan = Plan.objects.create(key="pg-kw", name="PostgreSQL", service="postgresql")
    Price.objects.create(
        plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.0137"), currency="kwd"
    )

    result = cost(plan, {"cpu": Decimal(1)}, hours=3)

    assert result.amount == Decimal("0.041")  # 0.0411 dinars for three hours
    assert result.per_month == Decimal("10.001")  # 0.0137 * 730
    invoice = Invoice.objects.create(
        tenant=_tenant(), plan=plan, period="2026-11", currency="kwd", total=result.per_month
    )
    invoice.refresh_from_db()
    assert str(amount(invoice.total, invoice.currency)) == "10.001"


def _tenant():
    from accounts.models import Tenant

    return Tenant.objects.create(name="Gulf", slug="gulf")


def test_unpriced_quantities_are_free_and_missing_quantities_cost_nothing(plan):
    result = cost(plan, {"replica": Decimal(3), "cpu": Decimal(1)})

    assert [line.dimension for line in result.lines] == ["cpu"]
    assert result.per_hour == Decimal("0.0350")


def test_load_specs_writes_the_specs_prices_and_replaces_them_when_they_change(
    transactional_db, tmp_path
):
    spec = tmp_path / "pg.yaml"
    spec.write_text(SPEC.read_text())
    call_command("load_specs", str(spec), stdout=None)

    prices = {
        p.dimension: (p.unit, p.time_unit, p.unit_price, p.currency)
        for p in Price.objects.filter(plan__key="postgres-cnpg")
    }
    assert prices == {
        "cpu": ("core", "hour", Decimal("0.035"), "usd"),
        "memory": ("GiB", "hour", Decimal("0.005"), "usd"),
        "storage": ("GiB", "hour", Decimal("0.00014"), "usd"),
        "backupStorage": ("GiB", "month", Decimal("0.02"), "usd"),
    }

    changed = (
        SPEC.read_text()
        .replace('price: "0.035"', 'price: "0.04"')
        .replace('  - {dimension: memory, unit: GiB, timeUnit: hour, price: "0.005"}\n', "")
        .replace("  service: postgresql\n", "  service: postgresql\n  currency: eur\n")
    )
    assert changed != SPEC.read_text()
    spec.write_text(changed)
    call_command("load_specs", str(spec), stdout=None)

    prices = {
        p.dimension: (p.unit_price, p.currency)
        for p in Price.objects.filter(plan__key="postgres-cnpg")
    }
    assert prices == {
        "cpu": (Decimal("0.04"), "eur"),
        "storage": (Decimal("0.00014"), "eur"),
        "backupStorage": (Decimal("0.02"), "eur"),
    }


TIB = SPEC.read_text().replace(
    '{dimension: storage, unit: GiB, timeUnit: hour, price: "0.00014"}',
    '{dimension: storage, unit: TiB, timeUnit: hour, price: "0.14336"}',
)


def test_a_plan_in_use_keeps_each_dimensions_unit(transactional_db, tmp_path, tenant):
    """A new version priced storage per TiB: its instances still on the version before, which
    measure GiB, were charged each GiB-hour as a TiB-hour (1024 times over), their invoices
    naming TiB."""
    from io import StringIO

    from billing.models import Plan
    from deployments import services
    from tests.deployments.factories import cell, make_instances

    version = services.plan_load(text=SPEC.read_text()).version
    make_instances(tenant, version, cell(), 1)  # the plan is in use
    spec, err = tmp_path / "pg.yaml", StringIO()
    spec.write_text(TIB)

    with pytest.raises(CommandError):
        call_command("load_specs", str(spec), stdout=StringIO(), stderr=err)

    assert "storage is priced per GiB on a plan in use" in err.getvalue()
    assert "Keep its unit, or price TiB under another dimension's name" in err.getvalue()
    plan = Plan.objects.get(key="postgres-cnpg")
    assert plan.prices.get(dimension="storage").unit == "GiB"
    assert plan.versions.count() == 1


def test_a_plan_no_one_used_yet_may_change_a_unit(db):
    from deployments import services

    services.plan_load(text=SPEC.read_text())
    services.plan_load(text=TIB)

    assert Price.objects.get(dimension="storage").unit == "TiB"


@pytest.mark.parametrize(
    ("unit", "quantity", "shown"),
    [
        ("core", "2", "2 cores"),
        ("core", "1", "1 core"),
        ("core", "0.5", "0.5 core"),
        ("core", "0", "0 cores"),
        ("bytes", "3", "3 bytes"),
        ("core", "1.50", "1.5 cores"),
        ("GiB", "12", "12 GiB"),
        ("", "3", "3"),
    ],
)
def test_a_cost_line_shows_its_quantity_with_its_unit_in_the_right_number(unit, quantity, shown):
    line = CostLine(
        dimension="cpu", unit=unit, quantity=Decimal(quantity), unit_price=Decimal(1),
        time_unit="hour", per_hour=Decimal(1), per_month=Decimal(1), amount=Decimal(1),
    )  # fmt: skip

    assert line.quantity_shown == shown
