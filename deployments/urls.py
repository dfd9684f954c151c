from django.urls import path

from deployments import views

# Mounted under /t/<tenant_slug>/.
tenant_urlpatterns = [
    path("deployments/", views.instance_list, name="instance_list"),
    path("deployments/<str:instance_id>/", views.instance_detail, name="instance_detail"),
]
