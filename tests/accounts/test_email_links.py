"""Links in the account emails (sign-up confirmation, password reset, the sign-up link sent to
an address with no account) lead to the portal's public address, OPSDECK_BASE_URL, as every
other email's do: never to the host a request happened to name, even one ALLOWED_HOSTS lets in
(an internal name, another domain of the same servers)."""

import re
from urllib.parse import urlsplit

import pytest
from django.core import mail

from tests.conftest import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("mail_at_commit")]

PUBLIC = "https://opsdeck.example.com"
OTHER_HOST = "opsdeck-internal.example"


@pytest.fixture(autouse=True)
def _two_allowed_hosts(settings):
    settings.ALLOWED_HOSTS = ["opsdeck.example.com", OTHER_HOST]
    settings.OPSDECK_BASE_URL = PUBLIC


def _links(body: str) -> list[str]:
    return re.findall(r"https?://\S+", body)


def test_a_reset_asked_through_another_allowed_host_links_to_the_public_address(client, owner):
    client.post("/accounts/password/reset/", {"email": owner.email}, HTTP_HOST=OTHER_HOST)

    (sent,) = mail.outbox
    (link,) = [x for x in _links(sent.body) if "/password/reset/key/" in x]
    assert link.startswith(f"{PUBLIC}/accounts/password/reset/key/")
    assert OTHER_HOST not in sent.body
    # The link works: it leads to the form that sets a new password.
    page = client.get(urlsplit(link).path, HTTP_HOST="opsdeck.example.com", follow=True)
    assert 'name="password1"' in page.content.decode()


def test_a_reset_asked_for_an_unknown_address_offers_sign_up_at_the_public_address(client):
    client.post("/accounts/password/reset/", {"email": "nobody@example.com"}, HTTP_HOST=OTHER_HOST)

    (sent,) = mail.outbox
    assert f"{PUBLIC}/accounts/signup/" in _links(sent.body)
    assert OTHER_HOST not in sent.body


def test_a_sign_up_through_another_allowed_host_is_confirmed_at_the_public_address(client):
    client.post(
        "/accounts/signup/",
        {"email": "new@example.com", "password1": PASSWORD, "password2": PASSWORD},
        HTTP_HOST=OTHER_HOST,
    )

    (sent,) = mail.outbox
    (link,) = [x for x in _links(sent.body) if "/confirm-email/" in x]
    assert link.startswith(f"{PUBLIC}/accounts/confirm-email/")
    assert OTHER_HOST not in sent.body


def test_signing_up_again_with_a_taken_address_links_to_the_public_reset_page(client, owner):
    client.post(
        "/accounts/signup/",
        {"email": owner.email, "password1": PASSWORD, "password2": PASSWORD},
        HTTP_HOST=OTHER_HOST,
    )

    (sent,) = mail.outbox
    assert f"{PUBLIC}/accounts/password/reset/" in _links(sent.body)
    assert OTHER_HOST not in sent.body
