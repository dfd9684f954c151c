"""Opsdeck settings: one file, read top to bottom, every value from the environment.

Production-safe by default (DEBUG off, secrets and services required). Reading
settings starts and creates nothing: in development `make run` and `scripts/manage`
set the environment through `portal/launch.py` (DEBUG=1, generated keys under var/,
the PostgreSQL and Redis it found or started). The README's "Configuration" table
lists every variable.
"""

import math
import os
import re
from pathlib import Path

import environ
import stripe
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.str("OPSDECK_VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = env.bool("DEBUG", default=False)

# --- Secrets and services: required ------------------------------------------

# No fallback here: a production process without them must not start on a guess (a local
# server, an old var/). All missing ones are named at once.
_REQUIRED = [
    "SECRET_KEY",
    "OPSDECK_ENCRYPTION_KEYS",
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "CACHE_URL",
]
_missing = ", ".join(name for name in _REQUIRED if not os.environ.get(name))
if _missing:
    raise ImproperlyConfigured(
        f"{_missing} must be set{'' if DEBUG else ' when DEBUG is off'} (the README's "
        "Configuration lists them). In development, start Opsdeck with `make run` and run "
        "manage.py commands as `scripts/manage COMMAND`: they set them."
    )

# As written: django-environ reads a value that begins with `$` as the name of another variable,
# and a generated key (`make run`'s among them) may begin with one.
SECRET_KEY = os.environ["SECRET_KEY"]
# Comma-separated Fernet keys; the first encrypts, all decrypt (MultiFernet).
OPSDECK_ENCRYPTION_KEYS = env.list("OPSDECK_ENCRYPTION_KEYS")

# --- HTTP and security -------------------------------------------------------

ALLOWED_HOSTS = env.list(
    "ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"] if DEBUG else []
)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
CSRF_FAILURE_VIEW = "portal.views.csrf_failure"
if env.bool("BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Proxies in front that append to X-Forwarded-For: the client address (audit log, sign-in
# rate limits) is read that many hops from the right. 0 trusts only the socket's address.
ALLAUTH_TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)

SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # load balancers probe over plain HTTP
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=not DEBUG)
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (django-csp), on every answer: scripts, styles, fonts and requests from
# this server only, never inline, never eval (htmx's `allowEval` is off: templates/base.html).
# Images also as data: URIs: Pico's icons are SVG written into its CSS, and the two-factor
# set-up's QR code is one. Forms are sent here only, and on to Stripe's Checkout and customer
# portal when Stripe bills (`portal.middleware.ContentSecurityPolicyMiddleware`).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        # What a browser refuses is logged (`portal.csp_reports`).
        "report-uri": ["/csp-report"],
    }
}
# Browser features no page uses, turned off for every page and anything it could embed (payment
# happens on Stripe's own page). Writing to the clipboard from this origin needs no permission.
PERMISSIONS_POLICY = {
    feature: []
    for feature in [
        "accelerometer",
        "camera",
        "display-capture",
        "geolocation",
        "gyroscope",
        "hid",
        "idle-detection",
        "magnetometer",
        "microphone",
        "midi",
        "payment",
        "screen-wake-lock",
        "serial",
        "usb",
        "xr-spatial-tracking",
    ]
}

# --- Applications ------------------------------------------------------------

INSTALLED_APPS = [
    "portal.apps.OpsdeckAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "csp",
    "template_partials",
    "rest_framework",
    "django_celery_beat",
    "allauth",
    "allauth.account",
    "allauth.mfa",
    "accounts",
    "billing",
    "deployments",
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.middleware.ContentSecurityPolicyMiddleware",
    "django_permissions_policy.PermissionsPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "portal.middleware.AccountPagesNotKeptMiddleware",
    "django.middleware.common.CommonMiddleware",
    "portal.middleware.NullCharacterMiddleware",
    "portal.middleware.FormOnlyAddressMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "portal.middleware.HtmxPageGoneMiddleware",
]

ROOT_URLCONF = "portal.urls"

# The API (`/api/v1/`): JSON only, an organization's API token its only way in (no session:
# no CSRF surface), errors as {"error": "..."}.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["accounts.api.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.api.TokenAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["accounts.api.JSONParser"],
    "EXCEPTION_HANDLER": "accounts.api.exception_handler",
    "UNAUTHENTICATED_USER": None,
    # OPTIONS would describe each view from its docstring: not the API's documentation.
    "DEFAULT_METADATA_CLASS": None,
    "DEFAULT_THROTTLE_CLASSES": ["accounts.api.TokenRate", "accounts.api.TokenWriteRate"],
}


