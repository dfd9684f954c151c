from django.contrib import admin

from accounts.admin import ServiceOwnedAdmin
from deployments.models import (
    Cell,
    Instance,
    InstanceStateChange,
    Operation,
    PlanVersion,
    Snapshot,
    TaskRun,
)


@admin.register(Cell)
class CellAdmin(ServiceOwnedAdmin):
    """Cells are registered with `manage.py add_cell`, which checks the cluster first."""

    list_display = ["name", "region", "cloud", "deployment_model", "is_default", "created_at"]
    list_filter = ["deployment_model", "cloud", "region"]
    search_fields = ["name", "region"]
    exclude = ["kubeconfig", "backup_credentials"]


@admin.register(PlanVersion)
class PlanVersionAdmin(ServiceOwnedAdmin):
    list_display = ["plan", "number", "digest", "released_at"]
    list_filter = ["plan"]
    search_fields = ["plan__key", "digest"]
    exclude = ["parsed"]


class StateChangeInline(admin.TabularInline):
    model = InstanceStateChange
    fields = ["at", "from_state", "to_state", "operation", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Instance)
class InstanceAdmin(ServiceOwnedAdmin):
    list_display = ["id", "name", "tenant", "plan_version", "cell", "state", "created_at"]
    list_filter = ["state", "cell", "plan_version__plan"]
    search_fields = ["id", "name", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant", "plan_version__plan", "cell"]
    exclude = ["secret_parameters"]
    inlines = [StateChangeInline]


class TaskRunInline(admin.TabularInline):
    model = TaskRun
    fields = ["node", "attempt", "state", "message", "started_at", "finished_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Operation)
class OperationAdmin(ServiceOwnedAdmin):
    list_display = ["id", "verb", "instance", "state", "requested_by", "created_at", "finished_at"]
    list_filter = ["state", "verb", "created_at"]
    search_fields = ["id", "instance__id", "instance__tenant__slug", "request_id"]
    list_select_related = ["instance", "requested_by"]
    exclude = ["secret_parameters", "engine_state"]
    inlines = [TaskRunInline]


@admin.register(Snapshot)
class SnapshotAdmin(ServiceOwnedAdmin):
    list_display = ["name", "tenant", "source_instance_id", "status", "created_at", "expires_at"]
    list_filter = ["status", "created_at"]
    search_fields = ["name", "source_instance_id", "tenant__slug"]
    list_select_related = ["tenant"]
