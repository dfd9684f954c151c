"""The API's addresses, mounted at /api/v1/ (without trailing slashes, as APIs are called)."""

from django.urls import path, re_path

from accounts.api import not_found
from deployments import api

urlpatterns = [
    path("plans", api.PlanList.as_view(), name="api_plan_list"),
    path("deployments", api.InstanceList.as_view(), name="api_instance_list"),
    path("deployments/<slug:instance_id>", api.InstanceDetail.as_view(), name="api_instance"),
    path(
        "deployments/<slug:instance_id>/operations",
        api.OperationList.as_view(),
        name="api_operation_list",
    ),
    path(
        "deployments/<slug:instance_id>/operations/<uuid:operation_id>",
        api.OperationDetail.as_view(),
        name="api_operation",
    ),
    path(
        "deployments/<slug:instance_id>/operations/<uuid:operation_id>/cancel",
        api.OperationCancel.as_view(),
        name="api_operation_cancel",
    ),
    path(
        "deployments/<slug:instance_id>/backups", api.BackupList.as_view(), name="api_backup_list"
    ),
    path(
        "deployments/<slug:instance_id>/backup-schedule",
        api.BackupScheduleDetail.as_view(),
        name="api_backup_schedule",
    ),
    path(
        "deployments/<slug:instance_id>/backups/<int:snapshot_id>/restore",
        api.BackupRestore.as_view(),
        name="api_backup_restore",
    ),
    path(
        "deployments/<slug:instance_id>/actions/<str:verb>",
        api.InstanceAction.as_view(),
        name="api_instance_action",
    ),
    re_path(r"^(?P<rest>.*)$", not_found),
]
