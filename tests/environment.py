"""The test run's environment, set before Django reads its settings (loaded with `-p`).

Tests run with production settings (DEBUG off) and their own secrets, Celery
queue, cache prefix and test database, so a `make run` worker on the same
Redis never takes a test's task, a test never reads the portal's cache, and
two runs can share one PostgreSQL server. The servers are those `make test`'s
launcher chose, or, when pytest runs directly, the ones it would choose.
"""

import json
import os
import secrets
import tempfile

import pytest
from cryptography.fernet import Fernet

RUN_ID = secrets.token_hex(4)

os.environ["DEBUG"] = "0"
os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
os.environ["OPSDECK_ENCRYPTION_KEYS"] = Fernet.generate_key().decode()
os.environ["SECURE_SSL_REDIRECT"] = "0"  # the test client speaks plain HTTP
os.environ["CELERY_QUEUE"] = f"opsdeck-test-{RUN_ID}"
os.environ["CACHE_KEY_PREFIX"] = f"opsdeck-test-{RUN_ID}"
os.environ["DATABASE_TEST_NAME"] = f"test_opsdeck_{RUN_ID}"
os.environ["STATIC_ROOT"] = tempfile.mkdtemp(prefix="opsdeck-static-")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before pytest-django reads the settings: PostgreSQL and Redis, unless set or not needed.

    Runs without Django (`-p no:django`, the engine and sandbox suites) need neither.
    """
    if early_config.pluginmanager.hasplugin("django"):
        from portal import launch

        launch.prepare(os.environ, dev=False)


def pytest_sessionfinish(session, exitstatus):
    """Leave nothing of this run in the broker: its queue and the bindings kombu keeps for it."""
    from django.conf import settings
    from kombu import Connection

    queue = os.environ["CELERY_QUEUE"]
    try:
        with Connection(settings.CELERY_BROKER_URL) as connection:
            client = connection.default_channel.client
            client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
            # Messages a killed worker held stay in kombu's unacked set, to be put back on
            # this queue by whichever client looks next: drop them too.
            for tag, raw in client.hscan_iter("unacked"):
                try:
                    routing_key = json.loads(raw)[2]
                except (ValueError, IndexError, TypeError):
                    continue
                if routing_key == queue:
                    client.hdel("unacked", tag)
                    client.zrem("unacked_index", tag)
    except Exception as exc:  # a broker gone by now is not the run's failure
        print(f"\nCould not remove the test queue {queue} from the broker: {exc}")
