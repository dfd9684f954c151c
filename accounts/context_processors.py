from collections import Counter

from django.utils.functional import SimpleLazyObject

from accounts import roles, selectors
from accounts.tenancy import SESSION_KEY


def tenancy(request) -> dict:
    """The current organization, the user's others (for the switcher) and what they may do.

    Pages outside `/t/<slug>/` (account settings, new organization) keep the organization
    last opened in this session, so they show the same shell with its sidebar.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    memberships = selectors.memberships_for_user(user)
    membership = getattr(request, "membership", None)
    if membership is None and hasattr(request, "session"):
        slug = request.session.get(SESSION_KEY)
        membership = next((m for m in memberships if m.tenant.slug == slug), None)
    return {
        "current_tenant": membership.tenant if membership else None,
        "current_membership": membership,
        # Read only by a page that shows the switcher (not an htmx panel).
        "user_memberships": SimpleLazyObject(lambda: _told_apart(memberships)),
        "allowed": roles.allowed_actions(membership.role) if membership else frozenset(),
        "nav_section": _section(request),
    }


def _section(request) -> str:
    """The part of an organization's pages the request is in, as the sidebar names them: the
    first step of its path under `/t/<slug>/` ("deployments" for a deployment's page, "billing"
    for an invoice's); "" for the dashboard, or outside an organization's pages."""
    match = getattr(request, "resolver_match", None)
    if match is None or "tenant_slug" not in match.kwargs:
        return ""
    within = request.path.split("/", 3)[3] if request.path.count("/") >= 3 else ""
    return within.split("/", 1)[0]


def _told_apart(memberships) -> list:
    """The memberships, each marked `name_shared` when another one's organization has the same
    name (whatever its case: an invitation to a second "Acme" accepted): the switcher tells
    them apart by their addresses."""
    listed = list(memberships)
    names = Counter(m.tenant.name.casefold() for m in listed)
    for m in listed:
        m.name_shared = names[m.tenant.name.casefold()] > 1
    return listed
