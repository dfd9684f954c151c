from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"

    def ready(self):
        from accounts.services import tenant_delete_blocker_register
        from deployments import checks  # noqa: F401 - registers the stored plan versions' check
        from deployments.selectors import tenant_delete_blockers

        tenant_delete_blocker_register(tenant_delete_blockers, first=True)
