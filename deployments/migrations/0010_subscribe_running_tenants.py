from django.db import migrations
from django.utils import timezone


def subscribe_running_tenants(Instance, Subscription) -> int:
    """Subscribe (active) every tenant to each plan it has instances on that are not deleted,
    unless it has an open subscription to it already: nothing that worked stops working when
    creating instances starts to need a subscription. The number of subscriptions made."""
    now = timezone.now()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    running = (
        Instance.objects.exclude(state="deleted")
        .values_list("tenant_id", "plan_version__plan_id")
        .distinct()
    )
    open_ones = set(
        Subscription.objects.exclude(status="cancelled").values_list("tenant_id", "plan_id")
    )
    missing = sorted(set(running) - open_ones)
    Subscription.objects.bulk_create(
        Subscription(
            tenant_id=tenant_id,
            plan_id=plan_id,
            status="active",
            current_period_start=start,
            created_at=now,
            updated_at=now,
        )
        for tenant_id, plan_id in missing
    )
    return len(missing)


def forwards(apps, schema_editor):
    subscribe_running_tenants(
        apps.get_model("deployments", "Instance"), apps.get_model("billing", "Subscription")
    )


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0009_instance_deletion_protected"),
        ("billing", "0006_subscription"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
