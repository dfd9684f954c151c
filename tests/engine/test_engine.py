"""The engine advancing runs step by step against an in-memory cluster.

The cluster here is a dict, standing in for the Kubernetes API the real
driver reaches; the integration tests run the same engine against the
sandbox API server.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time

import pytest

from deployments.spec.model import (
    OutputParameter,
    ResourceAction,
    RetryStrategy,
    Task,
    Template,
    Workflow,
)
from deployments.workflow import engine
from deployments.workflow.driver import PermanentError, TransientError
from deployments.workflow.render import Context

NS = "inst-abc12345"


class MemoryCluster:
    """Objects by (kind, namespace, name); enough of the driver protocol for the engine."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.calls: list[str] = []
        self.fail_next: str | None = None
        self.warnings: dict[tuple[str, str, str], list[tuple[float, str]]] = {}

    @staticmethod
    def key(obj):
        meta = obj["metadata"]
        return (obj["kind"], meta.get("namespace", ""), meta["name"])

    def _check(self, verb):
        self.calls.append(verb)
        if self.fail_next:
            message, self.fail_next = self.fail_next, None
            raise PermanentError(message)

    def create(self, obj, *, owner_label):
        self._check("create")
        existing = self.objects.get(self.key(obj))
        if existing is not None:
            label, value = owner_label
            if existing["metadata"].get("labels", {}).get(label) != value:
                raise PermanentError(f'{obj["kind"]} "{obj["metadata"]["name"]}" already exists')
            return existing
        self.objects[self.key(obj)] = copy.deepcopy(obj)
        return self.objects[self.key(obj)]

    def apply(self, obj):
        self._check("apply")
        current = self.objects.setdefault(self.key(obj), {})
        status = current.get("status")
        current.clear()
        current.update(copy.deepcopy(obj))
        if status is not None:
            current["status"] = status
        return current

    def patch(self, obj, *, strategy, subresource):
        self._check(f"patch:{strategy}:{subresource}")
        current = self.objects[self.key(obj)]
        if strategy == "json":  # replace and add on plain paths are enough here
            for operation in obj["patch"]:
                *parents, last = operation["path"].strip("/").split("/")
                target = current
                for part in parents:
                    target = target.setdefault(part, {})
                target[last] = copy.deepcopy(operation["value"])
            return current
        for key, value in obj.items():
            if key not in {"apiVersion", "kind", "metadata"}:
                current[key] = copy.deepcopy(value)
        return current

    KINDS = {"cm": ("v1", "ConfigMap"), "configmap": ("v1", "ConfigMap"),
             "cluster": ("postgresql.cnpg.io/v1", "Cluster")}  # fmt: skip

    def resolve(self, resource):
        self.calls.append(f"resolve:{resource}")
        if resource not in self.KINDS:
            raise PermanentError(f'The cluster serves no resource type "{resource}".')
        return self.KINDS[resource]

    def last_warning(self, obj, *, since):
        self.calls.append("events")
        seen = [w for w in self.warnings.get(self.key(obj), []) if since is None or w[0] >= since]
        return max(seen)[1] if seen else ""

    def replace(self, obj):
        self._check("replace")
        self.objects[self.key(obj)] = copy.deepcopy(obj)
        return self.objects[self.key(obj)]

    def delete(self, obj):
        self._check("delete")
        self.objects.pop(self.key(obj), None)

    def get(self, obj):
        self.calls.append("get")
        found = self.objects.get(self.key(obj))
        return copy.deepcopy(found) if found is not None else None

    def set_status(self, kind, name, **status):
        self.objects[(kind, NS, name)]["status"] = status


def configmap(name: str, data: str = "{{ inputs.parameters.value }}") -> str:
    return (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\n"
        'data:\n  value: "' + data + '"\n'
    )


def cluster_manifest() -> str:
    return (
        "apiVersion: postgresql.cnpg.io/v1\nkind: Cluster\n"
        "metadata:\n  name: {{ $sys.id }}\n  namespace: somewhere-else\n"
        "spec:\n  instances: {{ $var.instances }}\n"
    )


def resource(name, manifest, *, action="apply", success=None, failure=None, **extra) -> Template:
    return Template(
        name=name,
        inputs=extra.pop("inputs", []),
        resource=ResourceAction(
            action=action, manifest=manifest, success_condition=success, failure_condition=failure
        ),
        **extra,
    )


def dag(*tasks: Task, fail_fast=True) -> Template:
    return Template(name="main", tasks=list(tasks), fail_fast=fail_fast)


def workflow(*templates: Template, deadline=600, on_exit=None) -> Workflow:
    return Workflow(
        entrypoint="main",
        templates={t.name: t for t in templates},
        active_deadline_seconds=deadline,
        on_exit=on_exit,
    )


def ctx(**var) -> Context:
    return Context(var={"instances": 3, **var}, sys={"id": NS, "namespace": NS})


class Runner:
    """Drives a run the way the Celery task does: advance, save as JSON, repeat."""

    def __init__(self, wf, context=None, cluster=None, kinds=("ConfigMap", "Cluster", "Secret")):
        self.wf = wf
        self.ctx = context or ctx()
        self.cluster = cluster or MemoryCluster()
        self.settings = engine.RunSettings(namespace=NS, allowed_kinds=list(kinds))
        self.now = 1000.0
        self.saved = engine.start(wf, operation_id="op-1", now=self.now).to_json()

    @property
    def state(self) -> engine.RunState:
        return engine.RunState.from_json(self.saved)

    def step(self) -> engine.Step:
        state = engine.RunState.from_json(json.loads(json.dumps(self.saved)))
        result = engine.advance(state, self.wf, self.ctx, self.cluster, self.settings, now=self.now)
        self.saved = state.to_json()
        return result

    def until_quiet(self, limit=50) -> engine.Step:
        for _ in range(limit):
            result = self.step()
            if not result.progressed or self.state.done:
                return result
        raise AssertionError("the run never stopped progressing")

    def node(self, suffix: str) -> engine.Node:
        return next(n for i, n in self.state.nodes.items() if i.endswith(suffix))


def test_a_run_a_later_release_saved_goes_on_from_what_this_one_knows_of_it():
    """A release rolled back met states saved with fields it did not know, and every move of
    those runs failed on them."""
    wf = workflow(
        dag(Task(name="b", template="b")), resource("b", configmap("b", "x"), success="status.ok")
    )
    run = Runner(wf)
    run.until_quiet()
    run.saved["nodes"] = {
        key: {**node, "a_later_field": [1]} for key, node in run.saved["nodes"].items()
    }
    run.saved["another_later_field"] = "x"

    run.cluster.set_status("ConfigMap", "b", ok=True)
    run.until_quiet()

    assert run.state.phase == engine.SUCCEEDED and run.node(".b").phase == engine.SUCCEEDED


