"""Operations are claimed, not locked, while a worker advances them: no transaction stays
open through a call to the cluster, a second worker leaves a claimed operation alone, and a
worker whose claim ran out (stuck in a call) discards its move instead of committing it over
the new owner's."""

import json
import math
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.audit import Actor
from accounts.models import AuditEvent, OutgoingEmail
from bench.support import row_updates
from deployments import runner, services
from deployments.cells import driver_for
from deployments.models import (
    BackupSchedule,
    Cell,
    Instance,
    Operation,
    PlatformSecret,
    TaskRun,
)
from tests.concurrency import beside_a_lock
from tests.deployments.conftest import SPEC, instance_object
from tests.deployments.factories import BACKUPS


@pytest.fixture
def queued(db, owner, tenant):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=SPEC.read_text()).plan
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def test_an_operation_another_worker_holds_is_left_alone_until_its_claim_runs_out(queued):
    now = timezone.now()
    Operation.objects.filter(pk=queued.pk).update(
        claim_token=uuid.uuid4(), claimed_until=now + timedelta(seconds=60)
    )

    runner.operation_step(str(queued.pk))

    queued.refresh_from_db()
    assert queued.state == Operation.State.QUEUED and queued.moves == 0
    # The other worker died: once its claim has run out, the next step takes the operation.
    assert runner._claim(str(queued.pk), now + timedelta(seconds=61)) is not None


def test_a_worker_whose_claim_ran_out_commits_nothing(queued):
    stale = runner._claim(str(queued.pk), timezone.now()).claim_token
    # Stuck in a call past its lease: another worker claims the operation and moves it on.
    later = timezone.now() + timedelta(seconds=runner.settings.OPSDECK_OPERATION_LEASE + 1)
    fresh = runner._claim(str(queued.pk), later).claim_token
    assert fresh != stale

    queued.error = "written by the stale worker"
    with pytest.raises(runner.ClaimLost), transaction.atomic():
        TaskRun.objects.create(operation=queued, node="main.cluster", attempt=1, state="Running")
        runner._store(queued, stale, ["error"])

    queued.refresh_from_db()
    assert queued.error == "" and queued.claim_token == fresh  # the new owner's claim stands
    assert not TaskRun.objects.filter(operation=queued).exists()  # the move rolled back whole
    runner._store(queued, fresh, [])  # the owner commits; the claim is released
    queued.refresh_from_db()
    assert queued.claim_token is None and queued.claimed_until is None


def test_a_move_is_not_committed_on_an_operation_a_delete_cancelled_meanwhile(queued):
    token = runner._claim(str(queued.pk), timezone.now()).claim_token
    Operation.objects.filter(pk=queued.pk).update(state=Operation.State.CANCELLED)

    with pytest.raises(runner.ClaimLost):
        runner._store(queued, token, [])


def test_a_move_longer_than_the_lease_keeps_its_claim_from_other_workers(
    cell, plan, owner, tenant, settings, faults
):
    # A create's first move applies the namespace and its three guard rails, one slow call each:
    # 3.2 s, over a lease of 3 s, which the worker renews as it goes. A call that starts just
    # before the claim is due for renewal has the half lease left, 1.5 s, to end in: 0.7 s more
    # than the call takes, for a busy host (a CI run failed with 0.25 s to spare).
    settings.OPSDECK_OPERATION_LEASE = 3.0
    queued = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    # A worker's driver reads the kinds the cluster serves at its first call (eight requests
    # with the core group's, once per process): read before the cluster slows down.
    driver_for(cell).serves("v1", "Namespace")
    faults(latency_ms=800)  # every request to the cluster now takes 0.8 s
    moving = threading.Event()
    taken: list[uuid.UUID] = []

    def other_worker():  # a second delivery of the same step, trying all the while
        try:
            # From the moment the move claimed the operation (before, the claim is anyone's).
            mine = Operation.objects.filter(pk=queued.pk, claim_token__isnull=False)
            while moving.is_set() and not mine.exists():
                time.sleep(0.01)
            while moving.is_set() and not taken:
                claimed = runner._claim(str(queued.pk), timezone.now())
                if claimed is not None:
                    taken.append(claimed.claim_token)
                time.sleep(0.05)
        finally:
            connection.close()

    moving.set()
    contender = threading.Thread(target=other_worker)
    contender.start()
    try:
        started = time.monotonic()
        delay, _ = runner._step(str(queued.pk))
        took = time.monotonic() - started
    finally:
        moving.clear()
        contender.join(10)

    queued.refresh_from_db()
    assert took > settings.OPSDECK_OPERATION_LEASE  # the move outlasted its lease ...
    # ... and kept its claim to the end: had another worker taken it over meanwhile, the move's
    # fenced store would have been discarded (no delay, no move counted).
    assert delay is not None and queued.moves == 1 and queued.arguments["namespace_ready"]
    # Committed, the claim released (the other delivery may take it once it is free).
    assert queued.claim_token is None or queued.claim_token in taken


