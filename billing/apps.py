from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from accounts.services import tenant_delete_blocker_register, tenant_rename_hook_register
        from billing.selectors import tenant_delete_blockers
        from billing.stripe_sync import tenant_renamed

        tenant_delete_blocker_register(tenant_delete_blockers)
        tenant_rename_hook_register(tenant_renamed)