def _rate(name: str, default: str) -> str:
    """A rate as DRF's throttles read it ("600/min"), refused at start when it cannot be."""
    value = env.str(name, default=default)
    if not re.fullmatch(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)", value):
        raise ImproperlyConfigured(
            f"{name} must be a number of requests per second, minute, hour or day, e.g. "
            f"{default}; it is {value!r}."
        )
    return value


def _seconds(name: str, default: str) -> float:
    """A number of seconds greater than 0, refused at start when it is not one (0, a negative
    or NaN would make what waits that long not wait at all)."""
    value = env.str(name, default=default)
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ImproperlyConfigured(
            f"{name} must be a number of seconds greater than 0, e.g. {default}; it is {value!r}."
        )
    return seconds


# Requests one API token may make, and of them those that change something (POST, PATCH,
# DELETE): past either, a 429 says when to try again. Counted in the cache, shared by every web
# process.
OPSDECK_API_RATE = _rate("OPSDECK_API_RATE", "600/min")
OPSDECK_API_WRITE_RATE = _rate("OPSDECK_API_WRITE_RATE", "60/min")
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.tenancy",
                "billing.context_processors.billing_team",
            ],
        },
    },
]

# --- Data: PostgreSQL everywhere ---------------------------------------------

DATABASES = {"default": env.db_url_config(env.str("DATABASE_URL"))}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Parameters bound by the server, so that a statement a connection runs again and again (an
# operation's claim and move, a page's queries) is parsed and planned once: psycopg prepares it
# after 5 runs. Off for a pooler in transaction mode that cannot keep prepared statements.
if env.bool("DATABASE_PREPARED_STATEMENTS", default=True):
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=5
    )
# The database a test run creates (and drops); distinct names let runs share a server.
if env.str("DATABASE_TEST_NAME", default=""):
    DATABASES["default"]["TEST"] = {"NAME": env.str("DATABASE_TEST_NAME")}
# Where the launcher found the database (configured, local or embedded), for the test
# run's header and `make clean`.
OPSDECK_DATABASE_SOURCE = env.str("OPSDECK_DATABASE_SOURCE", default="configured")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: broker and cache -------------------------------------------------

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL")
OPSDECK_BROKER_SOURCE = env.str("OPSDECK_BROKER_SOURCE", default="configured")
# Required, not a per-process default: sign-in rate limits must be shared by every web process,
# and whether the mail worker was asked for the new emails by every process that writes one.
CACHE_URL = env.str("CACHE_URL")

if CACHE_URL.startswith(("redis://", "rediss://", "unix://")):
    _cache = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}
else:
    _cache = env.cache_url_config(CACHE_URL)
_cache["KEY_PREFIX"] = env.str("CACHE_KEY_PREFIX", default="opsdeck")
CACHES = {"default": _cache}

# --- Celery --------------------------------------------------------------------

CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_QUEUE", default="opsdeck")
# Emails wait on a queue of their own, which the Procfile's `mail` worker alone consumes: a mail
# server that is slow or never answers (EMAIL_TIMEOUT) holds a mail worker's thread, never a
# worker that moves operations or runs beat's rounds. The Procfile names it the same way.
OPSDECK_MAIL_QUEUE = env.str("CELERY_MAIL_QUEUE", default=f"{CELERY_TASK_DEFAULT_QUEUE}.mail")
_MAIL_TASKS = (
    "accounts.tasks.email_send",
    "accounts.tasks.emails_send_new",
    "accounts.tasks.invitation_send",
)
CELERY_TASK_ROUTES = {name: {"queue": OPSDECK_MAIL_QUEUE} for name in _MAIL_TASKS}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Steps have priorities (`deployments.transitions.step_priority`). Redis keeps a list per
# priority and pops the lowest number first; a task sent without one counts as 0, the first.
# RabbitMQ honours priorities only on a queue declared with a maximum priority (a queue declared
# earlier without it must be deleted once) and delivers the highest first: its queues get the
# fewest levels the steps need (RabbitMQ advises few), and a task sent without a priority (an
# email, beat's) the highest, by a route every task takes, so that each keeps its place.
if CELERY_BROKER_URL.split(":", 1)[0] in {"amqp", "amqps", "pyamqp"}:
    CELERY_TASK_QUEUE_MAX_PRIORITY = 3
    for _route in CELERY_TASK_ROUTES.values():
        _route["priority"] = CELERY_TASK_QUEUE_MAX_PRIORITY
    CELERY_TASK_ROUTES["*"] = {"priority": CELERY_TASK_QUEUE_MAX_PRIORITY}
