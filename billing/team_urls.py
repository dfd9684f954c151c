from django.urls import path

from billing import team_views

# Mounted under /billing-team/.
urlpatterns = [
    path("", team_views.invoices, name="billing_team_invoices"),
    path("invoices.csv", team_views.invoices_export, name="billing_team_invoices_export"),
    path("invoices/<int:invoice_id>/", team_views.invoice, name="billing_team_invoice"),
    path(
        "invoices/<int:invoice_id>/credit-notes/new/",
        team_views.credit_note_new,
        name="billing_team_credit_note_new",
    ),
    path(
        "credit-notes/<int:credit_note_id>/",
        team_views.credit_note,
        name="billing_team_credit_note",
    ),
    path(
        "credit-notes/<int:credit_note_id>/void/",
        team_views.credit_note_void,
        name="billing_team_credit_note_void",
    ),
    path(
        "invoices/<int:invoice_id>/<str:action>/",
        team_views.invoice_act,
        name="billing_team_invoice_act",
    ),
    path("usage/<slug:tenant_slug>/", team_views.tenant_usage, name="billing_team_usage"),
]
