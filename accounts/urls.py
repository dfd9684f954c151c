from django.urls import path

from accounts import views

# Mounted under /t/<tenant_slug>/.
tenant_urlpatterns = [
    path("team/", views.team, name="team"),
    path("team/invite/", views.team_invite, name="team_invite"),
    path("team/<int:membership_id>/role/", views.member_role, name="member_role"),
    path("team/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path(
        "team/invitations/<int:invitation_id>/revoke/",
        views.invitation_revoke,
        name="invitation_revoke",
    ),
    path("settings/", views.organization_settings, name="organization_settings"),
    path("settings/rename/", views.organization_rename, name="organization_rename"),
    path("settings/delete/", views.organization_delete, name="organization_delete"),
    path("settings/leave/", views.organization_leave, name="organization_leave"),
    path("settings/tokens/", views.api_token_create, name="api_token_create"),
    path("settings/tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
    path("audit/", views.audit_log, name="audit_log"),
    path("audit/export.csv", views.audit_export, name="audit_export"),
]

urlpatterns = [
    # Among allauth's account pages (mounted at /accounts/), which have no such page.
    path("accounts/delete/", views.account_delete, name="account_delete"),
    path("organizations/new/", views.organization_create, name="organization_create"),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation_accept"),
]
