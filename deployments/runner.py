"""The runner: advances operations one engine step at a time, durably.

A Celery task calls `operation_step(id)`. It claims the operation (a token
valid for `OPSDECK_OPERATION_LEASE` seconds: a second worker holding the same
message finds it claimed and skips it), lets the engine advance from the saved
state — calling the cluster outside any transaction — and commits the new state
and the task runs in one statement fenced by the claim (the run's end, which writes the
instance too, in a short transaction). After progress it
goes on with the next move in the same task (while two seconds have not passed
when a move is stored), keeping its claim and the operation it read; when the
run has to wait it releases the claim and sends itself again after a poll that
starts fast and slows to 5 s. Nothing sleeps. A worker killed anywhere loses at
most the move in flight, which the next delivery redoes from the last saved
state.

A commit waits for the disk only where something outside the database relies on it: a move
that stores an object for the next move to send (`engine.holds_unsent`) or the run's first
change the cluster took, and a run's end (the instance, the audit log, the email and the bill
follow it). A claim, a run's start, a later move that sent or read back an object, a retry's
backoff: a crash of PostgreSQL that loses one of these (`rows.UNFLUSHED`) leaves the operation
as a killed worker does, redone from the state before.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import salted_hmac

from accounts.audit import SYSTEM, audit_event
from accounts.models import Membership, Tenant, User
from deployments import cells, emails, executor, fleet, lifecycle, rows, selectors
from deployments.kube import KubeDriver
from deployments.models import (
    BackupSchedule,
    Cell,
    CellWatchLease,
    Instance,
    Operation,
    PlatformSecret,
    Snapshot,
    TaskRun,
)
from deployments.parameters import (
    instance_values,
    requested_changes,
    run_values,
    split_values,
    values_after,
    values_for_version,
    verb_values,
)
from deployments.transitions import (
    instance_state_set,
    instance_state_writes,
    operation_dispatch,
    snapshots_expire_by,
)
from deployments.workflow import engine
from deployments.workflow.driver import DriverError, PermanentError, TransientError
from deployments.workflow.render import Context, RenderError

log = logging.getLogger(__name__)

MOVES_PER_TASK = 2.0  # seconds one task may keep advancing a run that progresses
QUEUED_RECHECK = 2.0  # seconds between looks at a queued operation waiting for its turn
RETRYING = "Retrying after a cluster error: "  # an operation's error while it retries a step
FAULTS_BEFORE_FAILING = 5  # moves in a row an error of Opsdeck's own stops before the run fails
FAULT_RETRY_MOST = 300.0  # seconds between tries of a move whose run could not even be failed


def poll_delay(idle_steps: int) -> float:
    """Fast at first, then slower, capped: `OPSDECK_POLL_FIRST` (0.2 s), 0.3 s, 0.45 s, …
    `OPSDECK_POLL_MAX` (5 s)."""
    first, most = settings.OPSDECK_POLL_FIRST, settings.OPSDECK_POLL_MAX
    return min(most, first * (1.5**idle_steps))


def operation_step(operation_id: str) -> None:
    """Advance one operation while it makes progress (see the module docstring).

    Each move is its own transaction, committed before the next one starts, so a crash
    loses at most the move in flight. The task stops at the first move that has to wait,
    or at the first stored once MOVES_PER_TASK seconds have passed, and sends itself for the
    rest: a run that progresses does not queue behind every other run's task for each of its
    moves.
    """
    stop_at = time.monotonic() + MOVES_PER_TASK
    held = None
    while True:
        # A move that progresses and is stored in time keeps the claim for the next one.
        delay, held = _step(operation_id, held, keep_until=stop_at)
        if delay is None:
            return
        if held is None:
            # Its next move right away (it ran out of time here) goes before new work.
            operation_dispatch(operation_id, delay, urgent=delay == 0)
            return


class ClaimLost(Exception):
    """Another worker took the operation over (this one's claim expired while it waited on
    the cluster) or it ended meanwhile: the move made is discarded, never committed."""


# The statements every move makes on its operation, written in SQL: building each with the ORM
# took longer than the worker's whole share of running it.
_TABLE = Operation._meta.db_table
_LIVE = [Operation.State.QUEUED, Operation.State.RUNNING]
# Written out, not a parameter: a list parameter is converted again on every statement.
_IS_LIVE = f"state IN ({', '.join(repr(str(state)) for state in _LIVE)})"
_MINE = f"id = %s AND claim_token = %s AND {_IS_LIVE}"  # the claim's fence
_ANY = object()  # `_store`'s `due` when a wake-up meanwhile changes nothing


class _Joined:
    """A row of the claimed operation and what a move reads beside it — its instance, the
    instance's cell and tenant, its requester (none for the system's) — built as the ORM
    builds them (`rows.built`) and linked as `select_related` links them."""

    PARTS = ((Operation, "claimed"), (Instance, "i"), (Cell, "c"), (Tenant, "t"), (User, "u"))
    FROM = f"""
        claimed JOIN {Instance._meta.db_table} i ON i.id = claimed.instance_id
        JOIN {Cell._meta.db_table} c ON c.id = i.cell_id
        JOIN {Tenant._meta.db_table} t ON t.id = i.tenant_id
        LEFT JOIN {User._meta.db_table} u ON u.id = claimed.requested_by_id"""
    COLUMNS = ", ".join(rows.columns(model, alias) for model, alias in PARTS)

    @classmethod
    def built(cls, row: tuple) -> Operation:
        parts, start = [], 0
        for model, alias in cls.PARTS:
            width = len(model._meta.concrete_fields)
            parts.append(rows.built(model, alias, row[start : start + width]))
            start += width
        op, instance, cell, tenant, user = parts
        instance.cell, instance.tenant = cell, tenant
        op.instance, op.requested_by = instance, user if user.pk is not None else None
        return op


def _claim(
    operation_id: str, now, *, early: bool = False, token: uuid.UUID | None = None
) -> Operation | None:
    """Claim the operation for one move (`claim_token`: `token`, or a new one; valid until the
    lease ends) and read it, with what a move reads beside it (`_Joined`), in one statement;
    None when it ended, another worker holds it, or (unless `early`) its next step is not due
    yet."""
    due = "" if early else "AND (next_step_at IS NULL OR next_step_at <= %s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH claimed AS (
                UPDATE {_TABLE} SET claim_token = %s, claimed_until = %s
                 WHERE id = %s AND {_IS_LIVE} AND (claimed_until IS NULL OR claimed_until < %s)
                       {due}
                RETURNING *, {rows.UNFLUSHED}
            )
            SELECT {_Joined.COLUMNS} FROM {_Joined.FROM}
            """,  # noqa: S608 - our table and column names
            [token or uuid.uuid4(), now + timedelta(seconds=settings.OPSDECK_OPERATION_LEASE),
             operation_id, now, *([] if early else [now + timedelta(milliseconds=50)])],
        )  # fmt: skip
        row = cursor.fetchone()
    return None if row is None else _Joined.built(row)


