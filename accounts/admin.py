from collections.abc import Callable, Iterable
from functools import cached_property

from allauth.account.admin import EmailAddressAdmin as BaseEmailAddressAdmin
from allauth.account.models import EmailAddress
from allauth.mfa.admin import AuthenticatorAdmin as BaseAuthenticatorAdmin
from allauth.mfa.base.internal.flows import delete_dangling_recovery_codes
from allauth.mfa.models import Authenticator
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth.admin import GroupAdmin as BaseGroupAdmin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.contrib.auth.forms import AdminUserCreationForm
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import capfirst

from accounts import selectors, services
from accounts.audit import Actor, audit_record
from accounts.errors import ActionDenied
from accounts.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    OutgoingEmail,
    Tenant,
    User,
)
from accounts.roles import Role


class ListedColumnsAdmin(admin.ModelAdmin):
    """A list whose rows hold more than it shows (large or encrypted fields) names the columns it
    shows in `list_columns`: its page reads those alone (the change page reads the whole row).
    """

    list_columns: tuple[str, ...] = ()

    def get_changelist(self, request, **kwargs):
        return _ListedColumns if self.list_columns else super().get_changelist(request, **kwargs)


class ServiceOwnedAdmin(ListedColumnsAdmin):
    """Read-only: these rows change only through services, via the admin actions below."""

    # A list of a table that grows with the fleet: unfiltered, past
    # OPSDECK_ADMIN_ESTIMATE_ABOVE rows, it shows PostgreSQL's estimate of its rows
    # (`EstimatingPaginator`) instead of counting every row.
    count_estimated = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        paginator = EstimatingPaginator if self.count_estimated else self.paginator
        return paginator(queryset, per_page, orphans, allow_empty_first_page)


class EstimatingPaginator(Paginator):
    """Django's paginator, except that the rows of an unfiltered list of a table larger than
    OPSDECK_ADMIN_ESTIMATE_ABOVE are PostgreSQL's estimate (`pg_class.reltuples`, kept
    up to date by autovacuum), not a count of every row: the count would read the whole table
    on every page. `estimated` tells the page to say "about". Filtered, or a table smaller than
    that, or one never analyzed: the rows are counted."""

    estimated = False

    @cached_property
    def count(self) -> int:
        if not self.object_list.query.has_filters():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                    [self.object_list.model._meta.db_table],
                )
                (rows,) = cursor.fetchone()
            if rows > settings.OPSDECK_ADMIN_ESTIMATE_ABOVE:
                self.estimated = True
                return rows
        return super().count


class _ListedColumns(ChangeList):
    """Django's list, its rows read with the model admin's `list_columns` alone (a page, or
    every row found when they fit on one). The actions on the rows selected read them whole."""

    def get_results(self, request):
        self.queryset = self.queryset.only(*self.model_admin.list_columns)
        super().get_results(request)


