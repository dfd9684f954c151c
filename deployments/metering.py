"""How much of each pricing dimension an instance uses: the spec's `x-opsdeck.usage` rules
applied to its parameter values. Deployments owns quantities, billing owns prices
(`billing.pricing.cost`); the estimate on the create form and metering use the same pair.

Hourly metering (`usage_rows`, `meter_hour`, `meter_due`; docs/metering.md): each instance's
use of every dimension during one UTC hour, in unit-hours, from its state history and the
parameter values its succeeded operations left, to the second. Creating, running and updating
count every dimension; stopped and failed count only `PERSISTENT_DIMENSIONS` (the volume is
kept), and failed only once the instance has run; deleting and deleted count nothing. Billing
stores the rows (`billing.usage.record`).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import Any

from django.db.models import (
    BigIntegerField,
    Exists,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
)
from django.db.models.functions import Cast, Extract, Floor
from django.utils import timezone

from accounts.models import Tenant
from billing import pricing, usage
from billing.models import UNMETERED_DIMENSIONS, Plan, Price
from billing.pricing import Cost
from billing.usage import HOUR, UsageRow, hour_start
from deployments import selectors
from deployments.lifecycle import APPLIES_PARAMETERS, MAKES_INSTANCE
from deployments.models import Instance, InstanceStateChange, Operation, PlanVersion
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
    values = _measured_values(spec, parameters)
    result: dict[str, Decimal] = {}
    for dimension, expression in spec.usage_rules.items():
        result[dimension] = _quantity(dimension, expression, values)
    if "base" not in result:
        result["base"] = Decimal(1)
    return result


def _measured_values(spec: PlanSpec, parameters: dict[str, Any]) -> dict[str, Any]:
    """The values a usage rule sees: all but the Password ones."""
    secret = {p.key for p in spec.main.parameters if p.type == "Password"}
    return {key: value for key, value in parameters.items() if key not in secret}


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


def stored_quantities(version_id: int, parameters: dict[str, Any]) -> dict[str, Decimal]:
    """`quantities` of parameter values on a plan version, remembered per process: a version's
    usage rules never change, and the same values always measure the same (a tenant's usage is
    summed on every create, over every instance it holds, and each check measures the change
    asked for). Password values are left out first, as `quantities` leaves them out: none is
    kept in memory, and a new one makes no new values. Raises UsageError as `quantities` does
    (not remembered)."""
    spec = selectors.plan_version_loaded(version_id).spec
    values = _measured_values(spec, parameters)
    try:
        key = json.dumps(values, sort_keys=True)
    except (TypeError, ValueError):  # a value JSON cannot hold: measured, not remembered
        return quantities(spec, values)
    return dict(_stored_quantities(version_id, key))


@lru_cache(maxsize=4096)
def _stored_quantities(version_id: int, values: str) -> tuple[tuple[str, Decimal], ...]:
    spec = selectors.plan_version_loaded(version_id).spec
    return tuple(quantities(spec, json.loads(values)).items())


def _spec(plan: PlanVersion | PlanSpec) -> PlanSpec:
    return plan if isinstance(plan, PlanSpec) else selectors.plan_spec(plan)


def estimate(
    plan: Plan,
    version: PlanVersion | PlanSpec,
    parameters: dict[str, Any],
    *,
    tenant: Tenant,
    prices: list[Price] | None = None,
) -> Cost:
    """What an instance of `plan` with these typed parameter values costs `tenant` per hour
    and per month, per dimension and in total: at the prices it pays (`pricing.prices_for`, or
    `prices` when the caller read them for several plans at once), as its invoices will.
    Raises UsageError as `quantities` does."""
    if prices is None:
        prices = pricing.prices_for(tenant, [plan])[plan.pk]
    return pricing.cost(plan, quantities(version, parameters), prices=prices)


# --- hourly metering -------------------------------------------------------------------------

log = logging.getLogger(__name__)

_State = Instance.State
ALL_DIMENSIONS_STATES = frozenset({_State.CREATING, _State.RUNNING, _State.UPDATING})
# A stopped or failed instance keeps its volumes, and nothing else.
PERSISTENT_STATES = frozenset({_State.STOPPED, _State.FAILED})
# The pricing dimensions (the product's vocabulary, `spec.loader.PRICING_DIMENSIONS`) that
# measure what outlives the servers.
PERSISTENT_DIMENSIONS = frozenset({"storage"})
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


# Where a piece of the hour's parameter values come from, as the database wrote them (JSON
# text), so that instances with the same values share one parse and one usage-rule run:
# ("instance", version id, parameters) or ("op", version id, verb, parameters, requested,
# arguments) for the values an operation left.
Source = tuple


class _Measure:
    """Quantities per source, and an instance's hour totals per list of pieces: with 10,000
    instances of a few sizes, the usage rules and the arithmetic run a few times, not 10,000."""

    def __init__(self, versions: dict[int, _Version]) -> None:
        self.versions = versions
        self.by_source: dict[Source, dict[str, Decimal]] = {}
        self.by_pieces: dict[tuple, dict[str, Decimal]] = {}

    def quantities(self, source: Source) -> dict[str, Decimal]:
        found = self.by_source.get(source)
        if found is None:
            version_id, values = _values(source, self.versions)
            measured = quantities(self.versions[version_id].spec, values)
            found = {d: q for d, q in measured.items() if d not in UNMETERED_DIMENSIONS}
            self.by_source[source] = found
        return found

    def totals(self, pieces: tuple[tuple[int, bool, Source], ...]) -> dict[str, Decimal]:
        """Unit-hours per dimension of (seconds, whether only persistent dimensions count,
        source) pieces, exact to 6 places; dimensions that add up to 0 are left out."""
        found = self.by_pieces.get(pieces)
        if found is None:
            sums: dict[str, Decimal] = defaultdict(Decimal)
            for seconds, persistent_only, source in pieces:
                for dimension, quantity in self.quantities(source).items():
                    if not persistent_only or dimension in PERSISTENT_DIMENSIONS:
                        sums[dimension] += quantity * seconds
            found = {}
            for dimension in sorted(sums):
                total = (sums[dimension] / _SECONDS_PER_HOUR).quantize(_PLACES, ROUND_HALF_UP)
                if total > 0:
                    found[dimension] = total
            self.by_pieces[pieces] = found
        return found


def _values(source: Source, versions: dict[int, _Version]) -> tuple[int, dict[str, Any]]:
    """The plan version and (plain) parameter values a source stands for. An operation's are
    the instance's once it succeeded, as the runner stores them (`parameters.values_after`):
    what the run applied, with what the request changed or the verb's `updates` set."""
    if source[0] == "instance":
        return source[1], json.loads(source[2])
    _, version_id, verb_name, parameters, requested, arguments = source
    applied = json.loads(parameters)
    if verb_name in APPLIES_PARAMETERS:
        return version_id, {**applied, **json.loads(requested)}
    verb = versions[version_id].spec.main.verbs.get(verb_name)
    given = json.loads(arguments).get("verb_parameters", {})
    updates = verb.updates if verb is not None else {}
    return version_id, {**applied, **{t: given[s] for t, s in updates.items() if s in given}}


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
    ids = alive.values("pk")
    ran_before = InstanceStateChange.objects.filter(
        instance=OuterRef("pk"), to_state=_State.RUNNING, at__lt=start
    )
    instances = list(
        alive.order_by("id")
        .annotate(
            parameters_text=_text("parameters"),
            created=_epoch("created_at"),
            ran=Exists(ran_before),
        )
        .values_list(
            "id",
            "name",
            "tenant_id",
            "plan_version_id",
            "parameters_text",
            "state",
            "created",
            "ran",
        )
    )

    # The state each instance was in when the hour began, and its changes during the hour.
    last_before = (
        InstanceStateChange.objects.filter(instance__in=ids, at__lt=start)
        .order_by("instance_id", "-at", "-id")
        .distinct("instance_id")
        .values("pk")
    )
    changes = defaultdict(list)
    for instance_id, from_state, to_state, at in (
        InstanceStateChange.objects.filter(instance__in=ids)
        .filter(Q(at__gte=start, at__lt=end) | Q(pk__in=last_before))
        .order_by("instance_id", "at", "id")
        .annotate(second=_epoch("at"))
        .values_list("instance_id", "from_state", "to_state", "second")
    ):
        changes[instance_id].append((at, from_state, to_state))

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
    for instance_id, finished_at, *source in (
        succeeded.filter(Q(finished_at__gte=start) | Q(pk__in=op_before))
        .order_by("instance_id", "finished_at")
        .annotate(
            second=_epoch("finished_at"),
            parameters_text=_text("parameters"),
            requested_text=_text("requested"),
            arguments_text=_text("arguments"),
        )
        .values_list(
            "instance_id", "second", "plan_version_id", "verb", "parameters_text",
            "requested_text", "arguments_text",
        )
    ):  # fmt: skip
        operations[instance_id].append((finished_at, ("op", *source)))

    # What each instance was made with, by its create or restore whether it finished yet or
    # not: its values until an operation of it succeeds (a long create's first hours, metered
    # late, are not those a later change left).
    made_with = {
        instance_id: ("op", *source)
        for instance_id, *source in Operation.objects.filter(
            instance__in=ids, verb__in=MAKES_INSTANCE
        )
        .order_by("instance_id", "created_at", "id")
        .distinct("instance_id")
        .annotate(
            parameters_text=_text("parameters"),
            requested_text=_text("requested"),
            arguments_text=_text("arguments"),
        )
        .values_list(
            "instance_id", "plan_version_id", "verb", "parameters_text", "requested_text",
            "arguments_text",
        )
    }  # fmt: skip

    measure = _Measure(versions)
    result = HourUsage(hour, [], len(instances))
    start_second, end_second = int(start.timestamp()), int(end.timestamp())
    for instance in instances:
        instance_id, name, tenant_id = instance[:3]
        try:
            per_version = _instance_totals(
                instance,
                start_second,
                end_second,
                changes[instance_id],
                operations[instance_id],
                made_with.get(instance_id),
                measure,
            )
        except UsageError as exc:
            log.error("metering %s for %s: %s", instance_id, start, exc)
            result.failed.append(instance_id)
            continue
        for version_id, totals in per_version:
            version = versions[version_id]
            result.rows.extend(
                UsageRow(tenant_id, version.plan_id, instance_id, name, dimension,
                         version.units.get(dimension, ""), quantity)
                for dimension, quantity in totals.items()
            )  # fmt: skip
    return result