class ClaimedDriver:
    """The cell's driver as a task's moves call it, under the worker's claim on the operation.

    Before each call the claim is renewed once half its lease has passed, so a move that makes
    many slow calls keeps it; a worker whose claim was taken over meanwhile (it stalled longer
    than the lease) raises ClaimLost before its next call rather than write to the cluster
    beside the new owner. A single call never outlasts the half lease left after a renewal
    (`OPSDECK_OPERATION_LEASE` is at least twice the longest call)."""

    def __init__(
        self, driver: KubeDriver, operation_id: str, token: uuid.UUID, claimed_until: datetime
    ) -> None:
        self._driver = driver
        self._operation_id = operation_id
        self._token = token
        self._lease = settings.OPSDECK_OPERATION_LEASE
        self._renew_at = claimed_until.timestamp() - self._lease / 2

    def _keep(self) -> None:
        if time.time() < self._renew_at:
            return
        until = timezone.now() + timedelta(seconds=self._lease)
        # Outside any transaction: the renewal stands at once, whatever the move does next.
        kept = Operation.objects.filter(pk=self._operation_id, claim_token=self._token).update(
            claimed_until=until
        )
        if not kept:
            raise ClaimLost
        self._renew_at = until.timestamp() - self._lease / 2

    def create(self, obj: dict, *, owner_label: tuple[str, str]) -> dict:
        self._keep()
        return self._driver.create(obj, owner_label=owner_label)

    def apply(self, obj: dict, *, field_manager: str | None = None) -> dict:
        self._keep()
        return self._driver.apply(obj, field_manager=field_manager)

    def patch(self, obj: dict, *, strategy: str, subresource: str | None) -> dict:
        self._keep()
        return self._driver.patch(obj, strategy=strategy, subresource=subresource)

    def replace(self, obj: dict) -> dict:
        self._keep()
        return self._driver.replace(obj)

    def delete(self, obj: dict) -> None:
        self._keep()
        self._driver.delete(obj)

    def get(self, obj: dict) -> dict | None:
        self._keep()
        return self._driver.get(obj)

    def resolve(self, resource: str) -> tuple[str, str]:
        self._keep()
        return self._driver.resolve(resource)

    def last_warning(self, obj: dict, *, since: float | None) -> str:
        self._keep()
        return self._driver.last_warning(obj, since=since)


@dataclass
class Runs:
    """The TaskRun rows a move changed (`_task_runs_changed`), with the saved state's nodes
    (`before`) that say which rows earlier moves wrote."""

    nodes: list
    before: dict


def _store(
    op: Operation,
    token: uuid.UUID,
    fields: list[str],
    *,
    release: bool = True,
    due: object = _ANY,
    runs: Runs | None = None,
    flushed: bool = True,
    alongside: rows.Writes | None = None,
) -> bool:
    """Write the move's `fields` of the operation in one UPDATE fenced by the claim, releasing
    it (unless `release` is False: the same worker goes on with the next move), and in the same
    statement the task `runs` it changed (`_task_runs_sql`): a move is one statement, and no
    transaction, unless it finishes the run. Raises ClaimLost, and the transaction it is in
    rolls back, when the claim is not ours any more or the operation ended meanwhile (a delete
    cancelled it). With `due` (the `next_step_at` the move read), False and nothing written
    when a wake-up changed it meanwhile. Unless `flushed`, the transaction it is in commits
    without waiting for the disk (`rows.UNFLUSHED`). What others write to a claimed operation,
    its `cancel_reason` and `next_step_at`, is read back into `op` as the write left them.
    The writes `alongside` (a run's end: the instance and its audit event) are steps of the
    same statement, which the transaction it is in undoes with the rest on ClaimLost."""
    values = {name: getattr(op, name) for name in fields}
    if release:
        values |= {"claim_token": None, "claimed_until": None}
    if not values:
        raise ValueError("a store writes at least one field or releases the claim")
    names = list(values)
    woken = "" if due is _ANY else "AND next_step_at IS NOT DISTINCT FROM %s"
    statement = f"UPDATE {_TABLE} SET {rows.sets(Operation, names)} WHERE {_MINE} {woken}"  # noqa: S608 - our names
    params = [*rows.prepared(Operation, names, values), op.pk, token,
              *([] if due is _ANY else [due])]  # fmt: skip
    # Read back with the write: what others write to a claimed operation (a cancel, a wake-up),
    # as it stands once this store is, for the task's next move to go on from.
    back = "id, cancel_reason, next_step_at"
    returning = f" RETURNING {back}" if flushed else f" RETURNING {back}, {rows.UNFLUSHED}"
    # The task runs are written only if the operation is: both stand or neither.
    written, more = _task_runs_sql(runs) if runs is not None else ("", [])
    steps = alongside.steps if alongside is not None else []
    if written or steps:
        written += "".join(f", w{n} AS ({step})" for n, step in enumerate(steps))
        read = "".join(f", (SELECT * FROM w{n})" for n in range(len(steps)))  # noqa: S608
        statement = (
            f"WITH moved AS ({statement}{returning}){written} SELECT {back}{read} FROM moved"  # noqa: S608
        )
        params += [*more, *(alongside.params if alongside is not None else [])]
    else:
        statement += returning
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        stored = cursor.fetchone()
    if stored is not None:
        op.cancel_reason, op.next_step_at = stored[1], stored[2]
        if alongside is not None:
            alongside.stored(stored[3:])
        return True
    if due is not _ANY and _reread(op.pk, token) is not None:
        return False
    raise ClaimLost


