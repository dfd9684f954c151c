"""The tenant's invoices on the Billing page and the printable invoice."""

import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import Invoice, InvoiceLine, Plan


@pytest.fixture
def plan(db):
    return Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")


def _invoice(tenant, plan, period="2026-10", status="open", number="2026-000001", **extra):
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period=period, currency="usd", total=Decimal("12.34"),
        **({"number": number} if status != "draft" else {}), **extra,
    )  # fmt: skip
    InvoiceLine.objects.create(
        invoice=invoice, instance_id="inst-abcdefgh", instance_name="orders", dimension="cpu",
        unit="core", quantity=Decimal("352.5"), unit_price=Decimal("0.035"),
        amount=Decimal("12.34"),
    )  # fmt: skip
    if status != "draft":
        Invoice.objects.filter(pk=invoice.pk).update(status=status)
    return invoice


def _billing(tenant):
    return f"/t/{tenant.slug}/billing/"


def test_the_billing_page_lists_finalized_invoices_but_not_drafts(owner_client, tenant, plan):
    shown = _invoice(tenant, plan)
    _invoice(tenant, plan, period="2026-11", status="draft")

    page = owner_client.get(_billing(tenant)).content.decode()

    url = f"/t/{tenant.slug}/billing/invoices/{shown.pk}/"
    assert f'<a href="{url}">2026-000001</a>' in page
    assert '<span class="badge badge-invoice-open">Finalized</span>' in page
    assert "12.34 USD" in page
    assert "2026-11" not in page


def test_without_invoices_the_page_says_when_they_come(owner_client, tenant):
    page = owner_client.get(_billing(tenant)).content.decode()

    assert "No invoices yet. When a month ends, its usage becomes an invoice here." in page


def test_the_invoice_page_shows_its_lines_and_total_ready_to_print(owner_client, tenant, plan):
    invoice = _invoice(tenant, plan)

    page = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/").content.decode()

    assert "<h1>Invoice 2026-000001</h1>" in page
    assert "orders" in page and "inst-abcdefgh" in page and "<th>Deployment</th>" in page
    assert "352.5 core-hours" in page
    assert "<strong>12.34 USD</strong>" in page
    assert "data-print" in page


def test_an_invoice_says_its_backup_storage_line_at_0_is_not_measured_so_not_charged(
    owner_client, tenant, plan
):
    """Stripe lists every price of a subscription on its invoices, backup storage's too."""
    invoice = _invoice(tenant, plan, status="draft", source=Invoice.Source.STRIPE)
    InvoiceLine.objects.create(
        invoice=invoice, dimension="backupStorage", unit="GiB", quantity=Decimal(0),
        unit_price=Decimal("0.0000273973"), amount=Decimal(0),
    )  # fmt: skip
    Invoice.objects.filter(pk=invoice.pk).update(status="open", number="2026-000001")

    page = re.sub(
        r"\s+", " ", owner_client.get(f"{_billing(tenant)}invoices/{invoice.pk}/").content.decode()
    )

    assert (
        '<td>Backup storage <small class="muted">(not measured, so not charged)</small></td>'
    ) in page
    assert "<td>CPU</td>" in page  # a measured line says nothing of the kind


def test_the_billing_page_shows_each_plans_unit_prices_as_the_tenant_pays_them(
    owner_client, tenant, plan
):
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import PlanOverride, Price

    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    Price.objects.create(
        plan=plan, dimension="storage", unit="GiB", time_unit="month", unit_price=Decimal("0.10")
    )
    Price.objects.create(
        plan=plan, dimension="backupStorage", unit="GiB", time_unit="month",
        unit_price=Decimal("0.02"),
    )  # fmt: skip
    PlanOverride.objects.create(
        tenant=tenant, plan=plan, prices={"cpu": "0.02"},
        effective_from=timezone.now() - timedelta(hours=1),
    )  # fmt: skip

    page = re.sub(r"\s+", " ", owner_client.get(_billing(tenant)).content.decode())

    prices = page.split('id="prices-pg"', 1)[1].split("</ul>", 1)[0]
    assert "CPU: 0.02 USD per core per hour" in prices
    assert "Storage: 0.1 USD per GiB per month</li>" in prices
    # Nothing measures backups, so their price is never charged (not "yet": no date is known),
    # and an invoice that lists it (Stripe's list every price) shows 0.
    assert (
        'Backup storage: 0.02 USD per GiB per month <span class="muted">(not charged: this use '
        "is not measured; an invoice that lists it shows 0)</span>"
    ) in prices
    assert "Prices change" not in page  # none is coming