def _text(field_name: str) -> Cast:
    return Cast(field_name, TextField())


def _epoch(field_name: str) -> Cast:
    """The whole second (since the epoch) of a timestamp: usage is counted to the second."""
    return Cast(Floor(Extract(field_name, "epoch")), BigIntegerField())


def _instance_totals(
    instance: tuple,
    start: int,
    end: int,
    changes: list[tuple],
    operations: list[tuple],
    made_with: Source | None,
    measure: _Measure,
) -> list[tuple[int, dict[str, Decimal]]]:
    """One instance's hour (`start` to `end`, in seconds since the epoch): cut at each state or
    parameter change, each piece measured, the pieces on each plan summed. Returns, per plan it
    ran on in the hour (one, unless it moved to another plan), the last version of that plan it
    ran on and the unit-hours per dimension: an hour split by a move to another plan is billed
    on each plan for its own part.

    A failed instance that never ran (its create, or a restore, failed) counts nothing: the
    customer never had the database. Once it has run, failing keeps its volumes, and with
    them its data: storage counts."""
    _, _, _, current_version, current_values, current_state, created_at, ran = instance
    state = current_state
    if changes:
        at, from_state, to_state = changes[0]
        # Before its first recorded change the instance was in that change's from_state
        # ("" before it existed: nothing to count).
        state = to_state if at < start else from_state
    # Before any of its operations succeeded: the values it was made with (an instance made
    # before operations were kept has only its own).
    source: Source = made_with or ("instance", current_version, current_values)
    if operations:
        finished_at, first = operations[0]
        if finished_at < start or first[2] in MAKES_INSTANCE:
            # The values the last operation before the hour left, or those a create that
            # finishes during the hour is applying.
            source = first

    events = [(at, True, to_state) for at, _, to_state in changes if at >= start]
    events += [(at, False, op) for at, op in operations if at >= start]
    events.sort(key=lambda event: event[0])

    pieces = []
    moment = max(start, created_at)
    for at, is_state, value in events:
        if at > moment:
            _piece(pieces, at - moment, state, source, ran=ran)
            moment = at
        if is_state:
            state = value
            ran = ran or value == _State.RUNNING
        else:
            source = value
    _piece(pieces, end - moment, state, source, ran=ran)
    # Each plan's pieces apart, under the last version of it the instance ran on.
    by_plan: dict[int, list] = defaultdict(list)
    last_version: dict[int, int] = {}
    for piece in pieces:
        version_id = piece[2][1]
        plan_id = measure.versions[version_id].plan_id
        by_plan[plan_id].append(piece)
        last_version[plan_id] = version_id
    return [(last_version[plan], measure.totals(tuple(found))) for plan, found in by_plan.items()]


