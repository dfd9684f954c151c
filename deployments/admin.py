import re
import uuid
from functools import cache

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db.models import F, Func, IntegerField, OuterRef, Subquery
from django.shortcuts import redirect
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from accounts.admin import (
    ListedColumnsAdmin,
    ServiceOwnedAdmin,
    StaffAudited,
    staff_actor,
    values_filter,
)
from accounts.audit import Actor, audit_record
from accounts.models import Tenant
from deployments import fleet, selectors
from deployments.models import (
    INSTANCE_ID,
    BackupSchedule,
    Cell,
    FleetRun,
    Instance,
    InstanceStateChange,
    Operation,
    PlanVersion,
    PlatformSecret,
    Snapshot,
    TaskRun,
)
from deployments.spec.loader import SpecError


@admin.register(Cell)
class CellAdmin(StaffAudited, ServiceOwnedAdmin):
    """Cells are registered with `manage.py add_cell`, which checks the cluster first."""

    list_display = [
        "name",
        "guard_rails_current",  # before the rest: seen without scrolling on a narrow screen
        "region",
        "cloud",
        "deployment_model",
        "is_default",
        "public",
        "created_at",
    ]
    list_columns = ("name", "region", "cloud", "deployment_model", "is_default", "public")
    list_columns += ("settings_generation", "guard_rails_generation", "created_at")
    list_filter = ["deployment_model", "cloud", "region", "public"]
    search_fields = ["name", "region"]
    exclude = [
        "kubeconfig",
        "backup_credentials",
        "settings_generation",
        "guard_rails_generation",
        "guard_rails_pass_until",  # said in the guard rails' text
    ]
    filter_horizontal = ["tenants"]
    # Only who a cell is offered to is edited here; the rest comes from add_cell.
    editable = ("public", "tenants")

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm("deployments.change_cell")

    def save_model(self, request, obj, form, change):
        # Only what is edited here is written: the rest of the row (its kubeconfig and settings,
        # which add_cell writes, a pass's marks, the status sync's time) may have changed since
        # the page read it, and saving the whole row would put back what it read.
        fields = [name for name in self.editable if not Cell._meta.get_field(name).many_to_many]
        obj.save(update_fields=fields)

    def audit_payload(self, obj) -> dict:
        return {"public": obj.public, "tenants": sorted(t.slug for t in obj.tenants.all())}

    def save_related(self, request, form, formsets, change):
        """Also in the audit log of each organization the cell was offered to, or no longer is:
        what it may create where is its to know. Who may use it before and after, a public
        cell offered to every organization: one made private to some is withdrawn from the
        others, not offered again to those it served already."""
        was_public = change and form.initial["public"]
        before = _offered(was_public, form.instance.tenants)  # its list as it was: not saved yet
        super().save_related(request, form, formsets, change)
        after = _offered(form.instance.public, form.instance.tenants)
        for action, tenants in (("cell.offer", after - before), ("cell.withdraw", before - after)):
            for tenant in sorted(tenants, key=lambda t: t.pk):
                audit_record(
                    actor=Actor.from_request(request, staff=True),
                    action=action,
                    tenant=tenant,
                    target=form.instance,
                    payload={"cell": form.instance.name},
                )

    def get_readonly_fields(self, request, obj=None):
        return [
            f.name
            for f in Cell._meta.get_fields()
            if f.concrete and f.name not in self.editable and f.name not in self.exclude
        ] + ["guard_rails"]

    @admin.display(description="Guard rails", boolean=True)
    def guard_rails_current(self, cell: Cell) -> bool:
        return not cell.guard_rails_behind

    @admin.display(description="Guard rails")
    def guard_rails(self, cell: Cell) -> str:
        until = cell.guard_rails_pass_until
        running = until is not None and until > timezone.now()  # a pass holds the cell
        if not cell.guard_rails_behind:
            said = "Applied in every instance's namespace as the cell's settings render them."
            return said + (" A run is applying them again now." if running else "")
        said = (
            "Not all applied again since the cell's settings last changed (a run of add_cell "
            "stopped, or the cluster refused some). "
        )
        if running:
            return said + "A run is applying them now."
        return said + (
            "The cell watcher applies them again within minutes, and less and less often while "
            "the cluster refuses some; add_cell for the cell does so at once, naming each "
            "instance the cluster refuses."
        )


def _offered(public: bool, listed) -> set[Tenant]:
    """The organizations (not deleted) that may run instances on a cell offered so: every one
    when public, else those `listed` (`Cell.objects.offered_to`)."""
    return set((Tenant.objects if public else listed).live())