def test_the_billing_page_shows_the_price_in_effect_and_the_coming_one_with_its_date(
    owner_client, tenant, plan
):
    from django.utils import timezone

    from billing import periods, services
    from billing.models import Price, UsageRecord

    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    Price.objects.create(
        plan=plan, dimension="storage", unit="GiB", time_unit="month", unit_price=Decimal("0.10")
    )
    UsageRecord.objects.create(
        tenant=tenant, plan=plan, instance_id="inst-abcdefgh", instance_name="orders",
        dimension="cpu", hour=periods.current_start(), quantity=Decimal(1),
        period=f"{periods.current_start():%Y-%m}",
    )  # fmt: skip
    services.plan_prices_replace(plan=plan, currency="usd", prices=[
        {"dimension": "cpu", "unit": "core", "unit_price": "0.05"},
        {"dimension": "memory", "unit": "GiB", "unit_price": "0.01"},
    ])  # fmt: skip
    starts = periods.next_start(timezone.now())
    day = f"{starts.day} {starts:%b %Y}"

    page = re.sub(r"\s+", " ", owner_client.get(_billing(tenant)).content.decode())

    prices = re.sub(r"<[^>]+>", "", page.split('id="prices-pg"', 1)[1].split("</div>", 1)[0])
    assert f"CPU: 0.035 USD per core per hour; from {day}: 0.05 USD per core per hour" in prices
    assert f"Memory: not charged; from {day}: 0.01 USD per GiB per hour" in prices
    assert f"Storage: 0.1 USD per GiB per month; from {day}: not charged" in prices
    assert f"Prices change on {day}, at the start of a billing period" in prices


def test_a_draft_is_not_shown_to_the_tenant(owner_client, tenant, plan):
    draft = _invoice(tenant, plan, status="draft")

    assert owner_client.get(f"/t/{tenant.slug}/billing/invoices/{draft.pk}/").status_code == 404


@pytest.mark.parametrize(
    ("role", "status"), [("billing", 200), ("admin", 200), ("member", 403), ("viewer", 403)]
)
def test_billing_members_see_invoices_and_others_do_not(
    client, tenant, plan, add_member, role, status
):
    invoice = _invoice(tenant, plan)
    client.force_login(add_member(f"{role}@example.com", role))

    assert client.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/").status_code == status
    assert client.get(_billing(tenant)).status_code == status


def _queries(client, url) -> int:
    client.get(url)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries.captured_queries)


def test_every_invoice_can_be_reached_from_the_billing_page_a_page_at_a_time(
    owner_client, tenant, plan
):
    for n in range(30):  # 2 plans' invoices for 15 months
        _invoice(tenant, plan, period=f"20{24 + n // 12}-{n % 12 + 1:02d}", number=f"n-{n:03d}")

    first = owner_client.get(_billing(tenant)).content.decode()
    older = owner_client.get(_billing(tenant) + "?page=2").content.decode()

    listed = re.findall(r">(n-\d{3})</a>", first) + re.findall(r">(n-\d{3})</a>", older)
    assert listed == [f"n-{n:03d}" for n in reversed(range(30))]  # newest first, each once
    assert 'href="?page=2#invoices" rel="next">Older' in first
    assert 'href="?page=1#invoices" rel="prev">' in older


def test_the_billing_page_makes_as_many_queries_for_many_invoices_as_for_few(
    owner_client, tenant, plan
):
    _invoice(tenant, plan)
    few = _queries(owner_client, _billing(tenant))
    for month in range(1, 10):
        _invoice(tenant, plan, period=f"2025-{month:02d}", number=f"2025-{month:06d}")

    assert _queries(owner_client, _billing(tenant)) == few


def test_an_invoice_in_yen_shows_whole_yen(owner_client, tenant, plan):
    """Yen has no minor unit: an invoice billed 17 yen (stored as 17.00) says 17 JPY, on its
    page and in the Billing page's list, as the cost figures do."""
    invoice = _invoice(tenant, plan, status="draft")
    Invoice.objects.filter(pk=invoice.pk).update(currency="jpy", total=Decimal(17))
    invoice.lines.update(amount=Decimal(17))
    Invoice.objects.filter(pk=invoice.pk).update(status="open", number="2026-000001")

    page = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/").content.decode()
    listed = owner_client.get(_billing(tenant)).content.decode()

    assert "<strong>17 JPY</strong>" in page
    assert "17.00" not in page
    assert "17 JPY" in listed and "17.00" not in listed
