"""What a person sees in a real browser, at a desktop width (1280 px) and a phone's (390 px)."""

import re
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts import services
from accounts.audit import Actor, audit_record
from accounts.models import Membership
from tests.browser.conftest import scrolls_sideways, shot

ROOT = Path(__file__).resolve().parents[2]
BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])


@pytest.fixture
def busy_tenant(tenant, owner, add_member):
    """Acme with long addresses, several roles, an invitation and a long audit log."""
    add_member("an.admin.with.a.rather.long.address@subsidiary.example.com", "admin")
    add_member("second-owner@example.com", "owner")
    add_member("viewer@example.com", "viewer")
    services.invitation_create(
        actor=Actor(user=owner),
        tenant=tenant,
        email="someone.invited.with.a.long.address@example.com",
        role="member",
    )
    for n in range(5):
        audit_record(
            actor=Actor(user=owner, ip="2001:db8:85a3::8a2e:370:7334"),
            action="member.change_role",
            tenant=tenant,
            target=tenant,
            payload={"n": n},
        )
    return tenant


@BOTH_WIDTHS
@pytest.mark.parametrize("page_name", ["team", "audit"])
def test_team_and_audit_pages_never_scroll_sideways(
    open_page, owner, busy_tenant, width, page_name
):
    page = open_page(owner, f"/t/{busy_tenant.slug}/{page_name}/", width)
    shot(page, f"{page_name}-{width}")

    expect(page.locator("h1")).to_have_text("Team" if page_name == "team" else "Audit log")
    assert not scrolls_sideways(page)
    if page_name == "audit":  # every column of a row in view, its own scroll box included
        action = page.locator("#audit-table code").first
        expect(action).to_be_visible()
        box, view = action.bounding_box(), page.viewport_size
        assert box["x"] >= 0 and box["x"] + box["width"] <= view["width"]
        scroll = page.locator("#audit-table .table-scroll")
        assert scroll.evaluate("el => el.scrollWidth <= el.clientWidth")


@BOTH_WIDTHS
def test_the_last_owner_reads_why_they_cannot_leave_on_their_own_row(
    open_page, owner, tenant, add_member, width
):
    add_member("an.admin.with.a.rather.long.address@subsidiary.example.com", "admin")

    page = open_page(owner, f"/t/{tenant.slug}/team/", width)
    shot(page, f"team-last-owner-{width}")

    said = page.locator(f"#member-{owner.memberships.get().pk} #leave-refused")
    expect(said).to_contain_text("make someone else an owner first")
    box, view = said.bounding_box(), page.viewport_size
    assert box["x"] >= 0 and box["x"] + box["width"] <= view["width"]
    assert not scrolls_sideways(page)


@BOTH_WIDTHS
@pytest.mark.parametrize("path", ["/accounts/email/", "/accounts/password/change/"])
def test_account_pages_show_the_sidebar_and_the_organization_switcher(
    open_page, owner, tenant, width, path
):
    page = open_page(owner, f"/t/{tenant.slug}/", width)
    page.goto(page.url.split("/t/")[0] + path)
    shot(page, f"account{path.replace('/', '-').rstrip('-')}-{width}")

    expect(page.locator("aside.sidebar")).to_be_visible()
    expect(page.locator("aside.sidebar").get_by_role("link", name="Team")).to_be_visible()
    expect(page.locator(".tenant-switcher summary")).to_have_text("Acme")
    assert not scrolls_sideways(page)


@BOTH_WIDTHS
def test_the_organizations_links_never_overlap(open_page, owner, tenant, width):
    page = open_page(owner, f"/t/{tenant.slug}/billing/", width)
    shot(page, f"sidebar-{width}")

    links = page.locator("aside.sidebar nav a")
    boxes = [links.nth(n).bounding_box() for n in range(links.count())]
    assert len(boxes) >= 4
    for n, box in enumerate(boxes):
        for other in boxes[n + 1 :]:
            apart = (
                box["y"] + box["height"] <= other["y"] + 0.5
                or other["y"] + other["height"] <= box["y"] + 0.5
                or box["x"] + box["width"] <= other["x"] + 0.5
                or other["x"] + other["width"] <= box["x"] + 0.5
            )
            assert apart, (box, other)
    assert not scrolls_sideways(page)


