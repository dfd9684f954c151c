"""A plan's create verb as the benchmarks run it outside Opsdeck: which objects it writes, in
which order, and which of them it waits on until its successCondition holds.

Read from the spec, never assumed: the create workflow's entrypoint must be one resource
template or a DAG of resource tasks (no `when`, no fan-out), which is what a create usually
is. The baseline applies the same objects with the same rendering and waits on the same
conditions, evaluated by the engine's own code (`deployments.workflow.conditions`); the
notice-delay watch uses the conditions to find the change that satisfied them.
"""

from __future__ import annotations

import re
import secrets
import string
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from deployments import executor
from deployments.kube import KubeDriver
from deployments.schedules import plan_retention_days
from deployments.spec import load_spec, validate_parameters
from deployments.spec.model import PlanSpec, Template
from deployments.workflow import conditions
from deployments.workflow.engine import OPERATION_LABEL
from deployments.workflow.render import Context, render_manifest, render_text, render_value

from .support import BenchError

TENANT_SLUG = "bench"
BACKUP_DESTINATION = "s3://bench/opsdeck"
BACKUP_CREDENTIALS = {"ACCESS_KEY_ID": "bench", "ACCESS_SECRET_KEY": "bench-secret"}
POLL = 0.05  # seconds between two reads of an object whose condition does not hold yet


def new_instance_id() -> str:
    """`inst-` and 8 lowercase alphanumerics, as the instances of the portal."""
    alphabet = string.ascii_lowercase + string.digits
    return "inst-" + "".join(secrets.choice(alphabet) for _ in range(8))


def raised_limit(spec_text: str, count: int) -> str:
    """The spec text with `maxNumberOfInstancesAllowed` raised to `count` (a tenant makes that
    many instances in a benchmark)."""
    text, found = re.subn(
        r"^maxNumberOfInstancesAllowed:.*$",
        f"maxNumberOfInstancesAllowed: {max(count, 1)}",
        spec_text,
        flags=re.MULTILINE,
    )
    return text if found else f"{spec_text.rstrip()}\nmaxNumberOfInstancesAllowed: {count}\n"


@dataclass(frozen=True)
class Step:
    """One resource task of the create: the engine's node id (`TaskRun.node`), its template and
    the arguments its task passes."""

    node: str
    template: Template
    arguments: dict[str, Any]

    @property
    def waits(self) -> bool:
        return bool(self.template.resource and self.template.resource.success_condition)


class Create:
    """The create verb of a plan spec, its steps in an order the DAG allows."""

    def __init__(self, spec_text: str) -> None:
        self.spec: PlanSpec = load_spec(spec_text)
        self.verb = self.spec.main.verbs["create"]
        self.values = validate_parameters(self.spec.main.parameters, {})
        self.steps = _steps(self.verb.workflow)
        if not any(step.waits for step in self.steps):
            raise BenchError("the create verb waits on no object (no successCondition)")

    @property
    def waits(self) -> list[Step]:
        return [step for step in self.steps if step.waits]

    def placement(self, instance_id: str) -> executor.Placement:
        return executor.Placement(
            instance_id=instance_id, tenant_slug=TENANT_SLUG, tenant_name="Bench",
            region="local", cloud="sandbox", backup_destination=BACKUP_DESTINATION,
            backup_credentials=dict(BACKUP_CREDENTIALS),
        )  # fmt: skip

    def context(self, instance_id: str, operation_id: str = "") -> Context:
        """The run's variables for `instance_id`, with the plan's default parameters."""
        return executor.run_context(
            self.spec, self.verb, self.placement(instance_id), values=self.values,
            operation_id=operation_id, started_at=None,
            retention_days=plan_retention_days(self.spec.main.backup),
        )  # fmt: skip

    def render(self, step: Step, ctx: Context, namespace: str) -> tuple[dict, str, str | None]:
        """The object `step` writes in `namespace`, and its success and failure conditions."""
        where = step.template.where("resource")
        inputs = {
            **step.template.input_defaults,
            **{k: render_value(v, ctx, where=where) for k, v in step.arguments.items()},
        }
        task_ctx = replace(ctx, inputs=inputs)
        action = step.template.resource
        obj = render_manifest(action.manifest, task_ctx, where=where)
        obj.setdefault("metadata", {})["namespace"] = namespace
        success, failure = (
            render_text(text, task_ctx, where=where) if text else None
            for text in (action.success_condition, action.failure_condition)
        )
        return obj, success, failure

    def kinds(self) -> set[tuple[str, str]]:
        """(apiVersion, kind) of the objects the create waits on."""
        ctx = self.context("inst-00000000")
        return {
            (obj["apiVersion"], obj["kind"])
            for obj, _, _ in (self.render(step, ctx, "") for step in self.waits)
        }

    def run(self, driver: KubeDriver, *, deadline: float) -> str:
        """The create as a bare script makes it: the instance's namespace as the executor
        prepares it, each object applied, each waited-on one read until its successCondition
        holds. Returns the instance id."""
        instance_id, operation_id = new_instance_id(), str(uuid.uuid4())
        where = self.placement(instance_id)
        for _ in executor.prelude(driver, executor.namespace_objects(self.spec, where)):
            pass
        ctx = self.context(instance_id, operation_id)
        for step in self.steps:
            obj, success, failure = self.render(step, ctx, instance_id)
            obj["metadata"].setdefault("labels", {})[OPERATION_LABEL] = operation_id
            driver.apply(obj)
            if not step.waits:
                continue
            while True:
                verdict = conditions.evaluate(driver.get(obj) or {}, success, failure)
                if verdict == conditions.SUCCEEDED:
                    break
                if verdict == conditions.FAILED or time.monotonic() > deadline:
                    raise BenchError(f"the baseline's {step.node} of {instance_id}: {verdict}")
                time.sleep(POLL)
        return instance_id


def _steps(workflow) -> list[Step]:
    entry = workflow.templates[workflow.entrypoint]
    if entry.resource is not None:
        return [Step(workflow.entrypoint, entry, {})]
    unsupported = BenchError(
        "the benchmark runs create verbs whose entrypoint is one resource template or a DAG of "
        "resource tasks without when or fan-out"
    )
    if entry.tasks is None:
        raise unsupported
    tasks = {task.name: task for task in entry.tasks}
    done: list[Step] = []
    while len(done) < len(tasks):
        named = {step.node.rsplit(".", 1)[-1] for step in done}
        ready = [
            task
            for name, task in tasks.items()
            if name not in named and set(_dependencies(task, tasks)) <= named
        ]
        if not ready:
            raise unsupported
        for task in ready:
            template = workflow.templates.get(task.template)
            plain = template is not None and template.resource is not None
            if not plain or task.when or task.with_items or task.with_param:
                raise unsupported
            done.append(Step(f"{workflow.entrypoint}.{task.name}", template, task.arguments))
    return done


def _dependencies(task, tasks: dict) -> list[str]:
    if task.dependencies is not None:
        return list(task.dependencies)
    # `depends` is an expression over task names (`a && b.Succeeded`): its names are enough.
    return [w for w in re.findall(r"[A-Za-z0-9_-]+", task.depends or "") if w in tasks]
