import logging
import re

import pytest


@pytest.mark.django_db
def test_the_dashboard_shows_the_navigation_for_the_role(owner_client, tenant):
    page = owner_client.get(f"/t/{tenant.slug}/")

    assert page.status_code == 200
    html = page.content.decode()
    for label in ["Dashboard", "Deployments", "Billing", "Team", "Audit log", "Sign out"]:
        assert label in html
    assert "Recent activity" in html
    assert "tenant.create" in html
    # Front-end files come from this server, never a CDN.
    assert "/static/vendor/htmx/htmx.min" in html
    assert "/static/vendor/pico/pico.min" in html
    assert "https://" not in html


@pytest.mark.django_db
def test_a_viewer_is_not_offered_billing_or_the_audit_log(client, tenant, add_member):
    client.force_login(add_member("vic@example.com", "viewer"))

    html = client.get(f"/t/{tenant.slug}/").content.decode()

    assert "Deployments" in html
    assert "Audit log" not in html
    assert f"/t/{tenant.slug}/billing/" not in html


@pytest.mark.django_db
def test_the_billing_role_sees_billing_and_a_viewer_is_refused_it(client, tenant, add_member):
    client.force_login(add_member("bill@example.com", "billing"))
    assert client.get(f"/t/{tenant.slug}/billing/").status_code == 200

    client.force_login(add_member("vic@example.com", "viewer"))
    refused = client.get(f"/t/{tenant.slug}/billing/")
    assert refused.status_code == 403
    assert b"Your role (Viewer) does not allow viewing billing." in refused.content


@pytest.mark.django_db
def test_an_address_only_a_form_is_sent_to_opened_as_a_page_says_so_and_leads_to_its_page(
    owner_client, tenant, owner
):
    from accounts.models import Membership

    membership = Membership.objects.get(tenant=tenant, user=owner)
    for address, page_above, name in [
        (f"/t/{tenant.slug}/deployments/inst-abcdefgh/actions/stop/",
         f"/t/{tenant.slug}/deployments/inst-abcdefgh/", "the deployment"),
        (f"/t/{tenant.slug}/team/{membership.pk}/role/", f"/t/{tenant.slug}/team/", "Team"),
    ]:  # fmt: skip
        page = owner_client.get(address)

        assert page.status_code == 405 and page["Allow"] == "POST"
        text = page.content.decode()
        assert "Sent from a form only" in text and "Nothing was done." in text
        assert f'<a href="{page_above}">Go to {name}</a>' in text  # named, not a raw path
    assert Membership.objects.get(pk=membership.pk).role == "owner"


@pytest.mark.django_db
def test_a_missing_page_is_a_404_inside_the_layout(owner_client):
    page = owner_client.get("/no/such/page/")

    assert page.status_code == 404
    assert b"Page not found" in page.content
    assert b"owner@example.com" in page.content  # the account menu of the layout


@pytest.mark.django_db
def test_static_files_are_served(client):
    response = client.get("/static/css/opsdeck.css")

    assert response.status_code == 200


def test_the_500_page_renders_without_a_request():
    from django.template.loader import render_to_string

    html = render_to_string("500.html")

    assert "Something went wrong" in html
    assert "Opsdeck" in html


@pytest.mark.django_db
def test_too_many_sign_in_attempts_get_a_429_inside_the_layout(client, settings):
    settings.ACCOUNT_RATE_LIMITS = {"login": "2/m/ip"}
    for _ in range(2):
        client.post("/accounts/login/", {"login": "a@example.com", "password": "x"})

    response = client.post("/accounts/login/", {"login": "a@example.com", "password": "x"})

    assert response.status_code == 429
    assert b"Too many requests" in response.content
    assert b"Sign up" in response.content  # rendered inside the layout


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/accounts/email/", "/accounts/password/change/", "/accounts/2fa/"]
)
def test_account_pages_keep_the_sidebar_and_switcher_of_the_organization_in_use(
    owner_client, tenant, path
):
    owner_client.get(f"/t/{tenant.slug}/team/")  # the organization in use

    html = owner_client.get(path).content.decode()

    assert '<aside class="sidebar">' in html
    assert f'href="/t/{tenant.slug}/audit/"' in html
    assert "<summary>Acme</summary>" in html


