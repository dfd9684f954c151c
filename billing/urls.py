from django.urls import path

from billing import views

# Mounted under /t/<tenant_slug>/.
tenant_urlpatterns = [
    path("billing/", views.overview, name="billing_overview"),
    path("billing/details/", views.billing_details, name="billing_details"),
    path("billing/invoices/<int:invoice_id>/", views.invoice_detail, name="invoice_detail"),
    path(
        "billing/invoices/<int:invoice_id>/credit-notes/<int:credit_note_id>/",
        views.credit_note_detail,
        name="credit_note_detail",
    ),
    path("billing/subscribe/<slug:plan_key>/", views.subscribe, name="billing_subscribe"),
    path("billing/payment/", views.payment_manage, name="billing_payment"),
    path(
        "billing/subscriptions/<int:subscription_id>/cancel/",
        views.subscription_cancel,
        name="billing_subscription_cancel",
    ),
]
