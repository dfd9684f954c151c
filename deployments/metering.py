"""How much of each pricing dimension an instance uses: the spec's `x-opsdeck.usage` rules
applied to its parameter values. Deployments owns quantities, billing owns prices
(`billing.pricing.cost`); the estimate on the create form and metering use the same pair.

Hourly metering (`usage_rows`, `meter_hour`, `meter_due`; docs/metering.md): each instance's
use of every dimension during one UTC hour, in unit-hours, from its state history and the
parameter values its succeeded operations left, to the second. Creating, running and updating
count every dimension; stopped and failed count only `PERSISTENT_DIMENSIONS` (the volume is
kept); deleting and deleted count nothing. Billing stores the rows (`billing.usage.record`).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from billing import pricing, usage
from billing.models import Plan
from billing.pricing import Cost
from billing.usage import HOUR, UsageRow, hour_start
from deployments import selectors
from deployments.models import Instance, InstanceStateChange, Operation, PlanVersion
from deployments.parameters import _APPLIES_PARAMETERS as APPLIES_PARAMETERS
from deployments.spec.model import PlanSpec
from deployments.workflow.evaluator import ProgramError, ProgramLimitError, evaluate_cel

# Quantities come from CEL doubles: 0.1 * 3 is 0.30000000000000004, which is 0.3 here.
_PLACES = Decimal("0.000001")
_MAX = Decimal(10) ** 15  # far beyond any real quantity; keeps the arithmetic exact


class UsageError(ValueError):
    """A usage rule that cannot give a quantity for these values; one readable sentence."""


def quantities(plan: PlanVersion | PlanSpec, parameters: dict[str, Any]) -> dict[str, Decimal]:
    """The quantity of every dimension the plan's usage rules measure, for typed parameter
    values (as `validate_parameters` returns them). A `base` dimension without a rule counts
    one per instance. Raises UsageError when a rule fails, exceeds a bound of the evaluator or
    gives something other than a number of at least 0."""
    spec = _spec(plan)
    secret = {p.key for p in spec.main.parameters if p.type == "Password"}
    values = {key: value for key, value in parameters.items() if key not in secret}
    result: dict[str, Decimal] = {}
    for dimension, expression in spec.usage_rules.items():
        result[dimension] = _quantity(dimension, expression, values)
    if "base" not in result:
        result["base"] = Decimal(1)
    return result


def _quantity(dimension: str, expression: str, values: dict[str, Any]) -> Decimal:
    try:
        value = evaluate_cel(expression, "var", values).value
    except ProgramLimitError as exc:
        raise UsageError(f"The usage rule for {dimension} was stopped: {exc}") from None
    except ProgramError as exc:
        raise UsageError(f"The usage rule for {dimension} failed: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"The usage rule for {dimension} does not give a number.")
    quantity = Decimal(str(value))
    if not quantity.is_finite() or quantity < 0 or quantity >= _MAX:
        raise UsageError(f"The usage rule for {dimension} gives {value}, not a quantity.")
    quantity = quantity.quantize(_PLACES)
    # Written plainly: 10, 1.5 (never 10.000000 or 1E+1).
    return (
        quantity.quantize(1) if quantity == quantity.to_integral_value() else quantity.normalize()
    )


def _spec(plan: PlanVersion | PlanSpec) -> PlanSpec:
    return plan if isinstance(plan, PlanSpec) else selectors.plan_spec(plan)


def estimate(plan: Plan, version: PlanVersion | PlanSpec, parameters: dict[str, Any]) -> Cost:
    """What an instance of `plan` with these typed parameter values costs per hour and per
    month, per dimension and in total. Raises UsageError as `quantities` does."""
    return pricing.cost(plan, quantities(version, parameters))


# --- hourly metering -------------------------------------------------------------------------

log = logging.getLogger(__name__)

_State = Instance.State
ALL_DIMENSIONS_STATES = frozenset({_State.CREATING, _State.RUNNING, _State.UPDATING})
# A stopped or failed instance keeps its volumes, and nothing else.
PERSISTENT_STATES = frozenset({_State.STOPPED, _State.FAILED})
# The pricing dimensions (the product's vocabulary, `spec.loader.PRICING_DIMENSIONS`) that
# measure what outlives the servers.
PERSISTENT_DIMENSIONS = frozenset({"storage"})
# Not metered until a spec can say where a snapshot's size comes from.
UNMETERED_DIMENSIONS = frozenset({"backupStorage"})
# How far back `meter_due` looks for hours never metered; older ones need
# `manage.py meter_usage --backfill-from`.
BACKFILL_LIMIT = timedelta(days=31)
_SECONDS_PER_HOUR = Decimal(3600)


@dataclass
class HourUsage:
    """What `usage_rows` found for one hour: the rows, how many instances were alive in it,
    and the instances whose usage rules failed (logged; their segments count nothing)."""

    hour: datetime
    rows: list[UsageRow]
    instances: int
    failed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Version:
    plan_id: int
    spec: PlanSpec
    units: dict[str, str]


def _versions() -> dict[int, _Version]:
    """Every plan version's plan, spec and units (specs are parsed once per process)."""
    versions = {}
    for version in PlanVersion.objects.only("id", "plan_id", "digest", "spec_text"):
        spec = selectors.plan_spec(version)
        units = {item["dimension"]: item.get("unit", "") for item in spec.pricing}
        versions[version.pk] = _Version(version.plan_id, spec, units)
    return versions