@pytest.mark.django_db
def test_account_pages_show_no_organization_the_user_has_left(client, owner, tenant, add_member):
    bob = add_member("bob@example.com", "member")
    client.force_login(bob)
    client.get(f"/t/{tenant.slug}/")
    client.post(f"/t/{tenant.slug}/team/{tenant.memberships.get(user=bob).pk}/remove/")

    html = client.get("/accounts/email/").content.decode()

    assert '<aside class="sidebar">' not in html
    assert "<summary>Acme</summary>" not in html


@pytest.mark.django_db
def test_a_refused_page_logs_one_line_with_the_reason_and_no_traceback(
    client, tenant, add_member, caplog
):
    client.force_login(add_member("vic@example.com", "viewer"))

    with caplog.at_level(logging.WARNING, logger="django.request"):
        refused = client.get(f"/t/{tenant.slug}/audit/")

    assert refused.status_code == 403
    [record] = [r for r in caplog.records if r.name == "django.request"]
    assert record.getMessage() == (
        f"Forbidden (Permission denied): /t/{tenant.slug}/audit/ "
        "(Your role (Viewer) does not allow viewing the audit log.)"
    )
    assert record.exc_info is None
    assert "Traceback" not in caplog.text


@pytest.mark.django_db
def test_the_favicon_is_linked_and_favicon_ico_finds_it(owner_client, tenant, client):
    html = owner_client.get(f"/t/{tenant.slug}/").content.decode()
    linked = html.split('<link rel="icon" href="')[1].split('"')[0]

    asked = client.get("/favicon.ico", follow=True)

    assert asked.status_code == 200
    assert asked.request["PATH_INFO"] == linked
    assert asked["Content-Type"] == "image/svg+xml"
    assert b"<svg" in b"".join(asked.streaming_content)


def test_the_stylesheet_closes_every_block_it_opens():
    # An unclosed block swallows every rule after it (the colours of the state labels, say).
    from django.conf import settings

    text = (settings.BASE_DIR / "static" / "css" / "opsdeck.css").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    depth = 0
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        assert depth >= 0
    assert depth == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("address", "status"),
    [("/admin/deployments/instance/%00/change/", 404), ("/t/%00/deployments/", 404),
     ("/admin/deployments/operation/?state__exact=%00", 200),
     ("/admin/accounts/user/?q=sta%00ff", 200)],
)  # fmt: skip
def test_an_address_with_a_null_character_finds_nothing_or_the_rest_rather_than_an_error(
    client, make_user, address, status
):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))

    page = client.get(address)

    assert page.status_code == status
    if status == 404:
        assert b"Page not found" in page.content
    if "q=" in address:  # the search finds what the rest of it names
        assert b"staff@example.com" in page.content and b"1 user" in page.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    "page",
    ["", "deployments/", "deployments/new/", "billing/", "team/", "audit/", "audit/export.csv"],
)
def test_a_page_that_only_shows_refuses_a_post_as_a_method_it_does_not_take(
    owner_client, tenant, page
):
    url = f"/t/{tenant.slug}/{page}"

    assert owner_client.get(url).status_code == 200
    posted = owner_client.post(url, {"anything": "1"})
    assert posted.status_code == 405 and posted["Allow"] == "GET, HEAD"


@pytest.mark.django_db
def test_the_billing_teams_pages_that_only_show_refuse_a_post(client, make_user):
    from django.contrib.auth.models import Group

    from billing.team_views import BILLING_TEAM

    user = make_user("finance@opsdeck.example", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    client.force_login(user)

    for url in ["/billing-team/", "/billing-team/invoices.csv"]:
        assert client.get(url).status_code == 200, url
        assert client.post(url).status_code == 405, url