def _piece(pieces: list, seconds: int, state: str, source: Source, *, ran: bool) -> None:
    if state in ALL_DIMENSIONS_STATES:
        pieces.append((seconds, False, source))
    elif state in PERSISTENT_STATES and (ran or state != _State.FAILED):
        pieces.append((seconds, True, source))


def meter_hour(hour: datetime, *, versions: dict[int, _Version] | None = None) -> usage.Recorded:
    """Meter the UTC hour starting at `hour`: its rows, stored by billing; the hour is then
    metered. Metering it again changes nothing."""
    found = hour_usage(hour, versions=versions)
    return usage.record(hour, found.rows, instances=found.instances)


# How long after an hour ends it is metered: what the hour's operations changed is stamped as
# it is stored (a run's end as its statement is made, after its last cluster call), and commits
# moments later. An hour metered before such a commit would miss what it changed, and metering
# it again would then add it beside what it recorded.
SETTLE = timedelta(minutes=2)


def last_full_hour(now: datetime | None = None) -> datetime:
    """The last hour that ended at least SETTLE ago."""
    return hour_start((now or timezone.now()) - SETTLE) - HOUR


def hours_due(now: datetime | None = None) -> list[datetime]:
    """The full hours not metered yet, oldest first: from the first hour of the month the
    first instance was made in (a month closes once each of its hours is metered, those before
    any instance too), at most BACKFILL_LIMIT back, up to the last full hour."""
    last = last_full_hour(now)
    earliest = _first_instance_at()
    if earliest is None:
        first = last
    else:
        month = usage.period_bounds(usage.period_key(earliest))[0]
        first = max(month, last - BACKFILL_LIMIT)
    return usage.unmetered_hours(min(first, last), last + HOUR)