def _reread(operation_id, token: uuid.UUID) -> tuple[str, datetime | None] | None:
    """What others write to an operation this worker claimed: its cancel_reason (a user's
    cancel, a delete) and next_step_at (a wake-up); None when the claim is not ours any more
    or the operation ended."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT cancel_reason, next_step_at FROM {_TABLE} WHERE {_MINE}",  # noqa: S608
            [operation_id, token],
        )
        return cursor.fetchone()


@dataclass
class Held:
    """A worker's claim on an operation, kept from one move to the next within a task: the
    operation as read when it was claimed (with what others wrote to it as the last store
    read it back), and the cell's driver under the claim (made by the first move; it renews
    the claim from then on)."""

    op: Operation
    token: uuid.UUID
    claimed_until: datetime  # as claimed
    driver: ClaimedDriver | None = None
    # Where the run happens and its variables (`_context`), as the task's first move worked
    # them out: fixed by what the operation recorded when it started, so its later moves in
    # the task use them as they are (the platform's secrets are read again by each task).
    context: tuple[executor.Placement, Context] | None = None
    kept: bool = False  # whether the last move stored kept the claim for the next one


def _step(
    operation_id: str, held: Held | None = None, *, keep_until: float = 0.0
) -> tuple[float | None, Held | None]:
    """One move, committed: the delay before the next one, or None when there is none to
    schedule (finished, cancelled, held by another worker, or an early duplicate of a delivery
    still to come); and the claim, when the next move follows at once and this one was stored
    before `keep_until` (`time.monotonic()`): kept for it.

    No transaction or row lock stays open while the cluster is called: the operation is
    claimed first (`_claim`), the move is computed, and it is committed in one statement (a
    short transaction when it ends the run) whose write of the operation is fenced by the
    claim (`_store`) — so a worker that lost its claim while stuck in a call discards its move
    instead of overwriting the new owner's.

    A move that goes on from a kept claim reads nothing again: the store that kept it read back
    what others write to a claimed operation (a cancel, a wake-up) as its write left it, and
    the next store's fence finds the rest (a lost claim). A cancel that comes while a move is
    made is acted on by the task's next move.

    A move that raises an error no move expects, one of Opsdeck's own (`_faulted`), releases
    the claim at once and is tried again after a delay, instead of holding the operation until
    the lease runs out and failing alike at every try."""
    now = timezone.now()
    token = uuid.uuid4() if held is None else held.token
    try:
        if held is None:
            op = _claim(operation_id, now, token=token)
            if op is None:
                return None, None
            held = Held(op, token, op.claimed_until)
        op = held.op
        held.kept = False
        begun = _begin(op, now, held.token) if op.state == Operation.State.QUEUED else STARTED
        if begun == WAITS:
            # Its predecessor schedules it when it finishes; looking again now and then
            # covers a predecessor that finished while this one was being queued.
            return QUEUED_RECHECK, None
        if begun == REFUSED:
            return None, None
        delay = _advance(op, now, held, keep_until=keep_until)
    except ClaimLost:
        log.warning("operation %s: its claim was lost; the move is discarded", operation_id)
        return None, None
    except Exception as exc:  # a fault: any error a move does not expect
        return _faulted(operation_id, token, exc), None
    return delay, (held if held.kept else None)


FAULTED = "Opsdeck met an internal error"  # an operation's error after a fault (`_faulted`)


def _faulted(operation_id: str, token: uuid.UUID, exc: Exception) -> float | None:
    """After a move under `token` raised `exc`, an error no move expects (a bug, a state this
    release cannot read, a database error): log it with its traceback under a reference the
    operation shows, release the claim, and have the move tried again after a delay that
    doubles at each fault in a row (`OPSDECK_FAULT_RETRY_DELAY`). Nothing of the move was
    stored, so the next try starts from the state the last stored move left, as after a
    killed worker. At the FAULTS_BEFORE_FAILING-th fault in a row the run fails (`_give_up`),
    and the instance and the operations queued behind it go on as after any failed run. When
    the run's end faults too (its email, say: the fault may be in the end's own code), it fails
    without telling anyone it ended, which the log says. One whose run cannot be failed even so
    is tried again every FAULT_RETRY_MOST seconds, with the error shown. The delay, or None
    when the claim is not this worker's any more."""
    reference = uuid.uuid4().hex[:8]
    log.error("operation %s: a move failed (reference %s)", operation_id, reference, exc_info=exc)
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()  # one the error broke: the next is new
    mine = Operation.objects.filter(pk=operation_id, claim_token=token, state__in=_LIVE)
    streak = mine.values_list("fault_streak", flat=True).first()
    if streak is None:
        return None
    streak += 1
    if streak >= FAULTS_BEFORE_FAILING:
        reason = (
            f"{FAULTED} (reference {reference}) on {streak} tries in a row and stopped the "
            "operation. Give the reference to support."
        )
        for tell in (True, False):
            try:
                _give_up(operation_id, token, reason, tell=tell)
                return None
            except ClaimLost:
                return None
            except Exception:  # the run's end met an error of its own
                log.exception(
                    "operation %s: its run could not be failed%s",
                    operation_id, "; it is failed without telling anyone it ended" if tell else "",
                )  # fmt: skip
    delay = min(FAULT_RETRY_MOST, settings.OPSDECK_FAULT_RETRY_DELAY * 2 ** (streak - 1))
    error = f"{FAULTED} (reference {reference}); the step is tried again shortly."
    stored = mine.update(
        fault_streak=streak,
        error=error,
        next_step_at=timezone.now() + timedelta(seconds=delay),
        claim_token=None,
        claimed_until=None,
    )
    return delay if stored else None


def _give_up(operation_id: str, token: uuid.UUID, reason: str, *, tell: bool = True) -> None:
    """End the operation's run failed with `reason`, under this worker's claim (`token`), as a
    failure outside any task ends it (`engine.fail`: onExit not run), read again as stored: the
    move that faulted may have changed the operation it held. A saved state this release
    cannot read is replaced by a new one failed at once, the cluster taken as touched, and
    the task runs it left pending or running end failed with the run. Unless `tell`, nobody
    is told it ended (`_finish`)."""
    op = (
        Operation.objects.select_related("instance__cell", "instance__tenant", "requested_by")
        .filter(pk=operation_id, claim_token=token, state__in=_LIVE)
        .first()
    )
    if op is None:
        raise ClaimLost
    spec = selectors.plan_version_loaded(op.plan_version_id).spec
    verb = spec.main.verbs[lifecycle.workflow_verb(op.verb)]
    now = timezone.now()
    saved, unreadable = {}, False
    if op.state == Operation.State.QUEUED:
        state = engine.start(verb.workflow, operation_id=str(op.pk), now=now.timestamp())
        op.arguments = {**op.arguments, "state_before": op.instance.state}
    else:
        try:
            saved = json.loads(op.engine_state)
            state = engine.RunState.from_json(saved)
        except Exception:  # the fault may be its saved state
            saved, unreadable = {}, True
            state = engine.start(verb.workflow, operation_id=str(op.pk), now=now.timestamp())
            op.arguments = {**op.arguments, "cluster_touched": True}
    engine.fail(state, now=now.timestamp(), reason=reason)
    op.engine_state = json.dumps(state.to_json())
    before = saved.get("nodes", {})
    runs = Runs(_task_runs_changed(op, state, before=before), before)
    with transaction.atomic():
        locked = _instance_locked(op.instance, op.requested_by_id)
        if unreadable:  # its rows are all that says what its tasks were doing
            TaskRun.objects.filter(
                operation_id=op.pk, state__in=[engine.PENDING, engine.RUNNING]
            ).update(state=engine.FAILED, message=reason, finished_at=now)
        _finish(op, state, verb, now, token, locked=locked, runs=runs, tell=tell)


