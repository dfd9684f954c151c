"""Operations woken by watches: `python manage.py watch_cells`.

Kubernetes controllers watch rather than poll. Per cell, and per kind the loaded plans' resource
templates wait on (a success or failure condition; `kinds_of`) or read the status from, the
watcher lists (for a resourceVersion) and then watches from there, resuming
after each server-side timeout from the last version seen (bookmarks keep it fresh) and listing
again on 410 Gone. It keeps no objects, only each watch's resourceVersion, so its memory does not
grow with the cell.

Each instance is its own namespace: when an object in an instance's namespace changes, the
instance's running operations that the change may move on are due at once — those waiting on
that object whose condition it decides (`engine.wakes`), and those waiting on nothing in
particular: their `next_step_at` is set to now, then their step is sent (a step arriving before
`next_step_at` is taken for an early duplicate and dropped) — and when the object is the plan's
status object, the instance's observed status is written (`deployments.status`). Polling stays
as a safety net, slowed to `OPSDECK_POLL_MAX` while the watcher covers an operation
(`runner._wait`): an event the watcher misses delays it by one poll, never strands it.

One watcher per cell across any number of processes: a `CellWatchLease` row per cell, taken when
free or expired (its epoch rises), renewed every few seconds, and checked by every write the
watcher makes in the same statement. A process that dies loses its cells within `LEASE_TTL`; a
process that cannot renew stops its watches.

A cell's watcher also catches up its guard rails when they are behind (`Cell.guard_rails_behind`:
an add_cell that changed the cell's settings stopped, or the cluster refused some instance's):
once they have been so for `CATCH_UP_AFTER` with no pass holding the cell, it applies them
again in every instance's namespace (`services.cell_namespaces_apply`), and again after a pass
that could not, less and less often, as a controller reconciles what it owns.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection

from deployments import rows, selectors, services, status
from deployments.cells import configuration, driver_for
from deployments.kube import KubeDriver, WatchExpired
from deployments.models import (
    INSTANCE_ID,
    Cell,
    CellWatchLease,
    Instance,
    Operation,
    PlanVersion,
)
from deployments.transitions import operation_dispatch
from deployments.workflow import engine
from deployments.workflow.driver import DriverError

log = logging.getLogger(__name__)

LEASE_TTL = timedelta(seconds=15)
RENEW_EVERY = 3.0  # seconds; a lease lives through several missed renewals
# Seconds before a failed list or watch is tried again, doubling at each failure in a row up
# to RETRY_MOST: a kind the cluster does not serve makes the client discover the whole API
# again at each try.
RETRY_AFTER = 2.0
RETRY_MOST = 30.0
# Seconds a watch must go without failing, once started again after a failure, before it counts
# as streaming (`KindWatch.streaming`) and its next failure is no longer one in a row: one that
# fails at each try (a watch the cluster forbids) lists between its failures, and must not
# count as streaming then.
STREAMING_AFTER = 10.0
# Seconds a stopping watcher waits, in all, for its watches to end before it exits: a watch
# blocked in its stream ends only at its next event or the server's timeout, and as a daemon
# thread it cannot outlive the process; the lease is released without it (its writes are
# fenced by the lease).
STOP_WAIT = 5.0
# Seconds between two looks at a watch's database connection (too old, or unusable after an
# error, is closed; a kept one is checked before its next use): per event, that check would be
# one more statement for every object an operator writes.
TIDY_EVERY = 1.0
# Seconds a cell's guard rails stay behind before its watcher applies them again itself (the
# add_cell that changed its settings holds the cell with its own pass long before), and before
# it tries again after a pass that another held the cell during; after a pass that could not
# apply them everywhere, twice as long at each such pass in a row, up to CATCH_UP_MOST.
CATCH_UP_AFTER = 60.0
CATCH_UP_MOST = 30 * 60.0


def holder_name() -> str:
    """Who holds a lease: this host and process (and a thread, for tests running two)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


# --- the lease -----------------------------------------------------------------------------


