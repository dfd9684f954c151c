"""What deployments tells billing's entitlement check: a tenant's usage of a plan and the
quantities a change asks for, as plain values (billing never reads instances).

Quantities come from the plan's usage rules (`metering.stored_quantities`, which remembers
them per process), computed only when the tenant's limits name a dimension: most checks need
the instance count alone.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import JSONField

from accounts.errors import ActionDenied
from accounts.models import Tenant
from billing import entitlements
from billing.models import Plan
from deployments import lifecycle, metering, selectors
from deployments.models import Cell, Instance, Operation, PlanVersion
from deployments.parameters import values_after, values_for_version
from deployments.spec.loader import POINT_IN_TIME, SpecError
from deployments.spec.model import PlanSpec, Verb

_LIVE = [Operation.State.QUEUED, Operation.State.RUNNING]
# How a change that ran can end without its values being stored: failed, or cancelled after the
# cluster took some of it (which leaves the instance failed, as a failure does).
_ENDED_UNDONE = [Operation.State.FAILED, Operation.State.CANCELLED]


def usage_on_plan(
    tenant: Tenant, plan: Plan, *, dimensions: bool, pending: bool = False
) -> entitlements.Usage:
    """The tenant's instances on `plan` that are not deleted, and with `dimensions`, their
    summed quantities per usage dimension. With `pending` (what a check counts), the
    operations queued on them count too (`_usage`)."""
    return _usage(tenant, plan, dimensions=dimensions, pending=pending)[0]


def _usage(
    tenant: Tenant, plan: Plan, *, dimensions: bool, pending: bool
) -> tuple[entitlements.Usage, dict[str, dict[str, Decimal]]]:
    """`usage_on_plan`, and what each instance counts for in its totals.

    With `pending`, a change queued but not yet run is not room for another: each instance
    counts at the most it holds now or will hold while its queued and running operations run,
    and an instance moving onto the plan (an upgrade to one of its versions, queued) counts on
    it already. A failed instance counts at least the values of its last modify, upgrade or
    roll back that failed or was cancelled once running (what it ran with): the cluster may
    hold some of it, a grown volume for good. The operations are read with the instances, in
    one statement, so as of one moment: one finishing meanwhile is counted either as queued or
    by the values it left on its instance (the runner stores both at once), never missed.
    """
    if not dimensions:
        return entitlements.Usage(instances=_counts(tenant, [plan], pending=pending)[plan.pk]), {}
    live = _LIVE if pending else []  # without `pending`, no operation joins an instance
    with connection.cursor() as cursor:
        cursor.execute(
            _ROWS,
            [live, plan.pk, Instance.State.FAILED, _ENDED_UNDONE, list(lifecycle.ROLLED_BACK),
             tenant.pk, Instance.State.DELETED, plan.pk],
        )  # fmt: skip
        rows = cursor.fetchall()
    instances: dict[str, tuple] = {}
    queued: dict[str, list[tuple[Operation, Verb, PlanSpec]]] = {}
    for pk, version_id, plan_id, values, failed_version, failed_values, *op_values in rows:
        if pk not in instances:
            instances[pk] = (
                version_id,
                plan_id,
                _json(values),
                _failed(failed_version, failed_values),
            )
        if op_values[0] is None:
            continue  # no live operation on the plan
        op = Operation.from_db(
            connection.alias,
            _OP_NAMES,
            [_json(v) if f in _OP_JSON else v for f, v in zip(_OP_FIELDS, op_values, strict=True)],
        )
        spec = selectors.plan_version_loaded(op.plan_version_id).spec
        verb = spec.main.verbs.get(lifecycle.workflow_verb(op.verb))
        if verb is not None:
            queued.setdefault(pk, []).append((op, verb, spec))
    counted: dict[str, dict[str, Decimal]] = {}
    totals: dict[str, Decimal] = {}
    for pk, (version_id, plan_id, values, failed) in instances.items():
        # An instance still on another plan counts here from its move on.
        most = _counted(version_id if plan_id == plan.pk else None, values, failed)
        for op, verb, spec in queued.get(pk, []):
            values = values_after(op, verb, values, passwords=False) or values
            if op.verb == "upgrade":  # the version it applies takes the values so
                values = values_for_version(spec.main.parameters, values)
            _raise_to(most, _measured(op.plan_version_id, values))
        counted[pk] = most
        for dimension, quantity in most.items():
            totals[dimension] = totals.get(dimension, Decimal(0)) + quantity
    return entitlements.Usage(instances=len(instances), totals=totals), counted


# `_usage` reads in SQL: built with the ORM, its statements took most of a create's time.
_INSTANCE, _VERSION, _OPERATION = (
    m._meta.db_table for m in (Instance, PlanVersion, Operation)
)  # fmt: skip
# What a live operation counts by (nothing encrypted: nothing measures a password), in the
# order of its model's fields, as `Model.from_db` takes them.
_OP_FIELDS = [
    f for f in Operation._meta.concrete_fields
    if f.name in {"verb", "plan_version", "requested", "arguments"}
]  # fmt: skip
_OP_NAMES = [f.attname for f in _OP_FIELDS]
_OP_JSON = {f for f in _OP_FIELDS if isinstance(f, JSONField)}
# The tenant's instances that are not deleted and are on the plan or have a live operation on
# it, each beside every such operation (none: NULLs). Parameters: the live states and the plan,
# then (`_WHERE`) the tenant, the deleted state and the plan.
_JOINED = f"""
      FROM {_INSTANCE} i
      JOIN {_VERSION} v ON v.id = i.plan_version_id
      LEFT JOIN {_OPERATION} o
        ON o.instance_id = i.id AND o.state = ANY(%s)
           AND o.plan_version_id IN (SELECT id FROM {_VERSION} WHERE plan_id = %s)"""  # noqa: S608 - our names
_WHERE = "WHERE i.tenant_id = %s AND i.state <> %s AND (v.plan_id = %s OR o.id IS NOT NULL)"
# How many of the tenant's instances that are not deleted count on each of the plans: those on
# it, and those with a live operation on one of its versions (`_JOINED` and `_WHERE` read them
# for one plan). Parameters: the tenant, the deleted state, the plans, the live states, the
# tenant, the deleted state, the plans.
_COUNTS = f"""
    SELECT plan_id, count(*) FROM (
        SELECT i.id, v.plan_id
          FROM {_INSTANCE} i
          JOIN {_VERSION} v ON v.id = i.plan_version_id
         WHERE i.tenant_id = %s AND i.state <> %s AND v.plan_id = ANY(%s)
        UNION
        SELECT i.id, v.plan_id
          FROM {_INSTANCE} i
          JOIN {_OPERATION} o ON o.instance_id = i.id AND o.state = ANY(%s)
          JOIN {_VERSION} v ON v.id = o.plan_version_id
         WHERE i.tenant_id = %s AND i.state <> %s AND v.plan_id = ANY(%s)
    ) counted
     GROUP BY plan_id"""  # noqa: S608 - our names
# The version and parameters of a failed instance's last modify, upgrade or roll back that ran
# and failed or was cancelled (one refused at its start ran nothing). Parameters: the failed
# instance state, `_ENDED_UNDONE`, the verbs.
_FAILED = f"""
      LEFT JOIN LATERAL (
        SELECT plan_version_id, parameters FROM {_OPERATION}
         WHERE instance_id = i.id AND i.state = %s AND state = ANY(%s) AND verb = ANY(%s)
               AND started_at IS NOT NULL
         ORDER BY created_at DESC LIMIT 1
      ) f ON true"""  # noqa: S608 - our table
# Per instance: id, version, plan, parameters, and, failed, `_FAILED`'s; then an operation's
# `_OP_FIELDS`, oldest first.
_ROWS = f"""
    SELECT i.id, i.plan_version_id, v.plan_id, i.parameters, f.plan_version_id, f.parameters,
           {", ".join(f"o.{connection.ops.quote_name(f.column)}" for f in _OP_FIELDS)}
      {_JOINED}
      {_FAILED}
    {_WHERE}
     ORDER BY o.created_at"""
# `_ROWS` without operations, for several plans: the tenant's instances that are not deleted
# and on one of the plans (parameters: `_FAILED`'s, the tenant, the deleted state, the plans).
_SETTLED = f"""
    SELECT i.id, i.plan_version_id, v.plan_id, i.parameters, f.plan_version_id, f.parameters
      FROM {_INSTANCE} i
      JOIN {_VERSION} v ON v.id = i.plan_version_id
      {_FAILED}
     WHERE i.tenant_id = %s AND i.state <> %s AND v.plan_id = ANY(%s)"""  # noqa: S608 - our names


def _counts(tenant: Tenant, plans: list[Plan], *, pending: bool) -> dict[int, int]:
    """How many instances `usage_on_plan` counts on each plan without dimensions, by plan id, in
    one statement."""
    live = _LIVE if pending else []  # without `pending`, no operation moves an instance
    ids = [plan.pk for plan in plans]
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNTS,
            [tenant.pk, Instance.State.DELETED, ids, live, tenant.pk, Instance.State.DELETED, ids],
        )
        counted = dict(cursor.fetchall())
    return {pk: counted.get(pk, 0) for pk in ids}


def _settled(tenant: Tenant, plans: list[Plan]) -> dict[int, entitlements.Usage]:
    """`usage_on_plan` of each plan with dimensions and without pending, by plan id, in one
    statement (the Billing page lists every plan)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _SETTLED,
            [Instance.State.FAILED, _ENDED_UNDONE, list(lifecycle.ROLLED_BACK), tenant.pk,
             Instance.State.DELETED, [plan.pk for plan in plans]],
        )  # fmt: skip
        rows = cursor.fetchall()
    counts = dict.fromkeys((plan.pk for plan in plans), 0)
    totals: dict[int, dict[str, Decimal]] = {plan.pk: {} for plan in plans}
    for _, version_id, plan_id, values, failed_version, failed_values in rows:
        counts[plan_id] += 1
        failed = _failed(failed_version, failed_values)
        for dimension, quantity in _counted(version_id, _json(values), failed).items():
            totals[plan_id][dimension] = totals[plan_id].get(dimension, Decimal(0)) + quantity
    return {
        pk: entitlements.Usage(instances=count, totals=totals[pk]) for pk, count in counts.items()
    }


