"""The workflow engine: advances one run of a verb's workflow by one step at a time.

A run's whole state is a JSON-serialisable `RunState`. `advance()` takes it,
does what can be done now — render a task's object, act on it through the
driver, read it back and check its conditions — and returns. It never sleeps:
the caller saves the state and calls again, at once when `Step.progressed`,
else after a short wait (a retry backoff's end is `Step.wake_at`).

Each resource task moves new → rendered → waiting → done, one move per
advance, so the rendered object is saved before it is applied: a run resumed
after a crash re-applies the same object, never a re-rendered one.

Semantics follow Argo Workflows (see docs/spec-format.md and the DAG rules in
`dag.py`): dependencies/depends, when, withItems, failFast, continueOn,
retryStrategy, activeDeadlineSeconds, onExit.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from deployments.spec.model import FIELD_MANAGER_FLAG, Template, Workflow
from deployments.workflow import conditions, dag, evaluator, expressions, outputs
from deployments.workflow.driver import Driver, DriverError, PermanentError, TransientError
from deployments.workflow.render import (
    Context,
    RenderError,
    is_patch_list,
    render_manifest,
    render_patch,
    render_text,
    render_value,
)

SUCCEEDED = "Succeeded"
FAILED = "Failed"
ERRORED = "Errored"
SKIPPED = "Skipped"
OMITTED = "Omitted"
RUNNING = "Running"
PENDING = "Pending"
FINISHED = {SUCCEEDED, FAILED, ERRORED, SKIPPED, OMITTED}

# Label put on every object a run creates, so a resumed `create` knows its own object.
OPERATION_LABEL = "opsdeck.io/operation"
# Longest item text in a fanned-out child's name, `task(index:item)`.
_LABEL_MAX = 40
_NO_ITEM = object()  # a task that does not fan out (an item may be JSON null)
# Children one withItems / withParam task fans out to (each a node every move walks): a list
# read from the cluster (a server per item) is far shorter.
MAX_ITEMS = 500
# Steps one run holds (dags, tasks, fanned-out children), each walked by every move: the specs
# we know make about 30. Templates calling templates multiply: three tasks a level calling the
# next for 16 levels would make 43 million.
MAX_NODES = 1_000
# The longest wait between two attempts of a task, whatever its backoff says.
LONGEST_RETRY_WAIT = 86_400.0
_WRITES = frozenset({"create", "apply", "patch", "replace", "delete"})


@dataclass
class Node:
    """One task (or the entrypoint) of a run, with its progress."""

    id: str
    template: str
    phase: str = PENDING
    step: str = "new"  # resource tasks: new → rendered → waiting
    attempt: int = 1
    inputs: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    retry_at: float | None = None
    message: str = ""
    object: dict | None = None  # the rendered object, re-applied as is on resume
    observed: dict | None = None  # the object as last read back
    # While waiting: its success and failure conditions as last rendered (placeholders filled
    # in), so that whoever sees the object change can tell whether the change moves it on.
    conditions: list[str | None] | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    # While waiting: the object's newest Warning event, and when its events were last read, or
    # a retried attempt began (`RunSettings.warning_after`).
    warning: str = ""
    warning_read_at: float | None = None
    # The attempt a retry ended last: its `attempt`, `phase`, `message` and `finished_at`, for
    # whoever shows each attempt (the task's fields say the attempt now running).
    ended_attempt: dict | None = None


@dataclass
class RunState:
    """Everything about one run; `phase` is Running, Succeeded or Failed."""

    operation_id: str
    started_at: float
    deadline_at: float
    phase: str = RUNNING
    stage: str = "main"  # main → exit (the onExit handler) → done
    main_phase: str | None = None
    message: str = ""
    nodes: dict[str, Node] = field(default_factory=dict)
    # Whether the cluster accepted any write of this run: a run that fails before it did
    # changed nothing, and its instance stays as it was.
    changed: bool = False

    def to_json(self) -> dict:
        """The state as plain data for `json.dumps`; it shares nested values with the state
        (no deep copy: the runner serializes it at once, on every move)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["nodes"] = {key: dict(vars(node)) for key, node in self.nodes.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> RunState:
        """The state `to_json` gave, also by a later release: the fields this one does not know
        are left out, so a release rolled back goes on with the runs a newer one began."""
        nodes = {
            key: Node(**{name: v for name, v in value.items() if name in _NODE_FIELDS})
            for key, value in data.get("nodes", {}).items()
        }
        known = {name: v for name, v in data.items() if name in _RUN_FIELDS}
        return cls(**{**known, "nodes": nodes})

    @property
    def done(self) -> bool:
        return self.stage == "done"


_NODE_FIELDS = frozenset(f.name for f in fields(Node))
_RUN_FIELDS = frozenset(f.name for f in fields(RunState))


@dataclass
class Step:
    """What one advance did: progressed (call again now), or wait until `wake_at` or a poll;
    and the first transient error a task's call to the cluster met, if one did (`unanswered`):
    the advance went on with the other tasks, and that one makes its call again next time."""

    progressed: bool = False
    wake_at: float | None = None
    unanswered: TransientError | None = None

    def merge(self, other: Step) -> None:
        self.progressed = self.progressed or other.progressed
        self.unanswered = self.unanswered or other.unanswered
        if other.wake_at is not None:
            earlier = other.wake_at if self.wake_at is None else min(self.wake_at, other.wake_at)
            self.wake_at = earlier


@dataclass
class RunSettings:
    """Where a run's objects go: the instance namespace and the kinds the spec allows; and
    how long a task waits on its object before the object's newest Warning event is read into
    what the task says (`task_message`), and again each time as long after (None: never)."""

    namespace: str
    allowed_kinds: list[str]
    warning_after: float | None = None
    cluster_scoped_kinds: frozenset[str] = frozenset(
        {"Namespace", "Node", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
         "PersistentVolume", "StorageClass", "PriorityClass"}
    )  # fmt: skip


def start(workflow: Workflow, *, operation_id: str, now: float) -> RunState:
    """A new run of `workflow`, not yet advanced."""
    state = RunState(
        operation_id=operation_id,
        started_at=now,
        deadline_at=now + workflow.active_deadline_seconds,
    )
    root = Node(id=workflow.entrypoint, template=workflow.entrypoint, inputs={})
    state.nodes[root.id] = root
    return state


def advance(
    state: RunState,
    workflow: Workflow,
    ctx: Context,
    driver: Driver,
    settings: RunSettings,
    *,
    now: float,
) -> Step:
    """Advance `state` as far as possible without waiting; mutates it and returns what happened.

    `ctx` holds the run's variables ($var, $sys, $secret, workflow arguments),
    frozen at the operation's start. A task whose call to the cluster fails transiently
    leaves the other tasks to go on, as Argo's resource steps poll on past a failed read;
    when none moved on, the error propagates: the caller retries the advance later, from the
    state it last saved.
    """
    run = _Run(state, workflow, ctx, driver, settings, now)
    return run.advance()


def cancel(state: RunState, *, now: float, reason: str) -> None:
    """Stop the main stage at once (its running tasks fail); onExit still runs next."""
    if state.stage != "main":
        return
    for node in state.nodes.values():
        if node.phase in {PENDING, RUNNING}:
            _finish(node, FAILED, now, reason)
    state.main_phase = FAILED
    state.message = reason
    state.stage = "exit"


def waiting_on(state: RunState) -> list[dict]:
    """The objects the run waits on for a condition: a change to one of them is what may move
    it on. Each as `{"object": "Kind/name", "apiVersion": …}` (in the run's namespace), with
    `"conditions": [success, failure]` once they were rendered (`wakes` reads them). Empty when
    it waits on no object (a retry's backoff, a step still to take)."""
    found = {}
    for node in state.nodes.values():
        if node.phase == RUNNING and node.step == "waiting" and node.object:
            meta = node.object.get("metadata") or {}
            entry = {
                "object": f"{node.object.get('kind', '')}/{meta.get('name', '')}",
                "apiVersion": node.object.get("apiVersion", ""),
            }
            if node.conditions is not None:
                entry["conditions"] = list(node.conditions)
            found.setdefault(entry["object"], entry)
    return [found[key] for key in sorted(found)]


def stopped_by_cancel(state: RunState, reason: str) -> bool:
    """Whether the cancel given `reason` is what ended the run's main stage: it came while the
    stage was under way, and none of its tasks had failed on its own (a failure the main stage
    met first, or a deadline, is not the cancel's doing)."""
    failed = (node for node in state.nodes.values() if node.phase in {FAILED, ERRORED})
    return (
        bool(reason)
        and state.main_phase == FAILED
        and state.message == reason
        and all(node.message == reason for node in failed)
    )


def holds_unsent(state: RunState) -> bool:
    """Whether a running task holds an object it rendered and has not sent yet: the next move
    sends it. The state that holds it must be stored where a crash cannot lose it before that
    move starts, or a run resumed after one would render the object again, and the cluster
    could be sent a different one."""
    return any(node.phase == RUNNING and node.step == "rendered" for node in state.nodes.values())


def wakes(entry: dict, obj: dict | None) -> bool:
    """Whether the object a `waiting_on` entry names, now `obj` (None: deleted), may move the
    run on: when its conditions decide (succeeded or failed), or cannot be evaluated, or were
    not rendered yet, or the object is gone. False only when they evaluate to pending: the
    move would find exactly that and wait again."""
    if obj is None or "conditions" not in entry:
        return True
    success, failure = entry["conditions"]
    try:
        return conditions.evaluate(obj, success, failure) != conditions.PENDING
    except conditions.ConditionError:
        return True  # the move reports it


def fail(state: RunState, *, now: float, reason: str) -> None:
    """End the run failed at once, onExit not run: for a failure outside any task (a cell that
    cannot be used, variables that do not render), which onExit would meet again."""
    cancel(state, now=now, reason=reason)
    state.message = state.message or reason
    state.stage, state.phase = "done", FAILED


def verb_outputs(state: RunState, expressions_by_name: dict[str, str]) -> dict[str, str]:
    """A verb's outputParameters, read from the objects its tasks captured.

    `$tasks.<task>.resource.<path>` reads the last object read back by that task;
    any other value is kept as given.
    """
    result = {}
    for name, expr in expressions_by_name.items():
        text = str(expr).strip()
        if text.startswith("{{") and text.endswith("}}"):
            text = text[2:-2].strip()
        if text.startswith("$tasks."):
            task, _, rest = text.removeprefix("$tasks.").partition(".resource.")
            node = _find_task(state, task)
            observed = (node.observed or node.object) if node else None
            result[name] = outputs.resource_path(observed, rest) if observed else ""
        else:
            result[name] = str(expr)
    return result


def _find_task(state: RunState, task: str) -> Node | None:
    for node_id, node in state.nodes.items():
        if node_id.rsplit(".", 1)[-1] == task:
            return node
    return None


def _finish(node: Node, phase: str, now: float, message: str = "") -> None:
    node.phase = phase
    node.finished_at = now
    if message:
        node.message = message


class _Run:
    def __init__(self, state, workflow, ctx, driver, settings, now):
        self.state: RunState = state
        self.workflow: Workflow = workflow
        self.ctx: Context = ctx
        self.driver: Driver = driver
        self.settings: RunSettings = settings
        self.now: float = now
        # Resource nodes that moved in this advance: one move each, so every rendered
        # object is saved by the caller before it is applied. `polled`: nodes that read their
        # object (or waited for a retry) without moving; once per advance is enough.
        self.moved: set[str] = set()
        self.polled: set[str] = set()
        self.wrote = False  # a node wrote to the cluster in this advance

    # --- stages ---------------------------------------------------------------

    def advance(self) -> Step:
        state = self.state
        step = Step()
        if state.stage == "main":
            if self.now >= state.deadline_at:
                cancel(
                    state,
                    now=self.now,
                    reason=f"The workflow exceeded its deadline of "
                    f"{self.workflow.active_deadline_seconds} s."
                    f"{still_waiting(state, self.driver)}",
                )
                step.progressed = True
            else:
                root = state.nodes[self.workflow.entrypoint]
                step.merge(self.node(root, self.ctx))
                if root.phase in FINISHED:
                    state.main_phase = SUCCEEDED if root.phase == SUCCEEDED else FAILED
                    state.message = state.message or root.message
                    state.stage = "exit"
                    step.progressed = True
        if state.stage == "exit":
            step.merge(self.exit_handler())
        if step.unanswered is not None and not step.progressed:
            raise step.unanswered
        return step

    def exit_handler(self) -> Step:
        state = self.state
        handler = self.workflow.on_exit
        if not handler:
            self.conclude(exit_phase=None)
            return Step(progressed=True)
        node_id = f"onExit:{handler}"
        node = state.nodes.get(node_id)
        if node is None:
            node = Node(id=node_id, template=handler)
            state.nodes[node_id] = node
        status = "Succeeded" if state.main_phase == SUCCEEDED else "Failed"
        ctx = _with(self.ctx, workflow={**self.ctx.workflow, "status": status})
        step = self.node(node, ctx)
        if node.phase in FINISHED:
            self.conclude(exit_phase=node.phase)
            step.progressed = True
        return step

    def conclude(self, *, exit_phase: str | None) -> None:
        state = self.state
        failed = state.main_phase != SUCCEEDED or exit_phase in {FAILED, ERRORED}
        state.phase = FAILED if failed else SUCCEEDED
        if exit_phase in {FAILED, ERRORED} and state.main_phase == SUCCEEDED:
            state.message = state.nodes[f"onExit:{self.workflow.on_exit}"].message
        state.stage = "done"

    # --- nodes ------------------------------------------------------------------

    def node(self, node: Node, ctx: Context) -> Step:
        """Advance one node of any kind."""
        if node.phase in FINISHED:
            return Step()
        template = self.workflow.templates[node.template]
        if node.started_at is None:
            node.started_at = self.now
            node.phase = RUNNING
        deadline = template.active_deadline_seconds
        if deadline is not None and self.now >= node.started_at + deadline:
            self._fail_subtree(node, f"{node.id} exceeded its deadline of {deadline} s.")
            return Step(progressed=True)
        inputs = {**template.input_defaults, **node.inputs}
        if node.id == self.workflow.entrypoint or node.id.startswith("onExit:"):
            # The workflow's arguments feed the top templates' inputs of the same name (Argo).
            inputs.update({k: v for k, v in ctx.workflow.items() if k in template.inputs})
        node_ctx = _with(ctx, inputs=inputs)
        if template.tasks is not None:
            return self.dag(node, template, node_ctx)
        return self.resource(node, template, node_ctx)

    def _fail_subtree(self, node: Node, message: str) -> None:
        for child_id in node.children:
            child = self.state.nodes[child_id]
            if child.phase not in FINISHED:
                self._fail_subtree(child, message)
        _finish(node, FAILED, self.now, message)

    # --- DAG ----------------------------------------------------------------------

    def dag(self, node: Node, template: Template, ctx: Context) -> Step:
        step = Step()
        tasks = {task.name: task for task in template.tasks}
        try:
            target_names = self._targets(template, tasks, ctx)
        except RenderError as exc:
            _finish(node, ERRORED, self.now, str(exc))
            return Step(progressed=True)
        needed = dag.needed(target_names, tasks)
        while True:
            results = {name: self._task_phase(node, name) for name in tasks}
            groups = {name: self._group_phases(node, name) for name in tasks}
            task_ctx = _with(ctx, tasks={**ctx.tasks, **self._task_outputs(node, tasks)})
            started = False
            ready = []
            for task in template.tasks:
                if task.name not in needed or results[task.name] is not None:
                    continue  # not needed by a target, or already started or decided
                decision = dag.decide(task, results, groups, tasks)
                if decision == dag.OMIT:
                    self._decided(node, task.name, OMITTED, "depends expression is false")
                    started = True
                elif decision == dag.RUN:
                    ready.append(task)
            # Omissions first: with failFast nothing starts once a target's branch failed,
            # and a task that fails as it starts (its `when`) counts at once.
            for task in ready:
                if template.fail_fast and dag.failed_target(
                    target_names, tasks, {n: self._task_phase(node, n) for n in tasks}
                ):
                    break
                started |= self._start_task(node, task, task_ctx, step)
            step.merge(self._advance_children(node, task_ctx))
            # Go round again while tasks start or finish: a task whose dependencies just
            # finished renders in this same advance (each task still moves once per advance).
            if not started and all(self._task_phase(node, n) == results[n] for n in tasks):
                break
            step.progressed = True
        results = {name: self._task_phase(node, name) for name in tasks}
        outcome = dag.outcome(template, tasks, results, target_names)
        if outcome is not None:
            phase, failed_task = outcome
            message = ""
            if failed_task:
                failed = self.state.nodes[self._child_id(node, failed_task)]
                message = f"{failed_task}: {failed.message}" if failed.message else failed_task
            _finish(node, phase, self.now, message)
            step.progressed = True
        return step

    def _targets(self, template: Template, tasks: dict, ctx: Context) -> list[str]:
        """The DAG's target tasks; `dag.target` may name them through a parameter."""
        if not template.target:
            return dag.targets(tasks, None)
        where = template.where("dag.target")
        names = render_text(template.target, ctx, where=where).split()
        unknown = [name for name in names if name not in tasks]
        if unknown:
            raise RenderError(f'{where}: unknown task "{unknown[0]}"')
        return dag.targets(tasks, names)

    def _child_id(self, node: Node, task: str) -> str:
        return f"{node.id}.{task}"

    def _task_phase(self, node: Node, task: str) -> str | None:
        child = self.state.nodes.get(self._child_id(node, task))
        return child.phase if child else None

    def _group_phases(self, node: Node, task: str) -> list[str]:
        child = self.state.nodes.get(self._child_id(node, task))
        if child is None or not child.children or child.template != "":
            return []
        return [self.state.nodes[c].phase for c in child.children]

    def _task_outputs(self, node: Node, tasks: dict) -> dict[str, dict[str, Any]]:
        result = {}
        for name in tasks:
            child = self.state.nodes.get(self._child_id(node, name))
            if child is None:
                continue
            # Outputs of a skipped or omitted task resolve to "" (Argo).
            skipped = child.phase in {SKIPPED, OMITTED}
            result[name] = _EmptyOutputs() if skipped else dict(child.outputs)
        return result

    def _decided(self, node: Node, task: str, phase: str, message: str) -> Node:
        child = Node(id=self._child_id(node, task), template="", phase=phase)
        child.started_at = child.finished_at = self.now
        child.message = message
        self.state.nodes[child.id] = child
        node.children.append(child.id)
        return child

    def _start_task(self, node: Node, task, ctx: Context, step: Step) -> bool:
        fans_out = task.with_items is not None or task.with_param is not None
        if not fans_out:
            verdict = self._when(task, ctx)
            if verdict is not None:
                self._decided(node, task.name, *verdict)
                return True
            if not self._room_for(node, task, 1):
                return True
            self._new_child(node, task.name, task, ctx, _NO_ITEM)
            return True
        try:
            items = self._items(task, ctx)
        except RenderError as exc:
            self._decided(node, task.name, ERRORED, str(exc))
            return True
        field_name = "withItems" if task.with_items is not None else "withParam"
        if not items:
            self._decided(node, task.name, SKIPPED, f"{field_name} is empty")
            return True
        if len(items) > MAX_ITEMS:
            message = f"{field_name} holds {len(items)} items; a task fans out to at most"
            self._decided(node, task.name, ERRORED, f"{message} {MAX_ITEMS}")
            return True
        if not self._room_for(node, task, len(items) + 1):
            return True
        group = Node(id=self._child_id(node, task.name), template="", phase=RUNNING)
        group.started_at = self.now
        self.state.nodes[group.id] = group
        node.children.append(group.id)
        for index, item in enumerate(items):
            label = json.dumps(item) if isinstance(item, dict | list) else str(item)
            if len(label) > _LABEL_MAX:  # the index keeps names unique; ids stay short
                label = label[: _LABEL_MAX - 1] + "…"
            self._new_child(group, f"{task.name}({index}:{label})", task, ctx, item)
        return True

    def _room_for(self, node: Node, task, count: int) -> bool:
        """Whether the run has room for `count` more steps (`MAX_NODES`); if not, the task
        errors, saying so."""
        if len(self.state.nodes) + count <= MAX_NODES:
            return True
        message = f"the run would hold more than {MAX_NODES} steps (templates calling templates"
        self._decided(node, task.name, ERRORED, f"{message} multiply them)")
        return False

    @staticmethod
    def _when(task, ctx: Context) -> tuple[str, str] | None:
        """None when the task runs, else the (phase, message) its `when` decides."""
        if not task.when:
            return None
        try:
            condition = _render_text(task.when, ctx)
            run_it = expressions.when_is_true(condition)
        except (RenderError, expressions.ExpressionError) as exc:
            return FAILED, f"when: {exc}"
        return None if run_it else (SKIPPED, f"when '{condition}' evaluated false")

    @staticmethod
    def _items(task, ctx: Context) -> list:
        """The elements a withItems / withParam task fans out over."""
        if task.with_items is not None:
            return render_value(task.with_items, ctx, where=f"{task.name}.withItems")
        text = render_text(task.with_param, ctx, where=f"{task.name}.withParam")
        try:
            items = json.loads(text)
        except ValueError:
            items = None
        if not isinstance(items, list):
            raise RenderError(
                f"{task.name}.withParam: value could not be parsed as a JSON list: {text.strip()}"
            )
        return items

    def _new_child(self, parent: Node, name: str, task, ctx: Context, item: Any) -> Node:
        item_ctx = _with(ctx, item=item) if item is not _NO_ITEM else ctx
        child = Node(id=f"{parent.id}.{name}", template=task.template)
        parent.children.append(child.id)
        self.state.nodes[child.id] = child
        if item is not _NO_ITEM:  # a fanned-out task's `when` is decided per item (Argo)
            verdict = self._when(task, item_ctx)
            if verdict is not None:
                child.started_at = self.now
                _finish(child, verdict[0], self.now, verdict[1])
                return child
        try:
            child.inputs = {
                key: render_value(value, item_ctx, where=f"{child.id}.arguments.{key}")
                for key, value in task.arguments.items()
            }
        except RenderError as exc:
            child.started_at = self.now
            _finish(child, ERRORED, self.now, str(exc))
        return child

    def _advance_children(self, node: Node, ctx: Context) -> Step:
        step = Step()
        for child_id in list(node.children):
            child = self.state.nodes[child_id]
            if child.phase in FINISHED:
                continue
            if child.template == "":  # a withItems / withParam group
                step.merge(self._advance_group(child, ctx))
            else:
                step.merge(self.node(child, ctx))
        return step

    def _advance_group(self, group: Node, ctx: Context) -> Step:
        step = Step()
        for child_id in group.children:
            child = self.state.nodes[child_id]
            if child.phase not in FINISHED:
                step.merge(self.node(child, ctx))
        children = [self.state.nodes[c] for c in group.children]
        if all(c.phase in FINISHED for c in children):
            failed = [c for c in children if c.phase in {FAILED, ERRORED}]
            message = ""
            if failed:  # the first failure's reason, which is what a person needs to act
                message = f"{len(failed)} of {len(children)} items failed"
                if failed[0].message:
                    message += f"; the first: {failed[0].message}"
            _finish(group, FAILED if failed else SUCCEEDED, self.now, message)
            step.progressed = True
        return step

    # --- resource templates ------------------------------------------------------

    def resource(self, node: Node, template: Template, ctx: Context) -> Step:
        if node.id in self.moved:
            return Step(progressed=True)
        if node.id in self.polled:
            return Step(wake_at=node.retry_at)
        if self.wrote and self._calls_cluster(node, template):
            # After a write, no other cluster call in this advance: what the write changed is
            # saved before the cluster is asked anything else. The next advance comes at once,
            # after this one is saved.
            return Step(progressed=True)
        step = self._resource_move(node, template, ctx)
        (self.moved if step.progressed else self.polled).add(node.id)
        return step

    def _calls_cluster(self, node: Node, template: Template) -> bool:
        """Whether the node's next move talks to the cluster (rendering does not, but for
        a JSON patch whose object's kind discovery finds)."""
        if node.retry_at is not None and self.now < node.retry_at:
            return False
        if node.step != "new":
            return True
        resource = template.resource
        return resource.action == "patch" and is_patch_list(resource.manifest)

    def _resource_move(self, node: Node, template: Template, ctx: Context) -> Step:
        action = template.resource
        if node.retry_at is not None:
            if self.now < node.retry_at:
                return Step(wake_at=node.retry_at)
            node.retry_at = None
        if node.step == "new":
            try:
                node.object = self._render(template, ctx)
            except RenderError as exc:
                return self._attempt_failed(node, template, ERRORED, str(exc))
            except PermanentError as exc:  # the cluster serves no such kind
                return self._attempt_failed(node, template, FAILED, exc.message)
            except TransientError as exc:  # discovery, for a JSON patch's kind
                return Step(unanswered=exc)
            node.step = "rendered"
            return Step(progressed=True)
        if node.step == "rendered":
            self.wrote = self.wrote or action.action in _WRITES
            # A write counts from the moment it is sent: one whose answer is lost (a transient
            # error, which the caller sees) may have been applied. Only a refusal, or a failure
            # to reach the cluster at all, undoes it.
            changed_before = self.state.changed
            self.state.changed = changed_before or action.action in _WRITES
            try:
                node.observed = self._act(action, node.object)
            except PermanentError as exc:
                self.state.changed = changed_before
                return self._attempt_failed(node, template, FAILED, exc.message)
            except TransientError as exc:
                if not exc.sent:  # it never reached the cluster (no connection was made)
                    self.state.changed = changed_before
                return Step(unanswered=exc)  # sent again next time
            if action.action == "delete" or not (
                action.success_condition or action.failure_condition
            ):
                return self._succeed(node, template)
            node.step, node.conditions = "waiting", None
            return Step(progressed=True)
        # waiting: read the object back and let the conditions decide
        try:
            current = self.driver.get(node.object)
        except TransientError as exc:
            return Step(unanswered=exc)  # read again next time
        if current is None:
            return self._attempt_failed(
                node, template, FAILED, f"{_describe(node.object)} disappeared while waiting."
            )
        node.observed = current
        try:
            # Conditions may hold placeholders, e.g. `status.readyInstances == {{ $var.n }}`.
            success, failure = (
                render_text(text, ctx, where=template.where("resource")) if text else text
                for text in (action.success_condition, action.failure_condition)
            )
            node.conditions = [success, failure]
            verdict = conditions.evaluate(current, success, failure)
        except (conditions.ConditionError, RenderError) as exc:
            return self._attempt_failed(node, template, ERRORED, str(exc))
        if verdict == "succeeded":
            return self._succeed(node, template)
        if verdict == "failed":
            # What the object says first, in its own words where the API's conventions put
            # them; the spec's condition last, for whoever reads further.
            status = current.get("status") or {}
            phase = status.get("phase")
            said = f"{_describe(node.object)} failed"
            said += f': its phase is "{phase}".' if phase else "."
            words = next(
                (w for w in (status.get(k) for k in ("message", "error", "reason"))
                 if isinstance(w, str) and w.strip()),
                "",
            )  # fmt: skip
            words = words.strip()[:500]
            if words:  # one full stop: theirs when their words end with one
                said += f' It says "{words}"' + ("" if words.endswith((".", "!", "?")) else ".")
            if warning := last_warning(self.driver, node):
                said += f' Its last warning: "{warning}".'
            # As it was evaluated: its placeholders filled in.
            said += f" (It met its failureCondition, {failure.strip().rstrip('.')[:500]}.)"
            return self._attempt_failed(node, template, FAILED, said)
        self._warning_read(node)
        return Step()

    def _warning_read(self, node: Node) -> None:
        """Read the newest Warning event of the object the task waits on into its `warning`,
        once it has waited `warning_after` seconds, then again each time as long after (one
        read of the object's events): a controller that refuses what it was asked (a quota,
        an admission webhook) says why there, where the task's conditions only say "not yet".
        """
        after = self.settings.warning_after
        since = node.warning_read_at or node.started_at
        if after is None or since is None or self.now - since < after:
            return
        node.warning_read_at = self.now
        # What it said stands until a read answers: a throttled read is no news.
        with contextlib.suppress(DriverError):
            node.warning = _newest_warning(self.driver, node)

    def _render(self, template: Template, ctx: Context) -> dict:
        resource = template.resource
        if (
            resource.action == "patch"
            and resource.merge_strategy == "json"
            and is_patch_list(resource.manifest)
        ):
            obj = self._json_patch(template, ctx)
        else:
            obj = render_manifest(resource.manifest, ctx, where=template.where("resource"))
        kind = obj.get("kind", "")
        if not kind or not obj.get("apiVersion"):
            raise RenderError(f"{template.where('resource')}: the object has no apiVersion/kind")
        if kind in self.settings.cluster_scoped_kinds:
            raise RenderError(f"{kind} is cluster-scoped; workflows act inside their namespace")
        allowed = self.settings.allowed_kinds
        if allowed and kind not in allowed and f"{obj['apiVersion']}/{kind}" not in allowed:
            raise RenderError(
                f"{kind} is not among the kinds this plan may touch "
                f"({', '.join(self.settings.allowed_kinds)})"
            )
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict) or not metadata.get("name"):
            raise RenderError(f"{template.where('resource')}: the object has no metadata.name")
        metadata["namespace"] = self.settings.namespace
        if template.resource.action in {"create", "apply"}:
            labels = metadata.setdefault("labels", {}) or {}
            labels[OPERATION_LABEL] = self.state.operation_id
            metadata["labels"] = labels
        return obj

    def _json_patch(self, template: Template, ctx: Context) -> dict:
        """Argo's form of a JSON patch: the operations as the manifest, the object named in
        `flags` (`[cluster, NAME]` or `[cluster/NAME]`), its kind found by the cluster."""
        where = template.where("resource")
        operations = render_patch(template.resource.manifest, ctx, where=f"{where}.manifest")
        flags = [render_text(f, ctx, where=f"{where}.flags") for f in template.resource.flags]
        target = patch_target(flags)
        if target is None:
            raise RenderError(f"{where}.flags: {PATCH_TARGET_MISSING}")
        api_version, kind = self.driver.resolve(target[0])
        return {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": target[1]},
            "patch": operations,
        }

    def _act(self, action, obj: dict) -> dict | None:
        subresource = manager = None
        for flag in action.flags:
            if flag.startswith("--subresource="):
                subresource = flag.split("=", 1)[1]
            elif flag.startswith(FIELD_MANAGER_FLAG):
                manager = flag.removeprefix(FIELD_MANAGER_FLAG)
        match action.action:
            case "create":
                return self.driver.create(
                    obj, owner_label=(OPERATION_LABEL, self.state.operation_id)
                )
            case "apply" if manager:
                return self.driver.apply(obj, field_manager=manager)
            case "apply":
                return self.driver.apply(obj)
            case "patch":
                return self.driver.patch(
                    obj, strategy=action.merge_strategy, subresource=subresource
                )
            case "replace":
                return self.driver.replace(obj)
            case "delete":
                self.driver.delete(obj)
                return None
            case "get":
                current = self.driver.get(obj)
                if current is None:
                    raise PermanentError(f"{_describe(obj)} not found.")
                return current
        raise PermanentError(f"unknown resource action {action.action!r}")

    def _succeed(self, node: Node, template: Template) -> Step:
        source = node.observed or node.object or {}
        for output in template.outputs:
            try:
                if output.json_path:
                    value = outputs.json_path(source, output.json_path)
                elif output.jq_filter:
                    value = outputs.jq_filter(source, output.jq_filter)
                else:
                    value = ""
            except evaluator.ProgramLimitError as exc:  # a default would hide a runaway filter
                return self._attempt_failed(node, template, ERRORED, f"output {output.name}: {exc}")
            except outputs.OutputError as exc:
                if output.default is None:  # Argo: a failing filter without a default errors
                    return self._attempt_failed(
                        node, template, ERRORED, f"output {output.name}: {exc}"
                    )
                value = ""
            node.outputs[output.name] = value or (output.default or "")
        _finish(node, SUCCEEDED, self.now)
        return Step(progressed=True)

    def _attempt_failed(self, node: Node, template: Template, phase: str, message: str) -> Step:
        retry = template.retry
        if retry is not None and _retries(retry, phase):
            attempts = retry.limit + 1 if retry.limit is not None else None
            elapsed = self.now - (node.started_at or self.now)
            within = retry.max_duration is None or elapsed < retry.max_duration
            if (attempts is None or node.attempt < attempts) and within:
                try:
                    wait = retry.duration * (retry.factor ** (node.attempt - 1))
                except OverflowError:  # a factor this large waits the longest anyway
                    wait = LONGEST_RETRY_WAIT
                wait = min(wait, LONGEST_RETRY_WAIT)
                if retry.cap is not None:
                    wait = min(wait, retry.cap)
                node.ended_attempt = {
                    "attempt": node.attempt, "phase": phase, "message": message,
                    "finished_at": self.now,
                }  # fmt: skip
                node.attempt += 1
                node.step = "new"
                node.message = f"attempt {node.attempt - 1} failed: {message}"
                node.retry_at = self.now + wait
                # The new attempt waits its own while before its object's events are read.
                node.warning, node.warning_read_at = "", node.retry_at
                return Step(progressed=True, wake_at=node.retry_at)
        _finish(node, phase, self.now, message)
        return Step(progressed=True)