def lease_take(cell_id: int, holder: str) -> int | None:
    """Take the cell's lease if it is free, expired or already ours; the new epoch, or None
    when another holder has it. It holds no streaming watch yet (`lease_renew`)."""
    ttl = LEASE_TTL.total_seconds()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO deployments_cellwatchlease (cell_id, holder, epoch, expires_at, watching)
            VALUES (%s, %s, 1, clock_timestamp() + make_interval(secs => %s), '[]')
            ON CONFLICT (cell_id) DO UPDATE
              SET holder = EXCLUDED.holder,
                  epoch = deployments_cellwatchlease.epoch + 1,
                  expires_at = EXCLUDED.expires_at,
                  watching = EXCLUDED.watching
              WHERE deployments_cellwatchlease.expires_at < clock_timestamp()
                 OR deployments_cellwatchlease.holder = EXCLUDED.holder
            RETURNING epoch
            """,
            [cell_id, holder, ttl],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def lease_renew(
    cell_id: int, holder: str, epoch: int, watching: Collection[tuple[str, str]] = ()
) -> bool:
    """Extend our lease, saying which kinds' watches are streaming now (`watching`: a change
    to an object of one of them wakes the operations waiting on it, so they poll slowly);
    False when the lease is no longer ours (expired and taken, or gone)."""
    kinds = CellWatchLease.kinds_value(watching)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE deployments_cellwatchlease
               SET expires_at = clock_timestamp() + make_interval(secs => %s), watching = %s
             WHERE cell_id = %s AND holder = %s AND epoch = %s AND expires_at > clock_timestamp()
            """,
            [LEASE_TTL.total_seconds(), kinds, cell_id, holder, epoch],
        )
        return cursor.rowcount == 1


def lease_release(cell_id: int, holder: str, epoch: int) -> None:
    """Let another process take the cell at once (a clean stop)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE deployments_cellwatchlease SET expires_at = clock_timestamp() "
            "WHERE cell_id = %s AND holder = %s AND epoch = %s",
            [cell_id, holder, epoch],
        )


@dataclass(frozen=True)
class Lease:
    cell_id: int
    holder: str
    epoch: int


# The condition every write of the watcher carries: the lease is still this one.
_FENCE = """EXISTS (
    SELECT 1 FROM deployments_cellwatchlease l
     WHERE l.cell_id = %s AND l.holder = %s AND l.epoch = %s
       AND l.expires_at > clock_timestamp())"""


# --- what an event does ----------------------------------------------------------------------


def operations_wake(
    lease: Lease,
    instance_id: str,
    changed: dict | None = None,
    *,
    deleted: bool = False,
    alongside: tuple[str, list] | None = None,
) -> list[str]:
    """Make the instance's running operations (in the leased cell) that the change of
    `changed` (one of the instance's objects, `deleted` or not; None: anything may have
    changed) may move on due now, and send their step; their ids. Nothing when the lease is no
    longer ours.

    An operation waiting on that object wakes only when the change decides its condition
    (`engine.wakes`): an operator writes its status many times on the way, and a move for each
    would find it still pending. One waiting on no object (`engine.waiting_on`: it is moving on
    anyway, or waits out a retry's backoff on its own timer) is left alone: woken, it would
    only make the move under way store itself twice, or look at a retry not due yet. One a
    worker is moving right now (claimed) gets no step: its move, once stored, finds it woken
    and goes on at once (`runner._wait`); if that worker died, the claim expires and the
    sweeper sends the overdue step. With no `changed` (anything may have changed), every
    running operation of the instance wakes.

    `alongside`: a write the event makes too (the instance's observed status,
    `observed_update`), as (statement, parameters), made by the statement that looks the
    operations up: an event that wakes nothing is one round trip."""
    table = Operation._meta.db_table
    key = None
    waiting = ""  # which running operations the change may concern: all of them, or ...
    if changed is not None:
        meta = changed.get("metadata") or {}
        key = f"{changed.get('kind', '')}/{meta.get('name', '')}"
        waiting = "AND o.waiting_on @> %s::jsonb"  # ... those waiting on that object
    write, written = alongside or ("", [])
    with connection.cursor() as cursor:  # one per event: in SQL, not built by the ORM each time
        cursor.execute(
            f"""
            {f"WITH written AS ({write})" if write else ""}
            SELECT o.id, o.waiting_on FROM {table} o
              JOIN {Instance._meta.db_table} i ON i.id = o.instance_id
             WHERE o.instance_id = %s AND i.cell_id = %s AND o.state = %s {waiting}
            """,  # noqa: S608 - our table names
            [*written, instance_id, lease.cell_id, Operation.State.RUNNING,
             *([] if key is None else [json.dumps([{"object": key}])])],
        )  # fmt: skip
        running = cursor.fetchall()
    due = [
        operation_id
        for operation_id, waits in running
        if _woken_by(_json(waits), key, None if deleted else changed)
    ]
    if not due:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {table} o SET next_step_at = clock_timestamp()
             WHERE o.id = ANY(%s) AND o.state = %s AND {_FENCE}
            RETURNING o.id, o.claimed_until > clock_timestamp(), {rows.UNFLUSHED}
            """,  # noqa: S608 - our table name
            [due, Operation.State.RUNNING, lease.cell_id, lease.holder, lease.epoch],
        )
        woken = cursor.fetchall()
    for operation_id, moving, _ in woken:
        if not moving:  # one a worker is moving finds itself woken when it stores its move
            operation_dispatch(operation_id, urgent=True)
    return [str(operation_id) for operation_id, _, _ in woken]


