from billing.team_views import in_billing_team


def billing_team(request) -> dict:
    """`billing_team`: whether the top bar links the billing team's pages (staff only, so
    other users cost no query)."""
    user = getattr(request, "user", None)
    return {"billing_team": user is not None and user.is_staff and in_billing_team(user)}
