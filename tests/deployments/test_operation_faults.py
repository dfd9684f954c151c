"""A move that an error of Opsdeck's own stops (a fault: a bug, a state this release cannot
read, a database error) releases its claim at once and is tried again after a short delay,
instead of holding the operation until its lease runs out and failing alike at every try; the
run fails at the fifth fault in a row, so the instance and what is queued behind it go on."""

import json
import uuid

from django.db import connection
from django.utils import timezone

from accounts.audit import Actor
from accounts.models import AuditEvent, OutgoingEmail
from deployments import runner, services
from deployments.models import Instance, Operation, TaskRun
from tests.deployments.conftest import wait_done, where_it_stands


def _step_when_due(operation: Operation) -> None:
    """The operation's next step, made due now (its delay is not what these tests wait on)."""
    Operation.objects.filter(pk=operation.pk).update(next_step_at=timezone.now())
    runner._step(str(operation.pk))
    operation.refresh_from_db()


def test_a_move_that_keeps_faulting_is_retried_unclaimed_then_fails_the_run(
    created, settings, caplog
):
    settings.OPSDECK_FAULT_RETRY_DELAY = 0.01
    runner._step(str(created.pk))  # the run starts, and waits on the cluster
    created.refresh_from_db()
    assert created.state == Operation.State.RUNNING and created.fault_streak == 0
    # A saved state this release cannot read (one a newer release wrote, say); the field
    # encrypts it as the runner's stores do.
    Operation.objects.filter(pk=created.pk).update(engine_state=json.dumps({"nodes": 7}))

    seen = set()
    for tries in range(1, runner.FAULTS_BEFORE_FAILING):
        with caplog.at_level("ERROR", logger="deployments.runner"):
            _step_when_due(created)
        # Released at once, with the error and its reference shown, and due again soon.
        assert created.state == Operation.State.RUNNING and created.fault_streak == tries
        assert created.claim_token is None and created.claimed_until is None
        assert created.next_step_at <= timezone.now() + timezone.timedelta(seconds=1)
        reference = created.error.split("(reference ", 1)[1][:8]
        assert created.error == (
            f"Opsdeck met an internal error (reference {reference}); "
            "the step is tried again shortly."
        )
        (logged,) = [r for r in caplog.records if reference in r.getMessage()]
        assert logged.exc_info is not None  # the traceback, for whoever reads the logs
        caplog.clear()
        seen.add(reference)
    assert len(seen) == runner.FAULTS_BEFORE_FAILING - 1  # one reference per fault

    _step_when_due(created)

    assert created.state == Operation.State.FAILED and created.finished_at is not None
    assert created.claim_token is None and created.next_step_at is None
    assert created.error.startswith("Opsdeck met an internal error (reference ")
    assert created.error.endswith(
        "on 5 tries in a row and stopped the operation. Give the reference to support."
    )
    # What its run sent the cluster cannot be read back: the instance is failed, not as it was.
    created.instance.refresh_from_db()
    assert created.instance.state == Instance.State.FAILED
    assert AuditEvent.objects.filter(action="operation.failed", target_id=str(created.pk)).exists()
    # No task is left running under it: what was running ended failed, saying why.
    ended = TaskRun.objects.filter(operation=created).exclude(state="Succeeded")
    assert ended.exists()
    assert {(run.state, run.message) for run in ended} == {("Failed", created.error)}


def test_a_fault_once_in_a_runs_end_is_retried_at_once_not_after_the_lease(
    cell, plan, owner, tenant, worker
):
    """A database that fails the statement storing a create's end once (a full disk, say): the
    worker releases its claim and the end is stored at the next try, well inside the 90 s the
    operation would otherwise stay claimed."""
    assert runner.settings.OPSDECK_OPERATION_LEASE == 90
    instance_table = Instance._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE test_fault_once")
        cursor.execute(
            """
            CREATE FUNCTION test_fault_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('test_fault_once') = 1 THEN
                    RAISE EXCEPTION 'could not extend file: No space left on device'
                        USING ERRCODE = 'disk_full';
                END IF;
                RETURN NEW;
            END $$
            """
        )
        cursor.execute(
            f"CREATE TRIGGER test_fault_once BEFORE UPDATE OF state ON {instance_table}"
            " FOR EACH ROW WHEN (NEW.state = 'running') EXECUTE FUNCTION test_fault_once()"
        )
    try:
        create = services.instance_create(
            actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
            parameters={}, request_id=uuid.uuid4().hex,
        )  # fmt: skip
        wait_done(create, timeout=30)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER test_fault_once ON {instance_table}")
            cursor.execute("DROP FUNCTION test_fault_once()")
            cursor.execute("SELECT last_value FROM test_fault_once")
            (faults,) = cursor.fetchone()
            cursor.execute("DROP SEQUENCE test_fault_once")

    assert faults >= 2  # the end failed once, and was stored at the next try
    assert create.state == Operation.State.SUCCEEDED and create.error == ""
    assert create.fault_streak == 1  # for the record
    create.instance.refresh_from_db()
    assert create.instance.state == Instance.State.RUNNING