def _first_instance_at() -> datetime | None:
    """When the first instance was made (None before any): no hour before holds usage."""
    return Instance.objects.aggregate(first=Min("created_at"))["first"]


def meter_hours(hours: list[datetime]) -> list[usage.Recorded]:
    """Meter `hours`, oldest first; those that ended before the first instance was made hold
    nothing and are marked metered at once (`usage.record_none`)."""
    earliest = _first_instance_at()
    empty = {hour for hour in hours if earliest is None or hour + HOUR <= earliest}
    recorded = usage.record_none(sorted(empty))
    versions = _versions()
    return recorded + [meter_hour(hour, versions=versions) for hour in hours if hour not in empty]


def deleted_lives(
    tenant_ids: list[int], plans: QuerySet[Plan], since: datetime | None
) -> list[tuple[int, datetime, datetime]]:
    """When each of the tenants' instances of `plans` deleted after `since` (any, when None)
    was alive: its tenant's id, its creation and its deletion (`usage.unmetered_use` asks, for
    billing)."""
    deleted_at = (
        InstanceStateChange.objects.filter(instance=OuterRef("pk"), to_state=_State.DELETED)
        .order_by("-at")
        .values("at")[:1]
    )
    lives = (
        Instance.objects.filter(tenant_id__in=tenant_ids)
        .filter(state=_State.DELETED, plan_version__plan__in=plans)
        .annotate(deleted=Subquery(deleted_at))
        .filter(deleted__isnull=False)
    )
    if since is not None:
        lives = lives.filter(deleted__gt=since)
    return list(lives.values_list("tenant_id", "created_at", "deleted"))


def meter_due(now: datetime | None = None) -> list[usage.Recorded]:
    """Meter every full hour not metered yet (back-filling those missed while no worker ran)."""
    return meter_hours(hours_due(now))
