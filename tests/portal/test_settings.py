"""Settings as an operator meets them: a fresh process with only environment variables."""

import os
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "DATABASE_URL"}}
    return subprocess.run(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**keep, "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
             "CACHE_URL": "locmemcache://", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def _database_url() -> str:
    db = settings.DATABASES["default"]
    if db["HOST"]:
        return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    return f"postgres://{db['USER']}@/{db['NAME']}?host={db['OPTIONS']['host']}"


PRODUCTION = {
    "SECRET_KEY": "a-production-secret-" + "x" * 50,
    "ALLOWED_HOSTS": "opsdeck.example.com",
    "EMAIL_URL": "smtp+tls://mailer:password@smtp.example.com:587",
    "OPSDECK_BASE_URL": "https://opsdeck.example.com",
}


def test_deploy_checks_pass_with_production_variables():
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        OPSDECK_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
        DATABASE_URL=_database_url(),
        **PRODUCTION,
    )

    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_deploy_checks_name_development_defaults_left_in_production():
    result = _manage(
        "check",
        "--deploy",
        SECRET_KEY="a-production-secret-" + "x" * 50,
        OPSDECK_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
        ALLOWED_HOSTS="opsdeck.example.com",
        EMAIL_URL="consolemail://",
    )

    output = result.stderr + result.stdout
    assert "portal.W003" in output  # console email
    assert "portal.W004" in output  # links to localhost


def test_without_debug_a_secret_key_is_required():
    result = _manage("check", OPSDECK_ENCRYPTION_KEYS=Fernet.generate_key().decode())

    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off." in result.stderr


def test_a_malformed_encryption_key_is_reported_by_the_checks():
    result = _manage("check", SECRET_KEY="x" * 60, OPSDECK_ENCRYPTION_KEYS="not-a-key")

    assert result.returncode != 0
    assert "accounts.E001" in result.stderr
    assert "Key 1 in OPSDECK_ENCRYPTION_KEYS is not a Fernet key." in result.stderr


def test_development_also_requires_email_verification_so_sign_up_reveals_no_address(tmp_path):
    result = _manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.ACCOUNT_EMAIL_VERIFICATION)",
        DEBUG="1",
        OPSDECK_VAR_DIR=str(tmp_path),
        SECRET_KEY="x" * 60,
        OPSDECK_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
        DATABASE_URL=_database_url(),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "mandatory"