def test_a_task_renders_then_applies_then_waits_for_its_condition():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")),
        resource("cluster", cluster_manifest(), success="status.phase == healthy"),
    )
    run = Runner(wf)

    run.step()
    assert run.node(".cluster").step == "rendered"
    assert run.cluster.objects == {}  # saved before it is applied

    run.until_quiet()
    obj = run.cluster.objects[("Cluster", NS, NS)]
    assert obj["spec"] == {"instances": 3}
    assert obj["metadata"]["namespace"] == NS  # forced into the instance's namespace
    assert obj["metadata"]["labels"] == {engine.OPERATION_LABEL: "op-1"}
    assert run.state.phase == engine.RUNNING
    assert run.node(".cluster").step == "waiting"

    run.cluster.set_status("Cluster", NS, phase="healthy")
    run.until_quiet()

    assert run.state.phase == engine.SUCCEEDED
    assert run.state.done


def test_a_resumed_step_applies_the_object_it_rendered_not_a_new_one():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")),
        resource("cluster", cluster_manifest()),
    )
    run = Runner(wf)
    run.step()  # rendered with instances=3, then the worker died

    run.ctx = ctx(instances=5)
    run.until_quiet()

    assert run.cluster.objects[("Cluster", NS, NS)]["spec"] == {"instances": 3}


def test_a_run_holds_an_unsent_object_from_its_render_until_the_move_that_sends_it():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")),
        resource("cluster", cluster_manifest(), success="status.phase == healthy"),
    )
    run = Runner(wf)
    assert not engine.holds_unsent(run.state)  # nothing rendered yet

    run.step()  # rendered: the next move sends it, so this state must not be lost
    assert engine.holds_unsent(run.state) and run.cluster.objects == {}

    run.step()  # sent, now waiting on its condition: a lost state only sends it again
    assert run.cluster.objects and not engine.holds_unsent(run.state)

    run.step()
    assert not engine.holds_unsent(run.state)


def test_a_cancelled_run_holds_no_unsent_object():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")), resource("cluster", cluster_manifest())
    )
    run = Runner(wf)
    run.step()
    state = run.state

    engine.cancel(state, now=run.now, reason="Cancelled.")

    assert not engine.holds_unsent(state)  # its task failed: the object is never sent


def test_a_cancel_stopped_the_run_only_when_it_ended_a_main_stage_going_as_it_should():
    def waiting_run():
        wf = workflow(
            dag(Task(name="cluster", template="cluster"), Task(name="other", template="other")),
            resource("cluster", cluster_manifest(), success="status.phase == healthy"),
            resource("other", configmap("o", "x"), failure="data.value == x", success="false"),
            on_exit="cleanup",
        )
        wf.templates["cleanup"] = resource("cleanup", configmap("c", "y"))
        return Runner(wf)

    going = waiting_run()
    going.cluster.objects[("ConfigMap", NS, "o")] = {"data": {"value": "not yet"}}
    going.step()  # both rendered, nothing failed yet
    state = going.state
    engine.cancel(state, now=going.now, reason="Cancelled by a@example.com.")
    assert engine.stopped_by_cancel(state, "Cancelled by a@example.com.")

    failing = waiting_run()
    failing.until_quiet()  # "other" meets its failureCondition while "cluster" still waits
    state = failing.state
    assert failing.node(".other").phase == engine.FAILED
    engine.cancel(state, now=failing.now, reason="Cancelled by a@example.com.")
    assert not engine.stopped_by_cancel(state, "Cancelled by a@example.com.")

    ended = waiting_run()
    ended.until_quiet()
    ended.cluster.set_status("Cluster", NS, phase="healthy")
    ended.until_quiet()  # the main stage failed by itself; the cancel meets its onExit
    state = ended.state
    assert state.stage != "main" and state.main_phase == engine.FAILED
    engine.cancel(state, now=ended.now, reason="Cancelled by a@example.com.")
    assert not engine.stopped_by_cancel(state, "Cancelled by a@example.com.")

    deadline = waiting_run()
    deadline.step()
    state = deadline.state
    engine.cancel(state, now=deadline.now, reason="The workflow exceeded its deadline of 600 s.")
    assert not engine.stopped_by_cancel(state, "Cancelled by a@example.com.")
    assert not engine.stopped_by_cancel(state, "")


def test_create_treats_its_own_existing_object_as_done_and_refuses_a_strangers():
    wf = workflow(
        dag(Task(name="cm", template="cm")), resource("cm", configmap("c", "x"), action="create")
    )
    run = Runner(wf)
    run.until_quiet()
    assert run.state.phase == engine.SUCCEEDED

    again = Runner(wf, cluster=run.cluster)  # the same operation id, resumed after its create
    again.until_quiet()
    assert again.state.phase == engine.SUCCEEDED

    run.cluster.objects[("ConfigMap", NS, "c")]["metadata"]["labels"] = {}
    stranger = Runner(wf, cluster=run.cluster)
    stranger.until_quiet()
    assert stranger.state.phase == engine.FAILED
    assert 'ConfigMap "c" already exists' in stranger.node(".cm").message


def test_dependencies_order_tasks_and_a_failure_omits_what_depends_on_it():
    wf = workflow(
        dag(
            Task(name="a", template="a"),
            Task(name="b", template="b", dependencies=["a"]),
            Task(name="c", template="c", dependencies=["b"]),
            fail_fast=False,
        ),
        resource("a", configmap("a", "x")),
        resource("b", configmap("b", "x"), success="status.ok", failure="status.broken"),
        resource("c", configmap("c", "x")),
    )
    run = Runner(wf)
    run.until_quiet()
    assert ("ConfigMap", NS, "a") in run.cluster.objects
    assert ("ConfigMap", NS, "c") not in run.cluster.objects  # waits for b

    run.cluster.set_status("ConfigMap", "b", broken="yes")
    run.until_quiet()

    assert run.node(".b").phase == engine.FAILED
    assert run.node(".c").phase == engine.OMITTED
    assert run.state.phase == engine.FAILED
    assert "b:" in run.state.message
    assert ("ConfigMap", NS, "c") not in run.cluster.objects


def test_a_met_failure_condition_says_the_objects_own_words():
    wf = workflow(
        dag(Task(name="b", template="b")),
        resource("b", configmap("b", "x"), success="status.ok", failure="status.phase == failed"),
    )
    run = Runner(wf)
    run.until_quiet()

    run.cluster.set_status("ConfigMap", "b", phase="failed", error="the bucket refused the write")
    run.until_quiet()

    # What the object says comes first, the spec's condition last.
    assert run.node(".b").message == (
        'ConfigMap "b" failed: its phase is "failed". It says "the bucket refused the write". '
        "(It met its failureCondition, status.phase == failed.)"
    )