@BOTH_WIDTHS
def test_the_top_bars_menus_show_every_entry_whole_on_the_screen(open_page, make_user, width):
    from accounts import services
    from accounts.audit import Actor

    user = make_user("a.very.long.address.for.the.menus@example.com")
    for name in ("Member <b>Org</b> & Co with a long name", "Globex"):
        tenant = services.tenant_create(actor=Actor(user=user), name=name)
    page = open_page(user, f"/t/{tenant.slug}/", width)
    view = page.viewport_size

    for menu in (".tenant-switcher", ".account-menu"):
        page.locator(f"{menu} summary").click()
        entries = page.locator(f"{menu} ul li")
        expect(entries.first).to_be_visible()
        shot(page, f"menu{menu.replace('.', '-')}-{width}")
        for n in range(entries.count()):
            box = entries.nth(n).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= view["width"], (menu, n, box)
        if menu == ".account-menu":  # the summary may cut the address: the open menu has it whole
            said = page.locator("#signed-in-as")
            expect(said).to_have_text(user.email)
            assert said.evaluate("e => e.scrollWidth <= e.clientWidth"), "the address is cut"
        page.locator(f"{menu} summary").click()  # closed again
    assert not scrolls_sideways(page)


def test_an_admin_is_offered_no_owner_role_and_no_controls_on_owners(
    open_page, owner, tenant, add_member
):
    admin = add_member("admin@example.com", "admin")
    add_member("bob@example.com", "member")
    page = open_page(admin, f"/t/{tenant.slug}/team/")

    owner_row = page.locator(f"#member-{Membership.objects.get(user=owner).pk}")
    expect(owner_row).to_contain_text("Owner")
    expect(owner_row.locator("select")).to_have_count(0)
    expect(owner_row.get_by_role("button", name="Remove")).to_have_count(0)
    bob_row = page.locator("tr", has_text="bob@example.com")
    expect(bob_row.get_by_role("button", name="Remove")).to_be_visible()
    for select in [bob_row.locator("select"), page.locator("#invite-role")]:
        labels = select.locator("option").all_inner_texts()
        assert "Owner" not in labels
        assert "Admin" in labels


def test_removing_a_member_asks_first_with_buttons_that_say_what_they_do(
    open_page, owner, tenant, add_member
):
    add_member("bob@example.com", "member")
    page = open_page(owner, f"/t/{tenant.slug}/team/")
    bob_row = page.locator("tr", has_text="bob@example.com")
    dialog = page.locator("#confirm-dialog")

    bob_row.get_by_role("button", name="Remove").click()
    expect(dialog).to_contain_text("Remove bob@example.com from Acme?")
    dialog.get_by_role("button", name="Keep").click()
    expect(dialog).to_be_hidden()
    expect(bob_row).to_be_visible()
    assert Membership.objects.filter(user__email="bob@example.com").exists()

    bob_row.get_by_role("button", name="Remove").click()
    dialog.get_by_role("button", name="Remove").click()

    expect(page.locator("tr", has_text="bob@example.com")).to_have_count(0)
    assert not Membership.objects.filter(user__email="bob@example.com").exists()


@BOTH_WIDTHS
def test_an_owner_stepping_down_confirms_first(open_page, owner, tenant, add_member, width):
    add_member("second@example.com", "owner")
    mine = Membership.objects.get(user=owner)
    page = open_page(owner, f"/t/{tenant.slug}/team/", width)
    row = page.locator(f"#member-{mine.pk}")

    row.locator("select").select_option("admin")
    row.get_by_role("button", name="Change").click()

    dialog = page.get_by_role("alertdialog")
    expect(dialog).to_contain_text("You are about to give up the Owner role in Acme")
    shot(page, f"team-confirm-{width}")
    assert not scrolls_sideways(page)
    mine.refresh_from_db()
    assert mine.role == "owner"

    dialog.get_by_role("button", name="Confirm: become Admin").click()

    expect(page.locator("#messages")).to_contain_text("owner@example.com is now Admin.")
    expect(page.get_by_role("alertdialog")).to_have_count(0)
    mine.refresh_from_db()
    assert mine.role == "admin"