def test_a_worker_whose_claim_was_taken_over_makes_no_further_call(queued, settings, kube):
    settings.OPSDECK_OPERATION_LEASE = 0  # the claim is checked before every call
    stale = runner._claim(str(queued.pk), timezone.now()).claim_token
    Operation.objects.filter(pk=queued.pk).update(claim_token=uuid.uuid4())  # a new owner
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "inst-0stale00"}}

    with pytest.raises(runner.ClaimLost):
        runner.ClaimedDriver(kube, str(queued.pk), stale, timezone.now()).apply(namespace)

    assert kube.get(namespace) is None


def test_a_move_that_progresses_keeps_the_claim_for_the_tasks_next_move(created):
    delay, held = runner._step(str(created.pk), keep_until=math.inf)

    created.refresh_from_db()
    assert delay == 0 and held is not None and created.moves == 1  # committed, and ...
    assert created.claim_token == held.token  # ... still claimed by this worker:
    assert runner._claim(str(created.pk), timezone.now()) is None  # no other can take it

    delay, held = runner._step(str(created.pk), held)  # the task's last move

    created.refresh_from_db()
    assert created.moves == 2 and held is None
    assert created.claim_token is None and created.claimed_until is None  # released


def test_a_move_stored_once_the_tasks_time_is_up_releases_the_claim(created):
    delay, held = runner._step(str(created.pk), keep_until=time.monotonic())

    created.refresh_from_db()
    assert delay == 0 and held is None and created.moves == 1  # its next move: another task's
    assert created.claim_token is None and created.claimed_until is None


def test_a_cancel_that_comes_while_a_move_is_made_is_acted_on_by_the_tasks_next_move(
    created, owner, faults, django_capture_on_commit_callbacks
):
    faults(latency_ms=300)  # the move's calls to the cluster take a while
    moved = {}

    def task_first_move() -> None:
        try:
            moved["first"] = runner._step(str(created.pk), keep_until=math.inf)
        finally:
            connection.close()

    worker = threading.Thread(target=task_first_move)
    worker.start()
    deadline = time.monotonic() + 10
    while Operation.objects.get(pk=created.pk).state != Operation.State.RUNNING:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.02)
    # The run started; its first move is calling the cluster.
    with django_capture_on_commit_callbacks():  # its step is not sent: this task goes on
        services.operation_cancel(
            actor=Actor(user=owner), operation=created, request_id=uuid.uuid4().hex
        )
    worker.join(30)
    faults(latency_ms=0)
    delay, held = moved["first"]
    assert delay == 0 and held is not None  # stored, and the claim kept for the next move

    assert runner._step(str(created.pk), held, keep_until=math.inf) == (None, None)

    created.refresh_from_db()  # the plan has no onExit: the run ends with that move
    assert created.state == Operation.State.CANCELLED and created.moves == 2
    assert created.error == f"Cancelled by {owner.email}."


def test_a_creates_start_locks_nothing_when_nothing_else_is_pending_on_its_instance(created):
    BackupSchedule.objects.filter(instance=created.instance).update(retention_days=9)
    claimed = runner._claim(str(created.pk), timezone.now())

    with CaptureQueriesContext(connection) as statements:
        begun = runner._begin(claimed, timezone.now(), claimed.claim_token)

    # Whether another operation is pending (none: nothing to wait for or refuse) with the
    # retention, then the start, fenced by the claim: no lock, no transaction around them.
    assert begun == runner.STARTED
    assert len(statements) == 2 and not any("FOR UPDATE" in s["sql"] for s in statements)
    assert not connection.in_atomic_block
    created.refresh_from_db()
    assert created.state == Operation.State.RUNNING and created.started_at is not None
    assert created.claim_token == claimed.claim_token  # kept for its first move
    assert created.parameters == created.instance.parameters
    assert created.arguments["retention_days"] == 9
    assert created.arguments["state_before"] == Instance.State.CREATING