_SCHEDULES = BackupSchedule._meta.db_table
_MEMBERSHIPS = Membership._meta.db_table
# The instance's fields a run reads or writes (its tenant and cell never change).
_INSTANCE_FIELDS = [
    f.attname for f in Instance._meta.concrete_fields if f.attname not in {"tenant_id", "cell_id"}
]


@dataclass
class Locked:
    """What `_instance_locked` reads beside the instance it locks."""

    pending: list[tuple[str, str, str]]  # its queued and running operations: (id, verb, state)
    retention_days: int | None  # its backup schedule's; None without one
    requester_member: bool  # whether the operation's requester belongs to its organization


def _instance_locked(instance: Instance, requester_id: int | None) -> Locked:
    """Lock the instance, as every service that queues or cancels its operations locks it, and
    read it again (the row read when the task began may predate the commit of an operation
    before this one, and with it its values); then its queued and running operations as
    (id, verb, state), oldest first, which none can change while the lock is held, with its
    schedule's backup retention (which a schedule change writes under the same lock) and
    whether the user `requester_id` belongs to its organization (who is told how a run ended).

    Two statements: a statement that waits for the lock reads the locked row as committed
    meanwhile but the rest as it was when it began, so a list read beside the lock could
    miss an operation queued, or still hold one finished, while it waited (and the retention
    be the one a schedule change replaced). The second statement, which starts with the lock
    held, reads both: from one row (`one`) that always stands, so the retention comes back
    when no operation is pending too."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {rows.columns(Instance, 'i')} FROM {Instance._meta.db_table} i"  # noqa: S608
            " WHERE i.id = %s FOR UPDATE",
            [instance.pk],
        )
        fresh = rows.built(Instance, "i", cursor.fetchone())
        cursor.execute(
            f"""
            SELECT o.id::text, o.verb, o.state, s.retention_days,
                   EXISTS (SELECT 1 FROM {_MEMBERSHIPS} m WHERE m.tenant_id = %s AND m.user_id = %s)
              FROM (SELECT 1) one
              LEFT JOIN {_SCHEDULES} s ON s.instance_id = %s
              LEFT JOIN {_TABLE} o ON o.instance_id = %s AND o.{_IS_LIVE}
             ORDER BY o.created_at
            """,  # noqa: S608 - our table names
            [instance.tenant_id, requester_id, instance.pk, instance.pk],
        )
        found = cursor.fetchall()
    for name in _INSTANCE_FIELDS:
        setattr(instance, name, getattr(fresh, name))
    pending = [(pk, verb, state) for pk, verb, state, _, _ in found if pk is not None]
    return Locked(pending, found[0][3], found[0][4])


# What `_begin` did with a queued operation.
STARTED = "started"  # its run started: its first move follows, under the claim kept
WAITS = "waits"  # an operation before it is pending: it stays queued
REFUSED = "refused"  # its verb cannot start on the instance as it is now: it ended failed


def _begin(op: Operation, now, token: uuid.UUID) -> str:
    """Start a queued operation if it is the instance's oldest pending one, keeping the claim
    for its first move; else release the claim and leave it queued. One whose verb cannot
    start on the instance as the operations before it left it (`_start_refusal`) ends failed
    at once, saying why, with nothing sent to the cluster.

    The instance is locked for it (`_instance_locked`), as every service that queues or cancels
    its operations locks it, unless the operation makes the instance (a create, a restore), the
    instance is as that verb leaves it while it runs, and no other operation of it is pending
    (`_alone`): then there is nothing before it to wait for, nothing to refuse, nothing to write
    to the instance, and an operation queued meanwhile comes after it. Its start is then one
    statement, fenced by the claim: a cancel that came first ends it there, with nothing sent;
    one that comes after finds it running."""
    spec = selectors.plan_version_loaded(op.plan_version_id).spec
    verb = spec.main.verbs[lifecycle.workflow_verb(op.verb)]
    rule = lifecycle.rule(op.verb, custom=verb.custom)
    if rule.makes_instance and op.instance.state == rule.during:
        alone, retention_days = _alone(op)
        if alone:
            _start(op, spec, verb, now, token, retention_days=retention_days)
            return STARTED
    with transaction.atomic():
        # The instance first, locked and read again, with the operations pending on it.
        locked = _instance_locked(op.instance, op.requested_by_id)
        if locked.pending and locked.pending[0][0] != str(op.pk):
            _store(op, token, [], flushed=False)  # it starts when the one before it finishes
            return WAITS
        following = locked.pending[1:]
        refusal = _start_refusal(op, verb, following)
        if refusal:
            state = engine.start(verb.workflow, operation_id=str(op.pk), now=now.timestamp())
            engine.fail(state, now=now.timestamp(), reason=f"Did not start. {refusal}")
            op.engine_state = json.dumps(state.to_json())
            op.arguments = {**op.arguments, "state_before": op.instance.state}
            _finish(op, state, verb, now, token, locked=locked)
            return REFUSED
        _start(op, spec, verb, now, token, retention_days=locked.retention_days)
        if rule.during:
            instance_state_set(op.instance, rule.during, operation=op)
    return STARTED


def _alone(op: Operation) -> tuple[bool, int | None]:
    """Whether no other operation of the operation's instance is pending, and its backup
    schedule's retention (None without one), in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT NOT EXISTS (
                       SELECT 1 FROM {_TABLE} o
                        WHERE o.instance_id = %s AND o.id <> %s AND o.{_IS_LIVE}),
                   (SELECT s.retention_days FROM {_SCHEDULES} s WHERE s.instance_id = %s)
            """,  # noqa: S608 - our table names
            [op.instance_id, op.pk, op.instance_id],
        )
        return cursor.fetchone()


def _start(op: Operation, spec, verb, now, token: uuid.UUID, *, retention_days: int | None):
    """Store the operation's run as started, keeping the claim for its first move: the
    instance's values as the operations before it left them with the changes it asked for,
    and the backup retention it renders with (its schedule's `retention_days`, else the
    default), fixed for the run."""
    state = engine.start(verb.workflow, operation_id=str(op.pk), now=now.timestamp())
    known = {p.key for p in spec.main.parameters}
    changes = {k: v for k, v in requested_changes(op).items() if k in known}
    values = {**instance_values(op.instance), **changes}
    if op.plan_version_id != op.instance.plan_version_id:
        # An upgrade: the parameters of the version it applies, worked out now, from the
        # values the instance holds when it starts.
        values = values_for_version(spec.main.parameters, values)
    op.parameters, op.secret_parameters = split_values(spec.main.parameters, values)
    op.state = Operation.State.RUNNING
    op.started_at = now
    op.engine_state = json.dumps(state.to_json())
    # Where a run that fails before the cluster accepted any change leaves the instance,
    # and the backup retention it renders with (fixed for the run, as its parameters are).
    op.arguments = {
        **op.arguments,
        "state_before": op.instance.state,
        "retention_days": retention_days
        or selectors.backup_schedule_default(op.instance).retention_days,
    }
    # Nothing is sent yet: a start lost with PostgreSQL's last moments is made again.
    _store(
        op, token,
        ["state", "started_at", "engine_state", "parameters", "secret_parameters", "arguments"],
        release=False, flushed=False,
    )  # fmt: skip


def _start_refusal(op: Operation, verb, following: list) -> str | None:
    """Why the operation's verb cannot start on its instance (locked, read again) as it is
    now; None when it can. It was accepted on the state the operations queued before it would
    leave, which one of them that failed or was cancelled did not: a modify queued behind a
    start, once the start was cancelled, would change a stopped instance and wait for it to be
    healthy until its deadline. A verb that makes or ends the instance is not checked, nor an
    operation a delete waits behind (the last backup a delete takes first is taken whatever
    state the instance is in); a delete whose last backup did not complete is refused: the
    plan promised one before the data goes."""
    rule = lifecycle.rule(op.verb, custom=verb.custom)
    if last := op.arguments.get("last_backup"):  # a delete behind the last backup it took
        ended = Operation.objects.filter(pk=last).values_list("state", flat=True).first()
        if ended != Operation.State.SUCCEEDED:
            how = "was cancelled" if ended == Operation.State.CANCELLED else "failed"
            return (
                f"The last backup before deletion {how}, so nothing was deleted. Delete again "
                "to take another, or delete without a last backup."
            )
    if rule.makes_instance or rule.ends_instance:
        return None
    if any(queued_verb == "delete" for _, queued_verb, _ in following):
        return None
    instance = op.instance
    retry = False
    if instance.state == Instance.State.FAILED and op.verb in lifecycle.RETRIED:
        failed = selectors.instance_retry_source(instance)  # "Retry" of what failed it
        retry = failed is not None and failed.verb == op.verb
    return selectors.action_refusal(instance, op.verb, custom=verb.custom, retry=retry)


def _advance(op: Operation, now, held: Held, *, keep_until: float) -> float | None:
    """The run's next move from its saved state; the claim is released when it is stored,
    unless the next move follows at once and it is stored before `keep_until` (`held.kept`)."""
    token = held.token
    due = op.next_step_at  # as read after the claim; a wake-up during the move changes it
    op.moves += 1
    spec = selectors.plan_version_loaded(op.plan_version_id).spec
    verb = spec.main.verbs[lifecycle.workflow_verb(op.verb)]
    saved = json.loads(op.engine_state)
    state = engine.RunState.from_json(saved)
    instance = op.instance
    if op.cancel_reason:  # a user's cancel or a delete: the main stage stops, onExit runs
        engine.cancel(state, now=now.timestamp(), reason=op.cancel_reason)
    where = placement(op) if held.context is None else held.context[0]
    try:
        if held.driver is None:
            held.driver = ClaimedDriver(
                cells.driver_for(instance.cell), str(op.pk), token, held.claimed_until
            )
        driver = held.driver
        # A run that stops (cancelled, or past its deadline) needs no namespace: a cluster that
        # kept answering its prelude with errors kept it from the move that ends it.
        stops = state.stage != "main" or now.timestamp() >= state.deadline_at
        if not (op.arguments.get("namespace_ready") or stops):
            where = _prelude(op, spec, driver, where)
        if held.context is None:
            held.context = (where, _context(op, spec, verb, where))
        # The workflow's first move goes in the same transaction as the namespace's.
        step = executor.move(state, spec, verb, held.context[1], driver, where, now=time.time())
        if step.unanswered is not None:  # a task's call failed; the others moved on
            op.transient_failures += 1
    except TransientError as exc:
        # The cluster hiccupped: the same step again later, from the saved state. The error
        # stays visible while the step is retried.
        op.transient_failures += 1
        op.transient_streak += 1
        # Not sooner than the cluster asked (Retry-After, with a 429).
        backoff = 0.25 * 2 ** min(op.transient_streak - 1, 7)
        delay = min(30.0, max(backoff, exc.retry_after or 0.0))
        op.next_step_at = now + timedelta(seconds=delay)
        op.error = f"{RETRYING}{exc.message}"[:2000]
        # A write was sent and its answer lost: the cluster may hold it.
        flushed = _first_change(op, state, saved)
        if state.changed:
            op.arguments = {**op.arguments, "cluster_touched": True}
        _store(
            op, token,
            ["transient_failures", "transient_streak", "next_step_at", "moves", "arguments",
             "error"],
            flushed=flushed,
        )  # fmt: skip
        log.info("operation %s: transient error, retrying in %.1fs: %s", op.pk, delay, exc)
        return delay
    except (PermanentError, RenderError) as exc:
        # A failure outside any task (a cell that cannot be used, bad variables).
        message = exc.message if isinstance(exc, DriverError) else str(exc)
        engine.fail(state, now=now.timestamp(), reason=message)
        step = engine.Step(progressed=True)

    op.engine_state = json.dumps(state.to_json())
    before = saved.get("nodes", {})
    runs = Runs(_task_runs_changed(op, state, before=before), before)
    if not state.done:  # a move that only waits writes no instance, and locks none
        # In time for another move in this task: the claim is kept if that one follows at once.
        in_time = time.monotonic() < keep_until
        # What the cluster now relies on is stored where a crash cannot lose it: an object
        # rendered for the next move to send, or the run's first change the cluster took.
        flushed = engine.holds_unsent(state) or _first_change(op, state, saved)
        delay = _wait(
            op, state, step, now, token, due=due,
            keep=in_time, runs=runs, flushed=flushed,
        )  # fmt: skip
        held.kept = in_time and delay == 0
        return delay
    with transaction.atomic():
        # The instance first, as every service that changes an instance's operations locks it
        # (a delete): finishing writes the instance too, and the other order deadlocks with
        # such a service.
        # Read again with the lock: a task's later moves go on from the row its first read.
        locked = _instance_locked(instance, op.requested_by_id)
        # Stamped as it is stored, not as the move began (before its cluster calls and the
        # wait for the lock): metering reads the run's end as of its hour (`metering.SETTLE`).
        _finish(op, state, verb, timezone.now(), token, locked=locked, runs=runs)
    return None


def _prelude(op: Operation, spec, driver, where: executor.Placement) -> executor.Placement:
    """Apply the namespace and guard rails the operation's verb needs before its workflow
    (`executor.prelude_objects`), from the object the last try stopped at; the placement they
    were last rendered with.

    add_cell applies a changed cell's guard rails again in the namespaces there are
    (`services.cell_namespaces_apply`): a change committed while these were rendered and
    applied may have found this namespace not there yet, or been overwritten by them. So once
    all are applied the cell's settings are read again, and while they changed meanwhile the
    guard rails are rendered and applied again: a change committed after that read finds the
    namespace, and nothing of this operation's applied after its own."""
    objects = executor.prelude_objects(spec, op.verb, where)
    rendered = _rendered(objects)
    # Progress is counted per object, so a failed write redoes only itself; a count of objects
    # rendered otherwise (the cell's settings changed since the move that made it) is not.
    applied = 0
    if op.arguments.get("namespace_rendered") == rendered:
        applied = op.arguments.get("namespace_objects_applied", 0)
    try:
        while True:
            for count in executor.prelude(driver, objects, applied):
                applied = count
            if not objects or not cells.namespace_settings_read(op.instance.cell):
                return where
            where = placement(op)
            objects, applied = executor.prelude_objects(spec, op.verb, where), 0
            rendered = _rendered(objects)
    finally:
        if objects:
            op.arguments = {
                **op.arguments,
                "namespace_objects_applied": applied,
                "namespace_rendered": rendered,
                "namespace_ready": applied == len(objects),
            }


