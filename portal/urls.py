from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.urls import include, path

from accounts.urls import tenant_urlpatterns as accounts_tenant_urls
from billing.urls import tenant_urlpatterns as billing_tenant_urls
from billing.webhooks import stripe_webhook
from deployments.urls import tenant_urlpatterns as deployments_tenant_urls
from portal import views
from portal.csp_reports import CspReport

# Staff sign in through allauth like everyone else: MFA and rate limits apply.
admin.site.login = secure_admin_login(admin.site.login)

# Every page of one organization; each resolves the tenant and answers 404 to non-members.
tenant_urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    *accounts_tenant_urls,
    *deployments_tenant_urls,
    *billing_tenant_urls,
]

urlpatterns = [
    path("", views.home, name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("csp-report", CspReport.as_view(), name="csp_report"),
    path("admin/", admin.site.urls),
    path("billing/stripe/webhook/", stripe_webhook, name="stripe_webhook"),
    path("api/v1/", include("deployments.api_urls")),
    path("accounts/", include("allauth.urls")),
    path("t/<slug:tenant_slug>/", include(tenant_urlpatterns)),
    path("billing-team/", include("billing.team_urls")),
    path("", include("accounts.urls")),
]