def test_a_run_whose_end_keeps_faulting_fails_without_telling_anyone(created, settings, caplog):
    """The end of a run faults at every try: here the email of how it ended cannot be stored
    (a trigger refuses it), as a bug in the email's own code would raise. The fifth fault
    fails the run without the email, instead of trying its end again for ever, which held
    the instance and everything queued behind it, a delete included."""
    settings.OPSDECK_FAULT_RETRY_DELAY = 0.01
    email_table = OutgoingEmail._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION test_email_refused() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'the email cannot be stored' USING ERRCODE = 'internal_error';
            END $$
            """
        )
        cursor.execute(
            f"CREATE TRIGGER test_email_refused BEFORE INSERT ON {email_table}"
            " FOR EACH ROW EXECUTE FUNCTION test_email_refused()"
        )
    try:
        with caplog.at_level("ERROR", logger="deployments.runner"):
            for _ in range(50):  # the create's moves, then its end's tries
                _step_when_due(created)
                if created.state not in {Operation.State.QUEUED, Operation.State.RUNNING}:
                    break
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER test_email_refused ON {email_table}")
            cursor.execute("DROP FUNCTION test_email_refused()")

    assert created.state == Operation.State.FAILED, where_it_stands(created)
    assert created.error.endswith(
        "on 5 tries in a row and stopped the operation. Give the reference to support."
    )
    assert created.claim_token is None and created.next_step_at is None
    assert not OutgoingEmail.objects.exists()
    assert any("failed without telling anyone it ended" in r.getMessage() for r in caplog.records)
    # The cluster holds what the run applied: the instance is failed, not as it was.
    created.instance.refresh_from_db()
    assert created.instance.state == Instance.State.FAILED
    # Nothing holds the instance now: its delete goes ahead, and is told as usual.
    delete = services.instance_delete(
        actor=Actor(user=created.requested_by), instance=created.instance,
        request_id=uuid.uuid4().hex, last_backup=False,
    )  # fmt: skip
    for _ in range(50):
        _step_when_due(delete)
        if delete.state not in {Operation.State.QUEUED, Operation.State.RUNNING}:
            break
    assert delete.state == Operation.State.SUCCEEDED, where_it_stands(delete)


def test_a_run_that_cannot_even_be_failed_is_tried_again_unclaimed_with_its_error_shown(
    created, settings
):
    """A saved state no key of this deployment decrypts (a key retired too early): reading the
    operation faults, and so would failing its run. It is left running and unclaimed, tried
    again now and then with its error shown, for its key to come back."""
    settings.OPSDECK_FAULT_RETRY_DELAY = 0.01
    runner._step(str(created.pk))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Operation._meta.db_table} SET engine_state = %s WHERE id = %s",  # noqa: S608
            ["gAAAAABn-encrypted-with-a-key-since-retired", created.pk],
        )

    for tries in range(1, runner.FAULTS_BEFORE_FAILING + 2):
        Operation.objects.filter(pk=created.pk).update(next_step_at=timezone.now())
        delay, held = runner._step(str(created.pk))
        assert held is None and delay == min(runner.FAULT_RETRY_MOST, 0.01 * 2 ** (tries - 1))
        state, claim, streak, error = Operation.objects.filter(pk=created.pk).values_list(
            "state", "claim_token", "fault_streak", "error"
        )[0]
        assert (state, claim, streak) == (Operation.State.RUNNING, None, tries)
        assert error.startswith("Opsdeck met an internal error (reference ")
