"""Tenant pages: `/t/<tenant_slug>/…` resolves `request.tenant` and `request.membership`.

A user who is not a member gets a 404, never a 403 that would confirm the
organization exists. A member whose role lacks the page's action gets a 403. Someone who was a
member when the organization was deleted is sent home, told so (a tab left open, Back, a
second click on Delete), rather than shown a bare 404.

No tenant page is kept by the browser (`Cache-Control: no-store`): they show live state, and
Back after deleting an instance must not show it running with every button live.
"""

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.urls import reverse
from django.utils.cache import add_never_cache_headers

from accounts import roles, selectors
from accounts.audit import Actor, audit_record
from accounts.htmx import sent_to
from accounts.models import AuditEvent

SESSION_KEY = "tenant_slug"


def action_require(request, action: str, *, target=None) -> None:
    """Refuse (403 with the reason, audited, naming `target` when given) a member whose role
    does not allow `action`; for a view that needs more than its `tenant_view` action only for
    some requests, or on an object it reads first."""
    membership = request.membership
    reason = role_refusal(
        actor=Actor.from_request(request), role=membership.role, tenant=membership.tenant,
        action=action, target=target, path=request.path,
    )  # fmt: skip
    if reason:
        raise PermissionDenied(reason)


def role_refusal(*, actor: Actor, role: str, tenant, action: str, target, path: str) -> str:
    """Why `role` may not perform `action`, recorded in the audit log as refused to `actor`
    (naming `target` when given, and the path asked); "" when it may."""
    if roles.can(role, action):
        return ""
    reason = roles.denial_message(role, action)
    audit_record(
        actor=actor, action=action, tenant=tenant, target=target,
        result=AuditEvent.Result.DENIED, payload={"reason": reason, "path": path},
    )  # fmt: skip
    return reason


def tenant_view(action: str = "tenant.view"):
    roles.can(roles.Role.OWNER, action)  # fail at import on an unknown action name

    def decorator(view):
        @login_required
        @wraps(view)
        def wrapper(request, tenant_slug: str, *args, **kwargs):
            membership = selectors.membership_get(user=request.user, tenant_slug=tenant_slug)
            if membership is None:
                return _deleted_or_404(request, tenant_slug)
            request.tenant = membership.tenant
            request.membership = membership
            if request.session.get(SESSION_KEY) != tenant_slug:
                request.session[SESSION_KEY] = tenant_slug
            action_require(request, action)
            response = view(request, *args, **kwargs)
            add_never_cache_headers(response)
            return response

        return wrapper

    return decorator


def _deleted_or_404(request, tenant_slug: str):
    """Home, saying the organization was deleted, for someone who was in it then; else 404."""
    former = selectors.membership_get(user=request.user, tenant_slug=tenant_slug, deleted=True)
    if former is None:
        raise Http404("No such organization.")
    tenant = former.tenant
    if request.session.get(SESSION_KEY) == tenant_slug:
        del request.session[SESSION_KEY]
    messages.info(request, f"{tenant.name} was deleted on {tenant.deleted_at:%-d %B %Y}.")
    return sent_to(request, reverse("home"))
