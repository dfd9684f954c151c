"""`python -m portal.launch [--dev] -- COMMAND [ARG …]`: run COMMAND with its services found.

Settings only read the environment; this launcher fills it in for development and tests. It
points DATABASE_URL at the configured PostgreSQL, else the embedded one running under var/,
else the server on 127.0.0.1:5432, else an embedded one it starts under var/, and
CELERY_BROKER_URL and CACHE_URL likewise at Redis (see `portal.embedded`);
`OPSDECK_EMBEDDED=1` passes over the local servers. `--dev` also turns DEBUG on (unless DEBUG
is set), takes the secret and encryption keys from var/ (generated on first use) and points
OPSDECK_BASE_URL at this machine. It prints which PostgreSQL and Redis it chose, then replaces
itself with COMMAND, so the processes COMMAND starts (honcho's web, worker and beat) share one
environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import NoReturn
from urllib.parse import parse_qs, urlsplit

from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key

from portal import embedded

ROOT = Path(__file__).resolve().parent.parent


def var_dir(environ: MutableMapping[str, str]) -> Path:
    return Path(environ.get("OPSDECK_VAR_DIR") or ROOT / "var")


def prepare(environ: MutableMapping[str, str], *, dev: bool) -> list[str]:
    """Fill in what `environ` leaves unset; return one line each on PostgreSQL and Redis.

    Starts an embedded server when nothing answers locally, and creates the database.
    """
    var = var_dir(environ)
    database_name = embedded.DATABASE_NAME
    choice = environ.get("OPSDECK_EMBEDDED", "")
    if choice not in {"", "0", "1"}:
        raise ImproperlyConfigured(
            f"OPSDECK_EMBEDDED is {choice!r}: 1 uses embedded servers even where local ones "
            "answer, 0 (or unset) the local ones when they answer."
        )
    embedded_only = choice == "1"
    if dev:
        environ.setdefault("DEBUG", "1")
        if not environ.get("SECRET_KEY"):
            environ["SECRET_KEY"] = embedded.read_or_create(
                var / "secret_key", get_random_secret_key
            )
        if not environ.get("OPSDECK_ENCRYPTION_KEYS"):
            environ["OPSDECK_ENCRYPTION_KEYS"] = embedded.read_or_create(
                var / "encryption_key", lambda: Fernet.generate_key().decode()
            )
        # In development the database goes with the key that encrypts its secrets.
        encrypting_key = environ["OPSDECK_ENCRYPTION_KEYS"].split(",")[0].strip()
        database_name = embedded.development_database_name(encrypting_key)
        # ... and so do its Celery queue and cache keys: two checkouts on one Redis neither take
        # each other's tasks (a step for an operation the worker's database does not hold is
        # dropped) nor share sign-in rate limits.
        environ.setdefault("CELERY_QUEUE", database_name)
        environ.setdefault("CACHE_KEY_PREFIX", database_name)
        # Links in emails lead to the address `make run` prints, on the port it serves.
        environ.setdefault("OPSDECK_BASE_URL", f"http://127.0.0.1:{environ.get('PORT', '8000')}")
    return [
        _postgres(environ, var, database_name, embedded_only=embedded_only),
        _redis(environ, var, embedded_only=embedded_only),
    ]


def _postgres(
    environ: MutableMapping[str, str], var: Path, name: str, *, embedded_only: bool
) -> str:
    local = None if embedded_only else embedded.LOCAL_POSTGRES
    found = embedded.postgres(environ.get("DATABASE_URL", ""), var, local=local, name=name)
    if found.source == "configured":
        return f"PostgreSQL: DATABASE_URL as set ({_where(found.url)})"
    environ["DATABASE_URL"] = found.url
    environ["OPSDECK_DATABASE_SOURCE"] = found.source  # for the test run's header, make clean
    if found.source == "local":
        host, port = embedded.LOCAL_POSTGRES
        return f"PostgreSQL: local server at {host}:{port}, database {name}"
    return (
        f"PostgreSQL: embedded server with its data in {var / 'postgres'}, database {name}"
        + _because(found)
    )


def _because(found: embedded.Service) -> str:
    return f" ({found.note})" if found.note else ""


def _redis(environ: MutableMapping[str, str], var: Path, *, embedded_only: bool) -> str:
    broker, cache = environ.get("CELERY_BROKER_URL", ""), environ.get("CACHE_URL", "")
    if broker and cache:
        return "Redis: CELERY_BROKER_URL and CACHE_URL as set"
    found = embedded.redis("", var, local=None if embedded_only else embedded.LOCAL_REDIS)
    if found.source == "local":
        host, port = embedded.LOCAL_REDIS
        where = f"local server at {host}:{port}"
    else:
        where = f"embedded server on {found.url.removeprefix('unix://')}{_because(found)}"
    used = []
    if not broker:
        environ["CELERY_BROKER_URL"] = embedded.kombu_url(embedded.redis_url_for_db(found.url, 0))
        environ["OPSDECK_BROKER_SOURCE"] = found.source
        used.append("database 0 for the Celery broker")
    if not cache:
        environ["CACHE_URL"] = embedded.redis_url_for_db(found.url, 1)
        used.append("database 1 for the cache")
    return f"Redis: {where}, {' and '.join(used)}"


def _where(url: str) -> str:
    """Host and database of a PostgreSQL URL, without its password."""
    parts = urlsplit(url)
    host = parts.hostname or parse_qs(parts.query).get("host", ["the default socket"])[0]
    port = f":{parts.port}" if parts.port else ""
    return f"{host}{port}, database {parts.path.lstrip('/') or '(default)'}"


def main(argv: list[str]) -> NoReturn:
    parser = argparse.ArgumentParser(
        prog="python -m portal.launch",
        usage="%(prog)s [--dev] -- COMMAND [ARG ...]",
        description="Run COMMAND with DATABASE_URL, CELERY_BROKER_URL and CACHE_URL set to the "
        "configured, local or embedded PostgreSQL and Redis.",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="development: DEBUG=1 unless set, keys from var/, OPSDECK_BASE_URL on this machine",
    )
    # Everything after `--` is the command, options included.
    split = argv.index("--") if "--" in argv else len(argv)
    options, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("a command is required after --")
    try:
        lines = prepare(os.environ, dev=options.dev)
    except (ImproperlyConfigured, RuntimeError) as exc:
        sys.exit(f"portal.launch: {exc}")
    for line in lines:
        # On stderr: the command's own output (a dump, a JSON line) stays clean on stdout.
        print(line, file=sys.stderr, flush=True)
    try:
        os.execvp(command[0], command)  # noqa: S606 - the command the caller asked for
    except OSError as exc:
        sys.exit(f"portal.launch: cannot run {command[0]}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
