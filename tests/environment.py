"""The test run's environment, set before Django reads its settings (loaded with `-p`).

Tests run with production settings (DEBUG off) and their own secrets, Celery
queue, cache prefix and test database, so a `make run` worker on the same
Redis never takes a test's task, a test never reads the portal's cache, and
two runs can share one PostgreSQL server. The servers are those `make test`'s
launcher chose, or, when pytest runs directly, the ones it would choose.
"""

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
# Made by the collectstatic of the process that runs tests (`conftest._static_files`), which
# removes it: a pytest-xdist controller runs none and leaves no empty folder behind.
os.environ["STATIC_ROOT"] = os.path.join(tempfile.gettempdir(), f"opsdeck-static-{RUN_ID}")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before pytest-django reads the settings: PostgreSQL and Redis, unless set or not needed.

    Runs without Django (`-p no:django`, the engine and sandbox suites) need neither.
    """
    if early_config.pluginmanager.hasplugin("django"):
        from portal import launch

        launch.prepare(os.environ, dev=False)


def pytest_sessionfinish(session, exitstatus):
    """Leave nothing of this run in the broker: its queues at every priority, and the messages
    and bindings kombu keeps for them."""
    from django.conf import settings

    from portal.broker import queue_forget
    from portal.celery import app

    for queue in (settings.CELERY_TASK_DEFAULT_QUEUE, settings.OPSDECK_MAIL_QUEUE):
        try:
            queue_forget(app, queue)
        except Exception as exc:  # a broker gone by now is not the run's failure
            print(f"\nCould not remove the test queue {queue} from the broker: {exc}")