def test_a_creates_start_takes_its_instances_lock_when_another_operation_is_pending(created):
    # Queued behind the create (a delete would cancel a queued create): it comes after it.
    Operation.objects.create(
        instance=created.instance, verb="backup", request_id="later",
        plan_version=created.plan_version,
    )  # fmt: skip
    claimed = runner._claim(str(created.pk), timezone.now())

    with CaptureQueriesContext(connection) as statements:
        begun = runner._begin(claimed, timezone.now(), claimed.claim_token)

    assert begun == runner.STARTED
    assert any("FOR UPDATE" in s["sql"] for s in statements)
    created.refresh_from_db()
    assert created.state == Operation.State.RUNNING


def test_a_cancel_committed_before_an_unlocked_start_leaves_the_create_cancelled(created, owner):
    claimed = runner._claim(str(created.pk), timezone.now())
    services.operation_cancel(
        actor=Actor(user=owner), operation=created, request_id=uuid.uuid4().hex
    )

    with pytest.raises(runner.ClaimLost):  # the start is fenced: nothing is sent after it
        runner._begin(claimed, timezone.now(), claimed.claim_token)

    created.refresh_from_db()
    assert created.state == Operation.State.CANCELLED and created.started_at is None


def test_a_move_that_goes_on_from_a_kept_claim_makes_one_statement(created):
    _, held = runner._step(str(created.pk), keep_until=math.inf)  # the run's start, and a move

    with CaptureQueriesContext(connection) as statements:
        delay, held = runner._step(str(created.pk), held, keep_until=math.inf)

    # Its store, which reads back what others wrote meanwhile (a cancel) for the next move.
    assert delay == 0 and held is not None
    assert len(statements) == 1 and "UPDATE deployments_operation SET" in statements[0]["sql"]
    created.refresh_from_db()
    assert created.moves == 2 and created.claim_token == held.token


def test_a_tasks_later_moves_render_with_the_variables_its_first_move_worked_out(
    cell, owner, tenant
):
    PlatformSecret.objects.create(name="MONITORING_TOKEN", value="s3cr3t-token")
    labels = "                      opsdeck.io/instance: {{ $sys.id }}\n"
    annotated = labels + "                    annotations:\n"
    annotated += "                      monitoring: {{ $secret.MONITORING_TOKEN }}\n"
    text = SPEC.read_text().replace("plan: postgres-cnpg", "plan: postgres-with-secret", 1)
    assert labels in text
    plan = services.plan_load(text=text.replace(labels, annotated, 1)).plan  # the Cluster's
    created = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    _, held = runner._step(str(created.pk), keep_until=math.inf)  # the credentials rendered

    with CaptureQueriesContext(connection) as statements:
        delay, held = runner._step(str(created.pk), held, keep_until=math.inf)

    # The credentials sent, the Cluster rendered with the platform's secret, and the move
    # stored: in one statement (the secrets are not read again, nor anything else).
    assert delay == 0 and len(statements) == 1
    rendered = TaskRun.objects.get(operation=created, node="main.cluster").object
    assert json.loads(rendered)["metadata"]["annotations"] == {"monitoring": "s3cr3t-token"}


def test_a_runs_moves_update_its_operation_in_its_page(created):
    _, held = runner._step(str(created.pk), keep_until=math.inf)  # the run's start, and a move

    # Its next two moves (the credentials' end, the Cluster's apply: neither waits on the
    # operator, whose Cluster, healthy by a third, could end the run), in one transaction, so
    # that the counts are this connection's alone (the table's take in other connections',
    # sent late): a move's commit is a savepoint's.
    with transaction.atomic():
        before = row_updates(Operation)
        moves = 0
        while held is not None and moves < 2:
            _, held = runner._step(str(created.pk), held, keep_until=math.inf)
            moves += 1
        updated, in_place = (
            now - then for now, then in zip(row_updates(Operation), before, strict=True)
        )

    assert Operation.objects.get(pk=created.pk).state == Operation.State.RUNNING
    # One update a move, each in the row's page: a move writes no indexed column.
    assert moves >= 2 and updated == moves and in_place == updated