def _rendered(objects: list[dict]) -> str:
    """A keyed digest of the prelude's objects as rendered (they hold the object store's keys):
    stored with the count of those applied, which holds only for objects rendered alike."""
    text = json.dumps(objects, sort_keys=True)
    return salted_hmac("opsdeck.prelude", text, algorithm="sha256").hexdigest()


def _first_change(op: Operation, state: engine.RunState, saved: dict) -> bool:
    """Whether this move sent the run's first write the cluster may hold (its answer came, or
    was lost): stored where a crash cannot lose it, since a cancel after it leaves the instance
    failed, not as it was."""
    return state.changed and not (saved.get("changed") or op.arguments.get("cluster_touched"))


def _wait(
    op: Operation,
    state: engine.RunState,
    step: engine.Step,
    now,
    token: uuid.UUID,
    *,
    due,
    keep: bool = False,
    runs: Runs | None = None,
    flushed: bool = True,
) -> float:
    """Store a move that left the run waiting, with the task `runs` it changed (waiting for
    the disk if `flushed`); the delay before the next one. The claim is released, unless
    `keep` and the next move follows at once: the same worker makes it.

    The cell watcher wakes a waiting operation by making it due (`next_step_at`) when an
    object it waits on changes in a way that decides its condition (`engine.wakes`). While it
    does — it holds the cell's lease and its watch of every kind waited on streams
    (`_watched`) — polling is only the safety net: the next look is `OPSDECK_POLL_MAX` away. Else
    the poll starts fast and slows down (`poll_delay`).

    A wake-up that arrives while this move runs finds the operation claimed, and this move may
    have read the objects before the change it signals. So when `next_step_at` is no longer
    what this move read (`due`), the next move follows at once instead of after the delay."""
    if op.transient_streak or op.fault_streak:
        op.error = ""  # the cluster answers again, the move went through
    op.transient_streak = op.fault_streak = 0
    op.idle_steps = 0 if step.progressed else op.idle_steps + 1
    op.waiting_on = engine.waiting_on(state)
    if step.progressed:
        delay = 0.0
    elif _watched(op):
        delay = settings.OPSDECK_POLL_MAX
    else:
        delay = poll_delay(op.idle_steps)
    if step.wake_at is not None:  # a retry's backoff ends then
        delay = min(delay, max(0.0, step.wake_at - time.time()))
    op.next_step_at = now + timedelta(seconds=delay)
    fields = ["engine_state", "idle_steps", "transient_streak", "next_step_at", "arguments",
              "moves", "error", "waiting_on", "transient_failures", "fault_streak"]  # fmt: skip
    if _store(
        op, token, fields, release=not (keep and delay == 0), due=due, runs=runs, flushed=flushed
    ):
        return delay
    op.next_step_at, op.idle_steps = now, 0  # woken meanwhile: nothing was written
    _store(op, token, fields, release=not keep, runs=runs, flushed=flushed)
    return 0.0


