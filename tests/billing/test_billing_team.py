"""The billing team's pages: every invoice with filters, totals and CSV, draft review, a
tenant's usage. Staff in the "Billing team" group only."""

import codecs
import csv
import io
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import AuditEvent, Tenant
from billing import usage
from billing.models import Invoice, InvoiceLine, Plan, Price
from billing.team_views import BILLING_TEAM
from billing.usage import UsageRow


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    return plan


@pytest.fixture
def team_client(client, make_user):
    user = make_user("finance@opsdeck.example", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    client.force_login(user)
    return client


def _invoice(tenant, plan, period, total, status="draft", number=None):
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period=period, currency="usd", total=Decimal(total)
    )
    InvoiceLine.objects.create(
        invoice=invoice, instance_id="inst-abcdefgh", instance_name="orders", dimension="cpu",
        quantity=Decimal(10), unit_price=Decimal("0.035"), amount=Decimal(total),
    )  # fmt: skip
    if status != "draft":
        Invoice.objects.filter(pk=invoice.pk).update(status=status, number=number)
    return invoice


@pytest.fixture
def invoices(tenant, plan):
    acme = Tenant.objects.create(name="=Globex Corp", slug="globex-abc123")
    return {
        "draft": _invoice(tenant, plan, "2026-10", "12.50"),
        "open": _invoice(acme, plan, "2026-10", "99.00", "open", "2025-000001"),
        "void": _invoice(acme, plan, "2026-09", "5.00", "void", "2025-000002"),
        "paid": _invoice(tenant, plan, "2026-09", "7.25", "paid", "2025-000003"),
    }


@pytest.mark.parametrize(
    "who", ["anonymous", "member", "staff outside the team", "team, not staff"]
)
def test_only_staff_in_the_billing_team_reach_the_pages(client, make_user, invoices, who):
    if who == "member":
        client.force_login(make_user("member@example.com"))
    elif who == "staff outside the team":
        client.force_login(make_user("admin@example.com", is_staff=True))
    elif who == "team, not staff":
        user = make_user("ex-staff@example.com")
        user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
        client.force_login(user)
    draft = invoices["draft"]

    for url in [
        "/billing-team/",
        "/billing-team/invoices.csv",
        f"/billing-team/invoices/{draft.pk}/",
    ]:
        response = client.get(url)
        assert response.status_code == (302 if who == "anonymous" else 404), url
    response = client.post(f"/billing-team/invoices/{draft.pk}/finalize/")
    assert response.status_code == (302 if who == "anonymous" else 404)
    assert Invoice.objects.get(pk=draft.pk).status == "draft"


def period_totals(page: str) -> list[list[str]]:
    """The rows of the page's totals per period, each cell as read (its stacked label left
    out)."""
    table = re.search(r'<table id="period-totals-table".*?<tbody>(.*?)</tbody>', page, re.S)
    assert table, "the page shows no totals per period"
    return [
        [re.sub(r'<span class="stack-label">.*?</span>|<[^>]+>', "", cell).strip()
         for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)
    ]  # fmt: skip


def test_the_team_sees_every_tenants_invoices_with_totals_per_period(team_client, invoices):
    page = team_client.get("/billing-team/").content.decode()

    assert 'Invoices <small class="muted">(4)</small>' in page
    assert "=Globex Corp" in page and "2025-000001" in page and "Draft" in page
    # Voided invoices are left out: October 12.50 + 99.00, September 7.25.
    assert period_totals(page) == [
        ["2026-10", "2", "111.50 USD", "0.00 USD", "111.50 USD"],
        ["2026-09", "1", "7.25 USD", "0.00 USD", "7.25 USD"],
    ]


def test_filters_narrow_the_list_and_a_bad_one_is_flagged_not_applied(team_client, invoices):
    by_status = team_client.get("/billing-team/", {"status": "draft"}).content.decode()
    by_tenant = team_client.get("/billing-team/", {"tenant": "globex"}).content.decode()
    by_amount = team_client.get("/billing-team/", {"min_total": "10", "max_total": "50"})
    flagged = team_client.get("/billing-team/", {"period": "October", "status": "paid"})
    other_digits = team_client.get("/billing-team/", {"period": "\u0662\u0660\u0662\u0665-10"})

    assert "(1)" in by_status and "12.50 USD" in by_status
    assert "(2)" in by_tenant and "7.25 USD" not in by_tenant
    assert "(1)" in by_amount.content.decode() and "12.50 USD" in by_amount.content.decode()
    flagged = flagged.content.decode()
    assert "Period: Write the month as YYYY-MM." in flagged
    assert "(1)" in flagged and "2025-000003" in flagged  # the status filter still applies
    assert "Period: Write the month as YYYY-MM." in other_digits.content.decode()