def test_a_runs_claim_and_start_update_its_operation_in_its_page(created):
    with transaction.atomic():  # the counts are this connection's alone, as above
        before = row_updates(Operation)
        claimed = runner._claim(str(created.pk), timezone.now())
        assert runner._begin(claimed, timezone.now(), claimed.claim_token) == runner.STARTED
        updated, in_place = (
            now - then for now, then in zip(row_updates(Operation), before, strict=True)
        )

    assert Operation.objects.get(pk=created.pk).state == Operation.State.RUNNING
    # Neither writes an indexed column: no index's condition reads the operation's state.
    assert updated == 2 and in_place == 2


def test_a_task_whose_kept_claim_was_taken_over_stops_and_commits_nothing(created):
    _, held = runner._step(str(created.pk), keep_until=math.inf)
    new_owner = uuid.uuid4()  # the claim ran out meanwhile; another worker took it
    Operation.objects.filter(pk=created.pk).update(claim_token=new_owner)
    moves = Operation.objects.get(pk=created.pk).moves
    runs = list(TaskRun.objects.filter(operation=created).values_list("node", "state", "object"))

    assert runner._step(str(created.pk), held, keep_until=math.inf) == (None, None)

    created.refresh_from_db()
    assert created.moves == moves and created.claim_token == new_owner
    # Nor the task runs its move changed: they are written with the operation or not at all.
    after = list(TaskRun.objects.filter(operation=created).values_list("node", "state", "object"))
    assert after == runs


def test_a_move_stores_the_task_runs_it_changed_with_the_operation_in_one_statement(created):
    for _ in range(10):  # up to the move that applies the cluster
        with CaptureQueriesContext(connection) as statements:
            runner._step(str(created.pk), keep_until=0)
        Operation.objects.filter(pk=created.pk).update(next_step_at=None)
        if TaskRun.objects.filter(operation=created, node__endswith="cluster").exists():
            break
    written = [s["sql"] for s in statements if "deployments_taskrun" in s["sql"]]

    assert len(written) == 1 and "UPDATE deployments_operation" in written[0]
    assert [s["sql"] for s in statements if s["sql"] in {"BEGIN", "COMMIT"}] == []
    cluster = TaskRun.objects.get(operation=created, node__endswith="cluster")
    assert cluster.state == "Running" and '"kind": "Cluster"' in cluster.object


def test_a_move_that_only_reads_the_object_back_writes_the_operation_alone(created, faults):
    faults(frozen=["cnpg"])  # the cluster stays unready: every look finds it pending
    for _ in range(10):  # up to the move that waits on the cluster
        Operation.objects.filter(pk=created.pk).update(next_step_at=None)
        runner._step(str(created.pk))
        created.refresh_from_db()
        if created.waiting_on:
            break
    assert [w["object"].split("/")[0] for w in created.waiting_on] == ["Cluster"]

    Operation.objects.filter(pk=created.pk).update(next_step_at=None)
    with CaptureQueriesContext(connection) as statements:
        runner._step(str(created.pk))  # it reads the cluster back, still pending

    created.refresh_from_db()
    assert created.idle_steps >= 1  # a look that found nothing new
    assert not [s for s in statements if "deployments_taskrun" in s["sql"]]
    # Its one write, the operation's, commits alone: no transaction is opened for it.
    assert [s["sql"] for s in statements if s["sql"] in {"BEGIN", "COMMIT"}] == []
    cluster = TaskRun.objects.get(operation=created, node__endswith="cluster")
    assert cluster.state == "Running" and cluster.finished_at is None

    faults(frozen=[])  # the operator catches up: the row follows once the node moves on
    for _ in range(100):
        Operation.objects.filter(pk=created.pk).update(next_step_at=None)
        if runner._step(str(created.pk))[0] is None:
            break
        time.sleep(0.05)
    cluster.refresh_from_db()
    assert cluster.state == "Succeeded" and cluster.finished_at is not None


