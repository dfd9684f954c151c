"""Fleet actions: an operation queued on each of many instances, as platform staff confirmed
it in the admin (`admin.InstanceAdmin`).

The confirmation starts a `FleetRun` and returns at once; a worker queues its operations a
batch at a time, each as `services` queues one for the instance's owners (an upgrade also
refused when the instance's plan got a version newer than the one the page showed it). A batch
commits what it queued, what it refused and how far the run is in one transaction: a worker
that dies in one leaves it to be done again, and each instance's request id
(`fleet-<run>-<instance>`) makes what it had queued a repeat, not a second operation. Beat
sends again a run whose worker let its claim lapse (`fleet_runs_resume`). An instance whose
queuing fails with an error that is no refusal (a fault, logged) is refused as such, and the
run goes on; the database's own trouble (a deadlock, a lost connection) makes the batch again.
An operation a run queued that fails is told to its requester and to the organization's
owners and admins (`emails`), as one Opsdeck started on its own.

A run in waves (`FleetRun.wave`) queues that many instances, then waits until every operation
it queued on them has ended: the last of them to end sends the run again (`operation_ended`),
and beat does every minute should that message be lost; it ends once its last wave has. Once
more of its operations failed than it allows (`FleetRun.failures_allowed`), it stops, the
instances left refused for it: an upgrade that breaks the first instances does not go on to
break the fleet. Staff may stop a run (`fleet_run_stop`); what it queued already runs on.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.audit import Actor, audit_record
from accounts.errors import ActionDenied, database_trouble
from deployments import services
from deployments.models import FleetRun, Instance, Operation

log = logging.getLogger(__name__)

VERBS = ("upgrade", "restart", "stop", "start")
BATCH = 50  # instances a worker queues in one transaction
# How long a worker holds a run for one batch: longer than a batch may take.
CLAIM = timedelta(minutes=2)
UNEXPECTED = "An unexpected error stopped it: the worker's log has the details."


def fleet_run_start(
    *,
    actor: Actor,
    verb: str,
    request_id: str,
    selection: list[tuple[str, int | None]],
    wave: int | None = None,
    failures_allowed: int = 0,
) -> FleetRun:
    """The run of `verb` on the selected instances ([instance id, version seen]), `wave` of
    them at a time (all at once without), stopping once more than `failures_allowed` of its
    operations failed; the one this request id started when it is sent again. Its first batch
    is sent once it commits; it is audited with what it asks (each operation it queues is
    audited too, as its requester's)."""
    if verb not in VERBS:
        raise ValidationError(f"No fleet action {verb!r}.")
    if wave is not None and not 1 <= wave <= BATCH:
        raise ValidationError(f"Instances at a time: from 1 to {BATCH}, or none for all at once.")
    if failures_allowed < 0:
        raise ValidationError("Failures allowed: 0 or more.")
    with transaction.atomic():
        run, made = FleetRun.objects.get_or_create(
            request_id=request_id,
            defaults={
                "verb": verb,
                "requested_by": actor.user,
                "requested_ip": actor.ip,
                "selection": [list(item) for item in selection],
                "wave": wave,
                "failures_allowed": failures_allowed,
            },
        )
        if made:
            audit_record(
                actor=actor,
                action="fleet_run.start",
                target=run,
                payload={
                    "verb": verb,
                    "instances": len(selection),
                    "wave": wave,
                    "failures_allowed": failures_allowed,
                },
            )
    if made:
        transaction.on_commit(lambda: _send(run.pk), robust=True)  # beat sends it if this fails
    return run


def _send(run_id: int) -> None:
    from deployments.tasks import fleet_run_advance  # tasks import this module

    fleet_run_advance.delay(run_id)


def fleet_run_advance(run_id: int, *, now=None) -> bool:
    """Queue the run's next batch, claimed first in one UPDATE (no two workers queue it);
    then send the next one, or end the run. Whether this call queued a batch."""
    now = now or timezone.now()
    claimed = (
        FleetRun.objects.filter(pk=run_id, finished_at=None)
        .filter(Q(claimed_until=None) | Q(claimed_until__lt=now))
        .update(claimed_until=now + CLAIM)
    )
    if not claimed:
        return False
    run = FleetRun.objects.select_related("requested_by").get(pk=run_id)
    actor = Actor(user=run.requested_by, ip=run.requested_ip, staff=True)
    if not may_run(run.requested_by):  # as they may no longer start one, theirs stops
        _stop(run, "Its requester may no longer run fleet actions.")
        return True
    failed = run.failed
    if run.wave and run.handled:
        ended = _wave_ended(run)
        if ended is None:  # its operations still run: the last to end sends it again
            FleetRun.objects.filter(pk=run_id, handled=run.handled).update(claimed_until=None)
            return False
        failed += ended
        if run.stopped:  # staff stopped it while this wave ran: it ends with the wave
            _stop(run, run.stopped, failed=failed)
            return True
        if run.handled >= len(run.selection):  # its last wave ended, and the run with it
            FleetRun.objects.filter(pk=run_id, handled=run.handled, finished_at=None).update(
                failed=failed, claimed_until=None, finished_at=timezone.now()
            )
            return True
        if failed > run.failures_allowed:
            _stop(run, _too_many(failed, run.failures_allowed), failed=failed)
            return True
    batch = run.selection[run.handled : run.handled + (run.wave or BATCH)]
    instances = Instance.objects.select_related("tenant").in_bulk([pk for pk, _ in batch])
    queued, refused = 0, []
    with transaction.atomic():
        # Stopped since it was read (`fleet_run_stop` holds this lock while it stops it), or
        # its batch taken over by another worker: nothing of this batch.
        live = FleetRun.objects.select_for_update().filter(
            pk=run_id, handled=run.handled, finished_at=None, stopped=""
        )
        if not live.exists():
            return False
        for pk, seen in batch:
            instance = instances.get(pk)
            if instance is None:
                refused.append([pk, "It no longer exists."])
                continue
            try:
                with transaction.atomic():  # a refusal leaves the batch's others queued
                    _queue(run, actor, instance, seen)
            except (ActionDenied, ValidationError) as exc:
                why = exc.reason if isinstance(exc, ActionDenied) else "; ".join(exc.messages)
                refused.append([str(instance), why])
            except Exception as exc:
                if database_trouble(exc):
                    raise  # a deadlock, a lost connection: the batch again, later
                # Not a refusal: a fault (a plan version that no longer loads, say). Raised,
                # it rolled the batch back, and each time beat sent the run again it failed
                # the same way: the run never ended, its other instances never queued.
                log.exception("fleet run %s: queuing on instance %s failed", run.pk, pk)
                refused.append([str(instance), UNEXPECTED])
            else:
                queued += 1
        handled = run.handled + len(batch)
        # A run in waves ends once its last wave's operations have (their failures counted).
        finished = handled >= len(run.selection) and not (run.wave and queued)
        # Fenced by how far it was: a worker that outlasted its claim, while another took the
        # batch over, records nothing (what it queued were the other's repeats).
        FleetRun.objects.filter(pk=run_id, handled=run.handled).update(
            handled=handled,
            queued=F("queued") + queued,
            refused=run.refused + refused,
            failed=failed,
            claimed_until=None,
            finished_at=timezone.now() if finished else None,
        )
        if not finished and not (run.wave and queued):  # a wave waits for its operations
            transaction.on_commit(lambda: _send(run_id), robust=True)
    return True


def _wave(run: FleetRun) -> list[str]:
    """The instances of the run's last wave queued (those it refused among them too): waves
    start at multiples of its size, the last one maybe shorter."""
    start = run.handled - (run.handled % run.wave or run.wave)
    return [pk for pk, _ in run.selection[start : run.handled]]


def _wave_ended(run: FleetRun) -> int | None:
    """How many of the operations the run's last wave queued failed, once all have ended;
    None while one is still queued or running."""
    wave = _wave(run)
    states = Operation.objects.filter(
        instance_id__in=wave,
        request_id__in=[_request_id(run.request_id, pk) for pk in wave],
    ).values_list("state", flat=True)
    states = list(states)
    if any(state in (Operation.State.QUEUED, Operation.State.RUNNING) for state in states):
        return None
    return sum(state == Operation.State.FAILED for state in states)


def _too_many(failed: int, allowed: int) -> str:
    allowance = "none was allowed" if not allowed else f"at most {allowed} allowed"
    return f"Not queued: the run stopped after {failed} of its operations failed ({allowance})."


def fleet_run_stop(run: FleetRun, *, actor: Actor) -> bool:
    """Stop the run where it is, at a staff member's request (`actor`): the instances it has
    not queued on yet are refused for it; the operations it queued run on (each can be
    cancelled on its instance). A run in waves whose last wave still runs queues nothing more
    and ends with that wave, its failures counted (`fleet_run_advance`). Whether it stopped it
    (an ended or stopping run is left as it is); audited when it did, with how many instances
    it had not queued on."""
    by = actor.user.email or actor.user.get_username()
    why = f"Not queued: {by} stopped the run."
    with transaction.atomic():
        run = (
            FleetRun.objects.select_for_update()
            .filter(pk=run.pk, finished_at=None, stopped="")
            .first()
        )
        if run is None:
            return False
        audit_record(
            actor=actor,
            action="fleet_run.stop",
            target=run,
            payload={
                "verb": run.verb,
                "instances": len(run.selection),
                "not_queued": len(run.selection) - run.handled,
            },
        )
        if not (run.wave and run.handled):
            _stop(run, why)
            return True
        ended = _wave_ended(run)
        if ended is None:
            FleetRun.objects.filter(pk=run.pk).update(stopped=why)
        else:  # its last wave ended, its failures not counted yet
            _stop(run, why, failed=run.failed + ended)
    return True


def operation_ended(operation: Operation) -> None:
    """An operation ended: the fleet run in waves that queued it, if one did, is sent again
    once this commits (its wave may have ended)."""
    run_request_id = _run_request_id(operation)
    if run_request_id is None:
        return
    run_id = (
        FleetRun.objects.filter(request_id=run_request_id, finished_at=None, wave__isnull=False)
        .values_list("pk", flat=True)
        .first()
    )
    if run_id is not None:
        transaction.on_commit(lambda: _send(run_id), robust=True)


def may_run(user) -> bool:
    """Whether `user` may start a fleet action (and have one go on): active platform staff
    allowed to change instances."""
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm("deployments.change_instance")
    )


