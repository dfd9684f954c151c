from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"

    def ready(self):
        from accounts.services import tenant_delete_blocker_register
        from billing.usage import lives_source_register
        from deployments import checks  # noqa: F401 - registers the stored plan versions' check
        from deployments.metering import deleted_lives
        from deployments.selectors import tenant_delete_blockers

        tenant_delete_blocker_register(tenant_delete_blockers, first=True)
        lives_source_register(deleted_lives)