def _second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


class _Quantities:
    """`quantities()` once per (plan version, parameter values), however many instances share
    them."""

    def __init__(self, versions: dict[int, _Version]) -> None:
        self.versions = versions
        self.cache: dict[tuple[int, str], dict[str, Decimal]] = {}

    def of(self, version_id: int, values: dict[str, Any]) -> dict[str, Decimal]:
        key = (version_id, json.dumps(values, sort_keys=True, default=str))
        found = self.cache.get(key)
        if found is None:
            measured = quantities(self.versions[version_id].spec, values)
            found = {d: q for d, q in measured.items() if d not in UNMETERED_DIMENSIONS}
            self.cache[key] = found
        return found


def _values_after(op: dict, versions: dict[int, _Version]) -> dict[str, Any]:
    """The instance's (plain) parameter values once `op` succeeded, as the runner stores them
    (`parameters.values_after`): what the run applied, with what the request changed."""
    if op["verb"] in APPLIES_PARAMETERS:
        return {**op["parameters"], **op["requested"]}
    verb = versions[op["plan_version_id"]].spec.main.verbs.get(op["verb"])
    given = op["arguments"].get("verb_parameters", {})
    updates = verb.updates if verb is not None else {}
    return {**op["parameters"], **{t: given[s] for t, s in updates.items() if s in given}}


def usage_rows(hour: datetime) -> list[UsageRow]:
    """Every instance's usage during the UTC hour starting at `hour` (see `hour_usage`)."""
    return hour_usage(hour).rows


def hour_usage(hour: datetime, *, versions: dict[int, _Version] | None = None) -> HourUsage:
    """Every instance's usage during the UTC hour starting at `hour`, one row per dimension it
    used, in unit-hours exact to 6 places. Reads a constant number of queries whatever the
    number of instances; a usage rule runs once per distinct (plan version, parameter values).
    """
    start, end = hour, hour + HOUR
    versions = _versions() if versions is None else versions
    updating_verbs = {
        name
        for version in versions.values()
        for name, verb in version.spec.main.verbs.items()
        if verb.updates
    }
    deleted_later = InstanceStateChange.objects.filter(
        instance=OuterRef("pk"), to_state=_State.DELETED, at__gt=start
    )
    alive = Instance.objects.filter(created_at__lt=end).filter(
        ~Q(state=_State.DELETED) | Exists(deleted_later)
    )
    instances = list(
        alive.order_by("id").values(
            "id", "name", "tenant_id", "plan_version_id", "parameters", "state", "created_at"
        )
    )
    ids = alive.values("pk")

    # The state each instance was in when the hour began, and its changes during the hour.
    last_before = (
        InstanceStateChange.objects.filter(instance__in=ids, at__lt=start)
        .order_by("instance_id", "-at", "-id")
        .distinct("instance_id")
        .values("pk")
    )
    changes = defaultdict(list)
    for change in (
        InstanceStateChange.objects.filter(instance__in=ids)
        .filter(Q(at__gte=start, at__lt=end) | Q(pk__in=last_before))
        .order_by("instance_id", "at", "id")
        .values("instance_id", "from_state", "to_state", "at")
    ):
        changes[change["instance_id"]].append(change)

    # The parameter values and plan version each instance ran with when the hour began, and
    # those its operations left when they succeeded during the hour.
    succeeded = Operation.objects.filter(
        instance__in=ids,
        state=Operation.State.SUCCEEDED,
        finished_at__lt=end,
        verb__in=APPLIES_PARAMETERS | updating_verbs,
    )
    op_before = (
        succeeded.filter(finished_at__lt=start)
        .order_by("instance_id", "-finished_at")
        .distinct("instance_id")
        .values("pk")
    )
    operations = defaultdict(list)
    for op in (
        succeeded.filter(Q(finished_at__gte=start) | Q(pk__in=op_before))
        .order_by("instance_id", "finished_at")
        .values(
            "instance_id", "verb", "plan_version_id", "parameters", "requested", "arguments",
            "finished_at",
        )
    ):  # fmt: skip
        operations[op["instance_id"]].append(op)

    measure = _Quantities(versions)
    result = HourUsage(hour, [], len(instances))
    for instance in instances:
        try:
            result.rows.extend(
                _instance_rows(
                    instance, start, end, changes[instance["id"]], operations[instance["id"]],
                    versions, measure,
                )
            )  # fmt: skip
        except UsageError as exc:
            log.error("metering %s for %s: %s", instance["id"], start, exc)
            result.failed.append(instance["id"])
    return result