def test_a_met_failure_condition_says_the_objects_last_warning_since_the_task_began():
    """An operator that puts nothing of a failure in the object's status says it in an event
    (a restore finding no backup): the failure said only its phase."""
    wf = workflow(
        dag(Task(name="b", template="b")),
        resource("b", configmap("b", "x"), success="status.ok", failure="status.phase == failed"),
    )
    run = Runner(wf)
    key = ("ConfigMap", NS, "b")
    run.cluster.warnings[key] = [(run.now - 60, "FailingOver: from an earlier day")]
    run.until_quiet()
    run.cluster.warnings[key].append((run.now, "ErrorNoBackup: no backup found."))

    run.cluster.set_status("ConfigMap", "b", phase="failed")
    run.until_quiet()

    assert run.node(".b").message == (
        'ConfigMap "b" failed: its phase is "failed". '
        'Its last warning: "ErrorNoBackup: no backup found". '
        "(It met its failureCondition, status.phase == failed.)"
    )


QUOTA_SAID = (
    'Waiting on ConfigMap "b". Its last warning: "FailedCreate: exceeded quota: opsdeck-quota".'
)


def _waiting(template: Template, warning: str) -> tuple[Runner, tuple[str, str, str]]:
    """A run of one task `b` on ConfigMap "b", told to read its warnings after 30 s of waiting,
    the object's `warning` recorded as the task begins, and the run waiting on it."""
    run = Runner(workflow(dag(Task(name="b", template="b")), template))
    run.settings = dataclasses.replace(run.settings, warning_after=30.0)
    key = ("ConfigMap", NS, "b")
    run.cluster.warnings[key] = [(run.now, warning)]
    run.until_quiet()
    return run, key


def test_a_waiting_task_says_its_objects_newest_warning_read_at_most_every_so_often():
    """A controller that refuses what it was asked (a quota) says why in a Warning event on
    the object, where the task's conditions only ever read "not yet". The events are read once
    the task has waited `warning_after` seconds, then again each time as long after: not on
    every look at the object."""
    run, key = _waiting(
        resource("b", configmap("b", "x"), success="status.ok"),
        "FailedCreate: exceeded quota: opsdeck-quota",
    )
    run.now += 20
    run.step()
    assert "events" not in run.cluster.calls and engine.task_message(run.node(".b")) == ""

    run.now += 15  # 35 s after the task began
    run.step()
    run.now += 20
    run.step()

    assert run.cluster.calls.count("events") == 1
    assert engine.task_message(run.node(".b")) == QUOTA_SAID
    run.cluster.warnings[key].append((run.now, "FailedCreate: exceeded quota again"))
    run.now += 10  # 30 s after the last read
    run.step()
    assert run.cluster.calls.count("events") == 2
    assert "exceeded quota again" in engine.task_message(run.node(".b"))
    run.cluster.set_status("ConfigMap", "b", ok=True)
    run.until_quiet()
    assert run.node(".b").phase == engine.SUCCEEDED
    assert engine.task_message(run.node(".b")) == ""  # said only while it waits


def test_a_waiting_task_keeps_saying_its_warning_when_a_read_of_the_events_fails():
    """The API server throttles or hiccups on one read of the events (a 429 at fleet scale):
    the warning the task says stays until a read answers, rather than going blank for the
    next 30 s and coming back."""
    run, _ = _waiting(
        resource("b", configmap("b", "x"), success="status.ok"),
        "FailedCreate: exceeded quota: opsdeck-quota",
    )
    run.now += 35
    run.step()
    assert engine.task_message(run.node(".b")) == QUOTA_SAID

    def throttled(obj, *, since):
        run.cluster.calls.append("events")
        raise TransientError("Too many requests", status=429)

    run.cluster.last_warning = throttled
    run.now += 30
    run.step()

    assert run.cluster.calls.count("events") == 2  # it was read, and failed
    assert engine.task_message(run.node(".b")) == QUOTA_SAID


def test_a_retried_attempt_waits_its_own_while_before_it_says_a_warning():
    """An attempt that met its failure condition quoted the object's warning, and the task is
    retried: the new attempt, waiting on its object again, reads the events once it has waited
    `warning_after` seconds itself, not on its first look, where it said the warning of the
    attempt before it a second time ('… Its last warning: "X". … Waiting on ConfigMap "b".
    Its last warning: "X".'), seconds after it began."""
    template = resource("b", configmap("b", "x"), success="status.ok", failure="status.bad")
    template = dataclasses.replace(template, retry=RetryStrategy(limit=1, duration=5))
    run, _ = _waiting(template, "BackOff: the first attempt's warning")
    run.now += 35
    run.step()
    run.cluster.set_status("ConfigMap", "b", bad=True)
    run.step()  # attempt 1 failed; attempt 2 after a 5 s backoff
    run.cluster.set_status("ConfigMap", "b")
    assert run.node(".b").attempt == 2
    read = run.cluster.calls.count("events")

    run.now += 6
    run.until_quiet()
    run.now += 20  # 21 s into attempt 2
    run.step()

    node = run.node(".b")
    assert node.attempt == 2 and node.step == "waiting"
    assert run.cluster.calls.count("events") == read
    assert "Waiting on" not in engine.task_message(node)
    run.now += 10  # 31 s into attempt 2
    run.step()
    assert run.cluster.calls.count("events") == read + 1
    assert engine.task_message(run.node(".b")).endswith(
        'Waiting on ConfigMap "b". Its last warning: "BackOff: the first attempt\'s warning".'
    )


def test_a_waiting_task_reads_no_events_unless_told_to():
    wf = workflow(
        dag(Task(name="b", template="b")), resource("b", configmap("b", "x"), success="status.ok")
    )
    run = Runner(wf)
    run.until_quiet()
    run.now += 120
    run.step()

    assert run.cluster.calls == ["apply", "get", "get"]


def test_a_met_failure_condition_is_quoted_as_it_was_evaluated():
    wf = workflow(
        dag(Task(name="b", template="b")),
        resource(
            "b", configmap("b", "x"), success="status.ok",
            failure="status.readyInstances < {{ $var.instances }}",
        ),
    )  # fmt: skip
    run = Runner(wf)
    run.until_quiet()

    run.cluster.set_status("ConfigMap", "b", readyInstances=1, message="Only one of three is up.")
    run.until_quiet()

    # The condition with its placeholder filled in, as it was met, and one full stop.
    assert run.node(".b").message == (
        'ConfigMap "b" failed. It says "Only one of three is up." '
        "(It met its failureCondition, status.readyInstances < 3.)"
    )


