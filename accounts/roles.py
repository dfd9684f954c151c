"""Who may do what: the one table every permission check asks.

Roles belong to a membership (a user in a tenant). Actions are dotted names,
the same names the audit log records.
"""

from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"
    BILLING = "billing", "Billing"


# Action name -> how a refusal names it ("Your role does not allow <label>.").
ACTIONS: dict[str, str] = {
    "tenant.view": "viewing this organization",
    "tenant.rename": "renaming the organization",
    "tenant.delete": "deleting the organization",
    "tenant.tokens": "managing API tokens",
    "member.view": "viewing the team",
    "member.invite": "inviting members",
    "member.change_role": "changing roles",
    "member.remove": "removing members",
    "member.manage_owners": "granting or revoking the owner role",
    "audit.view": "viewing the audit log",
    "billing.view": "viewing billing",
    "billing.manage": "managing billing",
    "instance.view": "viewing deployments",
    "instance.create": "creating deployments",
    "instance.modify": "modifying deployments",
    "instance.operate": "stopping, starting or restarting deployments",
    "instance.delete": "deleting deployments",
    "instance.reveal_credentials": "revealing deployment passwords",
    "instance.protect": "turning deletion protection on or off",
    "backup.create": "taking backups or changing their schedule",
    "backup.restore": "restoring backups",
    "backup.delete": "deleting backups",
}

_VIEW = {"tenant.view", "member.view", "instance.view"}
_TEAM = {"member.invite", "member.change_role", "member.remove", "audit.view"}
_BILLING = {"billing.view", "billing.manage"}
_INSTANCES = {
    "instance.create",
    "instance.modify",
    "instance.operate",
    "instance.delete",
    "instance.reveal_credentials",
    "backup.create",
    "backup.restore",
    "backup.delete",
}

ROLE_ACTIONS: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset(ACTIONS),
    Role.ADMIN: frozenset(
        _VIEW | _TEAM | _BILLING | _INSTANCES | {"instance.protect", "tenant.tokens"}
    ),
    Role.MEMBER: frozenset(_VIEW | _INSTANCES),
    Role.VIEWER: frozenset(_VIEW),
    Role.BILLING: frozenset(_VIEW | _BILLING),
}


def can(role: str, action: str) -> bool:
    """Whether `role` may perform `action`; an unknown action is a programming error."""
    if action not in ACTIONS:
        raise KeyError(f"unknown action {action!r}: add it to accounts.roles.ACTIONS")
    return action in ROLE_ACTIONS.get(role, frozenset())


def allowed_actions(role: str) -> frozenset[str]:
    return ROLE_ACTIONS.get(role, frozenset())


def denial_message(role: str, action: str) -> str:
    label = Role(role).label if role in Role.values else role
    return f"Your role ({label}) does not allow {ACTIONS[action]}."


def roles_managed_by(role: str) -> frozenset[str]:
    """The roles a member with `role` may give or take away: the owner role needs
    `member.manage_owners` (granting it, and changing or removing an owner)."""
    if can(role, "member.manage_owners"):
        return frozenset(Role.values)
    return frozenset(Role.values) - {Role.OWNER}


def actions_lost(old_role: str, new_role: str) -> list[str]:
    """What a member moving from `old_role` to `new_role` may no longer do, as phrases."""
    lost = allowed_actions(old_role) - allowed_actions(new_role)
    return [label for action, label in ACTIONS.items() if action in lost]


# The roles an API token may have: never owner (what only an owner may do stays in the portal).
TOKEN_ROLES = (Role.ADMIN, Role.MEMBER, Role.VIEWER)


def token_roles_for(role: str) -> list[str]:
    """The roles a member with `role` may give an API token: those allowing nothing `role`
    does not."""
    return [r for r in TOKEN_ROLES if allowed_actions(r) <= allowed_actions(role)]
