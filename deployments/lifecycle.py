"""What each of Opsdeck's verbs does to an instance, in one table.

A verb's rule says where it may start, where it leaves the instance, the role action it
needs, whether it makes the instance (its namespace is prepared first, a failure always leaves
it failed, its requester hears when it is ready), ends it (its namespace goes once it
succeeded), and whether its run applies the instance's whole parameter set. The services that
accept a verb, the runner, the executor that production and `spec_test` share, and metering
read it here, so a new verb is one row.

No database and no app registry: the executor (which `spec_test` and the benchmark's baseline
run without Django's apps) imports it. Changing an instance's state, and sending an
operation's step to a worker, are in `transitions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models


class InstanceState(models.TextChoices):
    """An instance's lifecycle state (`Instance.State`)."""

    CREATING = "creating", "Creating"
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    UPDATING = "updating", "Updating"
    FAILED = "failed", "Failed"
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"


S = InstanceState


@dataclass(frozen=True)
class Rule:
    """`from_states`: where the verb may start; `during`/`after`: the state while it runs and
    after it succeeds (None: unchanged). A failed verb that changed the state leaves `failed`."""

    from_states: frozenset[str]
    during: str | None
    after: str | None
    action: str  # the role action (accounts.roles) it needs
    # The spec verb whose workflow it runs, when it is not the verb itself.
    runs: str | None = None
    # It brings the instance into being: its namespace and guard rails are applied before its
    # workflow, a failure leaves the instance failed (even before the cluster took anything),
    # "Retry" runs it again, and its requester is told when the instance is ready.
    makes_instance: bool = False
    # Once it succeeded the instance's namespace, and everything in it, is deleted.
    ends_instance: bool = False
    # Its run applies the instance's whole parameter set, which the instance holds after it.
    applies_parameters: bool = False
    # A failure of it can be rolled back (a failed roll back can be rolled back again).
    rolled_back: bool = False
    # When it failed the instance (it failed, or was cancelled, after the cluster took some of
    # it), "Retry" runs it again from `failed` (create and restore start only from there).
    retried: bool = False
    # Once the cluster took it, the operator carries it through on its own, and it changes no
    # parameter (a hibernation, a rolling restart, a switchover): a cancel that stopped it while
    # it went as it should leaves the instance where the verb leads (`after`), not failed.
    # A failure still fails it.
    settles_alone: bool = False
    # Once started, the cluster carries it to its end whatever Opsdeck does (a backup the
    # database has begun cannot be called back): only a queued one can be cancelled. This
    # says why a running one cannot; empty for the verbs a cancel stops.
    runs_through: str = ""
    # It puts the instance on the operation's plan version (an upgrade, a roll back to the one
    # it was on): the namespace's guard rails are applied again before its workflow, as that
    # version renders them (its `x-opsdeck.quota`, its port and operator).
    sets_version: bool = False


_LIVE = frozenset({S.RUNNING})
# Opsdeck's verb that renders a changed backup retention into the cluster.
RETENTION_APPLY = "applyBackupRetention"
RULES: dict[str, Rule] = {
    # Retrying a failed create runs it again.
    "create": Rule(
        frozenset({S.FAILED}), S.CREATING, S.RUNNING, "instance.create",
        makes_instance=True, applies_parameters=True, retried=True,
    ),
    "modify": Rule(
        _LIVE, S.UPDATING, S.RUNNING, "instance.modify",
        applies_parameters=True, rolled_back=True,
    ),
    # An upgrade runs the newer version's modify; a roll back re-applies the stored parameters
    # and version (what last ran) through that version's modify, after a failed change.
    "upgrade": Rule(
        _LIVE, S.UPDATING, S.RUNNING, "instance.modify",
        runs="modify", applies_parameters=True, rolled_back=True, sets_version=True,
    ),
    "rollback": Rule(
        frozenset({S.FAILED}), S.UPDATING, S.RUNNING, "instance.modify",
        runs="modify", applies_parameters=True, rolled_back=True, sets_version=True,
    ),
    "stop": Rule(
        _LIVE, S.UPDATING, S.STOPPED, "instance.operate", retried=True, settles_alone=True
    ),
    "start": Rule(
        frozenset({S.STOPPED}), S.UPDATING, S.RUNNING, "instance.operate",
        retried=True, settles_alone=True,
    ),
    "restart": Rule(
        _LIVE, S.UPDATING, S.RUNNING, "instance.operate", retried=True, settles_alone=True
    ),
    "failover": Rule(
        _LIVE, S.UPDATING, S.RUNNING, "instance.operate", retried=True, settles_alone=True
    ),
    "backup": Rule(
        _LIVE, None, None, "backup.create",
        runs_through=(
            "A backup that has started cannot be cancelled: the database carries it to its "
            "end. Delete the backup once it has completed if you do not want it."
        ),
    ),
    # Forgetting a snapshot leaves the instance as it is.
    "deleteBackup": Rule(
        frozenset({S.RUNNING, S.STOPPED, S.UPDATING, S.FAILED}), None, None, "backup.delete"
    ),
    # A changed backup retention reaches the cluster; the instance stays as it is.
    RETENTION_APPLY: Rule(
        frozenset({S.RUNNING, S.STOPPED, S.UPDATING, S.FAILED}), None, None, "backup.create"
    ),
    # Restore always makes a new instance, which starts out creating.
    "restore": Rule(
        frozenset({S.FAILED}), S.CREATING, S.RUNNING, "backup.restore",
        makes_instance=True, applies_parameters=True, retried=True,
    ),
    "delete": Rule(
        frozenset({S.CREATING, S.RUNNING, S.STOPPED, S.UPDATING, S.FAILED}),
        S.DELETING,
        S.DELETED,
        "instance.delete",
        ends_instance=True,
    ),
}  # fmt: skip
# Custom workflows act on a running instance and leave its state alone.
CUSTOM = Rule(_LIVE, None, None, "instance.operate")