UNFLUSHED = "set_config('synchronous_commit', 'off', true)"


@dataclass
class Move:
    unflushed: bool  # its store let its commit skip the wait for the disk
    unsent: bool  # the state it stored holds an object rendered for the next move to send
    first_change: bool  # it stored the run's first change the cluster took
    end: bool  # it ended the run


def _moves(operation: Operation) -> list[Move]:
    """Each move of the operation's run, one per step, to its end."""
    moves, changed = [], False
    for _ in range(100):
        Operation.objects.filter(pk=operation.pk).update(next_step_at=None)
        with CaptureQueriesContext(connection) as statements:
            delay, _ = runner._step(str(operation.pk))
        claim, *rest = [s["sql"] for s in statements]
        assert "WITH claimed AS" in claim and UNFLUSHED in claim  # a claim is never worth a wait
        store = [sql for sql in rest if "UPDATE deployments_operation SET" in sql][-1]
        operation.refresh_from_db()
        state = json.loads(operation.engine_state)
        unsent = any(
            node["phase"] == "Running" and node["step"] == "rendered"
            for node in state["nodes"].values()
        )
        first_change, changed = state["changed"] and not changed, state["changed"]
        # The end waits, with all it writes: the instance, the audit log and the email follow.
        end = delay is None
        moves.append(Move(any(UNFLUSHED in sql for sql in rest if end) or UNFLUSHED in store,
                          unsent, first_change, end))  # fmt: skip
        if end:
            assert operation.state == Operation.State.SUCCEEDED
            return moves
        time.sleep(0.05)
    raise AssertionError("the run did not end")


def test_only_the_moves_the_cluster_relies_on_and_a_runs_end_wait_for_the_disk(created, owner):
    create = _moves(created)
    modify = _moves(
        services.instance_action(
            actor=Actor(user=owner), instance=created.instance, verb="modify",
            request_id=uuid.uuid4().hex, parameters={"instances": 2},
        )
    )  # fmt: skip

    for moves in (create, modify):
        # A move whose state holds a rendered object (the next move sends it), or the run's
        # first change the cluster took, waits; a later one that sent or read an object does not.
        assert [m.unflushed for m in moves] == [
            not (m.unsent or m.first_change or m.end) for m in moves
        ]
    # Each kind was met: the create's Cluster was sent by a move that did not wait, and the
    # modify's first change was stored by one that did, with nothing left to send.
    assert any(m.unflushed for m in create)
    assert any(m.first_change and not m.unsent and not m.unflushed for m in modify)


def test_the_first_write_whose_answer_was_lost_is_stored_waiting_for_the_disk(
    created, owner, faults
):
    _moves(created)
    modify = services.instance_action(
        actor=Actor(user=owner), instance=created.instance, verb="modify",
        request_id=uuid.uuid4().hex, parameters={"instances": 2},
    )  # fmt: skip
    runner._step(str(modify.pk))  # started, its patch rendered: the next move sends it
    faults(error_500=1.0)  # every answer is lost from now on

    stores = []
    for _ in range(2):
        Operation.objects.filter(pk=modify.pk).update(next_step_at=None)
        with CaptureQueriesContext(connection) as statements:
            runner._step(str(modify.pk))
        stores += [
            s["sql"]
            for s in statements
            if "UPDATE deployments_operation SET" in s["sql"] and "WITH claimed" not in s["sql"]
        ]

    modify.refresh_from_db()
    assert modify.arguments["cluster_touched"] and modify.error.startswith(runner.RETRYING)
    # The cluster may hold the first write: a crash must not lose that it was sent (a cancel
    # would leave the instance as it was). The retry after it adds nothing to wait for.
    assert [UNFLUSHED in sql for sql in stores] == [False, True]