def _json(value):
    """A jsonb column as a raw cursor reads it: text (Django leaves decoding to the field)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _woken_by(waits: list[dict], key: str | None, obj: dict | None) -> bool:
    """Whether an operation waiting on `waits` is moved on by the object `key` becoming `obj`
    (None: deleted); with no `key` (anything may have changed), every one is."""
    if key is None:
        return True
    return any(entry["object"] == key and engine.wakes(entry, obj) for entry in waits)


def observed_update(
    lease: Lease, instance_id: str, observed: dict, *, versions: Collection[int]
) -> tuple[str, list]:
    """The statement that stores the instance's observed status (fenced by the lease) if it
    is on one of `versions` (those whose status rule read it), and its parameters."""
    statement = f"""
        UPDATE {Instance._meta.db_table}
           SET observed = %s::jsonb, observed_at = clock_timestamp()
         WHERE id = %s AND cell_id = %s AND plan_version_id = ANY(%s) AND {_FENCE}"""  # noqa: S608 - our table name
    return statement, [json.dumps(observed), instance_id, lease.cell_id, list(versions),
                       lease.cell_id, lease.holder, lease.epoch]  # fmt: skip


@dataclass
class Kind:
    """What a watch of one kind needs from the plans: for the plans whose status object is of
    this kind, their status rule per plan version."""

    api_version: str
    kind: str
    status_rules: dict[int, status.StatusRule] = field(default_factory=dict)  # by version id


def kinds_of(versions: Iterable[PlanVersion]) -> dict[tuple[str, str], Kind]:
    """Every kind the plan versions' resource templates wait on, and the status objects'.
    A kind no template waits on is not watched: a change of it wakes no run."""
    kinds: dict[tuple[str, str], Kind] = {}
    for version in versions:
        spec = selectors.plan_version_loaded(version.pk).spec
        for api_version, kind in spec.waited_kinds:
            kinds.setdefault((api_version, kind), Kind(api_version, kind))
        rule = status.status_rule(spec.extensions)
        if rule is not None:
            entry = kinds.setdefault(
                (rule.api_version, rule.kind), Kind(rule.api_version, rule.kind)
            )
            entry.status_rules[version.pk] = rule
    return kinds


def _shared_rule(rules: dict[int, status.StatusRule]) -> status.StatusRule | None:
    """The status rule every plan version in `rules` has (the usual case: one plan, or versions
    that read the status alike); None when they differ."""
    values = iter(rules.values())
    first = next(values, None)
    return first if all(rule == first for rule in values) else None


def event_handle(lease: Lease, kind: Kind, obj: dict, *, deleted: bool = False) -> None:
    """An object changed (or was `deleted`): wake its instance's operations it may move on; if
    it is the instance's status object, store what the portal shows of it."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    if not INSTANCE_ID.fullmatch(namespace):  # every instance is a namespace named after its id
        return  # not an instance's namespace (the cluster's own, or another tenant of it)
    rules = kind.status_rules  # read once: the watcher's round may replace it meanwhile
    write = None  # the observed status, stored by the statement that looks operations up
    if rules and meta.get("name") == namespace:
        rule, versions = _shared_rule(rules), list(rules)
        if rule is None:  # the instance's version says which rule reads it
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT plan_version_id FROM {Instance._meta.db_table} "  # noqa: S608
                    "WHERE id = %s AND cell_id = %s",
                    [namespace, lease.cell_id],
                )
                row = cursor.fetchone()
            version_id = row[0] if row else None
            rule, versions = rules.get(version_id), [version_id]
        if rule is not None:
            observed = status.observed_of(obj, rule)
            write = observed_update(lease, namespace, observed, versions=versions)
    operations_wake(lease, namespace, obj, deleted=deleted, alongside=write)


