import time

import pytest
from allauth.mfa import app_settings
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import (
    format_hotp_value,
    hotp_value,
    yield_hotp_counters_from_time,
)
from django.test import Client

from accounts import crypto
from accounts.models import AuditEvent
from tests.conftest import PASSWORD

PERIOD = app_settings.TOTP_PERIOD


def _totp(secret: str) -> str:
    """The authenticator app's code now; in a period's last two seconds, the next period's
    (one computed then could reach the server after the period turned, and be refused)."""
    if PERIOD - time.time() % PERIOD < 2:
        time.sleep(2.1)
    counter = next(iter(yield_hotp_counters_from_time()))
    return format_hotp_value(hotp_value(secret, counter))


def _sign_in(client, email="owner@example.com"):
    return client.post("/accounts/login/", {"login": email, "password": PASSWORD})


@pytest.mark.django_db
def test_totp_can_be_enabled_and_is_then_required_at_sign_in(
    client, owner, tenant, django_capture_on_commit_callbacks
):
    _sign_in(client)
    # Turning on MFA asks for the password again, however recent the sign-in.
    assert client.get("/accounts/2fa/totp/activate/").url.startswith("/accounts/reauthenticate/")
    client.post("/accounts/reauthenticate/", {"password": PASSWORD})
    page = client.get("/accounts/2fa/totp/activate/")
    assert page.status_code == 200
    secret = client.session["mfa.totp.secret"]

    wrong = client.post("/accounts/2fa/totp/activate/", {"code": "000000"})
    assert wrong.status_code == 200
    assert not Authenticator.objects.filter(user=owner).exists()

    with django_capture_on_commit_callbacks(execute=True):
        activated = client.post("/accounts/2fa/totp/activate/", {"code": _totp(secret)})
    assert activated.status_code == 302
    totp = Authenticator.objects.get(user=owner, type=Authenticator.Type.TOTP)
    # Stored encrypted with our key, not in the clear.
    assert totp.data["secret"] != secret
    assert crypto.decrypt(totp.data["secret"]) == secret
    assert AuditEvent.objects.filter(action="mfa.add", actor=owner).exists()

    client.post("/accounts/logout/")
    first_step = _sign_in(client)
    assert first_step.url == "/accounts/2fa/authenticate/"
    assert client.get(f"/t/{tenant.slug}/").status_code == 302  # not signed in yet

    bad = client.post("/accounts/2fa/authenticate/", {"code": "123456"})
    assert bad.status_code == 200
    assert client.get(f"/t/{tenant.slug}/").status_code == 302

    good = client.post("/accounts/2fa/authenticate/", {"code": _totp(secret)})
    assert good.status_code == 302
    assert client.get(f"/t/{tenant.slug}/").status_code == 200


@pytest.mark.django_db
def test_a_refused_code_and_a_recovery_code_used_up_are_in_the_audit_log(client, owner, tenant):
    from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
    from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret

    TOTP.activate(owner, generate_totp_secret())
    codes = RecoveryCodes.activate(owner).get_unused_codes()
    _sign_in(client)

    refused = client.post("/accounts/2fa/authenticate/", {"code": "123456"})
    used = client.post("/accounts/2fa/authenticate/", {"code": codes[0]})

    assert refused.status_code == 200 and used.status_code == 302
    assert client.get(f"/t/{tenant.slug}/").status_code == 200
    denied = AuditEvent.objects.get(action="mfa.verify", actor=owner)
    assert denied.result == AuditEvent.Result.DENIED
    recovered = AuditEvent.objects.get(action="mfa.recovery_code", actor=owner)
    assert recovered.payload == {"left": len(codes) - 1}


# --- the pages showing a second factor's secrets are never kept by the browser --------------


def _no_store(response) -> bool:
    return "no-store" in response.get("Cache-Control", "")


@pytest.mark.django_db
def test_the_authenticator_key_and_the_recovery_codes_are_never_kept_by_the_browser(
    owner, tenant, django_capture_on_commit_callbacks
):
    browser = Client()
    browser.post("/accounts/login/", {"login": owner.email, "password": PASSWORD})
    browser.post("/accounts/reauthenticate/", {"password": PASSWORD})

    activate = browser.get("/accounts/2fa/totp/activate/")
    secret = browser.session["mfa.totp.secret"]
    assert activate.status_code == 200 and secret in activate.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        activated = browser.post("/accounts/2fa/totp/activate/", {"code": _totp(secret)})
    assert activated.status_code == 302

    codes = browser.get("/accounts/2fa/recovery-codes/")
    download = browser.get("/accounts/2fa/recovery-codes/download/")
    assert codes.status_code == 200 and download.status_code == 200

    shown = {
        "the TOTP key": activate,
        "the recovery codes": codes,
        "the recovery codes' download": download,
    }
    kept = [what for what, page in shown.items() if not _no_store(page)]
    assert not kept, f"kept by the browser: {', '.join(kept)}"
