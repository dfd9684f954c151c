from accounts import roles, selectors


def tenancy(request) -> dict:
    """The current organization, the user's others (for the switcher) and what they may do."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    membership = getattr(request, "membership", None)
    return {
        "current_tenant": getattr(request, "tenant", None),
        "current_membership": membership,
        "user_memberships": selectors.memberships_for_user(user),
        "allowed": roles.allowed_actions(membership.role) if membership else frozenset(),
    }