def test_an_owner_who_cancels_stays_owner(open_page, owner, tenant, add_member):
    add_member("second@example.com", "owner")
    mine = Membership.objects.get(user=owner)
    page = open_page(owner, f"/t/{tenant.slug}/team/")
    row = page.locator(f"#member-{mine.pk}")
    row.locator("select").select_option("viewer")
    row.get_by_role("button", name="Change").click()

    page.get_by_role("alertdialog").get_by_role("button", name="Cancel").click()

    expect(page.get_by_role("alertdialog")).to_have_count(0)
    expect(page.locator(f"#member-{mine.pk} select")).to_have_value("owner")
    mine.refresh_from_db()
    assert mine.role == "owner"


def test_an_invalid_date_keeps_the_other_filter_and_flags_the_date(open_page, owner, busy_tenant):
    page = open_page(
        owner, f"/t/{busy_tenant.slug}/audit/?action=member.invite&since=2026-02-30", "narrow"
    )
    shot(page, "audit-invalid-date-narrow")

    expect(page.locator("#f-action")).to_have_value("member.invite")
    expect(page.locator("#f-since")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#f-since-error")).to_have_text("Enter a valid date.")
    expect(page.locator("#audit-table code")).to_have_text(["member.invite"])
    assert not scrolls_sideways(page)

    # Chrome drops an impossible date from a date input: filtering again (with htmx) sends
    # none, and the action filter still applies alongside the new one.
    page.locator("#f-actor").fill("owner@")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"actor=owner%40"))
    expect(page.locator("#f-since-error")).to_have_count(0)
    expect(page.locator("#f-action")).to_have_value("member.invite")
    expect(page.locator("#audit-table code")).to_have_text(["member.invite"])


@pytest.fixture
def instances(tenant, owner):
    from deployments import services as deployment_services
    from deployments.models import Cell, Instance

    spec = (ROOT / "specs" / "postgres-cnpg.yaml").read_text()
    version = deployment_services.plan_load(text=spec).version
    cell = Cell.objects.create(name="local", region="local")
    for state in ["running", "creating", "stopped", "failed", "deleted"]:
        Instance.objects.create(
            tenant=tenant, name=f"db-{state}", plan_version=version, cell=cell, state=state
        )


def _background(page, state: str) -> str:
    badge = page.locator("tr", has_text=f"db-{state}").locator(".badge")
    return badge.evaluate("el => getComputedStyle(el).backgroundColor")


def test_each_instance_state_has_its_own_colour_and_running_is_green(
    open_page, owner, tenant, instances
):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/")
    shot(page, "deployments-wide")

    colours = {
        state: _background(page, state) for state in ["running", "creating", "stopped", "failed"]
    }
    red, green, blue = (int(c) for c in re.findall(r"\d+", colours["running"])[:3])
    assert green > red + 40 and green > blue + 40  # green, not the grey it used to be
    assert len(set(colours.values())) == 4
    expect(page.locator("tr", has_text="db-running").locator(".badge")).to_have_text("Running")


def test_back_and_resubmit_of_new_organization_makes_one(open_page, owner, tenant):
    from accounts.models import Tenant

    page = open_page(owner, "/organizations/new/")
    first_id = page.locator('input[name="request_id"]').input_value()
    page.get_by_label("Organization name").fill("Globex")
    page.get_by_role("button", name="Create organization").click()
    expect(page.locator("#messages")).to_contain_text("Organization “Globex” created.")

    page.go_back()
    # Back brings what the form made, not the form: nothing to send a second time.
    expect(page.locator("#form-made")).to_contain_text("This form already made Globex")
    expect(page.get_by_role("button", name="Create organization")).to_have_count(0)
    assert first_id in page.url
    page.locator("#form-made").get_by_role("link", name="Globex").click()
    expect(page.locator(".tenant-switcher summary")).to_have_text("Globex")

    assert Tenant.objects.filter(name="Globex").count() == 1


@BOTH_WIDTHS
@pytest.mark.parametrize("page_name", ["dashboard", "deployments"])
def test_the_dashboard_and_deployments_pages_never_scroll_sideways(
    open_page, owner, busy_tenant, instances, width, page_name
):
    path = f"/t/{busy_tenant.slug}/" + ("deployments/" if page_name == "deployments" else "")
    page = open_page(owner, path, width)
    shot(page, f"{page_name}-{width}")

    expect(page.locator("h1")).to_have_text("Deployments" if page_name == "deployments" else "Acme")
    assert not scrolls_sideways(page)