def _failed(version_id: int | None, values: str | None) -> tuple[int, dict] | None:
    """A failed instance's last change that ran (`_FAILED`), as `_measured` takes it."""
    values = _json(values)
    return (version_id, values) if values else None


def _counted(version_id: int | None, values: dict, failed: tuple | None) -> dict[str, Decimal]:
    """What an instance counts for by its values on its version (none given: it is not on the
    plan), and at least by the change that failed it: the cluster may hold some of it."""
    most = _measured(version_id, values) if version_id is not None else {}
    if failed is not None:
        _raise_to(most, _measured(*failed))
    return most


def _json(value: str | None) -> Any:
    """A JSON column's value as the ORM reads it (Django reads jsonb as text)."""
    return None if value is None else json.loads(value)


def _raise_to(most: dict[str, Decimal], measured: dict[str, Decimal]) -> None:
    """Keep in `most` the larger quantity of each dimension."""
    for dimension, quantity in measured.items():
        most[dimension] = max(most.get(dimension, quantity), quantity)


def _measured(version_id: int, values: dict) -> dict[str, Decimal]:
    try:
        return metering.stored_quantities(version_id, values)
    except metering.UsageError:
        return {}  # values that cannot be measured cannot hold the tenant back either


def _quantities(version: PlanVersion, values: dict[str, Any]) -> dict[str, Decimal]:
    try:
        return metering.stored_quantities(version.pk, values)
    except metering.UsageError as exc:
        raise ValidationError(str(exc)) from exc