PATCH_TARGET_MISSING = (
    'a JSON patch given as a list names its object in flags, e.g. ["cluster", "NAME"] or '
    '["cluster/NAME"]'
)
# kubectl options that take their value as the next flag.
_VALUED_FLAGS = {"-n", "--namespace", "--type", "-p", "--patch", "-o", "--output",
                 "--field-manager", "--subresource", "-l", "--selector"}  # fmt: skip


def patch_target(flags: list[str]) -> tuple[str, str] | None:
    """The (resource type, name) kubectl-style resource arguments in `flags` name:
    `["widget", "w1"]` or `["widgets.example.io/w1"]`; None when they name none."""
    positional, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in _VALUED_FLAGS:
            skip = True
        elif not flag.startswith("-"):
            positional.append(flag)
    if len(positional) == 1 and "/" in positional[0]:
        resource_type, _, name = positional[0].partition("/")
    elif len(positional) == 2 and "/" not in positional[0]:
        resource_type, name = positional
    else:
        return None
    return (resource_type, name) if resource_type and name else None


def _retries(retry, phase: str) -> bool:
    policy = retry.policy or "OnFailure"
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return phase == FAILED
    if policy == "OnError":
        return phase == ERRORED
    return False  # OnTransientError: transient cluster errors are retried by the caller