def test_the_csv_export_has_the_filtered_invoices_safe_for_spreadsheets(team_client, invoices):
    response = team_client.get("/billing-team/invoices.csv", {"tenant": "globex"})

    assert response["Content-Type"] == "text/csv; charset=utf-8"
    body = b"".join(response.streaming_content)
    assert body.startswith(codecs.BOM_UTF8)  # a spreadsheet reads accented names as typed
    rows = list(csv.reader(io.StringIO(body.decode("utf-8-sig"))))
    assert rows[0] == [
        "number", "organization", "plan", "period", "status", "currency", "total", "finalized_at",
        "organization_deleted_at", "refunded", "credited",
    ]  # fmt: skip
    assert sorted(row[0] for row in rows[1:]) == ["2025-000001", "2025-000002"]
    assert {row[1] for row in rows[1:]} == {"'=Globex Corp"}  # not run as a formula
    # Each status as the pages say it.
    assert {row[0]: row[4] for row in rows[1:]} == {
        "2025-000001": "Finalized",
        "2025-000002": "Void",
    }


def test_the_team_finalizes_a_draft_from_its_page(team_client, invoices):
    draft = invoices["draft"]

    page = team_client.get(f"/billing-team/invoices/{draft.pk}/").content.decode()
    response = team_client.post(f"/billing-team/invoices/{draft.pk}/finalize/", follow=True)

    assert ">Finalize</button>" in page
    draft.refresh_from_db()
    assert (draft.status, draft.number) == ("open", f"{datetime.now(UTC):%Y}-000001")
    assert f"Invoice {draft.number} finalized." in response.content.decode()
    event = AuditEvent.objects.get(action="invoice.finalize", result="ok")
    assert (event.actor_email, event.actor_kind) == ("finance@opsdeck.example", "staff")


def test_a_refused_action_is_explained_on_the_invoice_page(team_client, invoices):
    paid = invoices["paid"]

    response = team_client.post(f"/billing-team/invoices/{paid.pk}/void/", follow=True)

    assert "only a draft or an unpaid invoice can be voided" in response.content.decode()
    assert Invoice.objects.get(pk=paid.pk).status == "paid"


def test_the_usage_explorer_shows_a_tenants_period_with_its_chart(team_client, tenant, plan):
    hour = datetime(2026, 10, 3, 4, tzinfo=UTC)
    usage.record(
        hour, [UsageRow(tenant.pk, plan.pk, "inst-aaaaaaaa", "orders", "cpu", "", Decimal(20))]
    )

    page = team_client.get(f"/billing-team/usage/{tenant.slug}/", {"period": "2026-10"})
    bad = team_client.get(f"/billing-team/usage/{tenant.slug}/", {"period": "soon"})

    page = page.content.decode()
    assert "Usage billed in 2026-10" in page
    assert '<span class="figure">0.70 USD</span>' in page
    # A period over is metered in full: no "so far", no "will".
    assert "metered in the period." in page and "As the invoice counts it" in page
    assert "so far" not in page and "will count" not in page
    assert 'data-chart="daily-cost-usd-data"' in page
    assert "is not a billing period" in bad.content.decode()


def test_the_invoice_list_makes_as_many_queries_for_many_invoices_as_for_few(
    team_client, tenant, plan
):
    _invoice(tenant, plan, "2026-01", "1.00")
    team_client.get("/billing-team/")
    with CaptureQueriesContext(connection) as few:
        team_client.get("/billing-team/")
    for month in range(2, 13):
        _invoice(tenant, plan, f"2025-{month:02d}", "1.00")
    with CaptureQueriesContext(connection) as many:
        team_client.get("/billing-team/")

    assert len(many.captured_queries) == len(few.captured_queries)


def _deleted_tenant(name, slug):
    return Tenant.objects.create(name=name, slug=slug, deleted_at=timezone.now())