def entitlement_require(
    *,
    tenant: Tenant,
    plan: Plan,
    action: str,
    version: PlanVersion | None = None,
    after: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    before_version: PlanVersion | None = None,
    instance_id: str | None = None,
    cell: str | None = None,
    retention_days: int | None = None,
    point_in_time: bool = False,
    limits: entitlements.Limits | None = None,
) -> None:
    """Ask billing whether `tenant` may do `action` on `plan` (whose `limits` the caller may
    have read already: `entitlements.limits_for`); ActionDenied with its reason when not.
    `after` and `before`: the instance's parameter values after and before the change
    (`before` None for a new instance), read on `version` (`before` on `before_version` when
    given: an upgrade measures the values before it by the rules of the version left). With
    `instance_id` (a change of an instance on the plan), what the change adds to the totals is
    how far it goes beyond the most the instance counts for already (its queued changes
    included): a change back down from a queued peak adds nothing."""
    limits = limits or entitlements.limits_for(tenant, plan)
    sized = bool(limits.max_total or limits.max_per_instance) and after is not None
    usage, counted = _usage(tenant, plan, dimensions=sized and bool(limits.max_total), pending=True)
    quantities = delta = None
    if sized:
        quantities = _quantities(version, after)
        if instance_id is not None and instance_id in counted:
            most = counted[instance_id]
            delta = {
                dim: max(q - most.get(dim, Decimal(0)), Decimal(0)) for dim, q in quantities.items()
            }
        else:
            was = _quantities(before_version or version, before) if before is not None else {}
            delta = {dim: q - was.get(dim, Decimal(0)) for dim, q in quantities.items()}
    decision = entitlements.check(
        tenant=tenant,
        plan=plan,
        action=action,
        usage=usage,
        limits=limits,
        request=entitlements.Request(
            quantities=quantities,
            delta=delta,
            cell=cell,
            retention_days=retention_days,
            point_in_time=point_in_time,
        ),
    )
    if not decision.allowed:
        raise ActionDenied(decision.reason)