@BOTH_WIDTHS
def test_an_organization_named_in_one_long_word_never_scrolls_sideways(
    open_page, owner, tenant, width
):
    from decimal import Decimal

    from billing.models import Invoice, Plan

    tenant.name = "Supercalifragilistic" * 5  # 100 characters, nowhere to break
    tenant.save(update_fields=["name"])
    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-10", currency="usd", total=Decimal("1.00")
    )
    Invoice.objects.filter(pk=invoice.pk).update(status="open", number="2026-000001")

    for path in ("", "billing/", f"billing/invoices/{invoice.pk}/", "team/"):
        page = open_page(owner, f"/t/{tenant.slug}/{path}", width)
        shot(page, f"long-name-{path.replace('/', '-') or 'dashboard'}{width}")
        assert not scrolls_sideways(page), path


def test_a_deployment_named_in_one_long_word_leaves_its_cost_in_view_on_the_billing_page(
    open_page, owner, tenant
):
    from decimal import Decimal

    from billing import usage
    from billing.models import Plan, Price
    from billing.usage import UsageRow

    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))
    hour = usage.hour_start(timezone.now()) - usage.HOUR
    row = UsageRow(tenant.pk, plan.pk, "inst-aaaaaaaa", "W" * 100, "cpu", "core", Decimal(2))
    usage.record(hour, [row])

    page = open_page(owner, f"/t/{tenant.slug}/billing/", "wide")

    table = page.locator("table.cost-by-instance")
    expect(table).to_contain_text("W" * 100)
    shot(page, "billing-long-deployment-name")
    assert table.evaluate("t => t.scrollWidth <= t.parentElement.clientWidth")


@BOTH_WIDTHS
def test_the_billing_teams_invoice_pages_show_every_column_on_a_phone(
    open_page, make_user, tenant, width
):
    from decimal import Decimal

    from django.contrib.auth.models import Group

    from billing.models import Invoice, InvoiceLine, Plan

    finance = make_user("finance@opsdeck.example", is_staff=True)
    finance.groups.add(Group.objects.get_or_create(name="Billing team")[0])
    plan = Plan.objects.create(key="hobby", name="Hobby PostgreSQL", service="postgresql")
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period="2026-10", currency="usd", total=Decimal("1234.56")
    )
    InvoiceLine.objects.create(
        invoice=invoice, instance_id="inst-abcdefgh", instance_name="orders-production-primary",
        dimension="storage", quantity=Decimal("74400"), unit_price=Decimal("0.000137"),
        amount=Decimal("1234.56"),
    )  # fmt: skip

    # Deleted since: its name says so, in the row as in the invoice's facts.
    tenant.deleted_at = timezone.now()
    tenant.save(update_fields=["deleted_at"])

    for path, table in [("/billing-team/", "#team-invoices"),
                        (f"/billing-team/invoices/{invoice.pk}/", ".invoice-lines")]:  # fmt: skip
        page = open_page(finance, path, width)
        shot(page, f"billing-team-{table.strip('#.')}-{width}")
        expect(page.locator(table)).to_contain_text("1234.56")
        expect(page.locator(".badge-state-deleted")).to_be_visible()
        assert not scrolls_sideways(page)
        box = page.locator(f".table-scroll:has({table})")
        assert box.evaluate("el => el.scrollWidth <= el.clientWidth"), path


def test_every_button_reached_with_the_keyboard_shows_a_solid_focus_ring(
    open_page, owner, busy_tenant
):
    page = open_page(owner, f"/t/{busy_tenant.slug}/team/")
    rings = []
    for _ in range(80):
        page.keyboard.press("Tab")
        found = page.evaluate(
            """() => {
                const el = document.activeElement;
                if (!el.matches('button, [type=submit], [type=button], [role=button]')) return null;
                const style = getComputedStyle(el);
                return [el.textContent.trim(), style.outlineStyle, parseFloat(style.outlineWidth),
                        style.outlineColor];
            }"""
        )
        if found:
            rings.append(found)

    assert len(rings) >= 3, rings  # the menus, Invite, and each member's controls
    # Solid, 2 px, in the primary colour (#0172ad: 5:1 against the page), whatever the button.
    assert {tuple(ring[1:]) for ring in rings} == {("solid", 2.0, "rgb(1, 114, 173)")}, rings
