from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from accounts.services import tenant_delete_blocker_register
        from billing.selectors import tenant_delete_blockers

        tenant_delete_blocker_register(tenant_delete_blockers)
