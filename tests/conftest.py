import shutil
import uuid
from pathlib import Path

import pytest

# Django-dependent imports happen inside fixtures: the engine and sandbox suites run without
# Django (`-p no:django`) and must be able to load this file.


def pytest_report_header(config):
    if not config.pluginmanager.hasplugin("django"):
        return []
    from django.conf import settings as django_settings

    db = django_settings.DATABASES["default"]
    where = db.get("HOST") or db.get("OPTIONS", {}).get("host") or "the default socket"
    return [
        f"database: PostgreSQL ({django_settings.OPSDECK_DATABASE_SOURCE}) "
        f"at {where}, test database {db.get('TEST', {}).get('NAME') or 'test_' + db['NAME']}",
        f"broker: {django_settings.OPSDECK_BROKER_SOURCE}, "
        f"queue {django_settings.CELERY_TASK_DEFAULT_QUEUE}",
    ]


@pytest.fixture(scope="session", autouse=True)
def _static_files(pytestconfig):
    """Pages are served as in production: hashed static files collected once per run."""
    if not pytestconfig.pluginmanager.hasplugin("django"):
        yield
        return
    from django.conf import settings as django_settings
    from django.core.management import call_command

    call_command("collectstatic", interactive=False, verbosity=0)
    yield
    shutil.rmtree(Path(django_settings.STATIC_ROOT), ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_cache(request):
    """Each test gets its own cache keys: rate limits of one never throttle another."""
    if not request.config.pluginmanager.hasplugin("django"):
        return
    settings = request.getfixturevalue("settings")
    settings.CACHES = {
        "default": {**settings.CACHES["default"], "KEY_PREFIX": f"t-{uuid.uuid4().hex}"}
    }


PASSWORD = "correct-horse-battery-9"


@pytest.fixture
def make_user(db):
    from allauth.account.models import EmailAddress

    from accounts.models import User

    def make(email: str, *, verified: bool = True, **extra):
        user = User.objects.create_user(email=email, password=PASSWORD, **extra)
        EmailAddress.objects.create(user=user, email=email, verified=verified, primary=True)
        return user

    return make


@pytest.fixture
def owner(make_user):
    return make_user("owner@example.com")


@pytest.fixture
def tenant(owner):
    from accounts import services
    from accounts.audit import Actor

    return services.tenant_create(actor=Actor(user=owner), name="Acme")


@pytest.fixture
def add_member(tenant, make_user):
    from accounts.models import Membership

    def add(email: str, role: str):
        user = make_user(email)
        Membership.objects.create(tenant=tenant, user=user, role=role)
        return user

    return add


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client
