from django.urls import path

from billing import views

# Mounted under /t/<tenant_slug>/.
tenant_urlpatterns = [
    path("billing/", views.overview, name="billing_overview"),
    path("billing/invoices/<int:invoice_id>/", views.invoice_detail, name="invoice_detail"),
]