CELERY_TASK_IGNORE_RESULT = True  # state lives in PostgreSQL, not in a result backend
# Celery's Django fixup closes every database connection before and after each task unless told
# to reuse them: an operation's move would open one (a PostgreSQL backend forked, TLS and auth)
# per step. It closes them once per this many tasks; in between, `portal.celery` applies
# DATABASE_CONN_MAX_AGE and the health check around each task, as Django does per request.
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# A message a killed worker held comes back after this many seconds (Redis brokers); the
# operation sweeper usually re-enqueues the operation sooner. A Redis broker whose host stops
# answering (its packets dropped, not refused) is given up on after a few seconds per attempt,
# not the system's two minutes, and so is one that takes the connection but never answers a
# command (a hung server, a half-open connection; kombu's default waits for ever): a request
# that committed sends its step after the commit and answers once the send gave up (the sweeper
# sends the step later). A worker's BRPOP is answered by the server within a second when idle,
# so 5 s between any two answers is no limit to a live server. RabbitMQ's connection timeout is
# Celery's `broker_connection_timeout` (4 s).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 300,
    "socket_connect_timeout": 3,
    "socket_timeout": 5,
}
# An operation whose next step is this many seconds overdue is re-enqueued by the sweeper.
OPSDECK_STALLED_AFTER = env.int("OPSDECK_STALLED_AFTER", default=60)
# The longest an operation waits between two looks at the cluster when nothing wakes it. The
# cell watcher (`watch_cells`) wakes an operation as soon as an object it may wait on changes,
# so with it running this is only a safety net and may be raised (e.g. 30).
OPSDECK_POLL_MAX = env.float("OPSDECK_POLL_MAX", default=5.0)
# The first wait, right after an object was applied (each next one 1.5 times longer).
OPSDECK_POLL_FIRST = env.float("OPSDECK_POLL_FIRST", default=0.2)
# Seconds a task waits on its object before the object's newest Warning event is read into what
# the task says on the Operations tab, and again each time as long after.
OPSDECK_WAIT_WARNING_AFTER = _seconds("OPSDECK_WAIT_WARNING_AFTER", "30")
# Seconds a worker holds an operation it advances; another takes a worker's operation over
# after that. At least twice the longest Kubernetes call (5 s to connect, 30 s to read), so a
# slow call never loses a live worker its claim.
OPSDECK_OPERATION_LEASE = env.int("OPSDECK_OPERATION_LEASE", default=90)
# Seconds before a move that an error of Opsdeck's own stopped (a fault: a bug, a database
# error) is tried again, doubling at each fault in a row; the run fails at the fifth.
OPSDECK_FAULT_RETRY_DELAY = env.float("OPSDECK_FAULT_RETRY_DELAY", default=2.0)
# Seconds one watch request lasts before the watcher resumes it from the last version seen.
OPSDECK_WATCH_TIMEOUT = env.int("OPSDECK_WATCH_TIMEOUT", default=60)
# Seconds a running instance fails its plan's health rule before it shows as Degraded (and
# its owners and admins are emailed).
OPSDECK_DEGRADED_AFTER = env.int("OPSDECK_DEGRADED_AFTER", default=120)
# Seconds after which the status sync reads again the status objects the cell watcher streams
# (a safety net for an event it missed), and stores an instance's unchanged status to confirm
# it (the page's "Observed" time). Each change is stored as it happens.
OPSDECK_STATUS_CONFIRM_AFTER = env.int("OPSDECK_STATUS_CONFIRM_AFTER", default=300)
# Rows past which an unfiltered staff list of a table that grows with the fleet (the audit log,
# operations, usage records, the Stripe outbox) shows PostgreSQL's estimate of them instead of
# counting every row on every page.
OPSDECK_ADMIN_ESTIMATE_ABOVE = env.int("OPSDECK_ADMIN_ESTIMATE_ABOVE", default=100_000)
CELERY_TIMEZONE = "UTC"
# Beat's DatabaseScheduler stores these entries in the database at start-up.
CELERY_BEAT_SCHEDULE = {
    "operations-sweep": {"task": "deployments.tasks.operations_sweep", "schedule": 30.0},
    "instances-observe": {"task": "deployments.tasks.instances_observe", "schedule": 30.0},
    "instances-health": {"task": "deployments.tasks.instances_health", "schedule": 30.0},
    "backups-run-due": {"task": "deployments.tasks.backups_run_due", "schedule": 60.0},
    "snapshots-prune": {"task": "deployments.tasks.snapshots_prune", "schedule": 600.0},
    # Every full hour not metered yet; running again changes nothing.
    "usage-meter": {"task": "deployments.tasks.usage_meter", "schedule": 300.0},
    "subscriptions-suspend-overdue": {
        "task": "billing.tasks.subscriptions_suspend_overdue",
        "schedule": 3600.0,
    },
    "suspended-instances-stop": {
        "task": "deployments.tasks.suspended_instances_stop",
        "schedule": 3600.0,
    },
    # Sends due Stripe meter events (does nothing while Stripe is not configured).
    "meter-events-flush": {"task": "billing.tasks.meter_events_flush", "schedule": 60.0},
    # Subscriptions as Stripe holds them, should one of its webhooks be lost.
    "subscriptions-reconcile": {
        "task": "billing.tasks.subscriptions_reconcile",
        "schedule": 3600.0,
    },
    # Billing details Stripe's customer does not hold yet (a failed update, tried again).
    "billing-details-push": {"task": "billing.tasks.billing_details_push_due", "schedule": 60.0},
    # Each month that has ended becomes draft invoices once every hour of it is metered.
    "billing-period-close": {"task": "billing.tasks.billing_period_close", "schedule": 3600.0},
    # The Metrics tab's samples: one a minute per server of every running instance.
    "server-samples-take": {"task": "deployments.tasks.server_samples_take", "schedule": 60.0},
    # Fleet actions whose worker died, or whose message was lost, carry on.
    "fleet-runs-resume": {"task": "deployments.tasks.fleet_runs_resume", "schedule": 60.0},
    # Emails whose message was lost, or whose failed send is due to be tried again.
    "emails-send-due": {"task": "accounts.tasks.emails_send_due", "schedule": 60.0},
    # Invitation emails still unsent a minute after the invitation was made.
    "invitations-mail-unsent": {
        "task": "accounts.tasks.invitations_mail_unsent",
        "schedule": 60.0,
    },
    # Request ids older than OPSDECK_REQUEST_IDS_KEPT_DAYS.
    "request-ids-prune": {"task": "accounts.tasks.request_ids_prune", "schedule": 86400.0},
    # Sign-ups unconfirmed for OPSDECK_UNCONFIRMED_SIGN_UP_DAYS give their address back.
    "unconfirmed-sign-ups-close": {
        "task": "accounts.tasks.unconfirmed_sign_ups_close",
        "schedule": 86400.0,
    },
}
# Days a sign-up may stay unconfirmed before its account is closed and its address released.
OPSDECK_UNCONFIRMED_SIGN_UP_DAYS = env.int("OPSDECK_UNCONFIRMED_SIGN_UP_DAYS", default=7)
# Days a request id is remembered: a repeat within them returns what the first request made.
OPSDECK_REQUEST_IDS_KEPT_DAYS = env.int("OPSDECK_REQUEST_IDS_KEPT_DAYS", default=30)