# The verbs that bring an instance into being (create, restore).
MAKES_INSTANCE = frozenset(verb for verb, r in RULES.items() if r.makes_instance)
# The verbs that put it on the operation's plan version (upgrade, roll back).
SETS_VERSION = frozenset(verb for verb, r in RULES.items() if r.sets_version)
# The verbs that apply the namespace's guard rails before their workflow, as their version
# renders them.
APPLIES_GUARD_RAILS = MAKES_INSTANCE | SETS_VERSION
# The verbs that end it (delete).
ENDS_INSTANCE = frozenset(verb for verb, r in RULES.items() if r.ends_instance)
# The verbs whose run applies the instance's whole parameter set.
APPLIES_PARAMETERS = frozenset(verb for verb, r in RULES.items() if r.applies_parameters)
# The verbs whose failure a roll back undoes.
ROLLED_BACK = frozenset(verb for verb, r in RULES.items() if r.rolled_back)
# The verbs run again by "Retry" when they failed the instance.
RETRIED = frozenset(verb for verb, r in RULES.items() if r.retried)
# The verbs the operator carries through once the cluster took them: cancelled, they leave the
# instance where they lead.
SETTLES_ALONE = frozenset(verb for verb, r in RULES.items() if r.settles_alone)
# The verbs that, cancelled after the cluster took some of them, leave the instance failed.
CANCEL_FAILS = frozenset(verb for verb, r in RULES.items() if r.during and not r.settles_alone)
# Deletion protection can change until a delete has started.
PROTECTABLE = RULES["delete"].from_states


def workflow_verb(verb: str) -> str:
    """The spec verb whose workflow an operation of `verb` runs."""
    found = RULES.get(verb)
    return (found.runs if found else None) or verb


def rule(verb: str, *, custom: bool = False) -> Rule:
    """The rule of an Opsdeck verb; a custom verb of the spec (`custom`) has `CUSTOM`'s."""
    return CUSTOM if custom else RULES[verb]


def refusal(
    verb: str,
    state: str,
    *,
    custom: bool = False,
    retry: bool = False,
    label: str = "",
    queued: bool = False,
) -> str | None:
    """Why `verb` cannot start from `state`, in one sentence naming it as the page does
    (`label`, else the verb); None when it can. A `retry` (of the verb that failed the
    instance) starts from `failed` too. `queued`: `state` is the one the operations queued
    before it will leave, not the instance's now, and the sentence says so."""
    allowed = rule(verb, custom=custom).from_states
    if state in allowed or (retry and state == S.FAILED and verb in RETRIED):
        return None
    if state == S.DELETED:
        return "The instance is being deleted." if queued else "The instance is deleted."
    named = label or verb
    if not named[1:2].isupper():  # "Switchover" reads "switchover" mid-sentence; "CPU" stays
        named = named[:1].lower() + named[1:]
    # "has failed", not "is failed": the other states read as they are named.
    if state == S.FAILED:
        now = "will have failed" if queued else "has failed"
    else:
        now = f"{'will be' if queued else 'is'} {S(state).label.lower()}"
    lead = (
        "Once the operations queued before it have run, the instance" if queued else "The instance"
    )
    if allowed == {S.FAILED}:  # a roll back, or a retry of a create or a restore
        return f"{lead} {now}; {named} is for an instance that has failed."
    needs = " or ".join(sorted(S(s).label.lower() for s in allowed))
    return f"{lead} {now}; {named} needs it to be {needs}."
