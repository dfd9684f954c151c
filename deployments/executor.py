"""How one verb of a plan runs on one instance, written once: production (`runner`), `spec_test`
(`spectest`) and the benchmark's baseline all run it, so `spec_test` proves what production does.

No Django and no database: callers hand it plain values (`Placement`). A run is
- before a verb that makes the instance (`lifecycle`: create, restore), the instance's
  namespace with its guard rails (`prelude_objects`), applied one object at a time so that a
  failure redoes only the object it failed on (`prelude`);
- the run's variables (`run_context`: `$sys`, `$var`, the seed; `$secret` when given);
- moves (`move`): the engine advances the saved state by one move; once a verb that ends the
  instance (delete) succeeded, the instance's namespace goes too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.conf import settings as django_settings

from deployments import context, lifecycle
from deployments.spec.model import PlanSpec, Verb
from deployments.workflow import engine
from deployments.workflow.driver import Driver
from deployments.workflow.render import Context


@dataclass(frozen=True)
class Placement:
    """Where and for whom a run happens: the instance, its tenant, the user who asked, and the
    cell it runs on (as `$sys` describes them, and as its namespace's guard rails need)."""

    instance_id: str
    tenant_slug: str
    tenant_name: str = ""
    user_id: str = ""
    user_email: str = ""
    region: str = ""
    cloud: str = ""
    labels: dict[str, Any] = field(default_factory=dict)
    backup_destination: str = ""
    # "" keeps the spec's `x-opsdeck.operator.namespace`.
    operator_namespace: str = ""
    customer_sources: tuple[str, ...] = ()
    backup_credentials: dict[str, str] | None = None

    @property
    def namespace(self) -> str:
        return self.instance_id  # every instance is a namespace named after its id


def namespace_objects(spec: PlanSpec, where: Placement) -> list[dict[str, Any]]:
    """The instance's namespace and its guard rails, in the order they are applied."""
    return context.namespace_objects(
        namespace=where.namespace,
        instance_id=where.instance_id,
        tenant_slug=where.tenant_slug,
        extensions=spec.extensions,
        endpoint=spec.main.primary_endpoint(),
        operator_namespace=where.operator_namespace,
        customer_sources=list(where.customer_sources),
        backup_credentials=where.backup_credentials,
    )


def prelude_objects(spec: PlanSpec, verb: str, where: Placement) -> list[dict[str, Any]]:
    """What Opsdeck's `verb` applies before its workflow: the namespace and its guard rails,
    as `spec` renders them, for a verb that makes the instance or puts it on `spec`'s version;
    nothing for any other."""
    return namespace_objects(spec, where) if verb in lifecycle.APPLIES_GUARD_RAILS else []


def prelude(driver: Driver, objects: list[dict[str, Any]], done: int = 0) -> Iterator[int]:
    """Apply `objects` from the `done`-th on (server-side apply: idempotent), yielding how many
    are applied after each; a failure raises where it happened, so the caller keeps the count
    it last saw and the next attempt starts with the object that failed."""
    while done < len(objects):
        driver.apply(objects[done])
        done += 1
        yield done


def run_context(
    spec: PlanSpec,
    verb: Verb,
    where: Placement,
    *,
    values: dict[str, Any],
    operation_id: str,
    started_at: datetime | None,
    retention_days: int,
    extra_sys: dict[str, Any] | None = None,
    secrets: dict[str, str] | None = None,
) -> Context:
    """The run's variables: `$sys` (`context.sys_variables`) from the placement and the
    operation, `$var` from `values`, and `$secret` when the platform's secrets are given."""
    sys = context.sys_variables(
        instance_id=where.instance_id,
        namespace=where.namespace,
        tenant_slug=where.tenant_slug,
        tenant_name=where.tenant_name,
        user_id=where.user_id,
        user_email=where.user_email,
        region=where.region,
        cloud=where.cloud,
        labels=where.labels,
        backup_destination=where.backup_destination,
        backup_retention_days=retention_days,
        parameters=values,
        operation_id=operation_id,
        started_at=started_at,
        endpoint=spec.main.primary_endpoint(),
        extra=extra_sys,
    )
    ctx = context.run_context(
        verb.workflow, verb=verb.name, values=values, sys=sys, seed=where.instance_id
    )
    return ctx if secrets is None else replace(ctx, secret=secrets)


def move(
    state: engine.RunState,
    spec: PlanSpec,
    verb: Verb,
    ctx: Context,
    driver: Driver,
    where: Placement,
    *,
    now: float,
) -> engine.Step:
    """One move of the run; once a verb that ends the instance succeeded, its namespace is
    deleted too."""
    settings = engine.RunSettings(
        namespace=where.namespace,
        allowed_kinds=list(spec.allowed_kinds),
        warning_after=django_settings.OPSDECK_WAIT_WARNING_AFTER,
    )
    step = engine.advance(state, verb.workflow, ctx, driver, settings, now=now)
    ends = not verb.custom and verb.name in lifecycle.ENDS_INSTANCE
    if state.done and state.phase == engine.SUCCEEDED and ends:
        context.namespace_delete(driver, where.namespace)
    return step
