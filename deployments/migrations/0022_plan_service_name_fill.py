"""Each plan's service name (`billing.Plan.service_name`) from its newest version's spec, as
`plan_load` now stores it: the deployments list shows it rather than the service's key."""

from django.db import migrations


def fill(apps, schema_editor):
    Plan = apps.get_model("billing", "Plan")
    PlanVersion = apps.get_model("deployments", "PlanVersion")
    for plan in Plan.objects.filter(service_name=""):
        newest = PlanVersion.objects.filter(plan=plan).order_by("-number").first()
        extensions = (newest.parsed or {}).get("x-opsdeck") if newest else None
        name = extensions.get("serviceName") if isinstance(extensions, dict) else None
        if isinstance(name, str) and name.strip():
            Plan.objects.filter(pk=plan.pk).update(service_name=name.strip()[:200])


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0014_plan_service_name"),
        ("deployments", "0021_snapshot_cancelled"),
    ]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