def values_filter(values: Callable[[], Iterable[str]]) -> type[admin.FieldListFilter]:
    """Django's filter of a field's values (`AllValuesFieldListFilter`) offering `values()`:
    a vocabulary the values come from, or an index's values (`selectors.indexed_values`),
    rather than a DISTINCT over the whole table, which a list of millions of rows cannot
    afford."""

    class ValuesFilter(admin.AllValuesFieldListFilter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.lookup_choices = sorted(set(values()))

    return ValuesFilter


def staff_actor(request) -> Actor:
    return Actor.from_request(request, staff=True)


def run_action(modeladmin, request, queryset, call, done: str, said=None) -> None:
    """Apply a service call to each selected row, reporting successes and refusals, and what
    `said(obj, result)` makes of a call's result besides (None: nothing)."""
    changed = 0
    for obj in queryset:
        try:
            result = call(obj)
            changed += 1
            extra = said(obj, result) if said is not None else None
            if extra:
                modeladmin.message_user(request, extra, messages.INFO)
        except (ActionDenied, ValidationError) as exc:
            reason = exc.reason if isinstance(exc, ActionDenied) else "; ".join(exc.messages)
            # Led by a word: the admin capitalises a message's first letter, which would
            # misspell an address ("Kim@example.com …").
            modeladmin.message_user(request, f"Not done for {obj}: {reason}", messages.ERROR)
    if changed:
        modeladmin.message_user(request, f"{done}: {changed}.", messages.SUCCESS)


class StaffAudited:
    """For the rows staff edit in the admin directly, which no service owns (users, groups,
    who a cell is offered to, beat's tasks): each add, change and delete is recorded in the
    audit log as `<model>.create`, `.update` or `.delete`, naming the fields it changed and
    what `audit_payload` adds. Recorded once the form's related rows are saved too, so a
    change of groups, permissions or tenants is in it."""

    def audit_payload(self, obj) -> dict:
        return {}

    def _audit(self, request, obj, verb: str, **payload) -> None:
        audit_record(
            actor=staff_actor(request),
            action=f"{obj._meta.model_name}.{verb}",
            target=obj,
            payload={**self.audit_payload(obj), **payload},
        )

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        changed = [name for name in form.changed_data if "password" not in name]
        self._audit(request, form.instance, "update" if change else "create", changed=changed)

    def delete_model(self, request, obj):
        self._audit(request, obj, "delete")
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self._audit(request, obj, "delete")
        super().delete_queryset(request, queryset)


class UserAddForm(AdminUserCreationForm):
    """Django's, with the address as the sign-up stores it (`services.email_address_clean`)
    and refused when an account signs in with it or confirmed it, whatever its case."""

    def clean_email(self):
        email = services.email_address_clean(self.cleaned_data["email"])
        if not selectors.email_address_unclaimed(email):
            raise ValidationError("Another account signs in with this address or confirmed it.")
        return email


# What a user may do in the admin: staff allowed to change users, or groups, but not superusers
# themselves, would grant it to themselves (Django lets whoever changes users set them).
_GRANTS = ["is_staff", "is_superuser", "groups", "user_permissions"]


def _beyond(request, user) -> bool:
    """Whether `user`'s account is beyond what the staff member making the request may change:
    for one who is not a superuser, any other staff account (its password, or its second
    factor, would let them in as someone who may do more)."""
    return not request.user.is_superuser and user.is_staff and user.pk != request.user.pk


@admin.register(User)
class UserAdmin(StaffAudited, BaseUserAdmin):
    ordering = ["email"]
    list_display = ["email", "is_active", "is_staff", "date_joined", "last_login"]
    list_filter = ["is_active", "is_staff", "is_superuser"]
    search_fields = ["email", "first_name", "last_name"]
    fieldsets = [
        (None, {"fields": ["email", "password"]}),
        ("Personal info", {"fields": ["first_name", "last_name"]}),
        (
            "Permissions",
            {"fields": ["is_active", "is_staff", "is_superuser", "groups", "user_permissions"]},
        ),
        ("Important dates", {"fields": ["last_login", "date_joined"]}),
    ]
    add_fieldsets = [
        (None, {"classes": ["wide"], "fields": ["email", "password1", "password2"]}),
    ]
    readonly_fields = ["last_login", "date_joined"]
    filter_horizontal = ["groups", "user_permissions"]
    add_form = UserAddForm

    def get_readonly_fields(self, request, obj=None):
        # A person changes their own address on their Email page, confirming it there.
        readonly = [*self.readonly_fields, *(["email"] if obj is not None else [])]
        if not request.user.is_superuser:  # what staff may do here is a superuser's to grant
            readonly += _GRANTS
        return readonly

    def has_change_permission(self, request, obj=None):
        if obj is not None and _beyond(request, obj):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        # Also asked of each account chosen for "Delete selected": one refuses them all.
        if obj is not None and _beyond(request, obj):
            return False
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request):
        """Django's, except that an account's addresses and second factors go with it (the
        admin deletes neither on its own), and that an account still in an organization, a
        deleted one's too (a restore brings its members back), is not deleted: it leaves or
        is removed first, under the last-owner rule. Its audit entries keep its address as
        text (`AuditEvent.actor_email`)."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # Not for want of a permission: addresses and second factors go with the account,
        # and memberships keep it (below).
        perms_needed -= {m._meta.verbose_name for m in (EmailAddress, Authenticator, Membership)}
        label = capfirst(Membership._meta.verbose_name)
        protected += [
            format_html(
                '{}: <a href="{}">{}</a>',
                label,
                reverse("admin:accounts_membership_change", args=[membership.pk]),
                membership,
            )
            for membership in Membership.objects.filter(user__in=objs)
            .select_related("user", "tenant")
            .order_by("tenant__name")
        ]
        return deleted, counts, perms_needed, protected

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and "is_active" in form.changed_data and not obj.is_active:
            withdrawn = services.user_invitations_withdraw(actor=staff_actor(request), user=obj)
            if withdrawn:
                self.message_user(
                    request,
                    f"The invitations {obj.email} had sent were withdrawn: {', '.join(withdrawn)}.",
                    messages.SUCCESS,
                )
            # Nobody left in these can manage members, make an owner, or delete them.
            ownerless = [t.name for t in selectors.tenants_owned_by_no_one_but(obj)]
            if ownerless:
                self.message_user(
                    request,
                    f"Left with no owner who can sign in: {', '.join(ownerless)} ({obj.email} "
                    "was the only one). Make one of their members owner from the Memberships "
                    "list, or make this account active again.",
                    messages.WARNING,
                )

    def audit_payload(self, obj) -> dict:
        return {"email": obj.email, "groups": sorted(g.name for g in obj.groups.all())}

    def user_change_password(self, request, id, form_url=""):
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302:  # changed, not refused
            user = self.get_object(request, unquote(id))
            audit_record(
                actor=staff_actor(request),
                action="user.password",
                target=user,
                payload={"email": user.email},
            )
        return response


class MembershipInline(admin.TabularInline):
    model = Membership
    fields = ["user", "role", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        # Each row names its user (and its tenant, for the row's label): read with the rows.
        return super().get_queryset(request).select_related("user", "tenant")

    def has_add_permission(self, request, obj=None):
        return False


class TenantDeletedFilter(admin.SimpleListFilter):
    title = "deleted"
    parameter_name = "deleted"

    def lookups(self, request, model_admin):
        return [("no", "Not deleted"), ("yes", "Deleted")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(deleted_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(deleted_at=None)
        return queryset


@admin.register(Tenant)
class TenantAdmin(ServiceOwnedAdmin):
    """Every organization, deleted ones too (kept for their invoices and audit log), marked."""

    list_display = ["name", "slug", "member_count", "created_at", "deleted"]
    search_fields = ["name", "slug", "memberships__user__email"]
    list_filter = [TenantDeletedFilter, "created_at"]
    inlines = [MembershipInline]
    show_full_result_count = False  # a second count of every organization on every page

    @admin.display(description="Deleted", ordering="deleted_at")
    def deleted(self, obj):
        return f"Deleted {obj.deleted_at:%Y-%m-%d %H:%M} UTC" if obj.deleted_at else ""

    def get_queryset(self, request):
        # Counted in the list's one query, not one query per row, and only for the rows of the
        # page (a subquery each, along the memberships' index); the list's count of the
        # organizations joins no membership.
        members = (
            Membership.objects.filter(tenant=OuterRef("pk"))
            .order_by()
            .values("tenant")
            .annotate(n=Count("*"))
            .values("n")
        )
        return super().get_queryset(request).annotate(members=Coalesce(Subquery(members), 0))

    @admin.display(description="Members", ordering="members")
    def member_count(self, obj):
        return obj.members

    actions = ["restore"]

    def has_manage_permission(self, request):
        return request.user.has_perm("accounts.change_tenant")

    @admin.action(description="Restore deleted organization", permissions=["manage"])
    def restore(self, request, queryset):
        run_action(
            self,
            request,
            queryset,
            lambda t: services.tenant_restore(actor=staff_actor(request), tenant=t),
            "Restored (their withdrawn invitations stay withdrawn)",
            said=_ownerless,
        )


def _ownerless(tenant: Tenant, restored: Tenant) -> str | None:
    """What staff must do next for a restored organization none of whose owners can sign in
    (their accounts deleted or closed since): no one could manage it."""
    if selectors.owners_active(restored).exists():
        return None
    return (
        f"No owner of {restored.name} can sign in any more: make one of its members an owner "
        "(Memberships: 'Change role to Owner'), or no one can manage it."
    )


def _withdrawn_with(
    membership: Membership, withdrawn: list[str] | services.Withdrawn
) -> str | None:
    """What a member's removal or demotion withdrew: the invitations they had sent that they
    may no longer send (`services.membership_change_role`), and on removal those to their own
    addresses too (`services.membership_remove`)."""
    sent, to_them = withdrawn if isinstance(withdrawn, services.Withdrawn) else (withdrawn, [])
    said = []
    if sent:
        said.append(
            f"The invitations {membership.user.email} had sent to {membership.tenant} were "
            f"withdrawn: {', '.join(sent)}."
        )
    if to_them:
        said.append(f"The invitations to their own addresses were withdrawn: {', '.join(to_them)}.")
    return " ".join(said) or None


def _role_action(role: str):
    def action(modeladmin, request, queryset):
        run_action(
            modeladmin,
            request,
            queryset.select_related("tenant", "user"),
            lambda m: services.membership_change_role(
                actor=staff_actor(request), membership=m, role=role
            ),
            f"Changed to {role}",
            said=_withdrawn_with,
        )

    action.__name__ = f"make_{role}"
    action.short_description = f"Change role to {Role(role).label}"
    action.allowed_permissions = ("manage",)
    return action


@admin.register(Membership)
class MembershipAdmin(ServiceOwnedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "created_at"]
    search_fields = ["user__email", "tenant__name", "tenant__slug"]
    list_select_related = ["user", "tenant"]
    actions = [*(_role_action(r) for r in Role.values), "remove_memberships"]

    def has_manage_permission(self, request):
        # The model permission, not the admin's change permission (read-only here).
        return request.user.has_perm("accounts.change_membership")

    @admin.action(description="Remove from organization", permissions=["manage"])
    def remove_memberships(self, request, queryset):
        run_action(
            self,
            request,
            queryset.select_related("tenant", "user"),
            lambda m: services.membership_remove(actor=staff_actor(request), membership=m),
            "Removed",
            said=_withdrawn_with,
        )


@admin.register(Invitation)
class InvitationAdmin(ServiceOwnedAdmin):
    list_display = ["email", "tenant", "role", "status", "invited_by", "created_at"]
    list_filter = ["role", "created_at"]
    search_fields = ["email", "tenant__name", "tenant__slug"]
    list_select_related = ["tenant", "invited_by"]
    actions = ["withdraw"]

    def has_manage_permission(self, request):
        return request.user.has_perm("accounts.change_invitation")

    @admin.action(description="Withdraw invitation", permissions=["manage"])
    def withdraw(self, request, queryset):
        run_action(
            self,
            request,
            queryset.select_related("tenant"),
            lambda i: services.invitation_revoke(actor=staff_actor(request), invitation=i),
            "Withdrawn",
        )


class ApiTokenStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("live", "Active"), ("revoked", "Revoked"), ("expired", "Expired")]

    def queryset(self, request, queryset):
        if self.value() == "live":
            return queryset.live()
        if self.value() == "revoked":
            return queryset.exclude(revoked_at=None)
        if self.value() == "expired":
            return queryset.filter(revoked_at=None, expires_at__lte=timezone.now())
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(ServiceOwnedAdmin):
    """The organizations' API tokens, for a platform team that must find one (by its first
    characters, as a leaked secret shows them) and revoke it: who made it, its role, when it
    was last used. Never the secret (only its digest is kept, and not shown either)."""

    list_display = ["name", "prefix", "tenant", "role", "status", "created_by_email"]
    list_display += ["created_at", "last_used_at", "expires_at"]
    list_columns = ("name", "prefix", "tenant__name", "role", "revoked_at", "expires_at")
    list_columns += ("created_by_email", "created_at", "last_used_at")
    list_filter = [ApiTokenStatusFilter, "role", "created_at"]
    search_fields = ["prefix", "name", "tenant__name", "tenant__slug", "created_by_email"]
    list_select_related = ["tenant"]
    fields = ["name", "prefix", "tenant", "role", "created_by_email", "created_at"]
    fields += ["last_used_at", "expires_at", "revoked_at"]
    actions = ["revoke"]

    def has_manage_permission(self, request):
        return request.user.has_perm("accounts.change_apitoken")

    @admin.action(description="Revoke the selected tokens", permissions=["manage"])
    def revoke(self, request, queryset):
        run_action(
            self,
            request,
            queryset.select_related("tenant"),
            lambda token: services.api_token_revoke(actor=staff_actor(request), token=token),
            "Revoked",
        )


@admin.register(AuditEvent)
class AuditEventAdmin(ServiceOwnedAdmin):
    """The largest table of a platform in service: the list reads one page of it, newest first
    along its index on `created_at`, and the actions it filters on along the index on `action`.
    No date hierarchy (its years, months and days are a DISTINCT over every row): the
    `created_at` filter narrows by date. Unfiltered, a large table's rows are estimated, not
    counted; no second count of every row beside a filtered one, and no facet counts."""

    list_display = ["created_at", "tenant", "actor_email", "actor_kind", "action", "result", "ip"]
    list_columns = ("created_at", "tenant__name", "actor_email", "actor_kind", "action", "result")
    list_columns += ("ip",)
    list_filter = [
        "result",
        "actor_kind",
        ("action", values_filter(lambda: selectors.indexed_values(AuditEvent, "action"))),
        "created_at",
    ]
    search_fields = ["actor_email", "action", "target_id", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant"]
    count_estimated = True
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER


@admin.register(OutgoingEmail)
class OutgoingEmailAdmin(ServiceOwnedAdmin):
    """The emails the mail server has not taken yet (`accounts.mail`): those waiting for an
    attempt, and those given up on, kept OPSDECK_EMAIL_GIVEN_UP_KEPT_DAYS. A sent one is gone."""

    list_display = ["created_at", "recipients", "subject", "attempts", "last_error"]
    list_display += ["next_attempt_at", "given_up_at"]
    list_columns = ("created_at", "to", "subject", "attempts", "last_error", "next_attempt_at")
    list_columns += ("given_up_at",)
    list_filter = [("given_up_at", admin.EmptyFieldListFilter)]
    search_fields = ["subject"]
    show_facets = admin.ShowFacets.NEVER
    # Not its body: a sign-in, confirmation or password-reset link waiting in it would let
    # whoever reads it into the account (the reason it is encrypted at rest).
    fields = ["to", "subject", "created_at", "attempts", "last_error", "next_attempt_at"]
    fields += ["claimed_until", "given_up_at"]

    @admin.display(description="To", ordering="to")
    def recipients(self, email: OutgoingEmail) -> str:
        return ", ".join(email.to)


admin.site.unregister(Group)


@admin.register(Group)
class GroupAdmin(StaffAudited, BaseGroupAdmin):
    """Django's, audited: a group's permissions are what its members may do here (the
    billing team is one)."""

    def audit_payload(self, obj) -> dict:
        return {"name": obj.name, "permissions": sorted(p.codename for p in obj.permissions.all())}

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return super().get_readonly_fields(request, obj)
        # A group's member would grant them to themselves (`_GRANTS`); and what a group lets
        # its members do may hang on its name (the billing team's): a member renaming their
        # group to it, the team's own renamed away first, would make themselves the team.
        return ["permissions"] if obj is None else ["name", "permissions"]


# allauth's own (imported above, so registered already) let staff edit any of them unaudited.
admin.site.unregister(EmailAddress)
admin.site.unregister(Authenticator)


@admin.register(EmailAddress)
class EmailAddressAdmin(BaseEmailAddressAdmin):
    """People's addresses, shown, never edited here: a person changes and confirms their own on
    their Email page (a user's own email is read-only in `UserAdmin` for the same reason)."""

    actions = []

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Authenticator)
class AuthenticatorAdmin(BaseAuthenticatorAdmin):
    """People's second factors: staff may remove one (a lost device, at the person's request),
    recorded in the audit log as the person's own removal is; never add or edit one."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        # Also asked of each row chosen for "Delete selected": one refuses them all.
        if obj is not None and _beyond(request, obj.user):
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request, obj):
        self.delete_queryset(request, Authenticator.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        users = {}
        for authenticator in queryset.select_related("user"):
            audit_record(
                actor=staff_actor(request),
                action="mfa.remove",
                target=authenticator.user,
                payload={"type": authenticator.type},
            )
            users[authenticator.user_id] = authenticator.user
        queryset.delete()
        for user in users.values():
            # Recovery codes left without the factor they stand in for go too, as the person's
            # own removal takes them: a device reset must not leave codes that may have leaked
            # with it working beside the next one.
            if delete_dangling_recovery_codes(user) is not None:
                audit_record(
                    actor=staff_actor(request),
                    action="mfa.remove",
                    target=user,
                    payload={"type": Authenticator.Type.RECOVERY_CODES},
                )
