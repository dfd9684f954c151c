"""Settings as an operator meets them: a fresh process with only environment variables."""

import os
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`python manage.py …` with the variables given and nothing else of this run's."""
    keep = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
    return subprocess.run(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**keep, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _services() -> dict[str, str]:
    return {
        "DATABASE_URL": os.environ["DATABASE_URL"],  # set by the launcher or tests/environment.py
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CACHE_URL": settings.CACHE_URL,
    }


def _keys() -> dict[str, str]:
    return {
        "SECRET_KEY": "a-production-secret-" + "x" * 50,
        "OPSDECK_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
    }


PRODUCTION = {
    "ALLOWED_HOSTS": "opsdeck.example.com",
    "EMAIL_URL": "smtp+tls://mailer:password@smtp.example.com:587",
    "OPSDECK_BASE_URL": "https://opsdeck.example.com",
}


def test_deploy_checks_pass_with_production_variables():
    result = _manage(
        "check", "--deploy", "--fail-level", "WARNING", **_keys(), **_services(), **PRODUCTION
    )

    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_deploy_checks_name_development_defaults_left_in_production():
    result = _manage(
        "check",
        "--deploy",
        **_keys(),
        **_services(),
        ALLOWED_HOSTS="opsdeck.example.com",
        EMAIL_URL="consolemail://",
    )

    output = result.stderr + result.stdout
    assert "portal.W003" in output  # console email
    assert "portal.W004" in output  # links to this machine


def test_deploy_checks_name_a_cache_each_process_keeps_to_itself():
    services = _services() | {"CACHE_URL": "locmemcache://"}

    result = _manage("check", "--deploy", **_keys(), **services, **PRODUCTION)

    assert "portal.W005" in result.stderr + result.stdout


def test_without_debug_every_missing_variable_is_named_in_one_line():
    result = _manage("createsuperuser")  # as a newcomer types it, in a fresh shell

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "manage.py: SECRET_KEY, OPSDECK_ENCRYPTION_KEYS, DATABASE_URL, CELERY_BROKER_URL, "
        "CACHE_URL must be set when DEBUG is off (the README's Configuration lists them). "
        "In development, start Opsdeck with `make run` and run manage.py commands as "
        "`scripts/manage COMMAND`: they set them."
    ]


def test_without_debug_a_missing_database_url_stops_the_start():
    services = {k: v for k, v in _services().items() if k != "DATABASE_URL"}

    result = _manage("migrate", **_keys(), **services)

    assert result.returncode == 1
    assert result.stderr.startswith("manage.py: DATABASE_URL must be set when DEBUG is off")
    assert "Traceback" not in result.stderr


def test_in_development_without_the_launcher_the_message_says_how_to_start():
    result = _manage("check", DEBUG="1")

    assert result.returncode == 1
    assert "must be set (the README's Configuration lists them). In development, start " in (
        result.stderr
    )
    assert "`scripts/manage COMMAND`" in result.stderr


@pytest.mark.django_db
def test_reading_the_settings_starts_and_creates_nothing(tmp_path):
    absent = f"opsdeck_absent_{secrets.token_hex(4)}"
    services = _services()
    services["DATABASE_URL"] = urlsplit(services["DATABASE_URL"])._replace(path=absent).geturl()

    result = _manage(
        "check", **_keys(), **services, DEBUG="1", OPSDECK_VAR_DIR=str(tmp_path / "var")
    )

    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "var").exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [absent])
        assert cursor.fetchone() is None


def test_a_malformed_encryption_key_is_reported_by_the_checks():
    result = _manage(
        "check", **_services(), SECRET_KEY="x" * 60, OPSDECK_ENCRYPTION_KEYS="not-a-key"
    )

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
        **_services(),
        **_keys(),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "mandatory"


_PREPARED = (
    "from django.db import connection\n"
    "from accounts.models import Tenant\n"
    "for _ in range(8): list(Tenant.objects.filter(slug='none'))\n"
    "with connection.cursor() as cursor:\n"
    "    cursor.execute('SELECT statement FROM pg_prepared_statements')\n"
    "    print(sum('accounts_tenant' in row[0] for row in cursor.fetchall()))\n"
)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setting", "prepared"), [({}, 1), ({"DATABASE_PREPARED_STATEMENTS": "0"}, 0)]
)
def test_a_statement_a_connection_runs_again_and_again_is_planned_once_unless_turned_off(
    setting, prepared
):
    # Off for a pooler in transaction mode that cannot keep prepared statements (PgBouncer
    # before 1.21, or without max_prepared_statements).
    services = _services()
    test_database = connection.settings_dict["NAME"]
    services["DATABASE_URL"] = (
        urlsplit(services["DATABASE_URL"])._replace(path=test_database).geturl()
    )

    result = _manage("shell", "-c", _PREPARED, **_keys(), **services, DEBUG="1", **setting)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(prepared)


def test_a_secret_key_that_begins_with_a_dollar_sign_is_taken_as_written(tmp_path):
    # Django's generated keys draw from 50 characters, `$` among them: one `make run` in 50
    # made a key that began with it.
    key = "$" + "k" * 60
    printed = "from django.conf import settings; print(settings.SECRET_KEY)"

    result = _manage(
        "shell", "-c", printed, **{**_keys(), "SECRET_KEY": key}, **_services(), DEBUG="1",
        OPSDECK_VAR_DIR=str(tmp_path),
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == key


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_wait_before_reading_warnings_that_is_no_wait_stops_the_start(value):
    result = _manage("check", **_keys(), **_services(), DEBUG="1", OPSDECK_WAIT_WARNING_AFTER=value)

    assert result.returncode != 0
    assert (
        f"OPSDECK_WAIT_WARNING_AFTER must be a number of seconds greater than 0, e.g. 30; it is "
        f"{value!r}." in result.stderr
    )