def test_continue_on_failed_lets_the_next_task_run():
    wf = workflow(
        dag(
            Task(name="a", template="a", continue_on={"failed": True}),
            Task(name="b", template="b", dependencies=["a"]),
        ),
        resource("a", configmap("a", "x"), action="get"),  # get of a missing object fails
        resource("b", configmap("b", "x")),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".a").phase == engine.FAILED
    assert run.node(".b").phase == engine.SUCCEEDED
    assert run.state.phase == engine.SUCCEEDED


def test_depends_on_a_failure_runs_the_cleanup_branch_only():
    wf = workflow(
        dag(
            Task(name="a", template="a"),
            Task(name="cleanup", template="b", depends="a.Failed"),
            Task(name="next", template="c", depends="a"),
            fail_fast=False,
        ),
        resource("a", configmap("a", "x"), action="get"),
        resource("b", configmap("b", "x")),
        resource("c", configmap("c", "x")),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".cleanup").phase == engine.SUCCEEDED
    assert run.node(".next").phase == engine.OMITTED


def test_fail_fast_starts_nothing_new_after_a_failure():
    wf = workflow(
        dag(
            Task(name="bad", template="bad"),
            Task(name="slow", template="slow"),
            Task(name="after-slow", template="c", dependencies=["slow"]),
        ),
        resource("bad", configmap("bad", "x"), action="get"),
        resource("slow", configmap("slow", "x"), success="status.done"),
        resource("c", configmap("c", "x")),
    )
    run = Runner(wf)
    run.until_quiet()
    assert run.node(".bad").phase == engine.FAILED
    assert run.state.phase == engine.RUNNING  # slow is still running; it may finish

    run.cluster.set_status("ConfigMap", "slow", done="true")
    run.until_quiet()

    assert run.state.phase == engine.FAILED
    assert ("ConfigMap", NS, "c") not in run.cluster.objects


def test_when_false_skips_and_outputs_of_a_skipped_task_are_empty():
    wf = workflow(
        dag(
            Task(name="maybe", template="maybe", when="{{ $var.instances }} > 5"),
            Task(
                name="after",
                template="after",
                dependencies=["maybe"],
                arguments={"value": "[{{ tasks.maybe.outputs.parameters.name }}]"},
            ),
        ),
        resource(
            "maybe",
            configmap("maybe", "x"),
            outputs=[OutputParameter(name="name", json_path="{.metadata.name}")],
        ),
        resource("after", configmap("after"), inputs=["value"]),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".maybe").phase == engine.SKIPPED
    assert run.cluster.objects[("ConfigMap", NS, "after")]["data"] == {"value": "[]"}
    assert run.state.phase == engine.SUCCEEDED


def test_task_outputs_flow_into_later_arguments():
    wf = workflow(
        dag(
            Task(name="first", template="first"),
            Task(
                name="second",
                template="second",
                dependencies=["first"],
                arguments={"value": "from-{{ tasks.first.outputs.parameters.name }}"},
            ),
        ),
        resource(
            "first",
            configmap("first", "x"),
            outputs=[OutputParameter(name="name", json_path="{.metadata.name}")],
        ),
        resource("second", configmap("second"), inputs=["value"]),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.cluster.objects[("ConfigMap", NS, "second")]["data"] == {"value": "from-first"}


def test_a_failed_attempt_is_retried_after_its_backoff_until_the_limit():
    wf = workflow(
        dag(Task(name="flaky", template="flaky")),
        resource(
            "flaky",
            configmap("flaky", "x"),
            action="get",
            retry=RetryStrategy(limit=2, duration=10, factor=2),
        ),
    )
    run = Runner(wf)
    result = run.until_quiet()
    assert run.node(".flaky").attempt == 2
    assert result.wake_at == run.now + 10

    run.now += 9
    assert not run.step().progressed  # still backing off
    run.now += 1
    run.until_quiet()
    assert run.node(".flaky").attempt == 3
    assert run.node(".flaky").retry_at == run.now + 20  # 10 * 2**1

    run.now += 20
    run.until_quiet()
    assert run.node(".flaky").phase == engine.FAILED  # 3 attempts = limit 2 + 1
    assert run.state.phase == engine.FAILED


def test_a_backoff_that_grows_past_any_clock_waits_a_day_at_most():
    wf = workflow(
        dag(Task(name="flaky", template="flaky")),
        resource(
            "flaky", configmap("flaky", "x"), action="get",
            retry=RetryStrategy(limit=5, duration=1, factor=1e200),
        ),
        deadline=10**6,
    )  # fmt: skip
    run = Runner(wf)
    run.until_quiet()
    run.now += 1
    run.until_quiet()  # the second wait, 1e200 s, is past any clock
    assert run.node(".flaky").retry_at == run.now + engine.LONGEST_RETRY_WAIT

    run.now += engine.LONGEST_RETRY_WAIT
    run.until_quiet()  # the third, 1e400 s, is past a float's too

    assert run.node(".flaky").attempt == 4
    assert run.node(".flaky").retry_at == run.now + engine.LONGEST_RETRY_WAIT


def test_a_retry_succeeds_once_the_object_appears():
    wf = workflow(
        dag(Task(name="wait", template="wait")),
        resource(
            "wait",
            configmap("w", "x"),
            action="get",
            retry=RetryStrategy(limit=5, duration=1, factor=1),
        ),
    )
    run = Runner(wf)
    run.until_quiet()
    run.cluster.objects[("ConfigMap", NS, "w")] = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w", "namespace": NS}
    }  # fmt: skip
    run.now += 1
    run.until_quiet()

    assert run.state.phase == engine.SUCCEEDED


def test_the_workflow_deadline_fails_the_run_and_on_exit_still_runs():
    wf = workflow(
        dag(Task(name="never", template="never")),
        resource("never", configmap("never", "x"), success="status.ready"),
        resource("exit", configmap("exit", "{{ workflow.status }}")),
        deadline=60,
        on_exit="exit",
    )
    wf.templates["exit"].inputs = []
    run = Runner(wf)
    run.until_quiet()
    assert run.state.phase == engine.RUNNING
    # Where its operator stands, as the object last read back says it.
    run.cluster.objects[("ConfigMap", NS, "never")]["status"] = {"phase": "Setting up primary"}
    run.now += 1
    run.until_quiet()

    run.now += 60
    run.until_quiet()

    assert run.state.phase == engine.FAILED
    assert run.state.message == (
        "The workflow exceeded its deadline of 60 s. It was still waiting on ConfigMap "
        '"never", whose phase was "Setting up primary".'
    )
    assert run.cluster.objects[("ConfigMap", NS, "exit")]["data"] == {"value": "Failed"}