def test_a_deleted_organization_is_said_deleted_beside_its_invoices_and_usage(
    team_client, tenant, plan
):
    gone = _deleted_tenant("Initech", "initech-abc123")
    paid = _invoice(gone, plan, "2026-09", "7.25", "paid", "2025-000009")
    kept = _invoice(tenant, plan, "2026-09", "3.00", "paid", "2025-000010")

    listed = team_client.get("/billing-team/").content.decode()
    shown = team_client.get(f"/billing-team/invoices/{paid.pk}/").content.decode()
    other = team_client.get(f"/billing-team/invoices/{kept.pk}/").content.decode()
    used = team_client.get(f"/billing-team/usage/{gone.slug}/").content.decode()

    deleted = '<span class="badge badge-state-deleted"'
    row = next(r for r in listed.split("<tr>") if "Initech" in r)
    assert deleted in row and ">Deleted</span>" in row
    assert listed.count(deleted) == 1  # Acme's row says nothing
    assert deleted in shown and deleted not in other
    assert deleted in used.split("</h1>")[0]
    # The export says it too, with when.
    export = team_client.get("/billing-team/invoices.csv")
    rows = list(csv.reader(io.StringIO(b"".join(export.streaming_content).decode("utf-8-sig"))))
    by_number = {
        row[0]: dict(zip(rows[0], row, strict=True))["organization_deleted_at"] for row in rows[1:]
    }
    assert by_number == {"2025-000009": gone.deleted_at.isoformat(), "2025-000010": ""}


def test_the_invoice_list_makes_as_many_queries_for_many_deleted_organizations_as_for_few(
    team_client, plan
):
    _invoice(_deleted_tenant("Gone 0", "gone-0"), plan, "2026-01", "1.00")
    team_client.get("/billing-team/")
    with CaptureQueriesContext(connection) as few:
        team_client.get("/billing-team/")
    for n in range(1, 8):
        _invoice(_deleted_tenant(f"Gone {n}", f"gone-{n}"), plan, "2026-01", "1.00")
    with CaptureQueriesContext(connection) as many:
        page = team_client.get("/billing-team/").content.decode()

    assert len(many.captured_queries) == len(few.captured_queries)
    assert page.count(">Deleted</span>") == 8


def test_the_top_bar_links_the_team_pages_for_its_members_only(team_client, owner, tenant):
    owner_client = Client()
    owner_client.force_login(owner)

    assert "Billing team</a>" in team_client.get("/billing-team/").content.decode()
    assert "Billing team</a>" not in owner_client.get(f"/t/{tenant.slug}/").content.decode()


def test_the_usage_page_shows_the_current_period_by_default(team_client, tenant):
    page = team_client.get(f"/billing-team/usage/{tenant.slug}/").content.decode()

    assert f"Usage billed in {datetime.now(UTC):%Y-%m}" in page
    assert "No usage yet this period." in page
    ended = team_client.get(f"/billing-team/usage/{tenant.slug}/", {"period": "2026-01"})
    assert "No usage in this period." in ended.content.decode()


def test_numbers_and_months_no_invoice_could_have_are_flagged_not_a_server_error(
    team_client, invoices, tenant
):
    for odd in ({"min_total": "1e200000"}, {"max_total": "9" * 40}, {"period": "9999-12"},
                {"period": "0000-01"}):  # fmt: skip
        response = team_client.get("/billing-team/", odd)
        assert response.status_code == 200, odd
        assert 'aria-invalid="true"' in response.content.decode() or "errorlist" in (
            response.content.decode()
        ), odd
    for period in ("9999-12", "0000-01", "1969-12"):
        page = team_client.get(f"/billing-team/usage/{tenant.slug}/", {"period": period})
        assert page.status_code == 200, period
        assert "the year is between 1970 and 9998" in page.content.decode(), period