@admin.register(PlanVersion)
class PlanVersionAdmin(ServiceOwnedAdmin):
    list_display = ["plan", "number", "digest", "released_at"]
    list_columns = ("plan__name", "number", "digest", "released_at")
    list_filter = ["plan"]
    search_fields = ["plan__key", "digest"]
    exclude = ["parsed"]


class StateChangeInline(admin.TabularInline):
    model = InstanceStateChange
    fields = ["at", "from_state", "to_state", "operation", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        # One read, any rows; of each operation what names it (`Operation.__str__`), not its
        # run's state and the secrets each row would decrypt.
        named = ("operation__verb", "operation__instance", "operation__state")
        changes = super().get_queryset(request).select_related("operation")
        return changes.only(*self.fields, "instance", *named)

    def has_add_permission(self, request, obj=None):
        return False


# A fleet request id: the confirmation page's, one per instance it queues an operation on.
_FLEET_REQUEST = re.compile(r"[0-9a-f]{32}")
_VERSION = re.compile(r"[0-9]{1,9}")  # a plan version's number, as a fleet page shows it
FIRST_WAVE = 5  # an upgrade's instances at a time, as the confirmation page offers it
# The newest version of an instance's plan, what an upgrade moves it to: its number, digest.
_newest = PlanVersion.objects.filter(plan_id=OuterRef("plan_version__plan_id")).order_by("-number")


@admin.register(Instance)
class InstanceAdmin(ServiceOwnedAdmin):
    """Instances change through their operations. Platform staff queue them across the fleet
    with the actions below (filter by cell, plan or state, select, confirm): each instance's
    operation runs after those queued on it before, as if its owners had asked, and is
    recorded in the audit log as staff's."""

    list_display = ["id", "name", "tenant", "plan_version", "cell", "state", "created_at"]
    # Not the parameters, status and outputs, nor the secrets and the cell's credentials, which
    # each row would decrypt.
    list_columns = ("name", "tenant__name", "plan_version__number", "plan_version__plan__key")
    list_columns += ("cell__name", "state", "created_at")
    list_filter = ["state", "cell", "plan_version__plan"]
    search_fields = ["id", "name", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant", "plan_version__plan", "cell"]
    exclude = ["secret_parameters"]
    inlines = [StateChangeInline]
    actions = ["upgrade", "restart", "stop", "start"]
    show_full_result_count = False  # a count of the fleet beside a filtered one
    show_facets = admin.ShowFacets.NEVER

    def has_operate_permission(self, request) -> bool:
        return fleet.may_run(request.user)  # as a run goes on only while its requester may

    @admin.action(
        description="Upgrade the selected instances to their plan's newest version",
        permissions=["operate"],
    )
    def upgrade(self, request, queryset):
        return self._fleet(request, queryset, "upgrade")

    @admin.action(description="Restart the selected instances", permissions=["operate"])
    def restart(self, request, queryset):
        return self._fleet(request, queryset, "restart")

    @admin.action(description="Stop the selected instances", permissions=["operate"])
    def stop(self, request, queryset):
        return self._fleet(request, queryset, "stop")

    @admin.action(description="Start the selected instances", permissions=["operate"])
    def start(self, request, queryset):
        return self._fleet(request, queryset, "start")

    def _fleet(self, request, queryset, action: str):
        """A page listing the selected instances, and what the action does to each, to
        confirm; once confirmed, a fleet run that queues the operation on each, in a worker
        (`fleet`): its page says how far it is and what was refused. The page's request id
        makes a confirmation sent twice (a reload, a double click) start one run."""
        fleet_request = request.POST.get("fleet_request", "")
        if request.POST.get("confirmed") == "yes" and _FLEET_REQUEST.fullmatch(fleet_request):
            # The instances the page listed, each with the version it showed, in one field:
            # two a row past 500 rows were more fields than a request may hold
            # (DATA_UPLOAD_MAX_NUMBER_FIELDS), refused whole.
            seen = _fleet_selection(request.POST.get("fleet_selection", ""))
            if not all(INSTANCE_ID.fullmatch(pk) for pk in seen):  # a page never sends one
                self.message_user(
                    request,
                    "The confirmation named something that is no instance, and nothing was "
                    "queued: select the instances and confirm again.",
                    messages.ERROR,
                )
                return None
            known = set(self.get_queryset(request).filter(pk__in=seen).values_list("pk", flat=True))
            try:
                run = fleet.fleet_run_start(
                    actor=staff_actor(request),
                    verb=action,
                    request_id=fleet_request,
                    selection=[(pk, version) for pk, version in seen.items() if pk in known],
                    wave=_whole(request.POST.get("fleet_wave", ""), blank=None),
                    failures_allowed=_whole(request.POST.get("fleet_failures", ""), blank=0),
                )
            except ValidationError as exc:
                said = " ".join(exc.messages)
                self.message_user(
                    request,
                    f"{said} Nothing was queued: select the instances and confirm again.",
                    messages.ERROR,
                )
                return None
            waves = f", {run.wave} at a time" if run.wave else ""
            self.message_user(
                request,
                f"The {run.verb} of {len(run.selection)} instances is being queued{waves}: this "
                "page says how far it is, and what was refused.",
                messages.SUCCESS,
            )
            return redirect("admin:deployments_fleetrun_change", run.pk)
        instances = list(
            queryset.select_related("tenant", "cell", "plan_version__plan")
            .annotate(
                newest=Subquery(_newest.values("number")[:1]),
                newest_digest=Subquery(_newest.values("digest")[:1]),
            )
            .order_by("tenant__slug", "name")
        )
        # The run refuses these, naming why: the page says so first.
        refusals = selectors.upgrade_cell_refusals(instances) if action == "upgrade" else {}
        for instance in instances:  # the same text released again is no upgrade: it is refused
            current = instance.plan_version
            instance.moves = selectors.upgrades_to(current, instance.newest, instance.newest_digest)
            instance.refused = refusals.get(instance.pk, "")
        selection = " ".join(
            f"{instance.pk}:{instance.newest or ''}" if action == "upgrade" else instance.pk
            for instance in instances
        )
        context = {
            **self.admin_site.each_context(request),
            "title": getattr(self, action).short_description,
            "opts": self.model._meta,
            "instances": instances,
            "action": action,
            "upgrade": action == "upgrade",
            "fleet_request": uuid.uuid4().hex,
            "selection": selection,
            # An upgrade goes to a few instances first: one that breaks them stops there.
            "wave": FIRST_WAVE if action == "upgrade" else "",
            "batch": fleet.BATCH,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/deployments/instance/fleet_confirm.html", context)


def _whole(field: str, *, blank: int | None) -> int | None:
    """A whole number a confirmation's field holds; `blank` when left empty. ValidationError
    for anything else."""
    field = field.strip()
    if not field:
        return blank
    if not _VERSION.fullmatch(field):
        raise ValidationError(f"“{field[:20]}” is not a whole number.")
    return int(field)


def _fleet_selection(field: str) -> dict[str, int | None]:
    """A fleet confirmation's instances, from its one field: "id:version" for each instance of
    an upgrade (the newest version the page showed it, or none), "id" for another action."""
    selection = {}
    for item in field.split():
        pk, _, version = item.partition(":")
        selection[pk] = int(version) if _VERSION.fullmatch(version) else None
    return selection


def _array_length(field: str) -> Func:
    return Func(F(field), function="jsonb_array_length", output_field=IntegerField())


@admin.register(FleetRun)
class FleetRunAdmin(ServiceOwnedAdmin):
    """The fleet actions staff confirmed on the instances' list: how far each is, and the
    instances that refused it and why (a stopped instance asked to restart, say). Each
    operation it queued is on the operations' list, recorded in the audit log as its
    requester's."""

    list_display = ["created_at", "verb", "requested_by", "progress", "queued", "refusals"]
    list_display += ["finished_at"]
    list_columns = ("created_at", "verb", "requested_by__email", "handled", "queued")
    list_columns += ("finished_at",)
    list_select_related = ["requested_by"]
    fields = ["verb", "requested_by", "created_at", "progress", "waves", "queued", "failures"]
    fields += ["finished_at", "stopped", "refused_list"]
    show_facets = admin.ShowFacets.NEVER
    actions = ["stop"]

    def has_operate_permission(self, request) -> bool:
        return fleet.may_run(request.user)

    @admin.action(description="Stop the selected runs", permissions=["operate"])
    def stop(self, request, queryset):
        """Stop each selected run that has not ended: it queues nothing more; what it queued
        runs on (each operation can be cancelled on its instance)."""
        actor = staff_actor(request)
        stopped = [run for run in queryset if fleet.fleet_run_stop(run, actor=actor)]
        for run in stopped:
            self.log_change(request, run, "Stopped the run.")
        if stopped:
            self.message_user(
                request,
                f"Stopped {len(stopped)} run{pluralize(len(stopped))}: "
                "it queues nothing more, and the operations it queued run on (each can be "
                "cancelled on its instance); one in waves ends once they have, their failures "
                "counted.",
                messages.SUCCESS,
            )
        if len(stopped) < len(queryset):
            self.message_user(
                request,
                "A run that had ended, or was stopping already, was left as it was.",
                messages.WARNING,
            )

    def has_view_permission(self, request, obj=None):
        # Whoever may start one (`InstanceAdmin.has_operate_permission`) sees how it went.
        return fleet.may_run(request.user) or super().has_view_permission(request, obj)

    def has_module_permission(self, request):
        return self.has_view_permission(request) or super().has_module_permission(request)

    def get_queryset(self, request):
        # The list's progress and refusals are counted by the database, not read whole.
        return (
            super()
            .get_queryset(request)
            .annotate(instances=_array_length("selection"), refusals=_array_length("refused"))
        )

    @admin.display(description="Instances handled")
    def progress(self, run: FleetRun) -> str:
        return f"{run.handled} of {run.instances}"

    @admin.display(description="Refused", ordering="refusals")
    def refusals(self, run: FleetRun) -> int:
        return run.refusals

    @admin.display(description="Instances at a time")
    def waves(self, run: FleetRun) -> str:
        if not run.wave:
            return "All at once"
        return f"{run.wave}: the next ones once the operations of these have ended"

    @admin.display(description="Failed")
    def failures(self, run: FleetRun) -> str:
        if not run.wave:
            return "Not counted (all at once): see the operations' list"
        allowed = "none allowed" if not run.failures_allowed else f"{run.failures_allowed} allowed"
        return f"{run.failed} of the waves ended ({allowed})"

    @admin.display(description="Refused")
    def refused_list(self, run: FleetRun) -> str:
        if not run.refused:
            return "None"
        return format_html_join(
            mark_safe("<br>"), "{}: {}", ((instance, why) for instance, why in run.refused)
        )


class TaskRunInline(admin.TabularInline):
    model = TaskRun
    fields = ["node", "attempt", "state", "message", "started_at", "finished_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        # The object each run rendered (encrypted, large) is not shown.
        return super().get_queryset(request).only(*self.fields, "operation")

    def has_add_permission(self, request, obj=None):
        return False


def _verbs_defined() -> set[str]:
    """The verbs of every plan version's services: those an operation can run."""
    return set().union(*map(_verbs_of, PlanVersion.objects.values_list("pk", flat=True)))


@cache
def _verbs_of(version_id: int) -> frozenset[str]:
    """A plan version's verbs, read once a process (versions never change): however many
    versions there are, the list does not parse their specs again on every request, as the
    specs' own cache of a few dozen would once there are more. A version this Opsdeck no
    longer loads (`checks` warns of it) runs nothing new: the verbs its operations ran."""
    try:
        spec = selectors.plan_version_loaded(version_id).spec
    except SpecError:
        ran = Operation.objects.filter(plan_version_id=version_id).values_list("verb", flat=True)
        return frozenset(ran.distinct().order_by())
    return frozenset(verb for service in spec.services for verb in service.verbs)


@admin.register(Operation)
class OperationAdmin(ServiceOwnedAdmin):
    """Every operation the fleet ran: the list reads one page, newest first along the index on
    `created_at`, without the run's state and the secrets each row would decrypt; its verbs to
    filter on are those the plans define. Unfiltered, a large table's rows are estimated, not
    counted; no second count of every row beside a filtered one, and no facet counts."""

    list_display = ["id", "verb", "instance", "state", "requested_by", "created_at", "finished_at"]
    list_columns = ("verb", "instance__name", "state", "requested_by__email", "created_at")
    list_columns += ("finished_at",)
    list_filter = ["state", ("verb", values_filter(_verbs_defined)), "created_at"]
    search_fields = ["id", "instance__id", "instance__tenant__slug", "request_id"]
    list_select_related = ["instance", "requested_by"]
    exclude = ["secret_parameters", "requested_secret", "engine_state"]
    inlines = [TaskRunInline]
    count_estimated = True
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER


@admin.register(Snapshot)
class SnapshotAdmin(ServiceOwnedAdmin):
    """A snapshot per instance and backup, kept once deleted: the list reads one page, newest
    first along the index on `created_at`, without each snapshot's metadata and parameters.
    Unfiltered, a large table's rows are estimated, not counted; no second count of every row
    beside a filtered one, and no facet counts."""

    list_display = [
        "name", "tenant", "source_instance_id", "status", "scheduled", "created_at", "expires_at"
    ]  # fmt: skip
    list_columns = ("name", "tenant__name", "source_instance_id", "status", "scheduled")
    list_columns += ("created_at", "expires_at")
    list_filter = ["status", "scheduled", "created_at"]
    search_fields = ["name", "source_instance_id", "tenant__slug"]
    list_select_related = ["tenant"]
    count_estimated = True
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER


@admin.register(BackupSchedule)
class BackupScheduleAdmin(ServiceOwnedAdmin):
    """Changed by the instance's owners on its Backups tab (`backup_schedule_update`)."""

    list_display = [
        "instance", "interval_hours", "cron", "retention_days", "retention_count", "enabled",
        "next_run_at", "last_outcome",
    ]  # fmt: skip
    # Its instance named as the instance list reads it (`InstanceAdmin.list_columns`).
    list_columns = ("instance__name", "interval_hours", "cron", "retention_days")
    list_columns += ("retention_count", "enabled", "next_run_at", "last_outcome")
    list_filter = ["enabled", "last_outcome"]
    search_fields = ["instance__id", "instance__name"]
    list_select_related = ["instance"]


def secret_read_by(*names: str) -> list[str]:
    """The plan versions that may still run and read any of the platform secrets `names`, as
    the admin names them (`selectors.secret_readers`)."""
    return [
        f"{version.plan.name} version {version.number}, which reads $secret.{name}"
        for name, versions in selectors.secret_readers(names).items()
        for version in versions
    ]


class PlatformSecretForm(forms.ModelForm):
    class Meta:
        model = PlatformSecret
        fields = ["name", "value", "description"]

    def clean_name(self):
        # Renamed, a secret a version that may still run reads is gone for it, as if deleted.
        name = self.cleaned_data["name"]
        stored = self.instance.name if self.instance.pk else None
        if stored and name != stored and (readers := secret_read_by(stored)):
            raise forms.ValidationError(
                f"{'; '.join(readers)}: renamed, its next run would fail. Add a secret with the "
                "new name instead, and delete this one once no version reads it."
            )
        return name


@admin.register(PlatformSecret)
class PlatformSecretAdmin(ListedColumnsAdmin):
    """Platform staff manage these secrets here; values are write-only and every change is
    audited."""

    list_display = ["name", "description", "updated_at"]
    list_columns = ("name", "description", "updated_at")  # not the value, which it decrypts
    search_fields = ["name", "description"]
    fields = ["name", "value", "description"]

    form = PlatformSecretForm

    def get_fields(self, request, obj=None):
        if obj is not None and not self.has_change_permission(request, obj):
            return ["name", "description"]  # staff who may only view never see the value
        return super().get_fields(request, obj)

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if "value" not in form.base_fields:  # shown to staff who may only view it
            return form
        # Never render a stored value back into the page.
        form.base_fields["value"].widget = forms.PasswordInput(render_value=False)
        if obj is not None:
            form.base_fields["value"].required = False
            form.base_fields["value"].help_text = "Leave empty to keep the current value."
        return form

    def save_model(self, request, obj, form, change):
        if change and not form.cleaned_data.get("value"):
            obj.value = PlatformSecret.objects.get(pk=obj.pk).value
        obj.updated_at = timezone.now()
        super().save_model(request, obj, form, change)
        # What changed (the value's name only, never the value), and the name it had.
        changed = [name for name in form.changed_data if name != "value" or form.cleaned_data[name]]
        renamed = {"from": form.initial["name"]} if change and "name" in changed else {}
        audit_record(
            actor=Actor.from_request(request, staff=True),
            action="secret.update" if change else "secret.create",
            target=obj,
            payload={"name": obj.name, **renamed, **({"changed": changed} if change else {})},
        )

    def get_deleted_objects(self, objs, request):
        # A secret a plan version that may still run reads is protected: its next run would
        # fail when it renders. The confirmation page names them and deletes nothing.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        protected += secret_read_by(*(secret.name for secret in objs))
        return deleted, counts, perms_needed, protected

    def delete_model(self, request, obj):
        self.delete_queryset(request, PlatformSecret.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        for secret in queryset:
            audit_record(
                actor=Actor.from_request(request, staff=True),
                action="secret.delete",
                target=secret,
                payload={"name": secret.name},
            )
        queryset.delete()
