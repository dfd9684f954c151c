"""`check --deploy` warnings for development defaults left in a production configuration.

The database, broker and cache have no default: without them settings refuse to load.
"""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def production_defaults_check(app_configs, **kwargs):
    found = []
    if settings.EMAIL_BACKEND.endswith(("console.EmailBackend", "locmem.EmailBackend")):
        found.append(
            Warning(
                "EMAIL_URL is not set: emails (sign-up, password reset, invitations) are only "
                "written to the log.",
                hint="Set EMAIL_URL, e.g. smtp+tls://user:password@smtp.example.com:587.",
                id="portal.W003",
            )
        )
    if "localhost" in settings.OPSDECK_BASE_URL or "127.0.0.1" in settings.OPSDECK_BASE_URL:
        found.append(
            Warning(
                "OPSDECK_BASE_URL points to this machine: links in emails will not work.",
                hint="Set OPSDECK_BASE_URL to the portal's public address.",
                id="portal.W004",
            )
        )
    backend = settings.CACHES["default"]["BACKEND"]
    if backend.endswith(("locmem.LocMemCache", "dummy.DummyCache")):
        found.append(
            Warning(
                "CACHE_URL names a cache each process keeps to itself: sign-in rate limits are "
                "counted per web process, and an email can wait a minute for beat where the "
                "mail worker would have sent it at once.",
                hint="Set CACHE_URL to a cache every process shares, e.g. redis://redis:6379/1.",
                id="portal.W005",
            )
        )
    return found