# --- Accounts: email login, verification, MFA --------------------------------

AUTH_USER_MODEL = "accounts.User"
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "home"

ACCOUNT_ADAPTER = "accounts.adapters.AccountAdapter"
ACCOUNT_SIGNUP_FORM_CLASS = "accounts.forms.SignupForm"
# An address no one has confirmed belongs to no one yet (see accounts/account_forms.py).
ACCOUNT_FORMS = {
    "signup": "accounts.account_forms.AccountSignupForm",
    "login": "accounts.account_forms.AccountLoginForm",
    "add_email": "accounts.account_forms.AccountAddEmailForm",
    "reset_password": "accounts.account_forms.AccountResetPasswordForm",
}
ACCOUNT_USER_MODEL_USERNAME_FIELD = None
ACCOUNT_LOGIN_METHODS = {"email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]
ACCOUNT_UNIQUE_EMAIL = True
# In every mode: sign-up then never reveals whether an address has an account (the
# console email backend prints the confirmation link in development).
ACCOUNT_EMAIL_VERIFICATION = "mandatory"
ACCOUNT_LOGIN_ON_EMAIL_CONFIRMATION = True
ACCOUNT_LOGOUT_REDIRECT_URL = "account_login"
ACCOUNT_EMAIL_SUBJECT_PREFIX = "[Opsdeck] "
# Failed sign-ins: 5 per address in 5 minutes, then 10 a minute per network address. The
# address's limit comes first, so that one account's refused attempts do not use up its network's
# (allauth checks each limit in turn and stops at the first refusal): someone hammering one
# account no longer locks out the colleagues behind the same network address, while 10
# accounts tried a minute from one address (password spraying) still are.
ACCOUNT_RATE_LIMITS = {"login_failed": "5/300s/key,10/m/ip"}
MFA_ADAPTER = "accounts.adapters.MFAAdapter"
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = "Opsdeck"

# The portal's public address, for links in emails sent by workers (the address `make run`
# prints; the launcher adds its port).
OPSDECK_BASE_URL = env.str("OPSDECK_BASE_URL", default="http://127.0.0.1:8000")
# Signed invitation links expire after this many seconds (7 days).
OPSDECK_INVITATION_MAX_AGE = 7 * 24 * 3600
# The most invitations an organization sends in a day, and to one address: the portal must not
# be a way to mail strangers without end.
OPSDECK_INVITATIONS_PER_DAY = env.int("OPSDECK_INVITATIONS_PER_DAY", default=100)
OPSDECK_INVITATIONS_PER_ADDRESS_PER_DAY = 5

# --- Stripe ----------------------------------------------------------------------

# Unset: billing stays local (nothing is sent to Stripe, the webhook endpoint answers 404).
STRIPE_API_KEY = env.str("STRIPE_API_KEY", default="")
STRIPE_WEBHOOK_SECRET = env.str("STRIPE_WEBHOOK_SECRET", default="")
# Another Stripe-compatible server (the emulator, `python -m stripe_emulator serve`).
STRIPE_API_BASE = env.str("STRIPE_API_BASE", default="")
# The API version the installed SDK was generated for: object shapes match its types.
STRIPE_API_VERSION = stripe.api_version
# A meter event failing this many times is parked as `dead` (the admin can retry it).
STRIPE_METER_EVENT_MAX_ATTEMPTS = env.int("STRIPE_METER_EVENT_MAX_ATTEMPTS", default=8)
# Minutes after a month ends that Stripe waits before finalizing its invoices (the account's
# finalization grace period, an hour unless changed in Stripe): usage of the month sent later
# would be on no invoice, so Opsdeck bills it itself, as an adjustment.
STRIPE_FINALIZATION_GRACE_MINUTES = env.int("STRIPE_FINALIZATION_GRACE_MINUTES", default=60)

# --- Invoices ------------------------------------------------------------------

# Who issues the invoices (the seller's legal name, address, tax number), printed on each one
# and kept by each as it was when finalized. Several lines: a literal `\n` starts a new one.
OPSDECK_INVOICE_ISSUER = env.str("OPSDECK_INVOICE_ISSUER", default="", multiline=True).strip()

# --- Email ---------------------------------------------------------------------

# EMAIL_BACKEND, EMAIL_HOST, EMAIL_PORT, credentials and TLS flags, from one URL.
globals().update(env.email_url_config(env.str("EMAIL_URL", default="consolemail://")))
# Seconds a mail server may take to answer (Django waits for ever by default): the mail worker's
# send to a hung server fails, and the email is tried again (`accounts.mail`).
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=30)
# Hours an email that cannot be sent is tried again before it is given up on, and days one
# given up on is kept for the staff to see (the admin's "Outgoing emails").
OPSDECK_EMAIL_GIVE_UP_HOURS = env.int("OPSDECK_EMAIL_GIVE_UP_HOURS", default=24)
OPSDECK_EMAIL_GIVEN_UP_KEPT_DAYS = env.int("OPSDECK_EMAIL_GIVEN_UP_KEPT_DAYS", default=7)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Opsdeck <noreply@localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# --- Static files --------------------------------------------------------------

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(VAR_DIR / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- Time and language -------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Logging -------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "filters": {"expected_denials": {"()": "portal.logfilters.ExpectedDenialFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": env.str("LOG_FORMAT", default="text"),
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        # A refused request (403) is one line with its reason, not a traceback.
        "django.request": {"filters": ["expected_denials"]},
        # The Stripe SDK logs two INFO lines per request (a meter event each); its failures
        # reach our own log lines as StripeFailure.
        "stripe": {"level": env.str("STRIPE_LOG_LEVEL", default="WARNING")},
    },
}
