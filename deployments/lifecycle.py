"""Which verb may start from which instance state, and where it leaves the instance.

One table, read by the services that accept a verb and by the runner that
moves the instance through its states.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployments.models import Instance

S = Instance.State


@dataclass(frozen=True)
class Rule:
    """`from_states`: where the verb may start; `during`/`after`: the state while it runs and
    after it succeeds (None: unchanged). A failed verb that changed the state leaves `failed`."""

    from_states: frozenset[str]
    during: str | None
    after: str | None
    action: str  # the role action (accounts.roles) it needs


_LIVE = frozenset({S.RUNNING})
RULES: dict[str, Rule] = {
    # Retrying a failed create runs it again.
    "create": Rule(frozenset({S.FAILED}), S.CREATING, S.RUNNING, "instance.create"),
    "modify": Rule(_LIVE, S.UPDATING, S.RUNNING, "instance.modify"),
    # An upgrade runs the newer version's modify; a roll back re-applies the stored parameters
    # and version (what last ran) through that version's modify, after a failed change.
    "upgrade": Rule(_LIVE, S.UPDATING, S.RUNNING, "instance.modify"),
    "rollback": Rule(frozenset({S.FAILED}), S.UPDATING, S.RUNNING, "instance.modify"),
    "stop": Rule(_LIVE, S.UPDATING, S.STOPPED, "instance.operate"),
    "start": Rule(frozenset({S.STOPPED}), S.UPDATING, S.RUNNING, "instance.operate"),
    "restart": Rule(_LIVE, S.UPDATING, S.RUNNING, "instance.operate"),
    "failover": Rule(_LIVE, S.UPDATING, S.RUNNING, "instance.operate"),
    "backup": Rule(_LIVE, None, None, "backup.create"),
    # Forgetting a snapshot leaves the instance as it is.
    "deleteBackup": Rule(
        frozenset({S.RUNNING, S.STOPPED, S.UPDATING, S.FAILED}), None, None, "backup.delete"
    ),
    # Restore always makes a new instance, which starts out creating.
    "restore": Rule(frozenset({S.FAILED}), S.CREATING, S.RUNNING, "backup.restore"),
    "delete": Rule(
        frozenset({S.CREATING, S.RUNNING, S.STOPPED, S.UPDATING, S.FAILED}),
        S.DELETING,
        S.DELETED,
        "instance.delete",
    ),
}
# Custom workflows act on a running instance and leave its state alone.
CUSTOM = Rule(_LIVE, None, None, "instance.operate")

# Opsdeck's own verbs that run a spec verb's workflow (of the operation's plan version).
_RUNS = {"upgrade": "modify", "rollback": "modify"}
# The verbs whose failure a roll back undoes (a failed roll back can be rolled back again).
ROLLED_BACK = frozenset({"modify", "upgrade", "rollback"})
# Deletion protection can change until a delete has started.
PROTECTABLE = frozenset({S.CREATING, S.RUNNING, S.STOPPED, S.UPDATING, S.FAILED})


def workflow_verb(verb: str) -> str:
    """The spec verb whose workflow an operation of `verb` runs."""
    return _RUNS.get(verb, verb)


def rule(verb: str, *, custom: bool = False) -> Rule:
    return CUSTOM if custom else RULES[verb]


def refusal(verb: str, state: str, *, custom: bool = False) -> str | None:
    """Why `verb` cannot start from `state`, in one sentence; None when it can."""
    allowed = rule(verb, custom=custom).from_states
    if state in allowed:
        return None
    label = S(state).label.lower()
    needs = " or ".join(sorted(S(s).label.lower() for s in allowed))
    return f"The instance is {label}; {verb} needs it to be {needs}."
