"""Operations survive a misbehaving cluster and operator, and a delete that cuts them short."""

import uuid

import pytest

from accounts.audit import Actor
from deployments import services
from deployments.models import Instance, Operation
from tests.deployments.conftest import SPEC, wait_done, wait_for


def _plan_with_create_deadline(seconds: int):
    """The PostgreSQL plan under another key, its create deadline cut to `seconds`."""
    text = SPEC.read_text()
    text = text.replace("plan: postgres-cnpg", "plan: postgres-short-deadline", 1)
    text = text.replace("activeDeadlineSeconds: 3600", f"activeDeadlineSeconds: {seconds}", 1)
    return services.plan_load(text=text).plan


def _create(owner, tenant, plan, name="db", **parameters):
    return services.instance_create(
        actor=Actor(user=owner),
        tenant=tenant,
        plan=plan,
        name=name,
        parameters=parameters,
        request_id=uuid.uuid4().hex,
    )


def test_operations_succeed_while_the_api_answers_5xx_and_conflicts(
    worker, cell, plan, tenant, owner, faults
):
    faults(error_500=0.05, error_503=0.05, conflict=0.1)

    creates = [_create(owner, tenant, plan, f"db-{n}", instances="2") for n in range(3)]
    for create in creates:
        assert wait_done(create, timeout=120).state == Operation.State.SUCCEEDED, create.error
    modify = services.instance_action(
        actor=Actor(user=owner),
        instance=creates[0].instance,
        verb="modify",
        request_id=uuid.uuid4().hex,
        parameters={"instances": "3"},
    )

    assert wait_done(modify, timeout=120).state == Operation.State.SUCCEEDED, modify.error
    # The faults did happen (a run of ~60 requests with none is below one in a thousand).
    retried = sum(Operation.objects.get(pk=op.pk).transient_failures for op in [*creates, modify])
    assert retried > 0


def test_an_operator_that_never_gets_healthy_fails_the_create_at_its_deadline(
    worker, cell, tenant, owner, faults
):
    faults(frozen=["clusters"])
    plan = _plan_with_create_deadline(3)

    create = _create(owner, tenant, plan)

    assert wait_done(create, timeout=60).state == Operation.State.FAILED
    assert create.error.startswith("The workflow exceeded its deadline of 3 s. ")
    # What it waited on (a frozen operator wrote no status to say where it stood).
    assert create.error.endswith(f'It was still waiting on Cluster "{create.instance_id}".')
    instance = Instance.objects.get(pk=create.instance_id)
    assert instance.state == Instance.State.FAILED
    assert instance.history.last().reason == create.error


def _create_failing_bootstrap(owner, tenant, plan, faults) -> Operation:
    """A create whose Cluster, once applied, fails its bootstrap."""
    faults(frozen=["clusters"])  # hold the operator until the fault names this cluster
    create = _create(owner, tenant, plan)
    wait_for(
        lambda: create.task_runs.filter(node="main.cluster").exists(),
        what="the create to apply its Cluster",
    )
    faults(fail_bootstrap=[f"{create.instance_id}/{create.instance_id}"], frozen=[])
    return create


def test_a_failed_bootstrap_fails_the_create_with_the_operators_phase(
    worker, cell, plan, tenant, owner, faults
):
    create = _create_failing_bootstrap(owner, tenant, plan, faults)

    assert wait_done(create, timeout=60).state == Operation.State.FAILED
    assert create.error.startswith("cluster: Cluster")
    assert 'failed: its phase is "Unable to create required cluster objects".' in create.error
    assert "(It met its failureCondition, " in create.error and create.error.endswith(".)")


def test_an_attempt_a_retry_ended_says_how_it_ended_not_running(
    worker, cell, tenant, owner, faults
):
    """The create's Cluster task retried once (a retryStrategy) and its bootstrap failing each
    time: the first attempt's row on the Operations tab read "Running" for good, beside the
    second's "Failed"."""
    text = SPEC.read_text().replace("plan: postgres-cnpg", "plan: postgres-retried", 1)
    task = "            - name: cluster\n"
    retry = "              retryStrategy: {limit: 1, backoff: {duration: 1s}}\n"
    text = text.replace(task, task + retry, 1)
    plan = services.plan_load(text=text).plan
    create = _create_failing_bootstrap(owner, tenant, plan, faults)

    assert wait_done(create, timeout=60).state == Operation.State.FAILED

    runs = list(create.task_runs.filter(node="main.cluster").order_by("attempt"))
    assert [(run.attempt, run.state) for run in runs] == [(1, "Failed"), (2, "Failed")]
    first = runs[0]
    assert first.finished_at is not None and first.finished_at <= runs[1].finished_at
    assert 'its phase is "Unable to create required cluster objects"' in first.message
    assert not first.message.startswith("attempt ")  # its own failure, as it happened


def test_delete_during_a_running_create_stops_it_and_removes_everything(
    worker, cell, tenant, owner, faults, sandbox_kubeconfig
):
    faults(frozen=["clusters"])  # the create will wait on the operator
    plan = _plan_with_create_deadline(600)
    create = _create(owner, tenant, plan)
    wait_for(
        lambda: create.task_runs.filter(node="main.cluster").exists(),
        what="the create to apply its Cluster",
    )

    delete = services.instance_delete(
        actor=Actor(user=owner), instance=create.instance, request_id=uuid.uuid4().hex
    )
    faults(frozen=[])

    assert wait_done(delete, timeout=60).state == Operation.State.SUCCEEDED, delete.error
    create.refresh_from_db()
    assert create.state == Operation.State.CANCELLED
    assert create.error == "The instance is being deleted."
    instance = Instance.objects.get(pk=create.instance_id)
    assert instance.state == Instance.State.DELETED
    assert list(instance.history.values_list("to_state", flat=True)) == [
        "creating", "deleting", "deleted",
    ]  # fmt: skip


def test_operations_on_one_instance_run_one_at_a_time_in_order(worker, cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    act = lambda verb, **p: services.instance_action(  # noqa: E731
        actor=Actor(user=owner), instance=create.instance, verb=verb,
        request_id=uuid.uuid4().hex, parameters=p or None,
    )  # fmt: skip
    first = act("modify", instances="2")
    second = act("stop")

    for op in (create, first, second):
        assert wait_done(op, timeout=90).state == Operation.State.SUCCEEDED, op.error
    assert create.finished_at <= first.started_at
    assert first.finished_at <= second.started_at
    instance = Instance.objects.get(pk=create.instance_id)
    assert instance.state == Instance.State.STOPPED


def test_a_verb_the_state_does_not_allow_is_refused_with_a_reason(
    worker, cell, plan, tenant, owner
):
    create = _create(owner, tenant, plan)
    wait_done(create)

    with pytest.raises(services.ActionDenied, match="The instance is running; start needs it"):
        services.instance_action(
            actor=Actor(user=owner), instance=create.instance, verb="start", request_id="x"
        )
