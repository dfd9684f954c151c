"""Beat's periodic tasks in the admin, audited: disabling one stops what it runs (metering,
closing billing periods, the sweeper), so who did it and when is in the audit log."""

import functools

from django.contrib import admin
from django_celery_beat.admin import PeriodicTaskAdmin as BasePeriodicTaskAdmin
from django_celery_beat.models import PeriodicTask

from accounts.admin import StaffAudited, staff_actor
from accounts.audit import audit_record


def _audited(name: str, verb: str):
    """Beat's admin action `name`, recording `periodictask.<verb>` for each task it ran on."""
    action = getattr(BasePeriodicTaskAdmin, name)

    @functools.wraps(action)
    def run(self, request, queryset):
        tasks = list(queryset)
        done = action(self, request, queryset)
        for task in tasks:
            audit_record(
                actor=staff_actor(request),
                action=f"periodictask.{verb}",
                target=task,
                payload={"name": task.name},
            )
        return done

    return run


admin.site.unregister(PeriodicTask)


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(StaffAudited, BasePeriodicTaskAdmin):
    enable_tasks = _audited("enable_tasks", "enable")
    disable_tasks = _audited("disable_tasks", "disable")
    toggle_tasks = _audited("toggle_tasks", "toggle")
    run_tasks = _audited("run_tasks", "run")

    def audit_payload(self, obj) -> dict:
        return {"name": obj.name, "enabled": obj.enabled}