def _instance_rows(
    instance: dict,
    start: datetime,
    end: datetime,
    changes: list[dict],
    operations: list[dict],
    versions: dict[int, _Version],
    measure: _Quantities,
) -> list[UsageRow]:
    """One instance's rows for the hour: the hour cut at each state or parameter change (to
    the second), each piece measured, the pieces summed."""
    before = [c for c in changes if c["at"] < start]
    within = [c for c in changes if c["at"] >= start]
    if before:
        state = before[-1]["to_state"]
    elif within:
        state = within[0]["from_state"]  # "" before its first state: nothing to count
    else:
        state = instance["state"]

    ops_before = [op for op in operations if op["finished_at"] < start]
    ops_within = [op for op in operations if op["finished_at"] >= start]
    if ops_before:
        version_id, values = (
            ops_before[-1]["plan_version_id"],
            _values_after(ops_before[-1], versions),
        )
    elif ops_within and ops_within[0]["verb"] in {"create", "restore"}:
        # Being created with the values its create applies.
        version_id, values = (
            ops_within[0]["plan_version_id"],
            _values_after(ops_within[0], versions),
        )
    else:
        version_id, values = instance["plan_version_id"], instance["parameters"]

    events = [(_second(c["at"]), "state", c["to_state"]) for c in within]
    events += [
        (_second(op["finished_at"]), "values", (op["plan_version_id"], _values_after(op, versions)))
        for op in ops_within
    ]
    events.sort(key=lambda event: event[0])

    totals: dict[str, Decimal] = defaultdict(Decimal)

    def count(since: datetime, until: datetime) -> None:
        seconds = int((until - since).total_seconds())
        if seconds <= 0:
            return
        if state in ALL_DIMENSIONS_STATES:
            measured = measure.of(version_id, values)
        elif state in PERSISTENT_STATES:
            measured = {
                d: q
                for d, q in measure.of(version_id, values).items()
                if d in PERSISTENT_DIMENSIONS
            }
        else:
            return
        for dimension, quantity in measured.items():
            totals[dimension] += quantity * seconds

    moment = max(start, _second(instance["created_at"]))
    for at, kind, value in events:
        if at > moment:
            count(moment, at)
            moment = at
        if kind == "state":
            state = value
        else:
            version_id, values = value
    count(moment, end)

    version = versions[version_id]
    rows = []
    for dimension in sorted(totals):
        quantity = (totals[dimension] / _SECONDS_PER_HOUR).quantize(_PLACES, ROUND_HALF_UP)
        if quantity > 0:
            rows.append(
                UsageRow(
                    tenant_id=instance["tenant_id"],
                    plan_id=version.plan_id,
                    instance_id=instance["id"],
                    instance_name=instance["name"],
                    dimension=dimension,
                    unit=version.units.get(dimension, ""),
                    quantity=quantity,
                )
            )
    return rows


def meter_hour(hour: datetime, *, versions: dict[int, _Version] | None = None) -> usage.Recorded:
    """Meter the UTC hour starting at `hour`: its rows, stored by billing; the hour is then
    metered. Metering it again changes nothing."""
    found = hour_usage(hour, versions=versions)
    return usage.record(hour, found.rows, instances=found.instances)


def last_full_hour(now: datetime | None = None) -> datetime:
    return hour_start(now or timezone.now()) - HOUR


def hours_due(now: datetime | None = None) -> list[datetime]:
    """The full hours not metered yet, oldest first: from the first hour an instance existed
    in, at most BACKFILL_LIMIT back, up to the last full hour."""
    last = last_full_hour(now)
    earliest = Instance.objects.aggregate(first=Min("created_at"))["first"]
    first = max(hour_start(earliest), last - BACKFILL_LIMIT) if earliest else last
    return usage.unmetered_hours(min(first, last), last + HOUR)


def meter_hours(hours: list[datetime]) -> list[usage.Recorded]:
    versions = _versions()
    return [meter_hour(hour, versions=versions) for hour in hours]


def meter_due(now: datetime | None = None) -> list[usage.Recorded]:
    """Meter every full hour not metered yet (back-filling those missed while no worker ran)."""
    return meter_hours(hours_due(now))