def last_warning(driver: Driver, node: Node) -> str:
    """The newest Warning event of the object `node` works on since the task began, at most
    500 characters; "" without one, or when the events cannot be read (what is said of the
    task is said without it)."""
    try:
        return _newest_warning(driver, node)
    except DriverError:
        return ""


def _newest_warning(driver: Driver, node: Node) -> str:
    """`last_warning`, raising DriverError when the events cannot be read."""
    warning = driver.last_warning(node.object, since=node.started_at)
    return warning.strip().rstrip(".")[:500]


def task_message(node: Node) -> str:
    """What a task says: its message, and while it waits on its object, the object's newest
    Warning event as last read (`RunSettings.warning_after`)."""
    if node.phase != RUNNING or node.step != "waiting" or not node.warning:
        return node.message
    waiting = f'Waiting on {_describe(node.object)}. Its last warning: "{node.warning}".'
    return f"{node.message} {waiting}" if node.message else waiting


def still_waiting(state: RunState, driver: Driver) -> str:
    """What a run ended at its deadline was still waiting on, as the object last read back
    said where the API's conventions put it (its status's phase): where the operator stood;
    with the object's newest Warning event, which often says why (a controller refused by the
    namespace's quota records one on the object it could not make happen)."""
    for node in state.nodes.values():
        if node.phase == RUNNING and node.step == "waiting" and node.object:
            phase = ((node.observed or {}).get("status") or {}).get("phase")
            said = f" It was still waiting on {_describe(node.object)}"
            said += f', whose phase was "{phase}".' if isinstance(phase, str) and phase else "."
            if warning := last_warning(driver, node):
                said += f' Its last warning: "{warning}".'
            return said
    return ""


def _describe(obj: dict | None) -> str:
    if not obj:
        return "the object"
    meta = obj.get("metadata") or {}
    return f'{obj.get("kind", "object")} "{meta.get("name", "?")}"'


class _EmptyOutputs(dict):
    """Outputs of a skipped or omitted task: every parameter reads as ""."""

    def __missing__(self, key):
        return ""

    def __contains__(self, key):
        return True


def _with(ctx: Context, **changes) -> Context:
    return replace(ctx, **changes)


def _render_text(text: str, ctx: Context) -> str:
    return render_text(text, ctx, where="when")