# --- the watches -----------------------------------------------------------------------------


class KindWatch(threading.Thread):
    """List then watch one kind in one cell until told to stop."""

    def __init__(self, lease: Lease, cell: Cell, kind: Kind, stopping: threading.Event):
        super().__init__(name=f"watch-{cell.name}-{kind.kind}", daemon=True)
        self.lease, self.cell, self.kind, self.stopping = lease, cell, kind, stopping
        self.resource_version: str | None = None
        self._tidy_at = 0.0  # when the database connection is looked at next (`TIDY_EVERY`)
        # When it last started again after a failure (monotonic), and its failures in a row:
        # each one sooner than `STREAMING_AFTER` after it started again.
        self._resumed_at = -math.inf
        self._failures = 0

    @property
    def streaming(self) -> bool:
        """Whether a change to an object of the kind reaches the watcher now: it has listed,
        and has not failed since it started, or for `STREAMING_AFTER` seconds since it started
        again."""
        return (
            self.resource_version is not None
            and time.monotonic() - self._resumed_at >= STREAMING_AFTER
        )

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self._watch(driver_for(self.cell))
                except WatchExpired:
                    self.resource_version = None  # too old: list again for a current one
                except DriverError as exc:  # not served (yet), unreachable, refused
                    log.warning("watch %s: %s", self.name, exc.message)
                    self._failed()
                except Exception:  # a watcher thread must not die of one bad answer
                    log.exception("watch %s failed; starting again", self.name)
                    self._tidy_at = 0.0  # perhaps a database error: look at the connection first
                    self._failed()
        finally:
            connection.close()

    def _failed(self) -> None:
        """Wait before trying again, longer at each failure in a row."""
        self.resource_version = None
        in_a_row = time.monotonic() - self._resumed_at < STREAMING_AFTER
        self._failures = self._failures + 1 if in_a_row else 1
        self.stopping.wait(min(RETRY_MOST, RETRY_AFTER * 2 ** (self._failures - 1)))
        self._resumed_at = time.monotonic()

    def _watch(self, driver: KubeDriver) -> None:
        """List if there is no version to resume from, then watch until the server ends the
        watch (a timeout: resumed from the last version seen) or the cell is dropped."""
        api_version, kind = self.kind.api_version, self.kind.kind
        if self.resource_version is None:
            items, self.resource_version = driver.list_for_watch(api_version, kind)
            log.info("watch %s: listed %d, watching from %s", self.name, len(items),
                     self.resource_version)  # fmt: skip
            for obj in items:  # whatever changed while nobody watched is news
                self._handle(obj)
        for event_type, obj in driver.watch_objects(
            api_version,
            kind,
            resource_version=self.resource_version,
            timeout=settings.OPSDECK_WATCH_TIMEOUT,
        ):
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = version
            if self.stopping.is_set():
                return
            if event_type in {"ADDED", "MODIFIED", "DELETED"}:
                self._handle(obj, deleted=event_type == "DELETED")

    def _handle(self, obj: dict, *, deleted: bool = False) -> None:
        if time.monotonic() >= self._tidy_at:
            close_old_connections()
            self._tidy_at = time.monotonic() + TIDY_EVERY
        event_handle(self.lease, self.kind, obj, deleted=deleted)


class _Stopped(Exception):
    """The cell's watches stopped (its lease lost, the watcher stopping): so does its pass."""