def _watched(op: Operation) -> bool:
    """Whether a change to what the operation waits on wakes it: it waits on objects, and a
    cell watcher holds the lease of its instance's cell with a streaming watch of each of
    their kinds (`watcher.lease_renew`). A watch that keeps failing (a kind the cluster does
    not serve, a watch it forbids) leaves its operations on the fast poll."""
    if not op.waiting_on:
        return False
    kinds = {(e.get("apiVersion", ""), e["object"].split("/", 1)[0]) for e in op.waiting_on}
    with connection.cursor() as cursor:  # in SQL, as the rest of a move
        cursor.execute(
            f"SELECT 1 FROM {CellWatchLease._meta.db_table}"  # noqa: S608 - our table
            " WHERE cell_id = %s AND expires_at > %s AND watching @> %s::jsonb",
            [op.instance.cell_id, timezone.now(), CellWatchLease.kinds_value(kinds)],
        )
        return cursor.fetchone() is not None


def _finish(
    op: Operation,
    state: engine.RunState,
    verb,
    now,
    token: uuid.UUID,
    *,
    locked: Locked,
    runs: Runs | None = None,
    tell: bool = True,
) -> None:
    """Store the run's end, with the task `runs` its last move changed, and what it does to
    the instance (`locked` by the caller, with what it read under the lock): the next of its
    other pending operations may start now. Then, if `tell`, tell whom the end concerns: the
    fleet run that queued the operation, and its requester by email."""
    following = [p for p in locked.pending if p[0] != str(op.pk)]
    succeeded = state.phase == engine.SUCCEEDED
    cancelled = not succeeded and bool(op.cancel_reason)  # by a user, or by a delete
    if succeeded:
        op.state = Operation.State.SUCCEEDED
    else:
        op.state = Operation.State.CANCELLED if cancelled else Operation.State.FAILED
    op.finished_at = now
    error = state.message or "The workflow failed."
    if op.error.startswith(RETRYING):  # e.g. a deadline: say what kept the run from finishing
        error = f"{error} The last cluster error: {op.error.removeprefix(RETRYING)}"
    op.error = "" if succeeded else error
    op.outputs = engine.verb_outputs(state, verb.outputs) if succeeded else {}
    op.next_step_at = None
    if not succeeded and state.changed:  # the page says what it may have left in the cluster
        op.arguments = {**op.arguments, "cluster_touched": True}
    instance = op.instance
    rule = lifecycle.rule(op.verb, custom=verb.custom)
    delete_waiting = any(
        verb == "delete" and state == Operation.State.QUEUED for _, verb, state in following
    )
    # Saved in the statement that records the run's end and the instance's change.
    event = audit_event(
        actor=SYSTEM,
        action=f"operation.{op.state}",
        tenant=instance.tenant,
        target=op,
        payload={"verb": op.verb, "instance": instance.pk, "error": op.error},
    )
    if succeeded:
        # Stored = deployed: the values the run applied (and those the verb declares it sets).
        after = values_after(op, verb, run_values(op))
        if after is not None:
            instance.parameters, instance.secret_parameters = split_values(
                selectors.plan_version_loaded(op.plan_version_id).spec.main.parameters, after
            )
            # ... and the version whose workflow applied them (an upgrade's newer one).
            instance.plan_version_id = op.plan_version_id
        if op.outputs and not op.arguments.get("snapshot"):  # a backup's go to its snapshot
            instance.outputs = {**instance.outputs, **op.outputs}
        instance.updated_at = now
        writes = instance_state_writes(
            instance, rule.after or instance.state, operation=op,
            also=["parameters", "secret_parameters", "plan_version", "outputs", "updated_at"],
            alongside=[event],
        )  # fmt: skip
    elif rule.during and not delete_waiting:  # else the delete takes it from here
        before = op.arguments.get("state_before")
        changed = state.changed or op.arguments.get("cluster_touched", False)
        if changed and rule.settles_alone and engine.stopped_by_cancel(state, op.cancel_reason):
            # The operator finishes what it took of a stop, a start, a restart or a switchover:
            # the instance is where the verb leads.
            after = rule.after
        else:
            # Failed, unless it stopped before the cluster took any of it: then it is as it was.
            after = (
                Instance.State.FAILED if changed or rule.makes_instance or not before else before
            )
        writes = instance_state_writes(
            instance, after, operation=op, reason=op.error, alongside=[event]
        )
    else:
        writes = rows.writes([event])
    if succeeded and (op.verb == lifecycle.RETENTION_APPLY or rule.makes_instance):
        # The retention the cluster now holds, the one this run rendered.
        writes.also_update(
            BackupSchedule,
            {"retention_days_applied": op.arguments["retention_days"]},
            instance_id=instance.pk,
        )
    # Only what finishing changes (a delete may have set cancel_reason meanwhile), in one
    # statement with the instance's change, its schedule's and the audit event.
    _store(
        op, token,
        ["state", "finished_at", "error", "outputs", "next_step_at", "engine_state", "moves",
         "arguments", "transient_streak", "transient_failures"],
        runs=runs, alongside=writes,
    )  # fmt: skip
    if op.verb == lifecycle.RETENTION_APPLY and succeeded:
        # The object store now prunes by the retention this run put on the cluster.
        snapshots_expire_by(instance, op.arguments["retention_days"])
    if op.arguments.get("forget_snapshot") and succeeded:
        Snapshot.objects.filter(pk=op.arguments["forget_snapshot"]).update(
            status=Snapshot.Status.DELETED
        )
    if op.arguments.get("snapshot"):
        # One deleted while its backup ran stays deleted (its data goes with the retention).
        Snapshot.objects.filter(pk=op.arguments["snapshot"]).exclude(
            status=Snapshot.Status.DELETED
        ).update(
            status=Snapshot.Status.COMPLETED if succeeded else _SNAPSHOT_ENDED[op.state],
            taken_at=op.finished_at if succeeded else None,
            metadata=op.outputs,
            parameters=op.parameters,  # what a restore of it keeps, also once the instance is gone
        )
    if following:
        operation_dispatch(following[0][0])
    if not tell:
        return
    fleet.operation_ended(op)  # a fleet run's wave may have ended with it
    # Its requester hears of a new instance ready, or of a failure (not of a run a delete ended).
    if rule.makes_instance if succeeded else not delete_waiting:
        # Sent by the mail worker once this commits.
        emails.operation_ended(op, belongs=locked.requester_member)