def test_the_move_that_ends_a_run_writes_the_instance_its_state_change_and_audit_event_at_once(
    created,
):
    for _ in range(100):  # up to the move that ends the run
        Operation.objects.filter(pk=created.pk).update(next_step_at=None)
        with CaptureQueriesContext(connection) as statements:
            delay, _ = runner._step(str(created.pk))
        if delay is None:
            break
        time.sleep(0.05)
    writes = [
        s["sql"]
        for s in statements
        if "INSERT INTO" in s["sql"] or "UPDATE deployments_instance " in s["sql"]
        or ("UPDATE deployments_operation SET" in s["sql"] and "claimed AS" not in s["sql"])
    ]  # fmt: skip
    emails = [sql for sql in writes if 'INSERT INTO "accounts_outgoingemail"' in sql]
    writes = [sql for sql in writes if sql not in emails]

    created.refresh_from_db()
    assert created.state == Operation.State.SUCCEEDED
    # The run's end, the instance's new state and values, the change and its audit event: one
    # statement writes them all; the "ready" email is kept beside it.
    assert len(writes) == 1, writes
    assert len(emails) == 1
    assert "UPDATE deployments_operation SET" in writes[0]
    assert "UPDATE deployments_instance SET" in writes[0]
    assert "INSERT INTO deployments_instancestatechange " in writes[0]
    assert "INSERT INTO accounts_auditevent " in writes[0]
    change = created.instance.history.get(operation=created)
    assert (change.from_state, change.to_state) == ("creating", "running")
    event = AuditEvent.objects.get(action="operation.succeeded", target_id=str(created.pk))
    assert event.actor_kind == "system" and event.payload["instance"] == created.instance_id


def _up_to_the_last_move(created, kube, faults) -> None:
    """The create's moves until it waits on the cluster, and the cluster then healthy: the
    run's next move is its last."""
    faults(frozen=["cnpg"])  # the cluster stays unready until the run waits on it
    for _ in range(10):
        Operation.objects.filter(pk=created.pk).update(next_step_at=None)
        runner._step(str(created.pk))
        created.refresh_from_db()
        if created.waiting_on:
            break
    faults(frozen=[])
    deadline = time.monotonic() + 30
    while True:
        cluster = instance_object(
            kube, created.instance, "postgresql.cnpg.io/v1", "Cluster", created.instance_id
        )
        status = (cluster or {}).get("status") or {}
        if status.get("phase") == "Cluster in healthy state" and status.get("readyInstances"):
            break
        assert time.monotonic() < deadline, "the cluster did not become healthy"
        time.sleep(0.05)


def test_a_creates_last_move_ends_it_tells_its_requester_and_keeps_the_retention_applied(
    created, kube, faults, owner
):
    _up_to_the_last_move(created, kube, faults)
    Operation.objects.filter(pk=created.pk).update(next_step_at=None)

    with CaptureQueriesContext(connection) as captured:
        assert runner._step(str(created.pk)) == (None, None)

    created.refresh_from_db()
    assert created.state == Operation.State.SUCCEEDED
    schedule = BackupSchedule.objects.get(instance=created.instance_id)
    assert schedule.retention_days_applied == created.arguments["retention_days"]
    [email] = OutgoingEmail.objects.filter(subject="[Opsdeck] orders is ready")
    assert email.to == [owner.email]
    # Its claim; the instance locked, and what is read under the lock (the operations pending,
    # the schedule's retention, whether the requester still belongs to the organization); the
    # run's end with the instance's, the schedule's and the audit event; the email.
    statements = [s["sql"] for s in captured if s["sql"] not in {"BEGIN", "COMMIT"}]
    assert len(statements) == 5, "\n".join(statements)
    [stored] = [s for s in statements if s.startswith("WITH moved AS")]
    assert "UPDATE deployments_backupschedule" in stored


def test_a_run_end_whose_claim_was_lost_writes_neither_the_operation_nor_the_instance(
    created, kube, faults
):
    _up_to_the_last_move(created, kube, faults)
    op = runner._claim(str(created.pk), timezone.now(), early=True)
    held = runner.Held(op, op.claim_token, op.claimed_until)
    new_owner = uuid.uuid4()  # the claim ran out meanwhile; another worker took it
    Operation.objects.filter(pk=created.pk).update(claim_token=new_owner)

    assert runner._step(str(created.pk), held) == (None, None)

    created.refresh_from_db()
    instance = Instance.objects.get(pk=created.instance_id)
    assert created.state == Operation.State.RUNNING and created.claim_token == new_owner
    assert instance.state == Instance.State.CREATING and instance.outputs == {}
    assert not instance.history.filter(operation=created).exists()
    assert not AuditEvent.objects.filter(target_id=str(created.pk)).exists()
    # The new owner ends the run.
    Operation.objects.filter(pk=created.pk).update(
        claim_token=None, claimed_until=None, next_step_at=None
    )
    assert runner._step(str(created.pk)) == (None, None)
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING and instance.outputs