class GuardRailsCatchUp(threading.Thread):
    """One pass applying a cell's guard rails again in every instance's namespace, unless
    another pass holds the cell; it takes no instance more once the cell's watches stop. What
    it came to: `done` (None when another pass held the cell), or `failed`."""

    def __init__(self, cell: Cell, stopping: threading.Event) -> None:
        super().__init__(name=f"guard-rails-{cell.name}", daemon=True)
        self.cell, self.stopping = cell, stopping
        self.done: services.NamespacesApplied | None = None
        self.failed = False

    def run(self) -> None:
        try:
            self.done = services.cell_namespaces_apply(self.cell, each=self._each, unless_held=True)
        except _Stopped:
            log.info("watch_cells: stopped applying the guard rails of cell %s", self.cell.name)
        except Exception:  # the watcher goes on; the next pass tries again
            log.exception("watch_cells: applying the guard rails of cell %s failed", self.cell.name)
            self.failed = True
        finally:
            connection.close()

    def _each(self, done: services.NamespacesApplied) -> None:
        if self.stopping.is_set():
            raise _Stopped


@dataclass
class CatchUp:
    """When the watcher applies a cell's guard rails again next (`time.monotonic()`), the
    passes in a row that could not, and the one running."""

    due: float
    failures: int = 0
    thread: GuardRailsCatchUp | None = None

    def ended(self, cell_name: str) -> None:
        """Schedule the next pass by how the last one ended."""
        thread, now = self.thread, time.monotonic()
        self.thread = None
        if thread.done is not None and not thread.done.failed:
            log.info("watch_cells: applied the guard rails of cell %s again in the namespaces of "
                     "%d instance(s)", cell_name, thread.done.applied)  # fmt: skip
            self.failures, self.due = 0, now + CATCH_UP_AFTER  # behind again since: a new change
        elif thread.done is not None or thread.failed:
            self.failures += 1
            delay = min(CATCH_UP_MOST, CATCH_UP_AFTER * 2 ** (self.failures - 1))
            self.due = now + delay
            if thread.done is not None and thread.done.gave_up:
                log.warning("watch_cells: the cluster refused the guard rails of the last %d "
                            "instances of cell %s alike (%s), so the pass stopped with %d left; "
                            "trying again in %.0f s", services.SAME_REFUSAL_STOPS, cell_name,
                            thread.done.gave_up, thread.done.total - thread.done.passed,
                            delay)  # fmt: skip
            elif thread.done is not None:
                refused = thread.done.failed
                log.warning("watch_cells: the cluster refused the guard rails of %d instance(s) "
                            "of cell %s (%s: %s); trying again in %.0f s",
                            len(refused), cell_name, *refused[0], delay)  # fmt: skip
        else:  # another pass held the cell, or the watches stopped
            self.due = now + CATCH_UP_AFTER