# What a backup that did not succeed leaves of its snapshot, by how its operation ended.
_SNAPSHOT_ENDED = {
    Operation.State.FAILED: Snapshot.Status.FAILED,
    Operation.State.CANCELLED: Snapshot.Status.CANCELLED,
}

# What a TaskRun row shows of its node (besides the attempt that names it).
_SHOWN = ("phase", "message", "warning", "object", "started_at", "finished_at")


def _task_runs_changed(op: Operation, state: engine.RunState, *, before: dict) -> list:
    """The nodes whose TaskRun row (one per attempt of each resource task, with the object it
    rendered) this move changed: only what a row shows counts (`before` is the saved state's
    nodes), so a move that only read an object back, or took a node from one step to the next,
    writes none."""
    changed = []
    for node in state.nodes.values():
        if node.template == "" or (node.object is None and node.phase == engine.PENDING):
            continue
        prev = before.get(node.id)
        if _synced(prev, node) and all(prev.get(name) == getattr(node, name) for name in _SHOWN):
            continue
        template = op_template(op, node.template)
        if template is not None and template.resource is not None:
            changed.append(node)
    return changed


def _synced(prev: dict | None, node) -> bool:
    """Whether the node's row was written by an earlier move (the saved state `prev` names
    the same attempt, past pending)."""
    return (
        prev is not None
        and prev.get("attempt") == node.attempt
        and not (prev.get("object") is None and prev.get("phase") == engine.PENDING)
    )


