from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class PortalConfig(AppConfig):
    name = "portal"

    def ready(self) -> None:
        from portal import checks  # noqa: F401 - registers the deploy checks


class OpsdeckAdminConfig(admin_apps.AdminConfig):
    """Django's admin, on Opsdeck's site (`portal.admin_site`)."""

    default = False  # "portal" names PortalConfig
    default_site = "portal.admin_site.OpsdeckAdminSite"