def test_a_template_deadline_fails_its_task():
    wf = workflow(
        dag(Task(name="slow", template="slow")),
        resource(
            "slow", configmap("slow", "x"), success="status.ready", active_deadline_seconds=30
        ),
    )
    run = Runner(wf)
    run.until_quiet()
    run.now += 30
    run.until_quiet()

    assert run.node(".slow").phase == engine.FAILED
    assert "exceeded its deadline of 30 s" in run.node(".slow").message


def test_with_items_fans_out_one_child_per_item():
    wf = workflow(
        dag(
            Task(
                name="each",
                template="each",
                with_items=["a", "b"],
                arguments={"value": "{{ item }}"},
            )
        ),
        Template(
            name="each",
            inputs=["value"],
            resource=ResourceAction(
                action="apply", manifest=configmap("cm-{{ inputs.parameters.value }}", "x")
            ),
        ),
    )
    run = Runner(wf)
    run.until_quiet()

    assert {k[2] for k in run.cluster.objects} == {"cm-a", "cm-b"}
    assert run.state.phase == engine.SUCCEEDED


def test_a_fanned_out_task_that_fails_says_why_its_first_item_failed():
    wf = workflow(
        dag(Task(name="each", template="each", with_items=["a", "b"],
                 arguments={"value": "{{ item }}"})),
        Template(
            name="each",
            inputs=["value"],
            resource=ResourceAction(
                action="apply", manifest=configmap("cm-{{ inputs.parameters.value }}", "x"),
                success_condition="status.ok", failure_condition="status.broken",
            ),
        ),
    )  # fmt: skip
    run = Runner(wf)
    run.until_quiet()
    run.cluster.set_status("ConfigMap", "cm-a", ok="yes")
    run.cluster.set_status("ConfigMap", "cm-b", broken="yes")
    run.until_quiet()

    assert run.state.phase == engine.FAILED
    message = run.state.message
    assert message.startswith("each: 1 of 2 items failed; the first: "), message
    assert "status.broken" in message


def test_a_task_fanning_out_to_more_items_than_the_limit_errors_and_applies_nothing():
    wf = workflow(
        dag(Task(name="each", template="each", with_items=list(range(engine.MAX_ITEMS + 1)),
                 arguments={"value": "{{ item }}"})),
        Template(
            name="each", inputs=["value"],
            resource=ResourceAction(
                action="apply", manifest=configmap("cm-{{ inputs.parameters.value }}", "x")
            ),
        ),
    )  # fmt: skip
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".each").phase == engine.ERRORED
    assert run.node(".each").message == "withItems holds 501 items; a task fans out to at most 500"
    assert not run.cluster.objects
    assert run.state.phase != engine.SUCCEEDED


def test_templates_calling_templates_past_the_steps_a_run_holds_error_and_stop_growing():
    levels = [
        Template(name=f"l{n}", tasks=[Task(name=f"t{i}", template=f"l{n + 1}") for i in range(3)])
        for n in range(8)  # 3 ** 8 = 6,561 leaves
    ]
    leaf = resource("l8", configmap("x", "x"), action="get", success="status.ready")
    wf = workflow(dag(Task(name="chain", template="l0")), *levels, leaf)
    run = Runner(wf)
    run.until_quiet()  # every leaf waits for an object no one makes: no write, no end

    assert len(run.state.nodes) <= engine.MAX_NODES + 10
    assert run.state.phase in (engine.FAILED, engine.ERRORED)
    errored = [n for n in run.state.nodes.values() if n.phase == engine.ERRORED]
    assert errored and errored[0].message == (
        "the run would hold more than 1000 steps (templates calling templates multiply them)"
    )


def test_an_empty_with_items_list_skips_the_task():
    wf = workflow(
        dag(Task(name="each", template="each", with_items=[])),
        resource("each", configmap("x", "x")),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".each").phase == engine.SKIPPED
    assert run.state.phase == engine.SUCCEEDED


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n", "Namespace is cluster-scoped"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n",
            "Deployment is not among the kinds this plan may touch",
        ),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ $var.nope }}\n", "nope"),
    ],
)
def test_objects_the_plan_may_not_create_fail_their_task_with_the_reason(manifest, message):
    wf = workflow(dag(Task(name="t", template="t")), resource("t", manifest))
    run = Runner(wf)
    run.until_quiet()

    assert run.state.phase == engine.FAILED
    assert message in run.node(".t").message
    assert run.cluster.objects == {}


def test_a_permanent_api_error_fails_the_task_with_its_message():
    wf = workflow(dag(Task(name="t", template="t")), resource("t", configmap("t", "x")))
    run = Runner(wf)
    run.step()
    run.cluster.fail_next = 'ConfigMap "t" is invalid: data.value: Invalid value'
    run.until_quiet()

    assert run.node(".t").message == 'ConfigMap "t" is invalid: data.value: Invalid value'
    assert run.state.phase == engine.FAILED


@pytest.mark.parametrize(("sent", "changed"), [(True, True), (False, False)])
def test_a_write_whose_answer_was_lost_counts_as_a_change_unless_it_never_reached_the_cluster(
    sent, changed
):
    """A write that failed transiently may have been applied (its answer lost): the run counts
    it as a change, so a cancel leaves the instance failed rather than as it was. One whose
    connection was never made (refused, say) carried nothing, and changed nothing."""
    wf = workflow(dag(Task(name="t", template="t")), resource("t", configmap("t", "x")))
    run = Runner(wf)
    run.step()  # rendered: the next move sends it

    def unreachable(obj, **_):
        raise TransientError("The cluster could not be reached (connection refused)", sent=sent)

    run.cluster.apply = unreachable
    state = run.state
    with pytest.raises(TransientError):
        engine.advance(state, wf, run.ctx, run.cluster, run.settings, now=run.now)

    assert state.changed is changed


def test_a_task_whose_read_fails_leaves_the_other_tasks_to_go_on():
    """Tasks waiting side by side (a server and a volume per item of a fan-out), one of whose
    reads the API server fails (a 503): the others' progress stands, and the failed one reads
    again next time, as Argo's resource steps poll on past a failed read. The error is the
    advance's only when nothing moved on: with six reads of 10 % errors, an advance that
    needed every read to answer failed one time in two, and a modify's backoff climbed to
    30 s between tries."""
    wf = workflow(
        dag(Task(name="a", template="a"), Task(name="b", template="b")),
        resource("a", configmap("a", "x"), success="status.ok"),
        resource("b", configmap("b", "x"), success="status.ok"),
    )
    run = Runner(wf)
    run.until_quiet()  # both applied, both waiting
    run.cluster.set_status("ConfigMap", "a", ok=True)
    run.cluster.set_status("ConfigMap", "b", ok=True)
    answers = run.cluster.get

    def unavailable_for_b(obj):
        if obj["metadata"]["name"] == "b":
            raise TransientError("the server is currently unable to handle the request")
        return answers(obj)

    run.cluster.get = unavailable_for_b
    step = run.step()

    assert step.progressed and step.unanswered.message.startswith("the server is currently")
    assert run.node(".a").phase == engine.SUCCEEDED  # saved with the advance
    assert run.node(".b").phase == engine.RUNNING and run.node(".b").step == "waiting"
    # Nothing else to move on: the error is the advance's, for its caller to retry it later.
    with pytest.raises(TransientError):
        run.step()
    run.cluster.get = answers
    run.until_quiet()
    assert run.state.phase == engine.SUCCEEDED


