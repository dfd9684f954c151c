from django.urls import path

from deployments import views

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
    path("deployments/<str:instance_id>/", views.instance_detail, name="instance_detail"),
]
