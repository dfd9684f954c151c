"""Databases of their own for test runs and benchmarks, copied from a migrated template.

Migrating an empty database takes several seconds here (ten on a busy machine), once per test
process and once per benchmark; copying a migrated one takes a fraction of a second. The
template, `opsdeck_migrated_<digest>`, is named by a digest of every installed app's migration
files, so a changed or added migration (ours or a library's) makes a new one; it stays on the
server for the next run, and templates of other migrations are dropped when a new one is
built. The first process that needs it builds it, by `manage.py migrate` in a database of
another name renamed once migrated (a build cut short leaves no template), while the others
wait on a lock (a PostgreSQL advisory lock, on the server's maintenance database).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_PREFIX = "opsdeck_migrated_"
# One lock for every template on a server: taken while a template is built, dropped or copied.
_LOCK_KEY = int.from_bytes(hashlib.sha256(b"opsdeck migrated template").digest()[:4], "big")


class ScratchDatabaseError(Exception):
    """The database could not be made (the message says why)."""


def database_copy(db: dict[str, Any], name: str) -> None:
    """Make the database `name` on the server of Django's `db` settings, a copy of the migrated
    template (built first when there is none); a database of that name is dropped first."""
    from psycopg import sql

    template = TEMPLATE_PREFIX + migrations_digest()
    with connect(db, "postgres") as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [_LOCK_KEY])
        try:
            if not _exists(conn, template):
                _build(conn, db, template)
            _drop(conn, name)
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(_name(name), _name(template))
            )
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])


def database_exists(db: dict[str, Any], name: str) -> bool:
    with connect(db, "postgres") as conn:
        return _exists(conn, name)


def database_drop(db: dict[str, Any], name: str) -> None:
    with connect(db, "postgres") as conn:
        _drop(conn, name)


def migrations_digest() -> str:
    """A digest of the migration files of every installed app, their names and contents."""
    from django.apps import apps

    digest = hashlib.sha256()
    for config in sorted(apps.get_app_configs(), key=lambda config: config.label):
        spec = importlib.util.find_spec(f"{config.name}.migrations")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(folder).glob("*.py")):
                digest.update(f"{config.label}/{path.name}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _build(conn, db: dict[str, Any], template: str) -> None:
    from cryptography.fernet import Fernet
    from psycopg import sql

    building = f"{template}_building"
    _drop(conn, building)
    conn.execute(sql.SQL("CREATE DATABASE {}").format(_name(building)))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_URL": url(db, building),
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "OPSDECK_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
    }
    command = [sys.executable, "manage.py", "migrate", "--no-input", "--verbosity", "0"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)  # noqa: S603
    if result.returncode != 0:
        _drop(conn, building)
        raise ScratchDatabaseError(f"migrating the template failed:\n{result.stderr[-3000:]}")
    conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(_name(building), _name(template)))
    others = conn.execute(
        "SELECT datname FROM pg_database WHERE starts_with(datname, %s) AND datname <> %s",
        [TEMPLATE_PREFIX, template],
    ).fetchall()
    for (other,) in others:
        _drop(conn, other)


def _exists(conn, name: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None
    )


def _drop(conn, name: str) -> None:
    """Drop the database `name` if there is one, whoever is connected to it."""
    from psycopg import sql

    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(_name(name)))


def _name(name: str):
    from psycopg import sql

    return sql.Identifier(name)


def server_params(db: dict[str, Any]) -> dict[str, Any]:
    """The server of Django's `db` settings: host, port, user and password."""
    host = db.get("HOST") or (db.get("OPTIONS") or {}).get("host", "")
    return {"host": host, "port": str(db.get("PORT") or ""), "user": db.get("USER") or "",
            "password": db.get("PASSWORD") or ""}  # fmt: skip


def connect(db: dict[str, Any], dbname: str):
    """An autocommit psycopg connection to `dbname` on the server of Django's `db` settings."""
    import psycopg

    params = {k: v for k, v in server_params(db).items() if v}
    try:
        return psycopg.connect(dbname=dbname, autocommit=True, connect_timeout=10, **params)
    except psycopg.OperationalError as exc:
        raise ScratchDatabaseError(
            f"cannot reach the PostgreSQL server: {str(exc).strip()}"
        ) from exc


def url(db: dict[str, Any], name: str) -> str:
    """The DATABASE_URL of the database `name` on the server of Django's `db` settings."""
    server = server_params(db)
    user = quote(server["user"], safe="")
    if server["password"]:
        user += ":" + quote(server["password"], safe="")
    if server["host"].startswith("/"):
        return f"postgres://{user}@/{name}?host={quote(server['host'], safe='/')}"
    return f"postgres://{user}@{server['host'] or 'localhost'}:{server['port'] or 5432}/{name}"
