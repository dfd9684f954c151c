"""The catalog and the create form in a real browser, at 1280 px and at a phone's 390 px."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import htmx_settled, scrolls_sideways, shot
from tests.deployments.factories import BACKUPS

ROOT = Path(__file__).resolve().parents[2]
BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])


@pytest.fixture
def plan(tenant):
    from deployments import services
    from deployments.models import Cell

    Cell.objects.create(name="local", region="local", is_default=True, **BACKUPS)
    Cell.objects.create(name="second", region="a-region-with-a-rather-long-name", **BACKUPS)
    return services.plan_load(text=(ROOT / "specs" / "postgres-cnpg.yaml").read_text()).plan


@BOTH_WIDTHS
def test_the_catalog_and_the_form_never_scroll_sideways(open_page, owner, tenant, plan, width):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/", width)
    shot(page, f"catalog-{width}")
    expect(page.locator("h1")).to_have_text("New deployment")
    expect(page.locator("#plan-postgres-cnpg")).to_contain_text("0.0464 USD")
    assert not scrolls_sideways(page)

    page.get_by_role("button", name="Create instance of PostgreSQL").click()
    expect(page.locator("h1")).to_have_text("Create instance")
    shot(page, f"create-form-{width}")
    expect(page.locator("#estimate-month")).to_have_text("33.87")
    assert not scrolls_sideways(page)


def test_typing_a_new_server_count_changes_the_estimate(open_page, owner, tenant, plan):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/")
    expect(page.locator("#estimate-hour")).to_have_text("0.0464")

    page.get_by_label("Servers").fill("3")

    expect(page.locator("#estimate-hour")).to_have_text("0.1392")  # three servers of the same
    expect(page.locator("#estimate-month")).to_have_text("101.62")

    page.get_by_label("Servers").fill("9")  # more than the plan allows
    expect(page.locator("#estimate")).to_contain_text("Enter valid values to see the price.")


def test_a_new_price_is_said_by_the_live_region_that_was_there(open_page, owner, tenant, plan):
    """A screen reader reads a live region's changes, not a region put in whole: each new
    estimate swapped in a new #estimate, and the new price went unsaid."""
    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/")
    htmx_settled(page)
    page.evaluate("() => { document.getElementById('estimate').dataset.heard = '1'; }")

    page.get_by_label("Servers").fill("3")
    expect(page.locator("#estimate-month")).to_have_text("101.62")

    heard = page.locator("[data-heard]")
    expect(heard).to_have_attribute("aria-live", "polite")
    expect(heard).to_contain_text("101.62")


def test_an_invalid_value_is_shown_beside_its_field_and_nothing_is_created(
    open_page, owner, tenant, plan
):
    from deployments.models import Instance

    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/", "narrow")
    page.get_by_label("Instance name").fill("orders")
    page.get_by_label("Database").fill("Orders-DB")
    page.get_by_label("Owner password").fill("secret-password-1")
    # The estimate follows the typing: its last answer in place before the click, which a swap
    # under way could move.
    expect(page.locator("#estimate")).to_contain_text("Enter valid values to see the price.")
    htmx_settled(page)
    with page.expect_navigation():  # a full page: the form answered with its errors
        page.get_by_role("button", name="Create instance").click()

    expect(page.locator("#id_p-database_error")).to_have_text(
        "Use lowercase letters, digits and underscores, starting with a letter."
    )
    expect(page.locator("#id_p-database")).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".error-summary a")).to_have_attribute("href", "#id_p-database")
    expect(page.get_by_label("Instance name")).to_have_value("orders")
    expect(page.get_by_label("Owner password")).to_have_value("")
    shot(page, "create-form-error-narrow")
    assert not scrolls_sideways(page)
    assert not Instance.objects.exists()


def test_a_valid_submit_creates_the_instance(open_page, owner, tenant, plan):
    from deployments.models import Instance

    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/")
    page.get_by_label("Instance name").fill("orders")
    page.get_by_label("Region").select_option(label="a-region-with-a-rather-long-name (second)")
    page.get_by_label("Servers").fill("2")
    page.get_by_role("button", name="Create instance").click()

    expect(page.locator("#messages")).to_contain_text("Creating orders.")
    expect(page).to_have_url(re.compile(rf"/t/{tenant.slug}/deployments/"))
    instance = Instance.objects.get()
    assert (instance.name, instance.cell.name, instance.parameters["instances"]) == (
        "orders",
        "second",
        2,
    )


def test_back_and_resubmit_of_the_create_form_makes_one_instance(open_page, owner, tenant, plan):
    from deployments.models import Instance

    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/")
    first_id = page.locator('input[name="request_id"]').input_value()
    page.get_by_label("Instance name").fill("orders")
    page.get_by_role("button", name="Create instance").click()
    expect(page.locator("#messages")).to_contain_text("Creating orders.")

    page.go_back()
    # Back brings what the form made, not the form: nothing to send a second time.
    expect(page.locator("#form-made")).to_contain_text("This form already made orders")
    expect(page.get_by_role("button", name="Create instance")).to_have_count(0)
    page.reload()
    expect(page.get_by_role("button", name="Create instance")).to_have_count(0)

    assert Instance.objects.count() == 1
    assert first_id in page.url


def test_generate_fills_the_password_field_and_the_instance_uses_it(open_page, owner, tenant, plan):
    from deployments import services
    from deployments.models import Instance

    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/", "narrow")
    password = page.locator("input[name=p-password]")
    expect(password).to_have_value("")

    page.get_by_role("button", name="Generate").click()

    expect(password).to_have_value(re.compile(r"^[A-Za-z2-9]{24}$"))
    expect(password).to_have_attribute("type", "text")  # shown, so it can be noted
    generated = password.input_value()
    assert not scrolls_sideways(page)
    page.get_by_label("Instance name").fill("orders")
    page.get_by_role("button", name="Create instance").click()

    expect(page.locator("#messages")).to_contain_text("Creating orders.")
    assert generated not in page.content()
    instance = Instance.objects.get(name="orders")
    assert services.instance_parameters(instance)["password"] == generated


@BOTH_WIDTHS
def test_back_after_creating_says_what_the_form_made_and_links_a_new_form(
    open_page, owner, tenant, plan, width
):
    page = open_page(owner, f"/t/{tenant.slug}/deployments/new/postgres-cnpg/", width)
    page.get_by_label("Instance name").fill("orders")
    page.get_by_role("button", name="Create instance").click()
    expect(page.locator("h1")).to_have_text("orders")

    page.go_back()

    made = page.locator("#form-made")
    expect(made).to_contain_text("This form already made orders")
    expect(made).to_be_in_viewport()
    shot(page, f"create-form-after-back-{width}")
    assert not scrolls_sideways(page)
    # Another instance is one click away, on a new form.
    made.get_by_role("link", name="Start a new form").click()
    expect(page.get_by_label("Instance name")).to_have_value("")
    page.get_by_label("Instance name").fill("orders-2")
    page.get_by_role("button", name="Create instance").click()
    expect(page.locator("h1")).to_have_text("orders-2")
