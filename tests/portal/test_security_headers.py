# ruff: noqa: F811 (the Stripe fixtures of the billing tests are parameters here)
"""The portal's Content-Security-Policy and Permissions-Policy: on every answer (a page, the
admin, a 404, a redirect), strict enough that an injected script or style does not run, and
with nothing in the templates that needs more (eval, inline scripts, inline styles)."""

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from billing import stripe_sync
from tests.billing.conftest import emulator, gw, priced_plan, stripe_settings  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
TURNED_OFF = ["camera", "microphone", "geolocation", "payment", "usb"]


def _policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {
        name: values
        for name, *values in (part.split() for part in header.split(";") if part.strip())
    }


def _turned_off(response) -> set[str]:
    return {
        feature
        for feature, allowed in re.findall(r"([\w-]+)=\(([^)]*)\)", response["Permissions-Policy"])
        if not allowed
    }


def _assert_strict(response) -> None:
    policy = _policy(response)
    assert policy["default-src"] == ["'self'"]
    assert "script-src" not in policy and "style-src" not in policy  # default-src: 'self' only
    assert policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["form-action"][0] == "'self'"
    assert "unsafe" not in response["Content-Security-Policy"]
    assert set(TURNED_OFF) <= _turned_off(response)
    # Copy buttons write to the clipboard: same-origin needs no permission, so none is withheld.
    assert "clipboard-write" not in response["Permissions-Policy"]


@pytest.mark.django_db
def test_pages_the_admin_a_404_and_a_redirect_all_carry_the_policies(
    client, owner_client, tenant, make_user
):
    page = owner_client.get(f"/t/{tenant.slug}/")
    missing = owner_client.get("/no-such-page/")
    client.logout()
    redirect = client.get(f"/t/{tenant.slug}/deployments/")
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    admin_page = client.get("/admin/deployments/instance/")

    assert [page.status_code, missing.status_code, redirect.status_code] == [200, 404, 302]
    assert admin_page.status_code == 200
    for response in [page, missing, redirect, admin_page]:
        _assert_strict(response)


@pytest.mark.django_db
def test_without_stripe_forms_are_sent_to_the_portal_only(owner_client, tenant, settings):
    settings.STRIPE_API_KEY = ""

    page = owner_client.get(f"/t/{tenant.slug}/billing/")

    assert _policy(page)["form-action"] == ["'self'"]


@pytest.mark.django_db
def test_stripes_own_pages_may_receive_what_the_billing_page_sends(owner_client, tenant, settings):
    settings.STRIPE_API_KEY = "sk_live_abc"
    settings.STRIPE_API_BASE = ""

    page = owner_client.get(f"/t/{tenant.slug}/billing/")

    assert _policy(page)["form-action"] == [
        "'self'", "https://checkout.stripe.com", "https://billing.stripe.com",
    ]  # fmt: skip


@pytest.mark.unsubscribed
def test_subscribing_may_go_on_to_the_checkout_page_of_the_stripe_server_configured(
    owner_client, tenant, priced_plan, gw, emulator
):
    stripe_sync.catalog_sync(gw)
    page = owner_client.get(f"/t/{tenant.slug}/billing/")
    sent = owner_client.post(
        f"/t/{tenant.slug}/billing/subscribe/{priced_plan.key}/", {"request_id": "csp-1"}
    )

    checkout = urlsplit(sent["Location"])
    assert sent.status_code == 302 and checkout.path.startswith("/c/pay/")
    # A browser checks a form's redirect against the page's form-action: Checkout is allowed.
    assert f"{checkout.scheme}://{checkout.netloc}" in _policy(page)["form-action"]


def test_htmx_runs_no_code_from_attributes_and_injects_no_style():
    base = (ROOT / "templates" / "base.html").read_text()

    config = re.search(r'<meta name="htmx-config" content=\'([^\']*)\'', base).group(1)

    assert '"allowEval": false' in config
    assert '"includeIndicatorStyles": false' in config


def test_no_template_needs_eval_an_inline_script_or_an_inline_style():
    templates = [
        path
        for folder in ["templates", "accounts", "billing", "deployments", "portal"]
        for path in (ROOT / folder).rglob("*.html")
    ]
    needs_eval = re.compile(
        r"hx-on|hx-vars|hx-(?:vals|headers)=['\"]\s*(?:js|javascript):"
        r"|hx-trigger=\"[^\"]*\[|javascript:"
    )
    inline_script = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>")
    inline_style = re.compile(r"<style|\sstyle=")

    found = {
        str(path.relative_to(ROOT)): kind
        for path in templates
        for kind, pattern in [
            ("eval", needs_eval),
            ("inline script", inline_script),
            ("inline style", inline_style),
        ]
        if pattern.search(path.read_text())
    }

    assert len(templates) > 50
    assert found == {}