def test_status_patches_go_to_the_status_subresource():
    manifest = (
        "apiVersion: postgresql.cnpg.io/v1\nkind: Cluster\nmetadata:\n  name: {{ $sys.id }}\n"
        "status:\n  targetPrimary: {{ $sys.id }}-2\n"
    )
    wf = workflow(
        dag(Task(name="switch", template="switch")),
        resource("switch", manifest, action="patch"),
    )
    wf.templates["switch"].resource.merge_strategy = "merge"
    wf.templates["switch"].resource.flags = ["--subresource=status"]
    cluster = MemoryCluster()
    cluster.objects[("Cluster", NS, NS)] = {
        "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
        "metadata": {"name": NS, "namespace": NS}, "status": {"targetPrimary": f"{NS}-1"},
    }  # fmt: skip
    run = Runner(wf, cluster=cluster)
    run.until_quiet()

    assert "patch:merge:status" in cluster.calls
    assert cluster.objects[("Cluster", NS, NS)]["status"] == {"targetPrimary": f"{NS}-2"}


def test_verb_outputs_read_the_object_a_task_captured():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")),
        resource("cluster", cluster_manifest(), success="status.readyInstances == 3"),
    )
    run = Runner(wf)
    run.until_quiet()
    run.cluster.set_status("Cluster", NS, readyInstances=3, currentPrimary=f"{NS}-1")
    run.until_quiet()

    found = engine.verb_outputs(
        run.state,
        {
            "primary": "$tasks.cluster.resource.status.currentPrimary",
            "ready": "{{ $tasks.cluster.resource.status.readyInstances }}",
        },
    )
    assert found == {"primary": f"{NS}-1", "ready": "3"}


def test_cancel_fails_the_running_tasks_and_runs_on_exit():
    wf = workflow(
        dag(Task(name="slow", template="slow")),
        resource("slow", configmap("slow", "x"), success="status.ready"),
        resource("exit", configmap("exit", "{{ workflow.status }}")),
        on_exit="exit",
    )
    run = Runner(wf)
    run.until_quiet()
    state = run.state
    engine.cancel(state, now=run.now, reason="The instance is being deleted.")
    run.saved = state.to_json()
    run.until_quiet()

    assert run.state.phase == engine.FAILED
    assert run.state.message == "The instance is being deleted."
    assert run.cluster.objects[("ConfigMap", NS, "exit")]["data"] == {"value": "Failed"}


def _waits_for_the_instances():
    """A run whose one task applies the Cluster and waits for `$var.instances` ready."""
    return Runner(
        workflow(
            dag(Task(name="cluster", template="cluster")),
            resource(
                "cluster",
                cluster_manifest(),
                success="status.readyInstances == {{ $var.instances }}",
            ),
        )
    )


def test_conditions_may_use_the_runs_variables():
    run = _waits_for_the_instances()
    run.until_quiet()
    run.cluster.set_status("Cluster", NS, readyInstances=2)
    run.until_quiet()
    assert run.state.phase == engine.RUNNING

    run.cluster.set_status("Cluster", NS, readyInstances=3)
    run.until_quiet()

    assert run.state.phase == engine.SUCCEEDED


def test_a_waiting_run_says_what_it_waits_on_and_which_change_would_move_it_on():
    run = _waits_for_the_instances()
    run.until_quiet()

    # Its condition as the move rendered it, placeholders filled in.
    [entry] = engine.waiting_on(run.state)
    assert entry == {
        "object": f"Cluster/{NS}",
        "apiVersion": "postgresql.cnpg.io/v1",
        "conditions": ["status.readyInstances == 3", None],
    }
    cluster = run.node("cluster").observed
    cluster["status"] = {"readyInstances": 2}
    assert not engine.wakes(entry, cluster)  # a move would find it pending again
    cluster["status"] = {"readyInstances": 3}
    assert engine.wakes(entry, cluster)
    assert engine.wakes(entry, None)  # deleted: the move fails the task


def test_a_run_waits_on_no_object_while_its_task_is_still_to_apply():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")),
        resource("cluster", cluster_manifest(), success="status.readyInstances == 3"),
    )
    run = Runner(wf)
    run.step()  # rendered, not applied yet

    assert engine.waiting_on(run.state) == []


def test_kinds_may_be_allowed_with_their_api_version():
    wf = workflow(dag(Task(name="cm", template="cm")), resource("cm", configmap("c", "x")))
    run = Runner(wf, kinds=("v1/ConfigMap",))
    run.until_quiet()

    assert run.state.phase == engine.SUCCEEDED


def test_workflow_arguments_feed_the_entrypoints_inputs():
    wf = workflow(
        Template(
            name="main",
            inputs=["value"],
            tasks=[
                Task(name="cm", template="cm", arguments={"value": "{{ inputs.parameters.value }}"})
            ],
        ),
        resource("cm", configmap("cm"), inputs=["value"]),
    )
    context = ctx()
    context.workflow = {"value": "from-arguments"}
    run = Runner(wf, context=context)
    run.until_quiet()

    assert run.cluster.objects[("ConfigMap", NS, "cm")]["data"] == {"value": "from-arguments"}


def test_only_the_dag_targets_and_what_they_depend_on_run():
    wf = workflow(
        dag(
            Task(name="a", template="a"),
            Task(name="b", template="b", dependencies=["a"]),
            Task(name="c", template="c", dependencies=["a"]),
            Task(name="d", template="d"),
        ),
        *(resource(name, configmap(name, "x")) for name in "abcd"),
    )
    wf.templates["main"].target = "b"
    run = Runner(wf)
    run.until_quiet()

    assert {k[2] for k in run.cluster.objects} == {"a", "b"}
    assert run.state.phase == engine.SUCCEEDED


