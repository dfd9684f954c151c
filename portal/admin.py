"""Beat's periodic tasks and schedules in the admin, audited: disabling a task, or changing the
schedule it runs on, changes what it runs (metering, closing billing periods, the sweeper), so
who did it and when is in the audit log."""

import functools
import json

from django import forms
from django.contrib import admin, messages
from django_celery_beat import admin as beat_admin
from django_celery_beat.admin import PeriodicTaskAdmin as BasePeriodicTaskAdmin
from django_celery_beat.admin import PeriodicTaskForm as BasePeriodicTaskForm
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)
from kombu.exceptions import OperationalError

from accounts.admin import StaffAudited, staff_actor
from accounts.audit import audit_record


def _audited(name: str, verb: str):
    """Beat's admin action `name`, recording `periodictask.<verb>` for each task it ran on."""
    action = getattr(BasePeriodicTaskAdmin, name)

    @functools.wraps(action)
    def run(self, request, queryset):
        tasks = list(queryset)
        try:
            done = action(self, request, queryset)
        except OperationalError as exc:  # "Run task" sends to the broker, which may be down
            self.message_user(
                request, f"The broker could not be reached, so nothing was run: {exc}",
                level=messages.ERROR,
            )  # fmt: skip
            return None
        for task in tasks:
            audit_record(
                actor=staff_actor(request),
                action=f"periodictask.{verb}",
                target=task,
                payload={"name": task.name},
            )
        return done

    return run


class PeriodicTaskForm(BasePeriodicTaskForm):
    """Beat's form, with the shapes Celery calls a task with: positional arguments a JSON
    list, keyword arguments a JSON object (beat's own takes any JSON, and a task saved with
    another shape then fails on every run, stopping what it does)."""

    def _shaped(self, field: str, shape: type, named: str) -> str:
        value = self._clean_json(field)
        if not isinstance(json.loads(value), shape):
            raise forms.ValidationError(f"Write them as a JSON {named}.")
        return value

    def clean_args(self):
        return self._shaped("args", list, 'list, e.g. [] or [1, "a"]')

    def clean_kwargs(self):
        return self._shaped("kwargs", dict, 'object, e.g. {} or {"hours": 2}')


admin.site.unregister(PeriodicTask)


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(StaffAudited, BasePeriodicTaskAdmin):
    form = PeriodicTaskForm
    enable_tasks = _audited("enable_tasks", "enable")
    disable_tasks = _audited("disable_tasks", "disable")
    toggle_tasks = _audited("toggle_tasks", "toggle")
    run_tasks = _audited("run_tasks", "run")

    def audit_payload(self, obj) -> dict:
        return {"name": obj.name, "enabled": obj.enabled}


class ScheduleAudited(StaffAudited):
    """A beat schedule, audited as its tasks are. One a task runs on is not deleted: deleting
    it deleted its tasks with it, unrecorded, and stopped what they run; the confirmation names
    them and deletes nothing."""

    def audit_payload(self, obj) -> dict:
        return {"schedule": str(obj)}

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        on = next(f.name for f in PeriodicTask._meta.fields if f.related_model is self.model)
        protected += [
            f"Task {name} runs on it: delete the task, or give it another schedule, first."
            for name in PeriodicTask.objects.filter(**{f"{on}__in": objs})
            .order_by("name")
            .values_list("name", flat=True)
        ]
        return deleted, counts, perms_needed, protected


for model in (ClockedSchedule, CrontabSchedule, IntervalSchedule, SolarSchedule):
    admin.site.unregister(model)


@admin.register(ClockedSchedule)
class ClockedScheduleAdmin(ScheduleAudited, beat_admin.ClockedScheduleAdmin):
    pass


@admin.register(CrontabSchedule)
class CrontabScheduleAdmin(ScheduleAudited, beat_admin.CrontabScheduleAdmin):
    pass


@admin.register(IntervalSchedule)
class IntervalScheduleAdmin(ScheduleAudited, beat_admin.IntervalScheduleAdmin):
    pass


@admin.register(SolarSchedule)
class SolarScheduleAdmin(ScheduleAudited, beat_admin.SolarScheduleAdmin):
    pass