def create_refusal(tenant: Tenant, plan: Plan) -> str | None:
    """Why the tenant cannot create an instance of `plan` now, whatever values it asks for (no
    subscription, one awaiting approval or payment or suspended, the plan's instance limit
    reached), None when it may try: what the create form says before it is filled in."""
    return create_refusals(tenant, [plan])[plan.key]


def create_refusals(tenant: Tenant, plans: list[Plan]) -> dict[str, str | None]:
    """`create_refusal` of each plan, by key, in as many queries for many plans as for one (the
    catalog's cards): `entitlement_require`'s check of a create, its values not asked yet."""
    if not plans:
        return {}
    reads = entitlements.Reads(tenant, plans)
    counts = _counts(tenant, plans, pending=True)
    refusals = {}
    for plan in plans:
        decision = entitlements.check(
            tenant=tenant,
            plan=plan,
            action="create",
            usage=entitlements.Usage(instances=counts[plan.pk]),
            reads=reads,
        )
        refusals[plan.key] = decision.reason or None
    return refusals


def moves_require(
    *, tenant: Tenant, plan: Plan, version: PlanVersion, moves: list[tuple[str, dict, str]]
) -> None:
    """Whether `plan` can take the tenant's instances moving onto it (a change of plan): each
    move — (instance name, values on `version`, cell) — counts as a new instance on `plan`,
    measured by `version`'s usage rules, on top of those before it. ActionDenied naming the
    first instance that does not fit, with billing's reason."""
    limits = entitlements.limits_for(tenant, plan)
    sized = bool(limits.max_total or limits.max_per_instance)
    usage = usage_on_plan(tenant, plan, dimensions=bool(limits.max_total), pending=True)
    count, totals = usage.instances, dict(usage.totals)
    for name, values, cell in moves:
        quantities = _quantities(version, values) if sized else None
        decision = entitlements.check(
            tenant=tenant,
            plan=plan,
            action="create",
            usage=entitlements.Usage(instances=count, totals=totals),
            limits=limits,
            request=entitlements.Request(quantities=quantities, delta=quantities, cell=cell),
        )
        if not decision.allowed:
            raise ActionDenied(f"{name}: {decision.reason}")
        count += 1
        for dimension, quantity in (quantities or {}).items():
            totals[dimension] = totals.get(dimension, Decimal(0)) + quantity


def _tenant_usage(
    tenant: Tenant, plans: list[Plan], *, pending: bool = False
) -> dict[int, entitlements.Usage]:
    if not pending:
        return _settled(tenant, plans)
    return {plan.pk: usage_on_plan(tenant, plan, dimensions=True, pending=True) for plan in plans}


def _plan_facts(plan: Plan) -> entitlements.PlanFacts | None:
    """The verbs of every version of the plan (instances on older ones run theirs) and the
    cells registered now; None before its first version. A version this Opsdeck no longer
    loads (`checks` warns of it) runs no verb: it adds none."""
    versions = PlanVersion.objects.filter(plan=plan).only("digest", "spec_text")
    verbs: set[str] = set()
    for version in versions:
        try:
            verbs |= set(selectors.plan_spec(version).main.verbs)
        except SpecError:
            continue
    if not verbs:
        return None
    if "restore" in verbs:
        verbs.add(POINT_IN_TIME)
    return entitlements.PlanFacts(
        verbs=frozenset(verbs), cells=frozenset(Cell.objects.values_list("name", flat=True))
    )


entitlements.usage_source_register(_tenant_usage)
entitlements.plan_facts_register(_plan_facts)