def test_a_dag_target_may_come_from_a_workflow_parameter():
    wf = workflow(
        dag(Task(name="a", template="a"), Task(name="b", template="b")),
        resource("a", configmap("a", "x")),
        resource("b", configmap("b", "x")),
    )
    wf.templates["main"].target = "{{ workflow.parameters.only }}"
    run = Runner(wf, context=Context(var={}, sys={"id": NS}, workflow={"only": "b"}))
    run.until_quiet()
    assert {k[2] for k in run.cluster.objects} == {"b"}

    unknown = Runner(wf, context=Context(var={}, sys={"id": NS}, workflow={"only": "z"}))
    unknown.until_quiet()
    assert unknown.state.phase == engine.FAILED
    assert 'unknown task "z"' in unknown.state.message
    assert unknown.cluster.objects == {}


def test_a_failure_a_later_task_handles_does_not_fail_the_dag():
    # a fails; its handler runs (failFast does not stop it) and is the only leaf
    wf = workflow(
        dag(
            Task(name="a", template="a"),
            Task(name="handler", template="b", depends="a.Failed"),
        ),
        resource("a", configmap("a", "x"), action="get"),  # a get of a missing object fails
        resource("b", configmap("b", "x")),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".a").phase == engine.FAILED
    assert run.node(".handler").phase == engine.SUCCEEDED
    assert run.state.phase == engine.SUCCEEDED


@pytest.mark.parametrize("fail_fast", [True, False])
def test_an_omitted_target_inherits_the_failure_it_was_omitted_for(fail_fast):
    wf = workflow(
        dag(
            Task(name="a", template="a"),
            Task(name="handler", template="b", depends="a.Failed"),
            Task(name="next", template="c", depends="a"),
            fail_fast=fail_fast,
        ),
        resource("a", configmap("a", "x"), action="get"),
        resource("b", configmap("b", "x")),
        resource("c", configmap("c", "x")),
    )
    run = Runner(wf)
    run.until_quiet()

    assert run.node(".next").phase == engine.OMITTED
    assert run.state.phase == engine.FAILED
    assert run.state.message.startswith("a: ")
    # failFast: the target `next` failed its branch, so nothing new starts, the handler neither
    assert (("ConfigMap", NS, "b") in run.cluster.objects) is not fail_fast


def test_without_fail_fast_the_other_branches_run_to_the_end():
    wf = workflow(
        dag(
            Task(name="bad", template="bad"),
            Task(name="slow", template="slow"),
            Task(name="after-slow", template="c", dependencies=["slow"]),
            fail_fast=False,
        ),
        resource("bad", configmap("bad", "x"), action="get"),
        resource("slow", configmap("slow", "x"), success="status.done"),
        resource("c", configmap("c", "x")),
    )
    run = Runner(wf)
    run.until_quiet()
    run.cluster.set_status("ConfigMap", "slow", done="true")
    run.until_quiet()

    assert ("ConfigMap", NS, "c") in run.cluster.objects
    assert run.state.phase == engine.FAILED


def fan_out(**task) -> Workflow:
    return workflow(
        dag(
            Task(name="list", template="list"),
            Task(
                name="each",
                template="each",
                dependencies=["list"],
                arguments={"value": "{{ item.name }}"},
                **task,
            ),
        ),
        Template(
            name="list",
            resource=ResourceAction(
                action="apply",
                manifest="apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: list\n"
                'data:\n  names: \'[{"name": "a"}, {"name": "b"}]\'\n',
            ),
            outputs=[OutputParameter(name="names", json_path="{.data.names}")],
        ),
        Template(
            name="each",
            inputs=["value"],
            resource=ResourceAction(
                action="apply", manifest=configmap("cm-{{ inputs.parameters.value }}", "x")
            ),
        ),
    )


def test_with_param_fans_out_over_a_json_list_another_task_produced():
    run = Runner(fan_out(with_param="{{ tasks.list.outputs.parameters.names }}"))
    run.until_quiet()

    assert {k[2] for k in run.cluster.objects} == {"list", "cm-a", "cm-b"}
    assert run.node('.each(1:{"name": "b"})').phase == engine.SUCCEEDED
    assert run.state.phase == engine.SUCCEEDED


def test_with_param_that_is_not_a_json_list_errors_its_task():
    run = Runner(fan_out(with_param="{{ tasks.list.outputs.parameters.names }}x"))
    run.until_quiet()

    assert run.node(".each").phase == engine.ERRORED
    assert "could not be parsed as a JSON list" in run.node(".each").message
    assert run.state.phase == engine.FAILED


def test_when_of_a_fanned_out_task_is_decided_per_item():
    run = Runner(
        fan_out(
            with_param="{{ tasks.list.outputs.parameters.names }}",
            when="{{ item.name }} != a",
        )
    )
    run.until_quiet()

    assert {k[2] for k in run.cluster.objects} == {"list", "cm-b"}
    assert run.node('.each(0:{"name": "a"})').phase == engine.SKIPPED
    assert run.state.phase == engine.SUCCEEDED


def jq_output(name, program, default=None) -> Workflow:
    return workflow(
        dag(Task(name="cluster", template="cluster")),
        resource(
            "cluster",
            cluster_manifest(),
            outputs=[OutputParameter(name=name, jq_filter=program, default=default)],
        ),
    )


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        (".spec.instances", "3"),
        (".metadata.name", NS),  # a string comes out raw, as with jq -r
        (".spec", '{"instances":3}'),  # anything else as compact JSON
        (".spec.missing", "null"),
        ("[.spec.instances, 1] | .[]", "3\n1"),  # one line per result
    ],
)
def test_jq_filter_outputs_read_the_object_as_jq_rc_prints_it(program, expected):
    run = Runner(jq_output("out", program))
    run.until_quiet()

    assert run.node(".cluster").outputs == {"out": expected}


def test_a_jq_filter_that_fails_on_the_object_errors_unless_it_has_a_default():
    run = Runner(jq_output("out", ".spec.instances.x"))
    run.until_quiet()
    assert run.node(".cluster").phase == engine.ERRORED
    assert "output out: jq: Cannot index number" in run.node(".cluster").message

    with_default = Runner(jq_output("out", ".spec.instances.x", default="none"))
    with_default.until_quiet()
    assert with_default.node(".cluster").outputs == {"out": "none"}


def json_patch(flags) -> Workflow:
    wf = workflow(
        dag(Task(name="scale", template="scale")),
        resource(
            "scale",
            "- op: replace\n  path: /spec/instances\n  value: {{ $var.instances }}\n",
            action="patch",
        ),
    )
    wf.templates["scale"].resource.merge_strategy = "json"
    wf.templates["scale"].resource.flags = flags
    return wf


