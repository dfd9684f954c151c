"""What a tenant is entitled to: the one place entitlement rules live.

For now a plan's only limit is its maximum number of instances per tenant.
"""

from accounts.models import Tenant
from billing.models import Plan


class EntitlementDenied(Exception):
    """A request beyond what the tenant's plan allows; the message says which limit."""


def check(*, tenant: Tenant, plan: Plan, action: str, active_instances: int) -> None:
    """Refuse `action` when it would take `tenant` past `plan`'s limits.

    `active_instances` is the tenant's count of instances on this plan that are not deleted,
    counted by the caller (billing knows nothing of instances).
    """
    limit = plan.max_instances
    if action == "instance.create" and limit is not None and active_instances >= limit:
        raise EntitlementDenied(
            f"The {plan.name} plan allows at most {plan.max_instances} "
            f"instance{'s' if plan.max_instances != 1 else ''} per organization; "
            "delete one or choose another plan."
        )
