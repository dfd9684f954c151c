from django.urls import path

from deployments import metrics_views, views

# Mounted under /t/<tenant_slug>/.
tenant_urlpatterns = [
    path("deployments/", views.instance_list, name="instance_list"),
    # catalog and create form
    path("deployments/new/", views.instance_catalog, name="instance_catalog"),
    path("deployments/new/<slug:plan_key>/", views.instance_create, name="instance_create"),
    path(
        "deployments/new/<slug:plan_key>/estimate/",
        views.instance_estimate,
        name="instance_estimate",
    ),
    path("deployments/<slug:instance_id>/", views.instance_detail, name="instance_detail"),
    # --- instance page ---
    path(
        "deployments/<slug:instance_id>/operations/<uuid:operation_id>/",
        views.operation_detail,
        name="operation_detail",
    ),
    path(
        "deployments/<slug:instance_id>/actions/<str:verb>/",
        views.instance_act,
        name="instance_act",
    ),
    path("deployments/<slug:instance_id>/delete/", views.instance_delete, name="instance_delete"),
    path(
        "deployments/<slug:instance_id>/backups/<int:snapshot_id>/restore/",
        views.snapshot_restore,
        name="snapshot_restore",
    ),
    path(
        "deployments/<slug:instance_id>/backups/<int:snapshot_id>/restore/estimate/",
        views.snapshot_restore_estimate,
        name="snapshot_restore_estimate",
    ),
    path(
        "deployments/<slug:instance_id>/backups/<int:snapshot_id>/delete/",
        views.snapshot_delete,
        name="snapshot_delete",
    ),
    path(
        "deployments/<slug:instance_id>/backups/schedule/",
        views.backup_schedule_update,
        name="backup_schedule_update",
    ),
    # modify
    path("deployments/<slug:instance_id>/modify/", views.instance_modify, name="instance_modify"),
    path(
        "deployments/<slug:instance_id>/modify/estimate/",
        views.instance_modify_estimate,
        name="instance_modify_estimate",
    ),
    # cancel an operation
    path(
        "deployments/<slug:instance_id>/operations/<uuid:operation_id>/cancel/",
        views.operation_cancel,
        name="operation_cancel",
    ),
    # connection
    path(
        "deployments/<slug:instance_id>/connection/reveal/",
        views.instance_credentials_reveal,
        name="instance_credentials_reveal",
    ),
    # --- upgrade, roll back, protection ---
    path(
        "deployments/<slug:instance_id>/upgrade/", views.instance_upgrade, name="instance_upgrade"
    ),
    # A change of plan moves instances: deployments' part of the Billing page.
    path("billing/plans/<slug:plan_key>/change/", views.plan_change, name="billing_plan_change"),
    path(
        "deployments/<slug:instance_id>/rollback/",
        views.instance_rollback,
        name="instance_rollback",
    ),
    path(
        "deployments/<slug:instance_id>/protection/",
        views.instance_protect,
        name="instance_protect",
    ),
    path(
        "deployments/<slug:instance_id>/metrics/",
        metrics_views.instance_metrics,
        name="instance_metrics",
    ),
]