def _stop(run: FleetRun, why: str, *, failed: int | None = None) -> None:
    """End the run where it is, each instance not handled yet refused for `why`, which its
    page says first (with `failed`, its operations that failed so far)."""
    left = [[pk, why] for pk, _ in run.selection[run.handled :]]
    FleetRun.objects.filter(pk=run.pk, handled=run.handled).update(
        handled=len(run.selection),
        refused=run.refused + left,
        failed=run.failed if failed is None else failed,
        stopped=why if left else "",
        claimed_until=None,
        finished_at=timezone.now(),
    )


def _queue(run: FleetRun, actor: Actor, instance: Instance, seen: int | None) -> None:
    request_id = _request_id(run.request_id, instance.pk)
    if run.verb == "upgrade":
        services.instance_upgrade(actor=actor, instance=instance, request_id=request_id, seen=seen)
    else:
        services.instance_action(
            actor=actor, instance=instance, verb=run.verb, request_id=request_id
        )


def _request_id(run_request_id: str, instance_id: str) -> str:
    """The request id of the operation a run queues on an instance (a batch done again finds
    it: a repeat, not a second operation)."""
    return f"fleet-{run_request_id}-{instance_id}"


def _run_request_id(operation: Operation) -> str | None:
    """The request id of the fleet run whose request id the operation's has the form of
    (`_request_id`); None when it has not."""
    run_request_id = operation.request_id.removeprefix("fleet-").removesuffix(
        f"-{operation.instance_id}"
    )
    if _request_id(run_request_id, operation.instance_id) != operation.request_id:
        return None
    return run_request_id


def fleet_queued(operation: Operation) -> bool:
    """Whether a fleet run queued the operation: its request id is one a run makes, and that
    run's requester asked for it (a member of the organization may send such an id too)."""
    run_request_id = _run_request_id(operation)
    if run_request_id is None:
        return False
    return FleetRun.objects.filter(
        request_id=run_request_id, requested_by_id=operation.requested_by_id
    ).exists()


def fleet_runs_resume(*, now=None) -> int:
    """Send again each unfinished run no worker holds (its message lost, its worker dead) a
    minute after it began or its claim lapsed; how many (run every minute by beat)."""
    now = now or timezone.now()
    stalled = FleetRun.objects.filter(finished_at=None).filter(
        Q(claimed_until=None, created_at__lt=now - timedelta(minutes=1)) | Q(claimed_until__lt=now)
    )
    ids = list(stalled.values_list("pk", flat=True))
    for run_id in ids:
        _send(run_id)
    return len(ids)
