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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The benchmark smoke tests first. pytest-django puts the tests that use no database last,
    and these are the suite's longest (each a benchmark run of half a minute, on a throwaway
    database of its own): last, the run waited on them with its other workers done. First,
    the shorter tests fill in around them. They change no database the other tests read."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/bench/"))


@pytest.fixture(scope="session")
def django_db_setup(
    request,
    django_test_environment,
    django_db_blocker,
    django_db_keepdb,
    django_db_createdb,
    django_db_modify_db_settings,
):
    """pytest-django's, each test process's database copied from a migrated template
    (`portal.scratch_databases`) rather than migrated from scratch: about ten seconds saved
    per process. `--reuse-db` keeps using a database that exists, as pytest-django does."""
    from django.conf import settings as django_settings
    from django.db import connections
    from django.test.utils import setup_databases, teardown_databases
    from pytest_django.fixtures import _get_databases_for_setup

    from portal import scratch_databases

    aliases, serialized_aliases = _get_databases_for_setup(request.session.items)
    reuse = django_db_keepdb and not django_db_createdb
    verbosity = request.config.option.verbose
    with django_db_blocker.unblock():
        for alias in aliases:
            db = django_settings.DATABASES[alias]
            name = connections[alias].creation._get_test_db_name()
            if not (reuse and scratch_databases.database_exists(db, name)):
                scratch_databases.database_copy(db, name)
        config = setup_databases(
            verbosity=verbosity,
            interactive=False,
            aliases=aliases,
            serialized_aliases=serialized_aliases,
            keepdb=True,  # the copy: its `migrate` finds nothing to do
        )
    yield
    if not django_db_keepdb:
        with django_db_blocker.unblock():
            teardown_databases(config, verbosity=verbosity)


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


@pytest.fixture
def staff_client(client, make_user):
    """A client signed in as platform staff (a superuser)."""
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def mail_at_commit(transactional_db, settings):
    """Emails go out in this process as their transaction commits, the mail worker's task run
    eagerly into `mail.outbox`: a test reads them at once. (The mail queue and its worker are
    tested in tests/accounts/test_mail.py.)"""
    settings.CELERY_TASK_ALWAYS_EAGER = True


def mail_forget() -> None:
    """Forget the emails a test wrote before what it checks: those sent (`mail.outbox`), and
    those still waiting because the transaction that wrote them, the test's own, never
    committed (the mail worker sends every waiting email with the next one)."""
    from django.core import mail

    from accounts.models import OutgoingEmail

    mail.outbox.clear()
    OutgoingEmail.objects.all().delete()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "unsubscribed: tenants are not subscribed to plans on their own (see below)"
    )
    if config.pluginmanager.hasplugin("django"):
        from django.conf import settings as django_settings

        # A million PBKDF2 rounds take most of a second here, once per user a test makes;
        # what is tested is who may sign in, not how slowly the hash is made.
        django_settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
        # A test's commit need not wait for the disk (this connection only; a crash loses a
        # test database, not data anyone keeps).
        options = django_settings.DATABASES["default"].setdefault("OPTIONS", {})
        options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()
        # Django builds a test client's middleware anew for each client, and WhiteNoise's
        # scanned every collected static file each time (a fifth of a page test's time). It
        # looks a file up when it is asked for instead; the files served are the same.
        django_settings.WHITENOISE_AUTOREFRESH = True
        # After a transactional test, its rows deleted rather than every table truncated.
        from tests import emptying

        emptying.install()


@pytest.fixture(autouse=True)
def _tenants_subscribed(request):
    """Every tenant a test makes is subscribed (active) to every plan, whichever is made
    first — as the data migration subscribes the tenants that already ran instances — so a
    test about instances need not say so. Tests of subscriptions mark themselves
    `unsubscribed` and subscribe for themselves."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    if request.node.get_closest_marker("unsubscribed"):
        yield
        return
    from django.db.models.signals import post_save

    from accounts.models import Tenant
    from billing.models import Plan, Subscription

    def subscribe(tenants, plans) -> None:
        for tenant in tenants:
            for plan in plans:
                open_ = Subscription.objects.filter(tenant=tenant, plan=plan).exclude(
                    status=Subscription.Status.CANCELLED
                )
                if not open_.exists():
                    Subscription.objects.create(
                        tenant=tenant, plan=plan, status=Subscription.Status.ACTIVE
                    )

    def tenant_made(sender, instance, created, raw=False, **kwargs):
        if created and not raw:
            subscribe([instance], Plan.objects.all())

    def plan_made(sender, instance, created, raw=False, **kwargs):
        if created and not raw:
            subscribe(Tenant.objects.all(), [instance])

    post_save.connect(tenant_made, sender=Tenant, dispatch_uid="test-tenant-subscribed")
    post_save.connect(plan_made, sender=Plan, dispatch_uid="test-plan-subscribed")
    yield
    post_save.disconnect(sender=Tenant, dispatch_uid="test-tenant-subscribed")
    post_save.disconnect(sender=Plan, dispatch_uid="test-plan-subscribed")


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


@pytest.fixture
def broker(monkeypatch):
    """The broker as Celery reaches it: `down()` makes every send fail as kombu fails when the
    broker refuses the connection; `sent` holds what was sent once it is `back()`."""
    from celery import Celery
    from kombu.exceptions import OperationalError

    class Broker:
        def __init__(self):
            self.sent = []

        def down(self):
            def refuse(app, name, *args, **kwargs):
                raise OperationalError(
                    "Error 111 connecting to 127.0.0.1:6379. Connection refused."
                )

            monkeypatch.setattr(Celery, "send_task", refuse)

        def back(self):
            def send(app, name, args=None, kwargs=None, **options):
                self.sent.append((name, list(args or [])))

            monkeypatch.setattr(Celery, "send_task", send)

    return Broker()
