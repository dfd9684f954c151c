"""The sign-up page's errors in a real browser, at 1280 px and at a phone's 390 px."""

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import scrolls_sideways, shot

BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])
SHORT = "This password is too short. It must contain at least 8 characters."
DIFFERENT = "You must type the same password each time."


@BOTH_WIDTHS
def test_sign_up_errors_are_summed_up_on_top_and_said_beside_each_field(open_page, width):
    from accounts.models import User

    page = open_page(None, "/accounts/signup/", width)
    page.get_by_label("Email").fill("not-an-address")
    page.locator("#id_password1").fill("Zq8#vK")
    page.get_by_label("Password (again)").fill("Zq8#vL")
    with page.expect_navigation():
        page.locator("form").get_by_role("button", name="Sign up").click()

    summary = page.locator(".error-summary")
    expect(summary).to_be_in_viewport()
    expect(summary.get_by_role("link")).to_have_text(
        [
            "Email: Enter a valid email address.",
            f"Password: {SHORT}",
            f"Password (again): {DIFFERENT}",
        ]
    )
    for name, said in [("password1", SHORT), ("password2", DIFFERENT)]:
        label = page.locator(f'label[for="id_{name}"]').bounding_box()
        error = page.locator(f"#id_{name}_error")
        field = page.locator(f"#id_{name}")
        expect(error).to_have_text(said)
        expect(field).to_have_attribute("aria-invalid", "true")
        # Beside its field: under its label and right above its input, never above the label.
        box = error.bounding_box()
        assert label["y"] < box["y"] < field.bounding_box()["y"], name
    expect(page.get_by_label("Email")).to_have_value("not-an-address")
    expect(page.locator("#id_password1")).to_have_value("")  # a password is never kept
    shot(page, f"signup-errors-{width}")
    assert not scrolls_sideways(page)

    summary.get_by_role("link", name=f"Password (again): {DIFFERENT}").click()
    expect(page.locator("#id_password2")).to_be_focused()
    assert not User.objects.exists()


@BOTH_WIDTHS
def test_sign_in_and_password_change_say_their_errors_as_sign_up_does(open_page, width, make_user):
    make_user("kim@example.com")

    page = open_page(None, "/accounts/login/", width)
    page.get_by_label("Email").fill("kim@example.com")
    page.get_by_label("Password").fill("not-her-password")
    expect(page.get_by_label("Remember me")).not_to_be_checked()
    with page.expect_navigation():
        page.locator("form").get_by_role("button", name="Sign in").click()

    summary = page.locator(".error-summary")
    expect(summary).to_be_in_viewport()
    expect(summary).to_contain_text(
        "The email address and/or password you specified are not correct."
    )
    expect(page.get_by_label("Email")).to_have_value("kim@example.com")
    shot(page, f"signin-errors-{width}")
    assert not scrolls_sideways(page)

    kim = make_user("kim2@example.com")
    page = open_page(kim, "/accounts/password/change/", width)
    page.get_by_label("Current password").fill("not-her-password")
    page.locator("#id_password1").fill("another-horse-battery-7")
    page.locator("#id_password2").fill("another-horse-battery-7")
    with page.expect_navigation():
        page.locator("form").get_by_role("button", name="Change password").click()
    link = page.locator(".error-summary").get_by_role("link")
    expect(link).to_have_text("Current Password: Please type your current password.")
    error = page.locator("#id_oldpassword_error")
    expect(error).to_have_text("Please type your current password.")
    label = page.locator('label[for="id_oldpassword"]').bounding_box()
    field = page.locator("#id_oldpassword")
    assert label["y"] < error.bounding_box()["y"] < field.bounding_box()["y"]
    shot(page, f"password-change-errors-{width}")
    link.click()
    expect(field).to_be_focused()
    assert not scrolls_sideways(page)