def _values(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


@pytest.mark.parametrize("requester", ["a member", "the system"])
def test_a_claim_reads_the_operation_with_what_a_move_reads_as_the_orm_reads_them(
    created, requester
):
    if requester == "the system":
        Operation.objects.filter(pk=created.pk).update(requested_by=None)
    runner._step(str(created.pk))  # a move: run state, parameters and arguments stored
    read = Operation.objects.select_related("instance__cell", "instance__tenant", "requested_by")
    expected = read.get(pk=created.pk)

    claimed = runner._claim(str(created.pk), timezone.now())

    # Every value decoded as the ORM decodes it: JSON, times, encrypted fields in the clear.
    assert claimed.engine_state and claimed.secret_parameters and claimed.instance.cell.kubeconfig
    claim = {"claim_token": claimed.claim_token, "claimed_until": claimed.claimed_until}
    assert _values(claimed) == {**_values(expected), **claim}
    for part in ("instance", "cell", "tenant"):
        got = claimed if part == "instance" else claimed.instance
        want = expected if part == "instance" else expected.instance
        assert _values(getattr(got, part)) == _values(getattr(want, part)), part
    if requester == "the system":
        assert claimed.requested_by is None
    else:
        assert _values(claimed.requested_by) == _values(expected.requested_by)
    with CaptureQueriesContext(connection) as queries:  # all read with the claim, linked
        linked = (claimed.instance.cell.name, claimed.instance.tenant.slug, claimed.requested_by)
    assert len(queries) == 0 and linked[:2] == (
        expected.instance.cell.name,
        created.instance.tenant.slug,
    )


def test_the_operations_read_under_the_instances_lock_include_one_queued_while_it_waited(
    created,
):
    instance = created.instance
    locked, queued = threading.Event(), []

    def service():  # queues an operation under the instance's lock, as services do
        try:
            with transaction.atomic():
                Instance.objects.select_for_update().get(pk=instance.pk)
                locked.set()
                time.sleep(0.5)  # the run waits for the lock meanwhile
                restart = Operation.objects.create(
                    instance=instance, verb="restart", request_id="race",
                    plan_version=instance.plan_version,
                )  # fmt: skip
                queued.append(str(restart.pk))
        finally:
            connection.close()

    other = threading.Thread(target=service)
    other.start()
    assert locked.wait(5)
    with transaction.atomic():
        pending = runner._instance_locked(Instance.objects.get(pk=instance.pk), None).pending
    other.join(10)

    assert [entry[0] for entry in pending] == [str(created.pk), *queued] and len(queued) == 1


def test_a_run_starts_with_the_backup_retention_committed_while_it_waited_for_the_lock(created):
    # A schedule change writes under the instance's lock: the run that waited for that lock
    # renders (and stores) the retention it set, not the one it replaced.
    instance = created.instance
    BackupSchedule.objects.filter(instance=instance).update(retention_days=7)

    def start():
        with transaction.atomic():
            return runner._instance_locked(
                Instance.objects.get(pk=instance.pk), None
            ).retention_days

    held, read = beside_a_lock(
        lambda: Instance.objects.select_for_update().get(pk=instance.pk),
        lambda: BackupSchedule.objects.filter(instance=instance).update(retention_days=30),
        start,
    )

    assert held == "committed" and read == 30


def test_the_sweeper_resends_a_run_whose_worker_died_in_its_first_move(
    transactional_db, tenant, broker
):
    """Started (running, claimed) but no move stored: no step is due, and its message went
    with the worker. Once long started, the sweeper sends it again; a run started just now is
    left to its worker."""
    from tests.deployments import factories

    version = factories.postgres_version()
    cell = factories.cell()
    stuck, busy = factories.make_instances(tenant, version, cell, 2)
    died = factories.make_operation(stuck, state="running", ago=timedelta(minutes=5))
    factories.make_operation(busy, state="running")
    broker.back()

    assert runner.operations_sweep() == 1
    assert broker.sent == [("deployments.tasks.operation_step", [str(died.pk)])]
