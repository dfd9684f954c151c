"""A part of a page that polls, or a form sent in place, whose page no longer holds sends the
browser to what is true now, instead of an answer htmx leaves unswapped (and asks again for
ever) or swaps into the part."""

import pytest

from accounts.models import Membership

pytestmark = pytest.mark.django_db


def _htmx(current: str) -> dict:
    return {"HX-Request": "true", "HX-Current-URL": f"http://testserver{current}"}


def test_a_poll_after_the_session_ended_sends_the_browser_to_sign_in_and_back(client, tenant):
    page = f"/t/{tenant.slug}/deployments/?q=orders"

    answer = client.get(f"/t/{tenant.slug}/deployments/?page=1&shown=x", headers=_htmx(page))

    assert answer.status_code == 200 and answer.content == b""  # nothing swapped
    assert (
        answer["HX-Redirect"] == f"/accounts/login/?next=/t/{tenant.slug}/deployments/%3Fq%3Dorders"
    )


def test_a_poll_of_an_organization_no_longer_the_members_reloads_the_page(
    client, tenant, add_member
):
    member = add_member("mia@example.com", "member")
    client.force_login(member)
    Membership.objects.filter(user=member).delete()

    answer = client.get(f"/t/{tenant.slug}/", headers=_htmx(f"/t/{tenant.slug}/"))

    assert answer.status_code == 404 and answer["HX-Refresh"] == "true"


def test_a_part_the_role_no_longer_allows_reloads_the_page(client, tenant, add_member):
    """An admin demoted to viewer while the audit log was open: its filters ask in place."""
    client.force_login(add_member("vic@example.com", "viewer"))
    audit = f"/t/{tenant.slug}/audit/"

    answer = client.get(f"{audit}?action=instance.create", headers=_htmx(audit))

    assert answer.status_code == 403 and answer["HX-Refresh"] == "true"


def test_a_current_address_from_elsewhere_leads_back_to_the_start(client, tenant):
    for sent in ["http://evil.example//evil.example/x", "not an address", "http://[::1"]:
        answer = client.get(
            f"/t/{tenant.slug}/", headers={"HX-Request": "true", "HX-Current-URL": sent}
        )
        assert answer["HX-Redirect"] == "/accounts/login/?next=/"


def test_requests_not_sent_by_htmx_are_answered_as_before(client, tenant, add_member):
    assert client.get(f"/t/{tenant.slug}/").url.startswith("/accounts/login/?next=")

    client.force_login(add_member("mia@example.com", "member"))
    Membership.objects.filter(user__email="mia@example.com").delete()
    answer = client.get(f"/t/{tenant.slug}/")

    assert answer.status_code == 404 and not answer.has_header("HX-Refresh")


def test_a_refusal_says_why_on_the_page_loaded_again(client, tenant, add_member):
    client.force_login(add_member("vic@example.com", "viewer"))
    audit = f"/t/{tenant.slug}/audit/"
    client.get(f"{audit}?action=x", headers=_htmx(audit))

    reloaded = client.get(f"/t/{tenant.slug}/").content.decode()  # what HX-Refresh loads

    assert "viewing the audit log" in reloaded  # the reason, as the role matrix words it


def test_a_history_restore_after_the_session_ended_is_sent_to_sign_in_as_a_page_is(client, tenant):
    """htmx reads no header of a history restore's answer and swaps it as it comes: the login
    page it follows the redirect to, not an empty answer."""
    restore = {**_htmx(f"/t/{tenant.slug}/"), "HX-History-Restore-Request": "true"}

    answer = client.get(f"/t/{tenant.slug}/deployments/", headers=restore)

    assert answer.status_code == 302 and answer.url.startswith("/accounts/login/?next=")


def test_other_answers_to_htmx_pass_unchanged(owner_client, tenant):
    """A redirect elsewhere than the login page, and a poll's empty answer."""
    headers = _htmx(f"/t/{tenant.slug}/")

    elsewhere = owner_client.get("/", headers=headers)  # to the member's organization
    assert elsewhere.status_code == 302 and not elsewhere.has_header("HX-Redirect")
    assert owner_client.get(f"/t/{tenant.slug}/", headers=headers).status_code == 200