class CellWatcher:
    """What `watch_cells` runs: takes the lease of every cell it can, watches the kinds of
    the loaded plans in each, renews, and stops a cell's watches when its lease is lost."""

    def __init__(self, *, holder: str | None = None, stopping: threading.Event | None = None):
        self.holder = holder or holder_name()
        self.stopping = stopping or threading.Event()
        # cell id -> (lease, its stop event, {kind key: thread})
        self.cells: dict[int, tuple[Lease, threading.Event, dict[tuple[str, str], KindWatch]]] = {}
        # The kinds of the plan versions last seen, worked out again only when they change.
        self._kinds: tuple[frozenset[int], dict[tuple[str, str], Kind]] = (frozenset(), {})
        # cell id -> its guard rails' catch-up, while they are behind
        self.catch_ups: dict[int, CatchUp] = {}

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                close_old_connections()
                try:
                    self.round()
                except Exception:
                    log.exception("watch_cells: a round failed")
                self.stopping.wait(RENEW_EVERY)
        finally:
            watches = [w for _, _, held in self.cells.values() for w in held.values()]
            watches += [c.thread for c in self.catch_ups.values() if c.thread is not None]
            for cell_id in list(self.cells):
                self._drop(cell_id, release=True)
            deadline = time.monotonic() + STOP_WAIT
            for thread in watches:  # their database connections closed, when they end in time
                thread.join(max(0.0, deadline - time.monotonic()))
            connection.close()

    def round(self) -> None:
        """Renew or take each cell's lease and start the watches a new plan needs."""
        kinds = self.kinds()
        for cell in Cell.objects.all():
            held = self.cells.get(cell.pk)
            if held is not None and not lease_renew(
                cell.pk, self.holder, held[0].epoch,
                watching=[key for key, watch in held[2].items() if watch.streaming],
            ):  # fmt: skip
                log.warning("watch_cells: lost the lease of cell %s", cell.name)
                self._drop(cell.pk, release=False)
                held = None
            if held is None:
                epoch = lease_take(cell.pk, self.holder)
                if epoch is None:
                    continue  # another process watches it
                log.info("watch_cells: watching cell %s (epoch %s)", cell.name, epoch)
                held = (Lease(cell.pk, self.holder, epoch), threading.Event(), {})
                self.cells[cell.pk] = held
            lease, stop, watches = held
            if any(configuration(w.cell) != configuration(cell) for w in watches.values()):
                # Its kubeconfig changed (`add_cell` again: credentials rotated, another
                # address): its watches start again on the new one. The old ones stop at their
                # next event or retry, unwaited for, as the lease is kept.
                log.info("watch_cells: the configuration of cell %s changed", cell.name)
                stop.set()
                held = (lease, threading.Event(), {})
                self.cells[cell.pk] = held
                lease, stop, watches = held
            for key, kind in kinds.items():
                if key not in watches:
                    watches[key] = KindWatch(lease, cell, kind, stop)
                    watches[key].start()
            self._catch_up(cell, stop)

    def _catch_up(self, cell: Cell, stop: threading.Event) -> None:
        """Start a pass applying the cell's guard rails again when they are behind and one is
        due (`CatchUp`), unless one is running."""
        catch_up = self.catch_ups.get(cell.pk)
        if catch_up is not None and catch_up.thread and not catch_up.thread.is_alive():
            catch_up.ended(cell.name)
        if not cell.guard_rails_behind:
            self.catch_ups.pop(cell.pk, None)  # one still running ends as it would
            return
        if catch_up is None:
            catch_up = self.catch_ups[cell.pk] = CatchUp(time.monotonic() + CATCH_UP_AFTER)
        if catch_up.thread is None and time.monotonic() >= catch_up.due:
            log.info("watch_cells: the guard rails of cell %s are behind its settings: applying "
                     "them again", cell.name)  # fmt: skip
            catch_up.thread = GuardRailsCatchUp(cell, stop)
            catch_up.thread.start()

    def kinds(self) -> dict[tuple[str, str], Kind]:
        """The kinds to watch, for the plan versions loaded now (one query when unchanged)."""
        ids = frozenset(PlanVersion.objects.values_list("id", flat=True))
        if ids != self._kinds[0]:
            kinds = self._kinds[1]
            for key, kind in kinds_of(PlanVersion.objects.filter(pk__in=ids).only("id")).items():
                if key in kinds:  # its running watches read the new versions' paths from now on
                    kinds[key].status_rules = kind.status_rules
                else:
                    kinds[key] = kind
            self._kinds = (ids, kinds)
        return self._kinds[1]

    def _drop(self, cell_id: int, *, release: bool) -> None:
        """Stop a cell's watches, unwaited for: one blocked in its stream ends at its next
        event or the server's timeout (`OPSDECK_WATCH_TIMEOUT`), and the other cells' leases
        must be renewed meanwhile. Once the lease is released or lost, their writes are
        refused (`_FENCE`)."""
        lease, stop, _ = self.cells.pop(cell_id)
        stop.set()
        self.catch_ups.pop(cell_id, None)
        if release:
            close_old_connections()  # one broken since the last round is not used to release
            try:
                lease_release(cell_id, lease.holder, lease.epoch)
            except DatabaseError as exc:  # another process takes the cell when the lease expires
                log.warning("watch_cells: could not release the lease of cell %s: %s", cell_id, exc)

    def holds(self, cell_id: int) -> bool:
        return cell_id in self.cells