def test_a_json_patch_in_argos_form_names_its_object_in_flags():
    for flags in (["cluster", "{{ $sys.id }}"], ["cluster/{{ $sys.id }}", "-n", "elsewhere"]):
        cluster = MemoryCluster()
        cluster.objects[("Cluster", NS, NS)] = {
            "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
            "metadata": {"name": NS, "namespace": NS}, "spec": {"instances": 1},
        }  # fmt: skip
        run = Runner(json_patch(flags), context=ctx(instances=4), cluster=cluster)
        run.until_quiet()

        assert run.state.phase == engine.SUCCEEDED, run.state.message
        assert "resolve:cluster" in cluster.calls
        assert cluster.objects[("Cluster", NS, NS)]["spec"] == {"instances": 4}
        assert run.node(".scale").object["metadata"] == {"name": NS, "namespace": NS}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "names its object in flags"),
        (["widget", "x"], 'serves no resource type "widget"'),
        (["configmap", "x"], None),  # a kind this plan may not touch
    ],
)
def test_a_json_patch_without_a_usable_target_fails_with_the_reason(flags, message):
    run = Runner(json_patch(flags), kinds=("Cluster",))
    run.until_quiet()

    assert run.state.phase == engine.FAILED
    if message:
        assert message in run.node(".scale").message
    else:
        assert "ConfigMap is not among the kinds this plan may touch" in run.node(".scale").message


def test_a_task_renders_in_the_advance_its_dependency_finished_in():
    wf = workflow(
        dag(Task(name="a", template="a"), Task(name="b", template="b", dependencies=["a"])),
        resource("a", configmap("a", "x")),
        resource("b", configmap("b", "x")),
    )
    run = Runner(wf)
    run.step()  # a is rendered
    run.step()  # a is applied and done; b renders at once

    assert run.node(".a").phase == engine.SUCCEEDED
    assert run.node(".b").step == "rendered"
    assert ("ConfigMap", NS, "b") not in run.cluster.objects  # saved before it is applied


def test_fail_fast_starts_nothing_in_the_pass_that_fails_a_target():
    # x (a target) is omitted and y becomes ready in the same pass; y must not start
    wf = workflow(
        dag(
            Task(name="ok", template="ok"),
            Task(name="bad", template="bad"),
            Task(name="y", template="y", dependencies=["ok"]),
            Task(name="x", template="x", dependencies=["bad"]),
        ),
        resource("ok", configmap("ok", "x"), action="get"),  # two reads decided in one step
        resource("bad", configmap("bad", "x"), action="get"),
        resource("y", configmap("y", "x")),
        resource("x", configmap("x", "x")),
    )
    cluster = MemoryCluster()
    cluster.objects[("ConfigMap", NS, "ok")] = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok", "namespace": NS}
    }  # fmt: skip
    run = Runner(wf, cluster=cluster)
    run.until_quiet()

    assert run.node(".x").phase == engine.OMITTED
    assert ("ConfigMap", NS, "y") not in run.cluster.objects
    assert run.state.phase == engine.FAILED


def test_a_long_item_is_cut_in_its_childs_name_and_a_null_item_is_an_item():
    wf = fan_out(with_param="{{ tasks.list.outputs.parameters.names }}")
    long_name = "n" * 200
    wf.templates["list"].resource.manifest = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: list\n"
        f'data:\n  names: \'[{{"name": "{long_name}"}}]\'\n'
    )
    run = Runner(wf)
    run.until_quiet()
    child = next(i for i in run.state.nodes if ".each(" in i)
    assert len(child) < 80 and child.endswith("…)")
    assert run.state.phase == engine.SUCCEEDED

    # JSON null is an item too: its `when` is decided for it (null reads as "")
    nulls = Runner(fan_out(with_param="[null]", when="'{{ item }}' != ''"))
    nulls.until_quiet()
    assert nulls.node(".each(0:None)").phase == engine.SKIPPED
    assert nulls.state.phase == engine.SUCCEEDED


def test_after_a_write_no_other_cluster_call_happens_in_the_same_advance():
    # a and b are independent: each step may write once, and reads wait for the next one
    wf = workflow(
        dag(Task(name="a", template="a"), Task(name="b", template="b")),
        resource("a", configmap("a", "x"), success="status.ok"),
        resource("b", configmap("b", "x"), success="status.ok"),
    )
    run = Runner(wf)
    run.step()  # both render
    calls = []
    for _ in range(4):
        before = len(run.cluster.calls)
        run.step()
        calls.append(run.cluster.calls[before:])

    assert calls[0] == ["apply"]  # a writes; b's apply waits
    assert calls[1] == ["get", "apply"]  # a's read comes first, then b writes
    assert all(step.count("apply") <= 1 for step in calls)


# Four nested maps over 60 elements: minutes of CEL, far past the evaluator's time limit.
_SIXTY = "[" + ",".join(str(i) for i in range(60)) + "]"
RUNAWAY_CEL = (
    f"cel: {_SIXTY}.map(a, {_SIXTY}.map(b, {_SIXTY}.map(c, {_SIXTY}.map(d, a + b + c + d))))"
    ".size() > 0"
)


def test_a_condition_that_exceeds_its_time_limit_errors_the_task_instead_of_waiting():
    wf = workflow(
        dag(Task(name="cluster", template="cluster")),
        resource("cluster", cluster_manifest(), success=RUNAWAY_CEL),
    )
    run = Runner(wf)

    started = time.monotonic()
    run.until_quiet()

    assert time.monotonic() - started < 30
    assert run.state.phase == engine.FAILED
    assert run.node(".cluster").phase == engine.ERRORED
    assert run.node(".cluster").message == (
        "successCondition: CEL: the expression exceeded its time limit of 2 s"
    )


def test_a_jq_output_that_takes_all_memory_errors_the_task_despite_its_default():
    wf = workflow(
        dag(Task(name="t", template="t"), Task(name="after", template="after", dependencies=["t"])),
        resource(
            "t",
            configmap("t", "x"),
            outputs=[OutputParameter(name="all", jq_filter="[repeat(1)]", default="none")],
        ),
        resource(
            "after",
            configmap("after", "x"),
            outputs=[OutputParameter(name="name", jq_filter=".metadata.name")],
        ),
    )
    run = Runner(wf)

    started = time.monotonic()
    run.until_quiet()

    assert time.monotonic() - started < 30
    assert run.node(".t").phase == engine.ERRORED
    assert re.fullmatch(
        r"output all: jq: the filter exceeded its (memory limit of 256 MiB|time limit of 2 s)",
        run.node(".t").message,
    )
    assert run.state.phase == engine.FAILED

    # The next filter, in a fresh evaluator, works as before.
    later = Runner(workflow(dag(Task(name="after", template="after")), wf.templates["after"]))
    later.until_quiet()
    assert later.node(".after").outputs == {"name": "after"}
    assert later.state.phase == engine.SUCCEEDED
