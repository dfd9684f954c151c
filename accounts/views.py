import re
import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from accounts import roles, selectors, services
from accounts.account_forms import AccountDeleteForm
from accounts.audit import Actor
from accounts.errors import ActionDenied, InvitationInvalid
from accounts.exports import csv_download
from accounts.forms import (
    ApiTokenForm,
    AuditFilterForm,
    InviteForm,
    OrganizationDeleteForm,
    OrganizationForm,
    OrganizationRenameForm,
    RoleForm,
)
from accounts.htmx import partial_template, sent_to
from accounts.models import Membership, Tenant, User
from accounts.roles import Role
from accounts.tenancy import SESSION_KEY, tenant_view

_REQUEST_ID = re.compile(r"[0-9a-f]{32}")


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def organization_create(request):
    if request.method != "POST" and not _REQUEST_ID.fullmatch(request.GET.get("request", "")):
        # The request id goes in the address: a Back that re-fetches the form gets the same one,
        # and the page says what the form made instead of offering it again.
        return redirect(f"{request.path}?request={uuid.uuid4().hex}")
    form = OrganizationForm(request.POST if request.method == "POST" else None)
    request_id = form["request_id"].value() or request.GET.get("request") or uuid.uuid4().hex
    made = selectors.organization_made_by_request(request.user, request_id)
    if made is not None and request.method == "GET":  # the form again after Back
        context = {"made": made, "invited": services.invitation_links(request.user)}
        return render(request, "accounts/organization_create.html", context)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = services.tenant_create(
                actor=Actor.from_request(request),
                name=form.cleaned_data["name"],
                request_id=form.cleaned_data["request_id"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
            # Nothing was made: the corrected form goes out as a new request (also when the
            # refusal was that this id had been sent with other values).
            request_id = uuid.uuid4().hex
        else:
            messages.success(request, f"Organization “{tenant.name}” created.")
            return redirect("dashboard", tenant_slug=tenant.slug)
    if made is not None:  # its id made one: corrected, the form makes another, as it says
        request_id = uuid.uuid4().hex
    context = {
        "form": form,
        "request_id": request_id,
        "action": f"{request.path}?request={request_id}",
        "made_before": made,  # sent again from a stale page: what its first sending made
        "invited": services.invitation_links(request.user),
    }
    return render(request, "accounts/organization_create.html", context)


def _team_context(request, **extra) -> dict:
    managed = roles.roles_managed_by(request.membership.role)
    return {
        "request_id": uuid.uuid4().hex,  # a fresh one for the next invitation
        "members": selectors.tenant_members(request.tenant),
        "invitations": selectors.invitations_pending(request.tenant),
        "invite_form": InviteForm(auto_id="invite-%s"),
        "managed_roles": managed,
        "role_choices": [(value, label) for value, label in Role.choices if value in managed],
        # Said on the user's own row instead of a Leave that would be refused.
        "leave_refusal": services.leave_refusal(request.membership),
        **extra,
    }


@tenant_view("member.view")
@require_safe
def team(request):
    return render(request, "accounts/team.html", _team_context(request))


def _reason(exc: Exception) -> str:
    """The sentence to show for a refusal or a validation error."""
    if isinstance(exc, ActionDenied):
        return exc.reason
    return " ".join(exc.messages)


def _team_response(request, **extra):
    """After a team change: the team panel for htmx, else a redirect to the page; home for
    one removed by someone else meanwhile (the refusal says so), as the page is no longer
    theirs to see."""
    try:
        # The change may have been to the user's own role: render what they may do now.
        request.membership.refresh_from_db()
    except Membership.DoesNotExist:
        return _sent_home(request)
    if request.htmx:
        template = partial_template(request, "accounts/team.html", "team-panel")
        return render(request, template, _team_context(request, **extra))
    return redirect("team", tenant_slug=request.tenant.slug)


def _withdrawn(addresses: list[str], *, sender: str) -> str:
    """A sentence naming the invitations withdrawn with a member's change ("" for none)."""
    if not addresses:
        return ""
    shown = ", ".join(addresses[:3])
    if len(addresses) > 3:
        shown += f" and {len(addresses) - 3} more"
    noun, verb = ("invitation", "was") if len(addresses) == 1 else ("invitations", "were")
    return f" The {noun} {sender} had sent to {shown} {verb} withdrawn."


def _withdrawn_to_them(addresses: list[str]) -> str:
    """A sentence naming the invitations to a removed member's own addresses withdrawn with
    them (one left open would have let them back): "" for none."""
    if not addresses:
        return ""
    noun, verb = ("invitation", "was") if len(addresses) == 1 else ("invitations", "were")
    return f" The {noun} to {', '.join(addresses)}, an address of theirs, {verb} withdrawn."


def _sent_home(request):
    """To the home page, which htmx follows as a whole page rather than a swapped panel."""
    return sent_to(request, reverse("home"))


# What the team page says when a form sent before comes again and its invitation is no longer
# open (nothing is sent), by the invitation's status.
_SENT_BEFORE = {
    "accepted": "This form was sent before: {email} has accepted that invitation since.",
    "revoked": "This form was sent before, and that invitation to {email} has been withdrawn "
    "or replaced since: nothing was sent. Invite them again below to send a new one.",
    "expired": "This form was sent before, and that invitation to {email} has expired since: "
    "nothing was sent. Invite them again below to send a new one.",
}


def _invitation_sent(invitation) -> str:
    """What the team page says once an invitation is sent; sending one to an address already
    invited says that the earlier link stops working, and the role it changed."""
    if invitation.status in _SENT_BEFORE:
        return _SENT_BEFORE[invitation.status].format(email=invitation.email)
    replaced = selectors.invitation_replaced(invitation)
    if replaced is None:
        return f"Invitation sent to {invitation.email}."
    said = f"Invitation sent again to {invitation.email}: the earlier link no longer works."
    if replaced.role != invitation.role:
        said += (
            f" It invites them as {invitation.get_role_display()} now,"
            f" not as {replaced.get_role_display()}."
        )
    return said


@tenant_view("member.view")
@require_POST
def team_invite(request):
    form = InviteForm(request.POST, auto_id="invite-%s")  # its fields' ids on the page
    if form.is_valid():
        try:
            invitation = services.invitation_create(
                actor=Actor.from_request(request),
                tenant=request.tenant,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                request_id=form.cleaned_data["request_id"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        except ActionDenied as exc:
            messages.error(request, exc.reason)
            return _team_response(request)
        else:
            sent = invitation.status == "pending"
            (messages.success if sent else messages.warning)(request, _invitation_sent(invitation))
            return _team_response(request)
    # htmx swaps only 2xx answers: the fragment with its errors comes back as 200.
    template = partial_template(request, "accounts/team.html", "team-panel")
    status = 200 if request.htmx else 400
    return render(request, template, _team_context(request, invite_form=form), status=status)


@tenant_view("member.view")
@require_POST
def member_role(request, membership_id: int):
    membership = get_object_or_404(request.tenant.memberships, pk=membership_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the listed roles.")
        return _team_response(request)
    role = form.cleaned_data["role"]
    gives_up_owner = (
        membership.user_id == request.user.pk
        and membership.role == Role.OWNER
        and role != Role.OWNER
        # The only owner is refused at once (below), not asked first.
        and selectors.owners_active(request.tenant).exclude(pk=membership.pk).exists()
    )
    if gives_up_owner and not form.cleaned_data["confirm"]:
        # Stepping down cannot be undone alone: ask first, change nothing yet.
        confirm = {
            "membership": membership,
            "role": Role(role),
            "lost": roles.actions_lost(Role.OWNER, role),
        }
        template = partial_template(request, "accounts/team.html", "team-panel")
        return render(request, template, _team_context(request, confirm_demotion=confirm))
    try:
        withdrawn = services.membership_change_role(
            actor=Actor.from_request(request), membership=membership, role=role
        )
    except (ActionDenied, ValidationError) as exc:
        messages.error(request, _reason(exc))
    else:
        sender = "you" if membership.user_id == request.user.pk else "they"
        messages.success(
            request,
            f"{membership.user.email} is now {Role(role).label}."
            + _withdrawn(withdrawn, sender=sender),
        )
    return _team_response(request)


@tenant_view("member.view")
@require_POST
def member_remove(request, membership_id: int):
    membership = get_object_or_404(request.tenant.memberships, pk=membership_id)
    leaving = membership.user_id == request.user.pk
    try:
        withdrawn = services.membership_remove(
            actor=Actor.from_request(request), membership=membership
        )
    except (ActionDenied, ValidationError) as exc:
        messages.error(request, _reason(exc))
        return _team_response(request)
    if leaving:
        messages.success(
            request, f"You left {request.tenant.name}." + _withdrawn(withdrawn.sent, sender="you")
        )
        return _sent_home(request)
    messages.success(
        request,
        f"{membership.user.email} was removed."
        + _withdrawn(withdrawn.sent, sender="they")
        + _withdrawn_to_them(withdrawn.to_them),
    )
    return _team_response(request)


@tenant_view("member.view")
@require_POST
def invitation_revoke(request, invitation_id: int):
    invitation = get_object_or_404(request.tenant.invitations, pk=invitation_id)
    try:
        services.invitation_revoke(actor=Actor.from_request(request), invitation=invitation)
    except (ActionDenied, ValidationError) as exc:
        messages.error(request, _reason(exc))
    else:
        messages.success(request, f"Invitation to {invitation.email} withdrawn.")
    return _team_response(request)


def _settings_page(request, status: int = 200, **forms):
    """The organization's settings: its name (a form for who may rename it), leaving it, and
    deleting it for who may, with what stands in the way said before anything is typed."""
    tenant = request.tenant
    context = {
        "rename_form": OrganizationRenameForm(initial={"name": tenant.name}),
        "delete_form": OrganizationDeleteForm(),
        **forms,
    }
    if roles.can(request.membership.role, "tenant.delete"):
        context["delete_blockers"] = services.tenant_delete_blockers(tenant)
    if roles.can(request.membership.role, "tenant.tokens"):
        context.setdefault("token_form", ApiTokenForm())
        context["token_request_id"] = uuid.uuid4().hex  # a fresh one for the next token
        context["tokens"] = selectors.api_tokens(tenant)
        context["token_roles"] = roles.token_roles_for(request.membership.role)
    context["leave_refusal"] = services.leave_refusal(request.membership)
    return render(request, "accounts/settings.html", context, status=status)


@tenant_view()
@require_safe
def organization_settings(request):
    return _settings_page(request)


@tenant_view("tenant.rename")
@require_POST
def organization_rename(request):
    form = OrganizationRenameForm(request.POST)
    if form.is_valid():
        before = request.tenant.name
        try:
            tenant = services.tenant_rename(
                actor=Actor.from_request(request),
                tenant=request.tenant,
                name=form.cleaned_data["name"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        except ActionDenied as exc:
            messages.error(request, exc.reason)
            return redirect("organization_settings", tenant_slug=request.tenant.slug)
        else:
            if tenant.name != before:
                messages.success(request, f"{before} is now called {tenant.name}.")
            return redirect("organization_settings", tenant_slug=tenant.slug)
    return _settings_page(request, status=400, rename_form=form)


@tenant_view("tenant.delete")
@require_POST
def organization_delete(request):
    form = OrganizationDeleteForm(request.POST)
    tenant = request.tenant
    if form.is_valid():
        try:
            services.tenant_delete(
                actor=Actor.from_request(request),
                tenant=tenant,
                confirm_name=form.cleaned_data["confirm_name"],
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        except ActionDenied as exc:
            if Tenant.objects.filter(pk=tenant.pk, deleted_at__isnull=False).exists():
                # Deleted by another request meanwhile (a second click, another owner).
                messages.info(request, f"{tenant.name} has been deleted.")
                return _sent_home(request)
            if not services.tenant_delete_blockers(tenant):  # else the page lists them, once
                form.add_error(None, exc.reason)
        else:
            request.session.pop(SESSION_KEY, None)
            messages.success(request, f"Organization {tenant.name} deleted.")
            return _sent_home(request)
    return _settings_page(request, status=400, delete_form=form)


@tenant_view("tenant.tokens")
@require_POST
def api_token_create(request):
    """Make a token and show its secret on the page this once: it is kept nowhere."""
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        try:
            token, secret = services.api_token_create(
                actor=Actor.from_request(request),
                tenant=request.tenant,
                name=form.cleaned_data["name"],
                role=form.cleaned_data["role"],
                expires_in_days=form.expires_in_days,
                request_id=form.cleaned_data["request_id"],
            )
        except ValidationError as exc:
            if not hasattr(exc, "error_dict"):  # its request id sent before with other values
                form.add_error(None, exc)
                form.data = form.data.copy()
                form.data["request_id"] = uuid.uuid4().hex  # corrected, it makes one anew
            else:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
        except ActionDenied as exc:
            messages.error(request, exc.reason)
            return redirect("organization_settings", tenant_slug=request.tenant.slug)
        else:
            if secret is None:  # the form sent again: its token was made, its secret shown
                messages.info(
                    request,
                    f"This form was sent before: the API token “{token.name}” was made then, "
                    "and its secret shown once. If it was not copied, revoke the token and make "
                    "another.",
                )
                return redirect("organization_settings", tenant_slug=request.tenant.slug)
            return _settings_page(request, new_token=token, new_secret=secret)
    return _settings_page(request, status=400, token_form=form)


@tenant_view("tenant.tokens")
@require_POST
def api_token_revoke(request, token_id: int):
    token = get_object_or_404(request.tenant.api_tokens, pk=token_id)
    try:
        services.api_token_revoke(actor=Actor.from_request(request), token=token)
    except ActionDenied as exc:
        messages.error(request, exc.reason)
    else:
        messages.success(request, f"API token “{token.name}” revoked: it no longer works.")
    return sent_to(
        request, reverse("organization_settings", args=[request.tenant.slug]) + "#api-tokens"
    )


@tenant_view()
@require_POST
def organization_leave(request):
    try:
        withdrawn = services.membership_leave(
            actor=Actor.from_request(request), tenant=request.tenant
        )
    except ActionDenied as exc:
        messages.error(request, exc.reason)
        return sent_to(request, reverse("organization_settings", args=[request.tenant.slug]))
    request.session.pop(SESSION_KEY, None)
    messages.success(
        request, f"You left {request.tenant.name}." + _withdrawn(withdrawn.sent, sender="you")
    )
    return _sent_home(request)


def _joined(request, token: str):
    """Where the link leads someone who already accepted it: the organization they joined."""
    joined = services.invitation_joined(token, request.user)
    if joined is None:
        return None
    messages.info(request, f"You have joined {joined.name}.")
    return redirect("dashboard", tenant_slug=joined.slug)


@require_http_methods(["GET", "HEAD", "POST"])
def invitation_accept(request, token: str):
    """The page an invitation link opens: sign in (or up) as the invited address, then join."""
    try:
        invitation = services.invitation_from_token(token)
    except InvitationInvalid as exc:
        if joined := _joined(request, token):
            return joined
        return render(request, "accounts/invitation.html", {"error": str(exc)}, status=400)
    if request.method == "POST" and request.user.is_authenticated:
        try:
            membership = services.invitation_accept(actor=Actor.from_request(request), token=token)
        except InvitationInvalid as exc:
            if joined := _joined(request, token):  # a second tab, or a second click
                return joined
            return render(
                request,
                "accounts/invitation.html",
                {"error": str(exc), "invitation": invitation},
                status=400,
            )
        messages.success(request, f"Welcome to {membership.tenant.name}.")
        return redirect("dashboard", tenant_slug=membership.tenant.slug)
    context = {"invitation": invitation}
    if request.user.is_authenticated:  # said before the button, not after a click
        context["error"] = selectors.invitation_refusal(request.user, invitation)
        context["elsewhere"] = bool(selectors.invitation_elsewhere(request.user, invitation))
    return render(request, "accounts/invitation.html", context)


def _audit_events(request):
    form = AuditFilterForm(request.GET or None)
    filters = {}
    if form.is_bound:
        form.is_valid()  # flags each bad field; the valid ones stay in cleaned_data and apply
        filters = form.cleaned_data
    events = selectors.audit_events_for_tenant(
        request.tenant,
        action=filters.get("action", ""),
        actor=filters.get("actor", ""),
        since=filters.get("since"),
        until=filters.get("until"),
    )
    return form, events


@tenant_view("audit.view")
@require_safe
def audit_log(request):
    form, events = _audit_events(request)
    page = Paginator(events, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "actions": selectors.audit_actions_for_tenant(request.tenant),
    }
    template = partial_template(request, "accounts/audit_log.html", "audit-log")
    response = render(request, template, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


@tenant_view("audit.view")
@require_safe
def audit_export(request):
    _, events = _audit_events(request)
    header = [
        "time", "actor", "actor_kind", "action", "target_type", "target_id", "result", "ip",
        "target_name",
    ]  # fmt: skip
    rows = (
        [
            e.created_at.isoformat(),
            e.actor_email,
            e.actor_kind,
            e.action,
            e.target_type,
            e.target_id,
            e.result,
            e.ip or "",
            e.target_named,
        ]
        for e in events.iterator(chunk_size=500)
    )
    return csv_download(f"audit-{request.tenant.slug}.csv", header, rows)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def account_delete(request):
    """The account's "Delete your account" page: what deleting it does to each of the
    person's organizations, or why it cannot be deleted yet, then the form that deletes it."""
    user = request.user
    actor = Actor.from_request(request)
    form = AccountDeleteForm(
        request.POST if request.method == "POST" else None, user=user, actor=actor
    )
    refusal = address = ""
    if form.is_bound:
        # The form's checks and the deletion in one transaction: the locks the form takes
        # before checking a code hold until the deletion.
        with transaction.atomic():
            if form.is_valid():
                try:
                    address = services.user_delete(
                        actor=actor,
                        confirm_email=form.cleaned_data["confirm_email"],
                        deleting=form.cleaned_data["organizations_deleted"],
                    )
                except ValidationError as exc:
                    form.add_error(None, exc)
                except ActionDenied as exc:
                    refusal = exc.reason
    if address:
        return _signed_out(
            request,
            f"Your account {address} has been deleted and every session of it ended. "
            "We have emailed you to confirm.",
        )
    if form.is_bound and not User.objects.filter(pk=user.pk, is_active=True).exists():
        return _signed_out(request, "Your account has been deleted.")  # by another tab
    plan = services.account_deletion_plan(user)
    if refusal and not plan.refused:  # else the page lists the reasons, once
        form.add_error(None, refusal)
    context = {
        "form": form,
        "plan": plan,
        "deleting": ",".join(str(tenant.pk) for tenant in plan.deleted),
    }
    status = 400 if form.errors or refusal else 200
    return render(request, "accounts/account_delete.html", context, status=status)


def _signed_out(request, said: str):
    """To the sign-in page, saying `said`, with this browser's session ended (not through
    `logout`: its audit event would name an account that is gone)."""
    request.session.flush()
    request.user = AnonymousUser()
    messages.success(request, said)
    return redirect("account_login")
