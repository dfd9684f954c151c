"""A form refused for its CSRF token (the token rotated when the person signed in again in
another tab) is said in the portal's own layout, with a way on, never Django's bare
"Forbidden (403) CSRF verification failed" page; an htmx action so refused is not a silent
reload."""

import re

import pytest
from django.test import Client

from accounts.models import Invitation
from portal.views import CSRF_REFUSED
from tests.conftest import PASSWORD


def _token(page) -> str:
    html = page.content.decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html) or re.search(
        r'X-CSRFToken": "([^"]+)"', html
    )
    return found.group(1)


def _signed_in_again(browser, owner, old_tab) -> None:
    """Signed out and in again in another tab: the CSRF token rotates."""
    browser.post("/accounts/logout/", {"csrfmiddlewaretoken": _token(old_tab)})
    login = browser.get("/accounts/login/")
    browser.post(
        "/accounts/login/",
        {"login": owner.email, "password": PASSWORD, "csrfmiddlewaretoken": _token(login)},
    )


@pytest.mark.django_db
def test_signing_in_from_a_second_tab_after_the_first_signed_in_gets_a_page_of_the_portal(owner):
    browser = Client(enforce_csrf_checks=True)  # one browser, two tabs: one cookie jar
    second_tab = browser.get("/accounts/login/")
    first_tab = browser.get("/accounts/login/")
    signed_in = browser.post(
        "/accounts/login/",
        {"login": owner.email, "password": PASSWORD, "csrfmiddlewaretoken": _token(first_tab)},
    )
    assert signed_in.status_code == 302

    # The second tab's form still holds the token from before the sign-in.
    page = browser.post(
        "/accounts/login/",
        {"login": owner.email, "password": PASSWORD, "csrfmiddlewaretoken": _token(second_tab)},
    )

    assert page.status_code == 403
    html = page.content.decode()
    assert "More information is available with DEBUG=True" not in html
    assert '<article class="error-page">' in html  # the portal's layout, as its 403/404 pages
    assert "This form was out of date, and nothing was done" in html
    assert 'href="/">Back to the start' in html


@pytest.mark.django_db
def test_an_action_sent_from_a_tab_opened_before_signing_in_again_is_not_a_bare_error(
    owner, tenant
):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    old_tab = browser.get(f"/t/{tenant.slug}/settings/")
    _signed_in_again(browser, owner, old_tab)

    page = browser.post(
        f"/t/{tenant.slug}/settings/rename/",
        {"name": "Acme Two", "csrfmiddlewaretoken": _token(old_tab)},
    )

    assert page.status_code == 403
    html = page.content.decode()
    assert "More information is available with DEBUG=True" not in html
    assert '<article class="error-page">' in html


@pytest.mark.django_db
def test_an_htmx_action_refused_for_its_token_says_why_on_the_page_loaded_again(owner, tenant):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    old_tab = browser.get(f"/t/{tenant.slug}/team/")
    _signed_in_again(browser, owner, old_tab)
    browser.get(f"/t/{tenant.slug}/")  # the sign-in's own message is shown, and spent

    refused = browser.post(
        f"/t/{tenant.slug}/team/invite/",
        {"email": "new@example.com", "role": "viewer"},
        HTTP_HX_REQUEST="true",
        HTTP_X_CSRFTOKEN=_token(old_tab),
    )
    assert refused.status_code == 403
    assert refused.get("HX-Refresh") == "true"  # htmx reloads the page...

    reloaded = browser.get(f"/t/{tenant.slug}/team/")
    said = [str(m) for m in reloaded.context["messages"]]
    assert said == [CSRF_REFUSED]
    assert not Invitation.objects.exists()