_RUNS = TaskRun._meta.db_table
_RUN_FIELDS = ["state", "message", "object", "started_at", "finished_at"]
_RUN_VALUES = "(%s, %s::int, %s, %s, %s, %s::timestamptz, %s::timestamptz)"  # node, attempt, …


def _task_runs_sql(runs: Runs) -> tuple[str, list]:
    """The TaskRun rows of `runs.nodes` (`_task_runs_changed`) as statements that follow the
    store's UPDATE of the operation (`moved`, one row or none) in its WITH: a row an earlier
    move wrote is updated, its object written again only when it changed (else not encrypted
    and sent again); a row new in this move (the state naming it commits with it) is inserted,
    or would update a row that exists after all rather than fail on it. The statements' text
    and their parameters."""
    kept, added = [], []
    for node in runs.nodes:
        prev = runs.before.get(node.id)
        values = {
            "state": node.phase,
            "message": engine.task_message(node),
            "object": json.dumps(node.object) if node.object else "",
            "started_at": _dt(node.started_at),
            "finished_at": _dt(node.finished_at),
        }
        synced = _synced(prev, node)
        if synced and prev.get("object") == node.object:
            values["object"] = None  # unchanged: kept as it is stored (COALESCE), not encrypted
        row = [node.id, node.attempt, *rows.prepared(TaskRun, _RUN_FIELDS, values)]
        (kept if synced else added).append(row)
        ended = node.ended_attempt
        if not synced and ended and prev is not None and prev.get("attempt") == ended["attempt"]:
            # A retry began another attempt: the row of the one it ended says how it ended.
            closed = {
                "state": ended["phase"], "message": ended["message"], "object": None,
                "started_at": _dt(node.started_at), "finished_at": _dt(ended["finished_at"]),
            }  # fmt: skip
            kept.append([node.id, ended["attempt"], *rows.prepared(TaskRun, _RUN_FIELDS, closed)])
    columns = [rows.column(TaskRun, name) for name in _RUN_FIELDS]
    named = f"v (node, attempt, {', '.join(columns)})"
    sql, params = "", []
    if kept:
        sets = ", ".join(
            f"{c} = COALESCE(v.{c}, t.{c})" if name == "object" else f"{c} = v.{c}"
            for name, c in zip(_RUN_FIELDS, columns, strict=True)
        )
        sql += f"""
            , kept AS (
                UPDATE {_RUNS} t SET {sets}
                  FROM moved, (VALUES {", ".join([_RUN_VALUES] * len(kept))}) AS {named}
                 WHERE t.operation_id = moved.id AND t.node = v.node AND t.attempt = v.attempt
            )"""  # noqa: S608 - our table and column names
        params += [value for row in kept for value in row]
    if added:
        sql += f"""
            , added AS (
                INSERT INTO {_RUNS} (operation_id, node, attempt, {", ".join(columns)})
                SELECT moved.id, v.node, v.attempt, {", ".join(f"v.{c}" for c in columns)}
                  FROM moved, (VALUES {", ".join([_RUN_VALUES] * len(added))}) AS {named}
                ON CONFLICT (operation_id, node, attempt)
                DO UPDATE SET {", ".join(f"{c} = EXCLUDED.{c}" for c in columns)}
            )"""  # noqa: S608 - our table and column names
        params += [value for row in added for value in row]
    return sql, params


def op_template(op: Operation, name: str):
    spec = selectors.plan_version_loaded(op.plan_version_id).spec
    verb = spec.main.verbs[lifecycle.workflow_verb(op.verb)]
    return verb.workflow.templates.get(name)


def _dt(timestamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(timestamp, tz=UTC) if timestamp is not None else None


def placement(op: Operation) -> executor.Placement:
    """Where and for whom the operation runs, from its instance, tenant, cell and requester."""
    instance, tenant, user = op.instance, op.instance.tenant, op.requested_by
    return cells.placement(
        instance.cell,
        instance_id=instance.pk,
        tenant_slug=tenant.slug,
        tenant_name=tenant.name,
        user_id=str(user.pk) if user else "",
        user_email=user.email if user else "",
    )


def _context(op: Operation, spec, verb, where: executor.Placement) -> Context:
    """The run's variables, fixed by what the operation recorded when it started; the
    platform's secrets are read when a task begins (they may be rotated), and only for specs
    that use them."""
    uses_secrets = selectors.plan_version_loaded(op.plan_version_id).uses_secrets
    return executor.run_context(
        spec,
        verb,
        where,
        values={**run_values(op), **verb_values(op)},
        operation_id=str(op.pk),
        started_at=op.started_at,
        retention_days=op.arguments.get("retention_days")
        or selectors.backup_retention_days(op.instance),
        extra_sys=op.arguments.get("sys", {}),
        secrets=dict(PlatformSecret.objects.values_list("name", "value")) if uses_secrets else None,
    )


def operations_sweep() -> int:
    """Re-enqueue operations whose next step is long overdue (a lost message, a dead worker):
    one due long ago, and one with no step due yet that was queued, or started, long ago (a
    step never sent; a worker that died in a run's first move, before it stored any)."""
    overdue = timezone.now() - timedelta(seconds=settings.OPSDECK_STALLED_AFTER)
    State = Operation.State
    stalled = list(
        Operation.objects.filter(
            Q(state__in=[State.QUEUED, State.RUNNING], next_step_at__lt=overdue)
            | Q(state=State.QUEUED, next_step_at=None, created_at__lt=overdue)
            | Q(state=State.RUNNING, next_step_at=None, started_at__lt=overdue),
            finished_at=None,  # read on their index (`operation_unfinished`)
        ).values_list("pk", flat=True)
    )
    for pk in stalled:
        operation_dispatch(pk)
    return len(stalled)
