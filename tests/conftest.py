import shutil
import uuid
from pathlib import Path

import pytest
from allauth.account.models import EmailAddress
from django.conf import settings as django_settings
from django.core.management import call_command

from accounts import services
from accounts.audit import Actor
from accounts.models import Membership, User


def pytest_report_header(config):
    db = django_settings.DATABASES["default"]
    where = db.get("HOST") or db.get("OPTIONS", {}).get("host") or "the default socket"
    return [
        f"database: PostgreSQL ({django_settings.OPSDECK_DATABASE_SOURCE}) "
        f"at {where}, test database test_{db['NAME']}",
        f"broker: {django_settings.OPSDECK_BROKER_SOURCE}, "
        f"queue {django_settings.CELERY_TASK_DEFAULT_QUEUE}",
    ]


@pytest.fixture(scope="session", autouse=True)
def _static_files():
    """Pages are served as in production: hashed static files collected once per run."""
    call_command("collectstatic", interactive=False, verbosity=0)
    yield
    shutil.rmtree(Path(django_settings.STATIC_ROOT), ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_cache(settings):
    """Each test gets its own cache keys: rate limits of one never throttle another."""
    settings.CACHES = {
        "default": {**settings.CACHES["default"], "KEY_PREFIX": f"t-{uuid.uuid4().hex}"}
    }


PASSWORD = "correct-horse-battery-9"


@pytest.fixture
def make_user(db):
    def make(email: str, *, verified: bool = True, **extra) -> User:
        user = User.objects.create_user(email=email, password=PASSWORD, **extra)
        EmailAddress.objects.create(user=user, email=email, verified=verified, primary=True)
        return user

    return make


@pytest.fixture
def owner(make_user):
    return make_user("owner@example.com")


@pytest.fixture
def tenant(owner):
    return services.tenant_create(actor=Actor(user=owner), name="Acme")


@pytest.fixture
def add_member(tenant, make_user):
    def add(email: str, role: str) -> User:
        user = make_user(email)
        Membership.objects.create(tenant=tenant, user=user, role=role)
        return user

    return add


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client
