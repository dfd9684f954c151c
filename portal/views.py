from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.utils.cache import patch_cache_control, patch_vary_headers
from django.views.decorators.http import require_safe
from kombu import Connection

from accounts import roles, selectors
from accounts import services as account_services
from accounts.htmx import partial_template, shown_digest, unchanged
from accounts.tenancy import SESSION_KEY, tenant_view
from deployments import selectors as deployment_selectors

# What a form refused for its CSRF token says: its token went when the person signed in or out
# in another tab (Django rotates it then), or it was sent from elsewhere.
CSRF_REFUSED = (
    "This form was out of date, and nothing was done: signing in or out, in this tab or "
    "another, ends the forms of pages loaded before. Load the page again and send it once more."
)


def csrf_failure(request, reason=""):
    """A form refused for its CSRF token (`CSRF_FAILURE_VIEW`): said in the portal's own
    layout, and, for an htmx action, on the page loaded again (`HtmxPageGoneMiddleware`)."""
    request._refusal = CSRF_REFUSED
    return render(request, "403.html", {"exception": CSRF_REFUSED}, status=403)


@require_safe
def home(request):
    """Send a signed-in user to their last organization (or their first)."""
    if not request.user.is_authenticated:
        return redirect("account_login")
    memberships = selectors.memberships_for_user(request.user)
    last = request.session.get(SESSION_KEY)
    membership = memberships.filter(tenant__slug=last).first() or memberships.first()
    if membership is None:
        return redirect("organization_create")
    return redirect("dashboard", tenant_slug=membership.tenant.slug)


@tenant_view()
@require_safe
def dashboard(request):
    tenant = request.tenant
    role = request.membership.role
    context = {
        "member_count": tenant.memberships.count(),
        "pending_invitations": selectors.invitations_pending_count(tenant),
        "recent_events": [],
        "invited": account_services.invitation_links(request.user),  # from other organizations
    }
    if roles.can(role, "audit.view"):
        shown = ("created_at", "actor_email", "actor_kind", "action", "result")  # its columns
        context["recent_events"] = selectors.audit_events_for_tenant(tenant).only(*shown)[:8]
    if roles.can(role, "instance.view"):
        states = deployment_selectors.instance_counts_by_state(tenant)
        context |= {
            "instance_count": sum(count for _, _, count in states),
            "instance_states": states,
            "instances_degraded": deployment_selectors.instances_degraded(tenant),
            "operations_running": deployment_selectors.operations_running(tenant),
            "operations_failed": deployment_selectors.operations_failed_recently(tenant, days=7),
            # While an operation is queued or running, the page follows it.
            "follows": deployment_selectors.operations_pending_in(tenant),
        }
    shown = _dashboard_shown(context, role=role)
    if answer := unchanged(request, shown):  # the page's poll, and nothing changed to swap
        return answer
    context["shown"] = shown
    template = partial_template(request, "portal/dashboard.html", "dashboard")
    response = render(request, template, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def _dashboard_shown(context: dict, *, role: str) -> str:
    """A digest of what the dashboard shows that operations and team changes change (the
    member's role, figures, states, the rows of each table), for its poll."""
    tables = [context.get("operations_running"), context.get("operations_failed")]
    degraded = context.get("instances_degraded")
    return shown_digest(
        [
            role,
            context.get("follows"),
            context["member_count"],
            context["pending_invitations"],
            [invitation.pk for invitation, _ in context["invited"]],
            [event.pk for event in context["recent_events"]],
            context.get("instance_states"),
            [(i.pk, i.health_reason) for i in degraded.instances] if degraded else None,
            degraded.total if degraded else None,
            [(t.total, [op.pk for op in t.operations]) for t in tables if t is not None],
        ]
    )


def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links: send them to the SVG icon."""
    response = redirect(static("favicon.svg"))
    patch_cache_control(response, public=True, max_age=86400)
    return response


def healthz(request):
    """The process is alive and serving requests."""
    return JsonResponse({"status": "ok"})


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        return False


def _broker_ok() -> bool:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as broker:
            broker.ensure_connection(max_retries=1, timeout=2)
        return True
    except Exception:
        return False


def readyz(request):
    """Ready to serve: the database and the broker answer; 503 names what does not."""
    checks = {"database": _database_ok(), "broker": _broker_ok()}
    failing = [name for name, ok in checks.items() if not ok]
    status = 503 if failing else 200
    body = {"status": "unavailable" if failing else "ok", "failing": failing}
    return JsonResponse(body, status=status)
