"""`manage.py check --database default`, and `migrate`, which runs it: the stored plan versions
this Opsdeck no longer loads.

Every use of a plan version reads its stored spec again with the rules of the Opsdeck that runs
now. A rule that became stricter since the version was stored (a `regex` RE2 does not take, say)
would leave its instances unusable; this says so when Opsdeck is deployed, not when a customer
opens one.
"""

from django.core.checks import Tags, Warning, register
from django.db import DatabaseError


@register(Tags.database)
def stored_plan_versions_check(app_configs, databases=None, **kwargs):
    if not databases or "default" not in databases:
        return []
    from deployments.models import PlanVersion
    from deployments.spec.loader import SpecError, load_spec

    try:
        versions = list(
            PlanVersion.objects.select_related("plan")
            .only("number", "spec_text", "plan__key")
            .order_by("plan__key", "number")
        )
    except DatabaseError:
        return []  # not migrated yet: nothing is stored
    found = []
    for version in versions:
        try:
            load_spec(version.spec_text, stored=True)
        except SpecError as exc:
            found.append(
                Warning(
                    f"Plan {version.plan.key} version {version.number} no longer loads: "
                    + "; ".join(exc.errors[:3]),
                    hint="Its instances cannot be operated. Load a corrected spec as a new "
                    "version (manage.py load_specs) and upgrade them to it.",
                    obj=version,
                    id="deployments.W001",
                )
            )
    return found
