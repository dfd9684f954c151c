"""Moving an instance between states, sending an operation's work to a worker, and when an
instance's snapshots expire.

The services that accept a verb and the runner that carries it out both use this module; they
never call each other. Which verb moves an instance from which state to which is `lifecycle`'s
table.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from celery import current_app
from django.db import transaction
from django.db.models import Model
from django.db.models.functions import Coalesce
from django.utils import timezone

from deployments import rows
from deployments.models import Instance, InstanceStateChange, Operation, Snapshot

STEP_TASK = "deployments.tasks.operation_step"


def instance_state_set(instance: Instance, state: str, **how) -> None:
    """Move an instance to `state` now, as `instance_state_writes` says (`how`: the operation
    that moved it, the reason, other fields changed, rows recorded alongside), in one
    statement."""
    writes = instance_state_writes(instance, state, **how)
    if writes is not None:
        writes.run()


def instance_state_writes(
    instance: Instance,
    state: str,
    *,
    operation: Operation | None = None,
    reason: str = "",
    also: Iterable[str] = (),
    alongside: Iterable[Model] = (),
) -> rows.Writes | None:
    """Move an instance to `state`, recording the change with its time; `also` names other
    fields the caller changed on `instance`, saved in the same UPDATE (also when the state
    stays as it is); `alongside`, new rows the caller records with it (an audit event). The
    writes, as steps of one statement (`rows.Writes`) for the caller to run, alone
    (`instance_state_set`) or in a statement of its own; None when nothing changes."""
    fields, new = set(also), list(alongside)
    if instance.state != state:
        change = InstanceStateChange(
            instance=instance,
            from_state=instance.state,
            to_state=state,
            operation=operation,
            reason=reason[:500],
        )
        new.insert(0, change)
        instance.state = state
        instance.updated_at = timezone.now()
        fields |= {"state", "updated_at"}
    if not (new or fields):
        return None
    # In SQL as the ORM writes them (`rows`): a run's end makes them, on every instance.
    return rows.writes(new, (instance, sorted(fields)) if fields else None)


# Which waiting step a worker takes first, in Redis's terms: each priority is a list of its own
# and workers pop the lowest number's first (kombu's `priority_steps`: 0, 3, 6, 9).
URGENT = 0  # an operation under way moving on: what it waited for came, a cancel, its next move
ROUTINE = 3  # an operation starting, or looking again after a delay (a poll, a back-off)


def step_priority(*, urgent: bool) -> int:
    """A step's priority in the broker's terms. Redis pops the lowest number first. A broker
    whose queues are declared with a maximum priority (RabbitMQ: `task_queue_max_priority`,
    which the settings give an amqp broker) delivers the highest first: the same two levels,
    counted down from that maximum (at least ROUTINE)."""
    priority = URGENT if urgent else ROUTINE
    highest = current_app.conf.task_queue_max_priority
    return highest - priority if highest else priority


def operation_dispatch(operation_id, delay: float = 0.0, *, urgent: bool = False) -> None:
    """Send the operation's next step to a worker in `delay` seconds, once the current
    transaction commits (at once outside one): a worker never looks for a row it cannot see
    yet, and a rolled-back request sends nothing. An `urgent` step goes before every routine
    one waiting: a burst of new operations does not delay those under way from acting on what
    they waited for.

    A broker that cannot be reached then does not undo the commit, nor turn the request that
    made it into an error: the step is lost, and the sweeper (`runner.operations_sweep`) sends
    the operation's next one once it is overdue."""
    priority = step_priority(urgent=urgent)
    transaction.on_commit(
        lambda: current_app.send_task(
            STEP_TASK, args=[str(operation_id)], countdown=max(delay, 0), priority=priority
        ),
        robust=True,
    )


def snapshots_expire_by(instance: Instance, retention_days: int) -> None:
    """The instance's snapshots expire `retention_days` after they were taken, as the object
    store prunes them once that retention is on the cluster."""
    Snapshot.objects.filter(instance=instance).exclude(status=Snapshot.Status.DELETED).update(
        expires_at=Coalesce("taken_at", "created_at") + timedelta(days=retention_days)
    )