def test_the_billing_team_works_in_the_billing_admin_and_nowhere_else_in_it(
    team_client, tenant, plan
):
    import importlib

    from django.apps import apps

    # What the migration gives the group (a test that empties the tables took it away).
    importlib.import_module("billing.migrations.0017_billing_team_permissions").grant(apps, None)
    invoice = _invoice(tenant, plan, "2026-10", "12.00")

    listed = team_client.get("/admin/billing/invoice/")
    assert listed.status_code == 200
    assert 'value="finalize"' in listed.content.decode()  # it may act, not only look
    finalized = team_client.post(
        "/admin/billing/invoice/", {"action": "finalize", "_selected_action": [invoice.pk]}
    )
    assert finalized.status_code == 302
    invoice.refresh_from_db()
    assert invoice.status == "open" and invoice.number  # finalized
    for page in ["/admin/billing/subscription/", "/admin/billing/planoverride/add/",
                 "/admin/billing/meterevent/"]:  # fmt: skip
        assert team_client.get(page).status_code == 200, page
    # Not the platform's other rows.
    assert team_client.get("/admin/deployments/instance/").status_code == 403
    assert team_client.get("/admin/accounts/user/").status_code == 403


def test_a_name_that_a_spreadsheet_would_read_as_a_formula_after_a_tab_is_defused(
    team_client, invoices
):
    Tenant.objects.filter(slug="globex-abc123").update(name="\t=HYPERLINK(1)")

    response = team_client.get("/billing-team/invoices.csv")

    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))
    assert {row[1] for row in rows[1:] if "HYPERLINK" in row[1]} == {"'\t=HYPERLINK(1)"}


def test_the_team_list_reads_only_the_columns_it_shows(team_client, invoices):
    """Number, organization, plan, period, status and total: not each invoice's Stripe page
    and PDF addresses (up to 1,000 characters each), nor the times the CSV holds."""
    with CaptureQueriesContext(connection) as queries:
        page = team_client.get("/billing-team/").content.decode()

    assert "99.00 USD" in page
    (listed,) = [
        query["sql"]
        for query in queries.captured_queries
        if query["sql"].startswith('SELECT "billing_invoice"."id"')
    ]
    for column in ["hosted_invoice_url", "pdf_url", "created_at", "finalized_at", "source"]:
        assert f'"billing_invoice"."{column}"' not in listed, column


@pytest.mark.parametrize(
    "typed",
    ["\uff27\uff4c\uff4f\uff42\uff45\uff58", "Globex  Corp"],  # full-width letters; two spaces
    ids=["fullwidth", "two spaces"],
)
def test_the_organization_filter_reads_a_name_as_names_are_stored(team_client, invoices, typed):
    """Names are stored with plain letters and single spaces (`organization_name_clean`): a
    name pasted from an email written in full-width letters, or with two spaces, finds it."""
    page = team_client.get("/billing-team/", {"tenant": typed}).content.decode()

    assert 'Invoices <small class="muted">(2)</small>' in page
    assert "99.00 USD" in page and "12.50 USD" not in page


def test_the_teams_pages_are_not_kept_by_the_browser(team_client, tenant, invoices):
    """As tenant pages and the admin: Back after Finalize must not show the draft with its
    buttons, nor a signed-out browser every organization's invoices."""
    draft = invoices["draft"]
    for url in [
        "/billing-team/",
        "/billing-team/invoices.csv",
        f"/billing-team/invoices/{draft.pk}/",
        f"/billing-team/usage/{tenant.slug}/",
    ]:
        response = team_client.get(url)
        assert response.status_code == 200, url
        assert "no-store" in response["Cache-Control"], url


def test_a_drafts_page_is_titled_with_its_organization_not_its_internal_id(
    team_client, tenant, invoices
):
    draft = invoices["draft"]

    page = team_client.get(f"/billing-team/invoices/{draft.pk}/").content.decode()

    assert "<title>Draft 2026-10 of Acme · Billing team" in page
    assert f"· {tenant.pk}" not in page


def test_the_team_filters_a_dinar_invoice_by_its_total_to_the_fils(team_client, tenant, plan):
    """Totals keep three places (a Kuwaiti dinar's fils); "Total at least" took two, and
    refused 10.001."""
    dinar = _invoice(tenant, plan, "2026-10", "10.001")
    Invoice.objects.filter(pk=dinar.pk).update(currency="kwd")
    _invoice(tenant, plan, "2026-09", "10.000")

    page = team_client.get("/billing-team/", {"min_total": "10.001"}).content.decode()

    assert "decimal places" not in page
    assert f"/billing-team/invoices/{dinar.pk}/" in page
    assert page.count("/billing-team/invoices/") == 1
