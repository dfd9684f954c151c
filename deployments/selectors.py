"""Reads for deployments. Tenant-owned queries start from the tenant."""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connection
from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    Count,
    Exists,
    F,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Value,
    When,
    Window,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Lower, RowNumber
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from accounts.idempotency import request_target, tenant_scope
from accounts.models import AuditEvent, Tenant
from accounts.text import name_plain
from billing import entitlements, pricing
from billing.models import Plan, PlanOverride
from billing.pricing import Cost
from deployments import lifecycle, schedules
from deployments.context import endpoint_host
from deployments.models import (
    SECRET_NAME,
    BackupSchedule,
    Cell,
    Instance,
    InstanceStateChange,
    Operation,
    PlanVersion,
    Snapshot,
    TaskRun,
)
from deployments.spec.loader import load_spec
from deployments.spec.model import Parameter, PlanSpec
from deployments.spec.params import (
    ParameterErrors,
    cel_values,
    check,
    coerce,
    format_value,
    initial_value,
    number_text,
    validate_parameters,
)
from deployments.workflow.evaluator import ProgramError, ProgramLimitError, evaluate_cel

log = logging.getLogger(__name__)


@lru_cache(maxsize=64)
def _spec(digest: str, text: str) -> PlanSpec:
    return load_spec(text, stored=True)


def plan_spec(version: PlanVersion) -> PlanSpec:
    """The loaded spec of a plan version (parsed once per process; versions never change). A
    saved version read without its text (`plan_version_latest`) is loaded by its id."""
    if "spec_text" in version.get_deferred_fields():
        return plan_version_loaded(version.pk).spec
    return _spec(version.digest, version.spec_text)


def verb_rule(version: PlanVersion, verb: str) -> lifecycle.Rule:
    """The lifecycle rule of `verb` on `version` (a plan's own action's, when its spec says
    so): the role action it needs, which cancelling it needs too."""
    spec_verb = plan_spec(version).main.verbs.get(verb)
    return lifecycle.rule(verb, custom=bool(spec_verb and spec_verb.custom))


# What a restore workflow reads when it can recover to a point in time (the shipped PostgreSQL
# spec does); one that does not restores a backup as it was taken.
POINT_IN_TIME_MARK = "$sys.restore.targetTime"


def restores_to_point_in_time(version: PlanVersion) -> bool:
    """Whether the plan's restore can recover to a point in time: its workflow reads
    `$sys.restore.targetTime`."""
    verb = plan_spec(version).main.verbs.get("restore")
    return verb is not None and POINT_IN_TIME_MARK in repr(verb.workflow)


@dataclass(frozen=True)
class LoadedVersion:
    spec: PlanSpec
    uses_secrets: bool  # whether the text reads platform secrets ($secret.*)


@lru_cache(maxsize=64)
def plan_version_loaded(version_id: int) -> LoadedVersion:
    """A plan version's spec by id, read and parsed once per process (versions never change):
    the runner needs it on every move without reading the spec text each time."""
    version = PlanVersion.objects.only("digest", "spec_text").get(pk=version_id)
    return LoadedVersion(_spec(version.digest, version.spec_text), "$secret." in version.spec_text)


def guard_rails_version(instance_id: str) -> int:
    """The plan version the instance's namespace guard rails were last applied for: that of
    the last operation to have started of those that apply them before their workflow (a
    create or restore, an upgrade or roll back), however it ended (a failed upgrade's objects
    may need its quota already); the instance's own when none has."""
    started = (
        Operation.objects.filter(
            instance_id=instance_id,
            verb__in=lifecycle.APPLIES_GUARD_RAILS,
            started_at__isnull=False,
        )
        .order_by("-started_at")
        .values_list("plan_version_id", flat=True)
        .first()
    )
    return started or Instance.objects.values_list("plan_version_id", flat=True).get(pk=instance_id)


def cell_offered(cell_id: int, tenant_id: int) -> bool:
    """Whether the tenant may run instances on the cell (`Cell.objects.offered_to`): a public
    cell, or one of its private ones. In SQL: every create asks.

    The cell's row is share-locked until the transaction ends: a withdrawal (the admin saves
    the cell) waits for the creates that found it offered, instead of committing while they
    go on to make an instance there. Creates on one cell do not wait for each other."""
    cells, private = Cell._meta.db_table, Cell.tenants.through._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {cells} c WHERE c.id = %s AND (c.public OR EXISTS ("  # noqa: S608 - our names
            f"SELECT 1 FROM {private} p WHERE p.cell_id = c.id AND p.tenant_id = %s))"
            " FOR SHARE OF c",
            [cell_id, tenant_id],
        )
        return cursor.fetchone() is not None


def cell_default_offered(tenant_id: int, names: tuple[str, ...] | None = None) -> Cell | None:
    """The cell a create that names none goes to: of those offered to the tenant (as
    `Cell.objects.offered_to`), and named in `names` when given (the cells its plan runs in),
    the default one, else the first by name; share-locked as `cell_offered` locks it. Its id
    and name only: the rest is deferred (read if asked for), so a create does not decrypt the
    cell's kubeconfig and credentials, which it never uses."""
    cells, private = Cell._meta.db_table, Cell.tenants.through._meta.db_table
    found = Cell.objects.raw(
        f"SELECT c.id, c.name FROM {cells} c WHERE (c.public OR EXISTS ("  # noqa: S608 - our names
        f"SELECT 1 FROM {private} p WHERE p.cell_id = c.id AND p.tenant_id = %s))"
        " AND (%s::text[] IS NULL OR c.name = ANY(%s::text[]))"
        " ORDER BY c.is_default DESC, c.name LIMIT 1 FOR SHARE OF c",
        [tenant_id, names and list(names), names and list(names)],
    )
    return next(iter(found), None)


_LATEST = ["id", "number", "digest", "released_at"]  # in the model's order, as `from_db` reads them


def plan_version_latest(plan: Plan) -> PlanVersion | None:
    """The plan's latest version, without its spec text or parsed JSON (`plan_spec` loads its
    spec by id, once per process). In SQL: every create reads it, and building the query cost
    more than running it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(_LATEST)} FROM {PlanVersion._meta.db_table}"  # noqa: S608 - our names
            " WHERE plan_id = %s ORDER BY number DESC LIMIT 1",
            [plan.pk],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    version = PlanVersion.from_db(connection.alias, _LATEST, row)
    version.plan = plan
    return version


# An operation is pending while it is queued or running: the pages that show it follow it.
_PENDING = [Operation.State.QUEUED, Operation.State.RUNNING]

INSTANCES_PER_PAGE = 25

# What a row of the deployments list shows: never a plan version's spec text or parsed JSON,
# nor a cell's kubeconfig (decrypting one per row is what made a long list slow).
_INSTANCE_ROW = [
    "id",
    "name",
    "state",
    "health",
    "created_at",
    "plan_version__number",
    "plan_version__plan__key",
    "plan_version__plan__name",
    "plan_version__plan__service",
    "plan_version__plan__service_name",
    "cell__name",
    "cell__region",
]


def instances_for_tenant(
    tenant: Tenant, *, search: str = "", state: str = "", service: str = ""
) -> QuerySet[Instance]:
    """The tenant's instances, newest first, with only the columns a list shows, and whether an
    operation is pending on each (`pending`: the list follows those).

    `search` matches a name (any part, any case, read as names are stored) or the start of an
    id, with or without its "inst-"; deleted instances are left out unless `state` asks for them.
    """
    instances = Instance.objects.for_tenant(tenant)
    instances = instances.filter(state=state) if state else instances.active()
    if search:
        # Read as names are stored (a Unicode dash as "-"); an id may be typed without its
        # "inst-" (which alone would match every instance).
        search = name_plain(search) or search
        prefix = search.lower()
        prefix = prefix if prefix.startswith("inst-") else "inst-" + prefix
        instances = instances.filter(Q(name__icontains=search) | Q(id__startswith=prefix))
    if service:
        instances = instances.filter(plan_version__plan__service=service)
    # Running instances that do not serve as they should come first.
    degraded = Case(
        When(state=Instance.State.RUNNING, health=Instance.Health.DEGRADED, then=Value(0)),
        default=Value(1),
    )
    pending = Operation.objects.filter(instance=OuterRef("pk"), state__in=_PENDING)
    return (
        instances.select_related("plan_version__plan", "cell")
        .only(*_INSTANCE_ROW)
        .annotate(pending=Exists(pending))
        .order_by(degraded, "-created_at", "-id")
    )


def instance_services(tenant: Tenant) -> dict[str, str]:
    """The services of the plans the tenant's instances (deleted ones too) run on, each with
    its name as people read it (the key when its plans name none), in the order of the names."""
    names: dict[str, str] = {}
    for service, name in (
        Instance.objects.for_tenant(tenant)
        .values_list("plan_version__plan__service", "plan_version__plan__service_name")
        .distinct()
    ):
        if name or service not in names:
            names[service] = name or service
    return dict(sorted(names.items(), key=lambda item: item[1].casefold()))


def instance_counts_by_state(tenant: Tenant) -> list[tuple[str, str, int]]:
    """(state, label, how many) of the tenant's instances, in the order of Instance.State;
    states with none, and deleted instances, left out."""
    counts = dict(
        Instance.objects.for_tenant(tenant)
        .active()
        .order_by()
        .values_list("state")
        .annotate(count=Count("pk"))
    )
    return [
        (state, label, counts[state]) for state, label in Instance.State.choices if state in counts
    ]


DEGRADED_SHOWN = 10


@dataclass(frozen=True)
class DegradedDigest:
    instances: list[Instance]  # the longest degraded few
    total: int


def instances_degraded(tenant: Tenant) -> DegradedDigest:
    """The tenant's running instances that do not serve as they should, the longest degraded
    first (at most DEGRADED_SHOWN; only what the dashboard shows of them), and how many are
    (counted in the same query)."""
    rows = list(
        Instance.objects.for_tenant(tenant)
        .filter(state=Instance.State.RUNNING, health=Instance.Health.DEGRADED)
        .only("id", "name", "health_reason", "unhealthy_since", "tenant_id")
        .annotate(degraded_total=Window(Count("id")))
        .order_by("unhealthy_since", "id")[:DEGRADED_SHOWN]
    )
    return DegradedDigest(instances=rows, total=rows[0].degraded_total if rows else 0)


@dataclass(frozen=True)
class OperationDigest:
    operations: list[Operation]  # the newest few
    total: int


# What a dashboard row shows: never an operation's encrypted state or parameters.
_OPERATION_ROW = [
    "id",
    "verb",
    "state",
    "created_at",
    "started_at",
    "finished_at",
    "error",
    "plan_version_id",
    "instance__id",
    "instance__name",
]


def _operation_digest(operations: QuerySet[Operation], limit: int) -> OperationDigest:
    rows = list(operations.select_related("instance").only(*_OPERATION_ROW)[:limit])
    for op in rows:  # named as the instance page names it (each spec read once per process)
        labels = verb_labels_of(op.plan_version_id)
        op.verb_label = labels.get(op.verb, op.verb)
    return OperationDigest(operations=rows, total=operations.count())


def operations_running(tenant: Tenant, *, limit: int = 10) -> OperationDigest:
    """The tenant's operations running now, the most recently started first."""
    running = Operation.objects.filter(
        instance__tenant=tenant, state=Operation.State.RUNNING
    ).order_by(F("started_at").desc(nulls_last=True), "-created_at")
    return _operation_digest(running, limit)


def operations_failed_recently(
    tenant: Tenant, *, days: int = 7, limit: int = 10
) -> OperationDigest:
    """The tenant's operations that failed in the last `days` days, the latest first."""
    failed_at = Coalesce("finished_at", "created_at")
    failed = (
        Operation.objects.filter(instance__tenant=tenant, state=Operation.State.FAILED)
        .alias(failed_at=failed_at)
        .filter(failed_at__gte=timezone.now() - timedelta(days=days))
        .order_by("-failed_at")
    )
    return _operation_digest(failed, limit)


def operations_pending(instance: Instance) -> QuerySet[Operation]:
    """The instance's queued and running operations, oldest first."""
    return instance.operations.filter(state__in=_PENDING).order_by("created_at")


def operation_last_ended(instance: Instance) -> Operation | None:
    """The instance's operation that ended last, read as the page says it ended."""
    return (
        instance.operations.exclude(state__in=_PENDING)
        .only("instance", "verb", "state")
        .order_by(F("finished_at").desc(nulls_last=True), "-created_at", "-pk")
        .first()
    )


def _forgetting() -> Exists:
    """Whether a deleteBackup of the outer query's snapshot is queued or running: it is no
    longer restorable."""
    return Exists(
        Operation.objects.filter(
            instance_id=OuterRef("instance_id"), verb="deleteBackup", state__in=_PENDING
        )
        .annotate(target=Cast(KT("arguments__forget_snapshot"), BigIntegerField()))
        .filter(target=OuterRef("pk"))
    )


def _restorable(snapshots: QuerySet) -> QuerySet:
    return snapshots.annotate(forgetting=_forgetting()).values_list("status", "forgetting")


def snapshot_restorable(snapshot: Snapshot) -> tuple[str, bool]:
    """The snapshot's status as stored now, and whether a deleteBackup of it is queued or
    running; one statement."""
    return _restorable(Snapshot.objects.filter(pk=snapshot.pk)).get()


RESTORE_FORGETTING = "This backup is being deleted: it can no longer be restored."
RESTORE_AGAIN_DELETED = (
    "The backup this instance was restored from was deleted: the restore cannot run again."
    " Delete this instance, or restore another backup into a new one."
)


def restore_again_refusal(instance: Instance, restore: Operation) -> str | None:
    """Why the restore that made the instance cannot run again (a Retry): the backup it read
    (named by its `$sys`) is being deleted, or was; None when it can."""
    sys = restore.arguments.get("sys") or {}
    found = _restorable(
        Snapshot.objects.filter(
            tenant_id=instance.tenant_id,
            source_instance_id=str(sys.get("sourceInstanceId", "")),
            name=str((sys.get("restore") or {}).get("snapshotId", "")),
        )
    ).first()
    status, forgetting = found or (Snapshot.Status.DELETED, False)
    if status == Snapshot.Status.DELETED:
        return RESTORE_AGAIN_DELETED
    return RESTORE_FORGETTING if forgetting else None


def snapshot_restoring(snapshot: Snapshot) -> bool:
    """Whether a restore from the snapshot is queued or running (into a new instance)."""
    return Operation.objects.filter(
        instance__tenant_id=snapshot.tenant_id,
        verb="restore",
        state__in=_PENDING,
        arguments__sys__sourceInstanceId=snapshot.source_instance_id,
        arguments__sys__restore__snapshotId=snapshot.name,
    ).exists()


def operations_pending_in(tenant: Tenant) -> bool:
    """Whether an operation is queued or running on any of the tenant's instances."""
    return Operation.objects.filter(instance__tenant=tenant, state__in=_PENDING).exists()


NAMED_AT_MOST = 5


def tenant_delete_blockers(tenants: Sequence[Tenant]) -> dict[int, list[str]]:
    """What in deployments keeps each of `tenants` from being deleted, as sentences by tenant
    id: its instances not deleted (named, the first few) and its operations queued or running
    (registered with accounts' `tenant_delete`). Two queries, however many tenants."""
    ids = [tenant.pk for tenant in tenants]
    said: dict[int, list[str]] = {}
    live = (
        Instance.objects.filter(tenant_id__in=ids)
        .active()
        .annotate(
            rank=Window(RowNumber(), partition_by=[F("tenant_id")], order_by=F("name").asc()),
            count=Window(Count("pk"), partition_by=[F("tenant_id")]),
        )
        .filter(rank__lte=NAMED_AT_MOST)
        .order_by("tenant_id", "rank")
        .values_list("tenant_id", "name", "count")
    )
    named: dict[int, tuple[list[str], int]] = {}
    for tenant_id, name, count in live:
        named.setdefault(tenant_id, ([], count))[0].append(name)
    for tenant_id, (names, count) in named.items():
        more = f" and {count - len(names)} more" if count > len(names) else ""
        noun, them = ("deployment is", "it") if count == 1 else ("deployments are", "them")
        said[tenant_id] = [
            f"{count} {noun} not deleted ({', '.join(names)}{more}): delete {them} first."
        ]
    pending = (
        Operation.objects.filter(instance__tenant_id__in=ids, state__in=_PENDING)
        .values_list("instance__tenant_id")
        .annotate(count=Count("pk"))
        .order_by()
    )
    for tenant_id, count in pending:
        noun, them = ("operation is", "it") if count == 1 else ("operations are", "them")
        said.setdefault(tenant_id, []).append(
            f"{count} {noun} queued or running: wait for {them} to finish."
        )
    return said


# --- catalog ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogPlan:
    """A plan as the catalog shows it: its latest version's spec, main limits, the cost of an
    instance with the default parameters (None when the defaults cannot be priced) and the
    unit prices, all at the prices the tenant pays."""

    plan: Plan
    version: PlanVersion
    spec: PlanSpec
    limits: list[tuple[str, str]]
    cost: Cost | None
    prices: pricing.PriceList  # as the tenant pays them now, and the change coming to them


def plans_available(tenant: Tenant) -> list[tuple[PlanVersion, PlanSpec]]:
    """The plans `tenant` may create instances of, each with its latest version: every plan
    with a released version (no plan is restricted to some tenants yet)."""
    versions = (
        PlanVersion.objects.select_related("plan")
        .prefetch_related("plan__prices")
        .order_by("plan_id", "-number")
        .distinct("plan_id")
    )
    return [(version, plan_spec(version)) for version in versions]


def plan_cells(spec: PlanSpec) -> frozenset[str] | None:
    """The names of the cells some organization may run instances of the plan on: its spec's
    `x-opsdeck.entitlements.cells`, widened by the organizations' overrides of the plan that
    name others; None when neither limits them (any cell)."""
    allowed = spec.entitlements.get("cells")
    if allowed is None:
        return None
    names = set(allowed)
    for limits in PlanOverride.objects.filter(plan__key=spec.key).values_list("limits", flat=True):
        if isinstance(limits, dict) and "cells" in limits:
            if limits["cells"] is None:  # the override lifts the limit
                return None
            names.update(limits["cells"])
    return frozenset(names)


def plans_for_cell(name: str) -> list[PlanSpec]:
    """The latest spec of every plan whose instances may run on the cell `name` (`plan_cells`:
    those whose `x-opsdeck.entitlements.cells` and overrides leave it out are not)."""
    versions = PlanVersion.objects.order_by("plan_id", "-number").distinct("plan_id")
    specs = [plan_spec(version) for version in versions]
    return [s for s in specs if (cells := plan_cells(s)) is None or name in cells]


def cells_for_plan(spec: PlanSpec) -> list[Cell]:
    """The registered cells instances of the plan may run on (`plan_cells`), by name."""
    cells = Cell.objects.order_by("name")
    allowed = plan_cells(spec)
    return list(cells if allowed is None else cells.filter(name__in=allowed))


def plan_digest_latest(key: str) -> str | None:
    """The digest of the latest version of the plan `key` (None before its first)."""
    versions = PlanVersion.objects.filter(plan__key=key).order_by("-number")
    return versions.values_list("digest", flat=True).first()


def plan_available(tenant: Tenant, key: str) -> tuple[PlanVersion, PlanSpec] | None:
    """The plan `key` with its latest version, if `tenant` may create instances of it."""
    version = (
        PlanVersion.objects.select_related("plan")
        .prefetch_related("plan__prices")
        .filter(plan__key=key)
        .order_by("-number")
        .first()
    )
    return (version, plan_spec(version)) if version is not None else None


def default_values(spec: PlanSpec) -> dict[str, Any]:
    """The main service's parameter defaults (a plan's price in the catalog is theirs)."""
    return {p.key: p.default for p in spec.main.parameters if p.default is not None}


def _main_limits(spec: PlanSpec) -> list[tuple[str, str]]:
    limits = []
    if spec.max_instances is not None:
        limits.append(("Instances per organization", f"up to {spec.max_instances}"))
    for parameter in spec.main.parameters:
        if parameter.type != "Float64":
            continue
        if parameter.options:
            limits.append((parameter.name, ", ".join(parameter.options)))
        elif parameter.limits and {"min", "max"} <= set(parameter.limits):
            low, high = (number_text(parameter.limits[k]) for k in ("min", "max"))
            limits.append((parameter.name, f"{low} to {high}"))
    return limits


@dataclass(frozen=True)
class CatalogService:
    key: str  # `x-opsdeck.service`
    name: str  # its plans' `service_name` (their specs' `x-opsdeck.serviceName`), else the key
    plans: list[CatalogPlan]


def catalog(tenant: Tenant) -> list[CatalogService]:
    """The plans `tenant` may use, grouped by service (`x-opsdeck.service`), by name."""
    from deployments import metering  # metering reads plan specs through this module

    services: dict[str, list[CatalogPlan]] = {}
    available = plans_available(tenant)
    plans = [version.plan for version, _ in available]
    prices = pricing.prices_for(tenant, plans)
    shown = pricing.price_lists(tenant, plans)
    for version, spec in available:
        try:
            cost = metering.estimate(
                version.plan, spec, default_values(spec), tenant=tenant,
                prices=prices[version.plan_id],
            )  # fmt: skip
        except metering.UsageError:
            cost = None
        entry = CatalogPlan(
            version.plan, version, spec, _main_limits(spec), cost, shown[version.plan_id]
        )
        services.setdefault(version.plan.service, []).append(entry)
    grouped = []
    for key, plans in services.items():
        name = next((p.plan.service_name for p in plans if p.plan.service_name), key)
        grouped.append(CatalogService(key, name, sorted(plans, key=lambda p: p.plan.name)))
    return sorted(grouped, key=lambda service: service.name.casefold())


# --- instance page ---------------------------------------------------------------------------


def _live_lowered(tenant: Tenant) -> QuerySet[Instance]:
    """The tenant's live instances with their names as the database's constraint compares
    them (`lowered`: PostgreSQL's lower case)."""
    return (
        Instance.objects.filter(tenant=tenant)
        .exclude(state=Instance.State.DELETED)
        .annotate(lowered=Lower("name"))
    )


def _live_named(tenant: Tenant, name: str) -> QuerySet[Instance]:
    """The tenant's live instances called `name`, whatever its case."""
    return _live_lowered(tenant).filter(lowered=Lower(Value(name)))


def instance_named(tenant: Tenant, name: str) -> Instance | None:
    """The tenant's live instance called `name`, whatever its case."""
    return _live_named(tenant, name).first()


def instance_name_free(tenant: Tenant, wanted: str, most: int) -> str:
    """`wanted`, or when another live instance of the tenant is called so (names are one per
    organization, whatever their case), the first of `wanted-2`, `wanted-3`, … none is; cut
    to fit in `most` characters. Two queries, however many are taken: the names compared in
    PostgreSQL's lower case, as the constraint compares them (letter by letter, so a name cut
    short is lowered as its lowered form cut short)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lower(%s)", [wanted])
        (lowered,) = cursor.fetchone()
    taken = set(
        _live_lowered(tenant)
        .filter(lowered__startswith=lowered[: most - 12])
        .values_list("lowered", flat=True)
    )
    number = 1
    while True:
        suffix = f"-{number}" if number > 1 else ""
        if lowered[: most - len(suffix)] + suffix not in taken:
            return wanted[: most - len(suffix)] + suffix
        number += 1


_NOT_ON_PAGES = [
    "plan_version__spec_text", "plan_version__parsed", "cell__kubeconfig",
    "cell__backup_credentials", "created_by__password",
]  # fmt: skip


def instance_for_tenant(tenant: Tenant, instance_id: str) -> Instance | None:
    """One of the tenant's instances (deleted ones too: their snapshots and history remain),
    with its plan version, plan, cell and creator (a user or an API token), but not what its
    pages never show: the version's text (`plan_spec` loads it by id, once per process), the
    cell's encrypted configuration and credentials (read when the cell is called), the
    creator's password."""
    return (
        Instance.objects.for_tenant(tenant)
        .select_related("plan_version__plan", "cell", "created_by", "created_by_token")
        .defer(*_NOT_ON_PAGES)
        .filter(pk=instance_id)
        .first()
    )


@dataclass(frozen=True)
class RestoredFrom:
    """Where a restored instance came from, as its restore was asked."""

    backup: str  # the backup's name
    source_id: str  # the instance the backup was taken of
    source: Instance | None  # that instance, while the tenant still sees it
    target_time: datetime | None  # the point in time it recovered to; None: the backup's end


def instance_restored_from(instance: Instance) -> RestoredFrom | None:
    """The backup (and instance, and point in time) the instance was restored from; None for
    one that was created."""
    restore = (
        Operation.objects.filter(instance=instance, verb="restore")
        .order_by("created_at")
        .values_list("arguments", flat=True)
        .first()
    )
    sys = (restore or {}).get("sys") or {}
    asked = sys.get("restore") or {}
    if not asked.get("snapshotId"):
        return None
    source_id = str(sys.get("sourceInstanceId") or "")
    source = None
    if source_id:
        tenants = Instance.objects.for_tenant(instance.tenant)
        source = tenants.filter(pk=source_id).only("pk", "name", "tenant_id").first()
    target = asked.get("targetTime")
    return RestoredFrom(
        backup=str(asked["snapshotId"]),
        source_id=source_id,
        source=source,
        target_time=parse_datetime(target) if target else None,
    )


def instance_made_by_request(tenant: Tenant, request_id: str, action: str) -> Instance | None:
    """The instance a create or restore form (`action`: "instance.create", "instance.restore")
    sent with `request_id` already made in the tenant, if any (the form again after Back carries
    the same id: the page says what it made)."""
    made = request_target(scope=tenant_scope(tenant), request_id=request_id, action=action)
    if made is None or made[0] != Operation._meta.label_lower:
        return None
    return (
        Instance.objects.for_tenant(tenant)
        .filter(operations__pk=made[1])
        .only("pk", "name", "tenant_id")
        .first()
    )


def instance_now(instance: Instance) -> tuple[Instance, bool]:
    """The instance as it is now, and whether an operation is pending on it, in one query
    while it has not changed since it was read: one read before an operation ended would
    show the operation's end as not come (and a page would not follow it any more)."""
    changed_at, pending = (
        Instance.objects.filter(pk=instance.pk)
        .annotate(pending=Exists(operations_pending(instance)))
        .values_list("updated_at", "pending")
        .get()
    )
    if changed_at != instance.updated_at:
        instance = instance_for_tenant(instance.tenant, instance.pk) or instance
    return instance, pending


# What the Operations tab shows of an operation (of its instance, which the page has), and who
# asked for it by their address alone.
OPERATION_LISTED = ("instance", "verb", "state", "created_at", "started_at", "finished_at")
OPERATION_LISTED += ("cancel_reason", "error", "requested_by__email")
OPERATION_LISTED += ("requested_by_token__name", "requested_by_token__prefix")


def operations_with_runs(instance: Instance) -> QuerySet[Operation]:
    """The instance's operations, newest first, each with its task runs (two queries in all),
    read as the Operations tab shows them: the requesters' accounts, the values each operation
    ran with, the encrypted engine state and the rendered objects stay in the database."""
    runs = TaskRun.objects.defer("object").order_by("started_at", "id")
    return (
        instance.operations.select_related("requested_by", "requested_by_token")
        .only(*OPERATION_LISTED)
        .prefetch_related(Prefetch("task_runs", queryset=runs))
        .order_by("-created_at", "-pk")  # one order for each page (`operation_listed_page`)
    )


def snapshots_of_instance(instance: Instance, *, deleted: bool = False) -> QuerySet[Snapshot]:
    """The instance's snapshots, newest first, deleted ones left out unless `deleted`."""
    found = Snapshot.objects.filter(tenant=instance.tenant, instance=instance)
    if not deleted:
        found = found.exclude(status=Snapshot.Status.DELETED)
    return found.order_by("-created_at", "-pk")


def _listed_page(newest_first: QuerySet, row, per_page: int) -> int:
    """The page (`per_page` a page) of a list ordered newest first, then by descending key,
    that lists `row`: one count of the rows before it."""
    at = row.created_at
    newer = newest_first.filter(Q(created_at__gt=at) | Q(created_at=at, pk__gt=row.pk))
    return newer.count() // per_page + 1


def snapshot_listed_page(instance: Instance, snapshot: Snapshot, per_page: int) -> int:
    """The page of the Backups tab (`per_page` a page, newest first) that lists `snapshot`."""
    return _listed_page(snapshots_of_instance(instance), snapshot, per_page)


def operation_listed_page(instance: Instance, operation: Operation, per_page: int) -> int:
    """The page of the Operations tab (`per_page` a page, newest first: `operations_with_runs`)
    that lists `operation`."""
    return _listed_page(instance.operations.all(), operation, per_page)


def snapshots_listed(instance: Instance) -> QuerySet[Snapshot]:
    """The instance's snapshots as its Backups tab lists them, each with `forgetting`:
    whether a deleteBackup of it is queued or running (it is no longer restorable), and
    `failure`: what its backup operation ended with (why a failed one failed)."""
    return (
        snapshots_of_instance(instance)
        .only(
            "name", "status", "created_at", "taken_at", "expires_at", "operation_id"
        )  # what it shows
        .annotate(forgetting=_forgetting(), failure=F("operation__error"))
    )


def snapshots_restorable(instance: Instance) -> QuerySet[Snapshot]:
    """The instance's snapshots a restore can start from: the completed ones (a failed one,
    or one still being taken, holds nothing to restore) but those being deleted."""
    return snapshots_of_instance(instance).filter(~_forgetting(), status=Snapshot.Status.COMPLETED)


def snapshot_of_instance(
    instance: Instance, snapshot_id: int, *, deleted: bool = False
) -> Snapshot | None:
    """One of the instance's snapshots; a deleted one only when `deleted`."""
    return snapshots_of_instance(instance, deleted=deleted).filter(pk=snapshot_id).first()


def snapshot_values(snapshot: Snapshot, at: datetime | None = None) -> dict:
    """The parameter values a restore of `snapshot` starts from, passwords aside: the
    snapshot's own (older snapshots without them take their source instance's). A restore to
    the point in time `at` recovers the data as it was then, which may need more than the
    snapshot's (a disk grown after it): each value its source ran with at that instant, as the
    last of its operations to succeed by then left it, takes the place of the snapshot's."""
    if snapshot.parameters:
        values = dict(snapshot.parameters)
    else:
        source = snapshot.instance
        values = dict(source.parameters) if source is not None else {}
    if at is not None:
        then = (
            Operation.objects.filter(
                instance_id=snapshot.source_instance_id,
                state=Operation.State.SUCCEEDED,
                finished_at__lte=at,
            )
            .exclude(parameters={})
            .order_by("-finished_at")
            .values_list("parameters", flat=True)
            .first()
        )
        values.update({key: value for key, value in (then or {}).items() if key in values})
    return values


def restore_changes(snapshot: Snapshot, given: dict, at: datetime | None) -> dict:
    """The changes the restore form's values `given` ask of a restore of `snapshot`. The form
    offers the backup's values: to a point in time `at`, one left as the backup holds it is no
    change, so the instance gets its value as it was then (`snapshot_values`)."""
    if at is None:
        return given
    own = snapshot_values(snapshot)
    return {key: value for key, value in given.items() if str(value) != str(own.get(key))}


def restore_values(snapshot: Snapshot, given: dict, at: datetime | None = None) -> dict | None:
    """Every parameter's value in the instance a restore of `snapshot` (to the point in time
    `at`) with the form's values `given` would make (a password the backup keeps is generated
    here: no price reads one); None when the changes are not valid. The service's own check
    (`services.snapshot_restore`) says why."""
    spec = plan_spec(snapshot.plan_version)
    try:
        return validate_parameters(
            spec.main.parameters,
            restore_changes(snapshot, given, at),
            current=snapshot_values(snapshot, at),
        )
    except ParameterErrors:
        return None


# The states in which an instance archives no more of its changes.
ARCHIVES_NOTHING = (Instance.State.STOPPED, Instance.State.DELETING, Instance.State.DELETED)


def recovery_window(snapshot: Snapshot, now: datetime) -> tuple[datetime, datetime]:
    """The instants a point-in-time restore from `snapshot` may target: from the snapshot (or
    the oldest recoverable instant the operator reports for its source instance, when later:
    older data has left the object store) to now (or the newest recoverable instant the
    operator reports, when the plan's status maps one). Both come from the source's observed
    status (`recoverableFrom`, `recoverableUntil`). A source stopped or deleted archives
    nothing since: the window ends when it stopped, or its delete began."""
    low, high = snapshot.taken, now
    observed = {}
    if snapshot.instance_id is not None:
        observed, state = Instance.objects.filter(pk=snapshot.instance_id).values_list(
            "observed", "state"
        ).first() or ({}, "")
        if state in ARCHIVES_NOTHING:
            # When it last went from archiving to not (a stopped instance deleted later
            # stopped archiving when it stopped).
            ended = (
                InstanceStateChange.objects.filter(
                    instance_id=snapshot.instance_id, to_state__in=ARCHIVES_NOTHING
                )
                .exclude(from_state__in=ARCHIVES_NOTHING)
                .order_by("-at")
                .values_list("at", flat=True)
                .first()
            )
            if ended is not None and ended < high:
                high = ended
        observed = observed or {}
    reported_low = _instant(observed.get("recoverableFrom"))
    reported_high = _instant(observed.get("recoverableUntil"))
    if reported_low is not None and reported_low > low:
        low = reported_low
    if reported_high is not None and reported_high < high:
        high = reported_high
    return low, max(low, high)


def _instant(value: Any) -> datetime | None:
    """An aware instant from observed RFC 3339 text; None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        moment = parse_datetime(value)
    except ValueError:
        return None
    return moment if moment is not None and moment.utcoffset() is not None else None


def instance_audit_events(instance: Instance) -> QuerySet[AuditEvent]:
    """The audit events about an instance: those aimed at it, at its snapshots, the restores
    from one of its snapshots (their payload names it as their source), and the cancels of its
    operations (an operation's end is on the Operations tab). Each kind is found along an index
    (`audit_target`, `audit_source`), not by reading the organization's log."""
    events = AuditEvent.objects.for_tenant(instance.tenant)
    kind = events.order_by()  # each kind's events, found in any order
    snapshots = Snapshot.objects.filter(instance=instance)
    operations = Operation.objects.filter(instance=instance)
    about = [
        kind.filter(target_type="instance", target_id=instance.pk),
        kind.filter(target_type="snapshot", target_id__in=_keys(snapshots)),
        kind.filter(payload__has_key="source", payload__source=instance.pk),  # `audit_source`
        kind.filter(
            target_type="operation", target_id__in=_keys(operations), action="operation.cancel"
        ),
    ]
    found = about[0].union(*about[1:], all=True).values("pk")
    return events.filter(pk__in=found)


def _keys(rows: QuerySet) -> QuerySet:
    """The primary keys of `rows` as an audit event's `target_id` holds them: as text."""
    return rows.annotate(key=Cast("pk", output_field=CharField())).values("key")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    message: str


@dataclass(frozen=True)
class ObservedStatus:
    """What the operator last reported about an instance, in Opsdeck's terms."""

    phase: str
    ready: int | None
    total: int | None
    primary: str
    conditions: list[Condition]
    at: datetime | None
    # What the plan's `x-opsdeck.status.fields` maps: the page shows only those (a plan whose
    # status object has no phase or primary, a StatefulSet say, shows no such row).
    shown: frozenset[str] = frozenset()
    # Not read for longer than the status sync lets a stored status age (`status_unread_after`):
    # what is shown, health included, is what the cluster last reported.
    unread: bool = False


def status_unread_after() -> timedelta:
    """How old a stored status is once the status sync has failed to read it for three rounds:
    the sync (beat, every 30 s) stores an unchanged status again once it is
    OPSDECK_STATUS_CONFIRM_AFTER old, so one older than that and 90 s was not read since (the
    cell did not answer, or no longer holds the instance's object)."""
    return timedelta(seconds=settings.OPSDECK_STATUS_CONFIRM_AFTER + 90)


def observed_status(instance: Instance) -> ObservedStatus | None:
    """The instance's observed status, None until the status sync has seen it
    (`deployments.status`: `{"phase", "ready", "total", "primary", "conditions": [{"type",
    "status", "message"}]}`, read at `observed_at`), and None once the instance is deleted
    (what was last seen of it is not its status). A key the plan maps but the object left out
    shows as unknown, but for the ready count: Kubernetes leaves a count of zero out."""
    observed = instance.observed or {}
    if not observed or instance.state == Instance.State.DELETED:
        return None
    conditions = [
        Condition(str(c.get("type", "")), str(c.get("status", "")), str(c.get("message", "")))
        for c in observed.get("conditions") or []
        if isinstance(c, dict)
    ]
    at = instance.observed_at
    ready = observed.get("ready", 0)
    return ObservedStatus(
        phase=str(observed.get("phase") or ""),
        ready=ready if isinstance(ready, int) else None,
        total=observed.get("total") if isinstance(observed.get("total"), int) else None,
        primary=str(observed.get("primary") or ""),
        conditions=conditions,
        at=at,
        shown=frozenset(
            (plan_spec(instance.plan_version).extensions.get("status") or {}).get("fields") or ()
        ),
        unread=at is not None and at < timezone.now() - status_unread_after(),
    )


@dataclass(frozen=True)
class ParameterShown:
    key: str
    name: str
    value: str  # "set, hidden" for a Password


HIDDEN_VALUE = "set, hidden"


def instance_parameters_shown(instance: Instance) -> list[ParameterShown]:
    """The instance's parameters as the page lists them, in the spec's order: Password values
    are never read (they are always set: a missing one is generated), and the others the spec
    keeps out of view (`export: false`) are left out."""
    spec = plan_spec(instance.plan_version)
    shown = []
    for parameter in spec.main.parameters:
        if parameter.type == "Password":
            value = HIDDEN_VALUE
        elif parameter.export and parameter.key in instance.parameters:
            value = format_value(parameter, instance.parameters[parameter.key])
        else:
            continue
        shown.append(ParameterShown(parameter.key, parameter.name or parameter.key, value))
    return shown


# The verbs offered as buttons on the instance page, in this order, with their labels.
BUTTONS = {
    "stop": "Stop",
    "start": "Start",
    "restart": "Restart",
    "failover": "Switchover",
    "backup": "Back up now",
}


@dataclass(frozen=True)
class InstanceAction:
    """A button on the instance page: `refusal` says why the instance's state forbids it now."""

    verb: str
    label: str
    description: str = ""
    refusal: str | None = None
    parameters: list[Parameter] = field(default_factory=list)
    confirm: str | None = None  # the spec's question (`x-opsdeck.confirm`); None: Opsdeck's

    @property
    def in_dialog(self) -> bool:
        """Whether it asks for input or confirmation first."""
        return bool(self.parameters) or self.verb in {"modify", "delete"}

    @property
    def warns(self) -> str:
        """What the button asks before it is sent, or its dialog says beside its fields: the
        spec's words, else Opsdeck's for what interrupts the service (a stray click must not
        stop a production database); "" when it asks nothing."""
        return self.confirm if self.confirm is not None else INTERRUPTS.get(self.verb, "")

    @property
    def asks(self) -> str:
        """What a button sent at once asks first ("" when nothing)."""
        return self.warns if not self.in_dialog else ""

    @property
    def keeps(self) -> str:
        """The answer that sends nothing: a switchover's keeps it running too, as "Not now"."""
        return "Keep it running" if self.verb in {"stop", "restart"} else "Not now"


# The actions that interrupt the service, and what the page asks before sending one.
INTERRUPTS = {
    "stop": "Stop this instance? Its servers shut down and refuse connections until you start it "
    "again; its data stays.",
    "restart": "Restart this instance? Its servers restart, and the connections open to them drop.",
    "failover": "Switch this instance's primary to a replica? The connections open to the "
    "primary drop.",
}


def instance_retry_source(instance: Instance) -> Operation | None:
    """The operation "Retry" runs again: the one that left the instance failed — it failed, or
    was cancelled, after the cluster took some of it — when its verb is one Retry runs
    (`lifecycle.RETRIED`: a create or restore, a stop, start, restart or failover); None
    otherwise. Found by the change into failed that it made, as a roll back's source is, so
    that what ran since on a failed instance (a backup forgotten) does not hide it."""
    if instance.state != Instance.State.FAILED:
        return None
    change = (
        instance.history.filter(to_state=Instance.State.FAILED, operation__isnull=False)
        .select_related("operation")
        .order_by("-at", "-id")
        .first()
    )
    if change is not None:
        failed = change.operation
    else:  # no change into failed names its operation: the last operation that ran
        failed = instance.operations.exclude(started_at=None).order_by("-created_at").first()
    ended = {Operation.State.FAILED, Operation.State.CANCELLED}
    if failed is None or failed.verb not in lifecycle.RETRIED or failed.state not in ended:
        return None
    return failed


def action_refusal(
    instance: Instance,
    verb: str,
    state: str = "",
    *,
    custom: bool = False,
    retry: bool = False,
    parameters: dict | None = None,
) -> str | None:
    """Why `verb` cannot start on the instance from `state` (default: its state now; another
    one is what its queued operations will leave, and the reason says so), naming the verb as
    its page does (`lifecycle.refusal`); None when it can."""
    label = verb_labels(instance.plan_version).get(verb, "")
    refusal = lifecycle.refusal(
        verb, state or instance.state, custom=custom, retry=retry, label=label,
        queued=bool(state) and state != instance.state,
    )  # fmt: skip
    return refusal or _requirement_refusal(instance, verb, parameters)


def _requirement_refusal(instance: Instance, verb: str, parameters: dict | None) -> str | None:
    """The spec's sentence when what the verb requires of the instance's parameters
    (`x-opsdeck.requires`) does not hold on `parameters` (default: those it has now; a
    request passes those it will have once the operations queued before it have run); an
    expression that fails to run counts as not holding."""
    service = plan_spec(instance.plan_version).main
    spec_verb = service.verbs.get(verb)  # its own: not a roll back's or an upgrade's modify
    requirement = spec_verb.requires if spec_verb is not None else None
    if requirement is None:
        return None
    given = instance.parameters if parameters is None else parameters
    values = cel_values(service.parameters, given)
    try:
        holds = evaluate_cel(requirement.when, "var", values).value is True
    except (ProgramError, ProgramLimitError) as exc:
        log.warning("instance %s: %s's requirement did not run: %s", instance.pk, verb, exc)
        holds = False
    return None if holds else requirement.message


_SECRET_READ = re.compile(rf"\$secret\.({SECRET_NAME})")


def secrets_read(text: str) -> set[str]:
    """The names of the platform secrets a spec's text reads (`$secret.NAME`)."""
    return set(_SECRET_READ.findall(text))


def secret_readers(names: Collection[str]) -> dict[str, list[PlanVersion]]:
    """For each platform secret name, the plan versions that read it (`$secret.<name>`) and may
    still run: the newest of its plan (what a create runs), or one a live instance is on. In
    three statements, whatever the number of names."""
    readers: dict[str, list[PlanVersion]] = {name: [] for name in names}
    if not readers:
        return readers
    mentions = Q()
    for name in readers:
        mentions |= Q(spec_text__contains=f"$secret.{name}")
    versions = [
        (v, read)
        for v in PlanVersion.objects.filter(mentions)
        .select_related("plan")
        .order_by("plan__key", "number")
        if (read := secrets_read(v.spec_text) & readers.keys())
    ]
    if not versions:
        return readers
    newest = dict(
        PlanVersion.objects.filter(plan_id__in={v.plan_id for v, _ in versions})
        .values("plan_id")
        .annotate(number=Max("number"))
        .values_list("plan_id", "number")
    )
    on = set(
        Instance.objects.active()
        .filter(plan_version__in=[v for v, _ in versions])
        .values_list("plan_version_id", flat=True)
    )
    for version, read in versions:
        if version.pk in on or version.number == newest[version.plan_id]:
            for name in sorted(read):
                readers[name].append(version)
    return readers


def instance_actions(instance: Instance, allowed: frozenset[str]) -> list[InstanceAction]:
    """The actions the instance page offers to a member whose role allows `allowed`: modify,
    the plan's lifecycle verbs, a retry of a failed create or restore, its custom workflows, and
    delete last. A deleted instance offers none (its page says why once, not for each)."""
    if instance.state == Instance.State.DELETED:
        return []
    spec = plan_spec(instance.plan_version)
    verbs = spec.main.verbs
    actions = []
    retry_source = instance_retry_source(instance)  # the failed create or restore, to retry

    def offer(verb: str, label: str, *, custom: bool = False, retry: bool = False, **extra):
        if lifecycle.rule(verb, custom=custom).action not in allowed:
            return
        refusal = action_refusal(instance, verb, custom=custom, retry=retry)
        if verb == "delete" and instance.deletion_protected and not refusal:
            refusal = DELETION_PROTECTED
        if verb == "backup" and not refusal and backup_pending(instance):
            refusal = BACKUP_PENDING
        if verb == "restore" and retry and not refusal:
            refusal = restore_again_refusal(instance, retry_source)
        actions.append(InstanceAction(verb, label, refusal=refusal, **extra))

    if "modify" in verbs:
        offer("modify", "Modify")
    for verb, label in BUTTONS.items():
        if verb in verbs:
            offer(verb, label, confirm=verbs[verb].confirm)
    retry = retry_source.verb if retry_source is not None else None
    if retry and retry in verbs:
        offer(retry, "Retry", retry=True, description=f"Run the failed {retry} again.")
    for verb in verbs.values():
        if verb.custom:
            offer(
                verb.name,
                verb.display_name or verb.name,
                custom=True,
                description=verb.description,
                parameters=verb.parameters,
                confirm=verb.confirm,
            )
    offer("delete", "Delete")
    return actions


# How the page names the verbs that are not buttons (custom ones use their display name).
VERB_LABELS = {
    **BUTTONS,
    "backup": "Backup",
    "create": "Create",
    "modify": "Modify",
    "restore": "Restore",
    "deleteBackup": "Delete backup",
    "applyBackupRetention": "Apply backup retention",
    "delete": "Delete",
}


def verb_labels(version: PlanVersion) -> dict[str, str]:
    """Each verb of the plan version as the operations timeline names it (with Opsdeck's own
    upgrade and roll back)."""
    return _verb_labels(plan_spec(version))


def verb_labels_of(version_id: int) -> dict[str, str]:
    """`verb_labels` of a plan version by its id, from the spec loaded once per process."""
    return _verb_labels(plan_version_loaded(version_id).spec)


def parameter_labels(version: PlanVersion) -> dict[str, str]:
    """Each parameter of the plan version, the instance's and its verbs' own, by key: the name
    its forms show."""
    spec = plan_spec(version)
    verbs = [p for verb in spec.main.verbs.values() for p in verb.parameters]
    return {p.key: p.name or p.key for p in [*verbs, *spec.main.parameters]}


def _verb_labels(spec: PlanSpec) -> dict[str, str]:
    verbs = spec.main.verbs.values()
    labels = {v.name: VERB_LABELS.get(v.name) or v.display_name or v.name for v in verbs}
    return {**labels, "upgrade": "Upgrade", "rollback": "Roll back"}


# --- backup schedules ---

RETENTION_MAX_DAYS = 3650  # what any schedule may keep backups for, whatever the plan


def backup_retention_most(instance: Instance) -> int:
    """The most days the instance's backups may be kept, as its schedule's form says: the
    tenant's plan's `max_backup_retention_days` (with its override), else RETENTION_MAX_DAYS.
    (The schedule's service refuses more with the plan's own words.)"""
    limit = entitlements.limits_for(
        instance.tenant, instance.plan_version.plan
    ).max_backup_retention_days
    return RETENTION_MAX_DAYS if limit is None else min(limit, RETENTION_MAX_DAYS)


def backup_schedule_default(instance: Instance, *, now: datetime | None = None) -> BackupSchedule:
    """An unsaved schedule with the plan's `backupConfiguration`: every `backupPeriodInHours`,
    snapshots kept `backupRetentionInDays`; enabled when the plan has one and can back up."""
    spec = plan_spec(instance.plan_version)
    interval = schedules.plan_period_hours(spec.main.backup)
    now = now or timezone.now()
    return BackupSchedule(
        instance=instance,
        interval_hours=interval,
        retention_days=schedules.plan_retention_days(spec.main.backup),
        enabled=(
            spec.main.backup is not None
            and spec.main.backup.get("backupPeriodInHours") != 0
            and "backup" in spec.main.verbs
        ),
        next_run_at=schedules.slot_after(after=now, interval_hours=interval, cron=""),
    )


def backup_schedule_of(instance: Instance) -> BackupSchedule:
    """The instance's schedule; the plan's default one (unsaved) for an instance made before
    schedules existed, until beat saves it."""
    found = BackupSchedule.objects.filter(instance=instance).first()
    return found or backup_schedule_default(instance)


def last_backup_taken(instance: Instance) -> bool:
    """Whether deleting the instance takes a last backup first: its plan says
    `snapshotBeforeDeletion`, has a backup verb, and the instance runs (a stopped or failed one
    cannot be backed up)."""
    spec = plan_spec(instance.plan_version)
    return bool(
        (spec.main.backup or {}).get("snapshotBeforeDeletion")
        and "backup" in spec.main.verbs
        and instance.state in {Instance.State.RUNNING, Instance.State.UPDATING}
    )


def backup_retention_unapplied(instance: Instance, schedule: BackupSchedule) -> int | None:
    """The days the cluster still keeps backups when the schedule's retention never reached it
    (its apply was cancelled or failed) and none is on its way; None otherwise."""
    applied = schedule.retention_days_applied
    if applied is None or applied == schedule.retention_days:
        return None
    if operations_pending(instance).filter(verb=lifecycle.RETENTION_APPLY).exists():
        return None
    return applied


def backup_retention_days(instance: Instance) -> int:
    """How long the instance's snapshots are kept: its schedule's days, else the plan's."""
    days = (
        BackupSchedule.objects.filter(instance=instance)
        .values_list("retention_days", flat=True)
        .first()
    )
    return days or backup_schedule_default(instance).retention_days


MASKED = "••••••"  # what a URI shows in place of the password


@dataclass(frozen=True)
class Connection:
    """How to reach an instance: its main endpoint and the user, database and URI scheme the
    spec names (`x-opsdeck.connection`); empty strings for what the spec does not say."""

    host: str
    port: str
    database: str
    user: str
    scheme: str
    has_password: bool

    def uri(self, password: str | None = MASKED) -> str:
        """The URI to connect with: the password masked unless given, or left out (None: the
        client asks for it); "" without a scheme."""
        if not self.scheme or not self.host:
            return ""
        user = quote(self.user, safe="")
        if password is None:
            credentials = f"{user}@" if self.user else ""
        else:
            secret = password if password == MASKED else quote(password, safe="")
            # A password without a user (Redis and the like) is written `scheme://:password@host`.
            credentials = f"{user}:{secret}@" if self.user or self.has_password else ""
        port = f":{self.port}" if self.port else ""
        database = f"/{quote(self.database, safe='')}" if self.database else ""
        return f"{self.scheme}://{credentials}{self.host}{port}{database}"


def instance_connection(instance: Instance) -> Connection:
    """The instance's connection details: the main service's primary endpoint (the first if
    none is marked) with its host rendered for the instance, and its parameter values."""
    spec = plan_spec(instance.plan_version)
    endpoint = spec.main.primary_endpoint()
    ports = endpoint.get("ports") or []
    mapping = spec.connection
    values = instance.parameters  # plain values only: the password is never read here

    def value(key: str) -> str:
        name = mapping.get(key)
        return str(values.get(name, "")) if name else ""

    return Connection(
        host=endpoint_host(endpoint, instance_id=instance.pk, namespace=instance.namespace),
        port=str(ports[0]) if isinstance(ports, list) and ports else "",
        database=value("database"),
        user=value("user"),
        scheme=str(mapping.get("scheme", "")),
        has_password=bool(mapping.get("password")),
    )


# --- upgrade, roll back, protection ----------------------------------------------------------

DELETION_PROTECTED = "Deletion protection is on; an owner or an admin can turn it off."
BACKUP_PENDING = (
    "A backup of this instance is already queued or running; back up again once it has finished."
)


def backup_pending(instance: Instance) -> bool:
    """Whether a backup of the instance is queued or running: another one asked for now (a
    second click, a second tab) would take much the same data, one after the other."""
    return instance.operations.filter(
        verb="backup", state__in=[Operation.State.QUEUED, Operation.State.RUNNING]
    ).exists()


@dataclass(frozen=True)
class ParameterChange:
    """One difference an upgrade makes: `before` and `after` as the page shows them."""

    key: str
    name: str
    before: str = ""
    after: str = ""


@dataclass(frozen=True)
class UpgradePreview:
    """What upgrading an instance to its plan's newest version changes.

    `added`: new parameters, with the default the instance takes; `removed`: parameters the
    newer version no longer has, with the value dropped; `defaults`: changed defaults (the
    instance keeps its value); `problems`: why the newer version cannot take the instance's
    values (the upgrade is refused while there is one).
    """

    current: PlanVersion
    target: PlanVersion
    added: list[ParameterChange]
    removed: list[ParameterChange]
    defaults: list[ParameterChange]
    problems: dict[str, str]


def _shown(parameter: Parameter, value: Any) -> str:
    return HIDDEN_VALUE if parameter.type == "Password" else format_value(parameter, value)


def upgrades_to(current: PlanVersion, number: int, digest: str) -> bool:
    """Whether version `number` of the current version's plan, its text's digest `digest`, is
    one to upgrade to: newer, and not the same text released again (a change taken back)."""
    return number > current.number and digest != current.digest


def upgrade_preview(
    instance: Instance, values: dict | None = None, target: PlanVersion | None = None
) -> UpgradePreview | None:
    """The upgrade of `instance` to its plan's newest version, or to `target` (the newest
    version of another plan of its service, on a change of plan); None when there is nothing
    to upgrade to. `values`: the instance's values to check, Password ones included (the page
    leaves them out: it never reads a password)."""
    current = instance.plan_version
    target = target or plan_version_latest(current.plan)
    if target is None or (
        target.plan_id == current.plan_id and not upgrades_to(current, target.number, target.digest)
    ):
        return None
    before = {p.key: p for p in plan_spec(current).main.parameters}
    after = {p.key: p for p in plan_spec(target).main.parameters}
    values = values if values is not None else {**instance.parameters}
    added, defaults, problems = [], [], {}
    for key, parameter in after.items():
        name = parameter.name or key
        old = before.get(key)
        if old is None:
            found, default = initial_value(parameter)
            if not found:
                problems[key] = f"{name}: version {target.number} adds it without a default."
            elif parameter.type == "Password":
                added.append(ParameterChange(key, name, after="generated"))
            else:
                added.append(ParameterChange(key, name, after=format_value(parameter, default)))
            continue
        if old.type != parameter.type:
            problems[key] = f"{name}: its type changes from {old.type} to {parameter.type}."
            continue
        if old.default != parameter.default and parameter.type != "Password":
            defaults.append(
                ParameterChange(
                    key,
                    name,
                    before=format_value(old, old.default),
                    after=format_value(parameter, parameter.default),
                )
            )
        if key in values:
            try:
                check(parameter, coerce(parameter, values[key]))
            except ValueError as exc:
                shown = (
                    "its value" if parameter.type == "Password" else _shown(parameter, values[key])
                )
                problems[key] = f"{name}: version {target.number} refuses {shown}. {exc}"
    removed = [
        ParameterChange(key, parameter.name or key, before=_shown(parameter, values.get(key)))
        for key, parameter in before.items()
        if key not in after
    ]
    return UpgradePreview(current, target, added, removed, defaults, problems)


def upgrade_cell_refusal(instance: Instance, target: PlanVersion) -> str | None:
    """Why `target` may not run the instance where it runs: the cells its plan runs in for the
    instance's organization (`x-opsdeck.entitlements.cells`, its override applied, as a create
    is refused elsewhere) leave out the instance's cell, which the version was never checked
    against (`plan_cells_check`): that cell may not serve the kinds it writes. None when they
    name it, or do not limit the cells."""
    cells = entitlements.limits_for(instance.tenant, target.plan).cells
    here = Cell.objects.filter(pk=instance.cell_id).values_list("name", flat=True).get()
    return _cell_refusal(cells, here, instance.name, target.plan.name, target.number)


def upgrade_cell_refusals(instances: list[Instance]) -> dict[str, str]:
    """`upgrade_cell_refusal` of each instance that has one, by instance id, to the newest
    version of its plan (`newest`, a number, annotated; its `cell` and `plan_version.plan`
    loaded): in one statement, however many organizations they belong to."""
    limits = entitlements.limits_among(
        {(instance.tenant_id, instance.plan_version.plan) for instance in instances}
    )
    refusals = {}
    for instance in instances:
        plan = instance.plan_version.plan
        cells = limits[(instance.tenant_id, plan.pk)].cells
        refusal = _cell_refusal(
            cells, instance.cell.name, instance.name, plan.name, instance.newest
        )
        if refusal:
            refusals[instance.pk] = refusal
    return refusals


def _cell_refusal(cells, here: str, name: str, plan: str, number) -> str | None:
    if cells is None or here in cells:
        return None
    return (
        f"Version {number} of the {plan} plan does not run in the {here} cell, where {name} "
        f"runs; it runs in: {', '.join(cells) or 'no cell'}."
    )


def instance_failed_by(instance: Instance) -> Operation | None:
    """The operation whose end left the instance failed: it failed, or was cancelled after the
    cluster took some of it; None when the instance is not failed, or no operation failed it."""
    if instance.state != Instance.State.FAILED:
        return None
    change = (
        instance.history.filter(to_state=Instance.State.FAILED)
        .select_related("operation")
        .order_by("-at", "-id")
        .first()
    )
    return change.operation if change is not None else None


@dataclass(frozen=True)
class SettingLeft:
    """A custom verb's run that stopped part-way through setting `values` (those shown)."""

    operation: Operation
    label: str
    values: list[ParameterShown]


def instance_setting_left(instance: Instance) -> SettingLeft | None:
    """The custom verb that sets instance values (`x-opsdeck.updates`) whose run failed, or was
    cancelled, after the cluster took some of it, when no later run applied values (that verb
    again, a modify, an upgrade, a roll back): the servers may run what it was setting, not
    what the instance holds. None otherwise. While it stands its verb's values are not
    compared (`services._sets_something`): either value may be the one to set."""
    spec = plan_spec(instance.plan_version)
    verbs = spec.main.verbs
    setting = {name for name, verb in verbs.items() if verb.custom and verb.updates}
    if not setting or instance.state in (Instance.State.DELETING, Instance.State.DELETED):
        return None
    # The last run that applied values, or that may have: one refused at its start did not.
    last = (
        instance.operations.filter(verb__in=setting | lifecycle.APPLIES_PARAMETERS)
        .filter(Q(state=Operation.State.SUCCEEDED) | Q(arguments__cluster_touched=True))
        .exclude(finished_at=None)
        .only("verb", "state", "arguments", "created_at")  # what the Overview says of it
        .order_by("-finished_at", "-created_at")
        .first()
    )
    if last is None or last.verb not in setting or last.state == Operation.State.SUCCEEDED:
        return None
    given = last.arguments.get("verb_parameters") or {}  # the plain ones: no Password
    values = [
        ParameterShown(p.key, p.name or p.key, format_value(p, given[source]))
        for target, source in verbs[last.verb].updates.items()
        if (p := spec.parameter(target)) is not None and p.export and source in given
    ]
    label = verb_labels(instance.plan_version).get(last.verb, last.verb)
    return SettingLeft(last, label, values)


def instance_rollback_source(instance: Instance) -> Operation | None:
    """The failed modify, upgrade or roll back that left the instance failed (a roll back
    re-applies what the instance held before it); None when something else failed it."""
    operation = instance_failed_by(instance)
    if operation is None or operation.verb not in lifecycle.ROLLED_BACK:
        return None
    return operation


def rollback_grown(instance: Instance, failed: Operation) -> dict:
    """The grow-only parameters (`x-opsdeck.growOnly`, a volume's size) the failed change
    raised: a roll back keeps them at the failed change's value, since what the cluster took
    of it cannot shrink back (a roll back to the smaller size was refused, and left the
    instance failed for good). No Password is grow-only: nothing is decrypted."""
    spec = plan_spec(instance.plan_version)
    ran = failed.parameters or failed.requested
    return {
        p.key: ran[p.key]
        for p in spec.main.parameters
        if p.grow_only
        and isinstance(ran.get(p.key), int | float)
        and isinstance(instance.parameters.get(p.key), int | float)
        and ran[p.key] > instance.parameters[p.key]
    }


@dataclass(frozen=True)
class LifecycleOffer:
    """The upgrade, roll back and deletion protection controls the instance page offers to a
    member: None (and False) for what the role or the instance does not allow."""

    upgrade: UpgradePreview | None
    upgrade_refusal: str | None
    rollback_of: Operation | None
    rollback_refusal: str | None
    # What a roll back keeps of the change it undoes: the grow-only values it raised, shown.
    rollback_keeps: list[ParameterShown]
    can_protect: bool


def lifecycle_refusal(instance: Instance, verb: str) -> str | None:
    """Why an upgrade or a roll back (`verb`) cannot start now: the instance's state, or
    operations still pending (the version they run on would change under them)."""
    reason = action_refusal(instance, verb)
    if reason is None:
        pending = set(operations_pending(instance).values_list("verb", flat=True))
        if "delete" in pending:
            reason = f"{instance.name} is queued for deletion."
        elif pending:
            reason = f"Operations are queued on this instance; {verb} once they have finished."
    return reason


def instance_lifecycle_offer(instance: Instance, allowed: frozenset[str]) -> LifecycleOffer:
    upgrade = rollback_of = None
    upgrade_refusal = rollback_refusal = None
    if lifecycle.rule("upgrade").action in allowed:
        upgrade = upgrade_preview(instance)
        if upgrade is not None:
            upgrade_refusal = lifecycle_refusal(instance, "upgrade") or upgrade_cell_refusal(
                instance, upgrade.target
            )
    keeps = []
    if lifecycle.rule("rollback").action in allowed:
        rollback_of = instance_rollback_source(instance)
        if rollback_of is not None:
            rollback_refusal = lifecycle_refusal(instance, "rollback")
            grown = rollback_grown(instance, rollback_of)
            keeps = [
                ParameterShown(p.key, p.name or p.key, format_value(p, grown[p.key]))
                for p in plan_spec(instance.plan_version).main.parameters
                if p.key in grown
            ]
    can_protect = "instance.protect" in allowed and instance.state in lifecycle.PROTECTABLE
    return LifecycleOffer(
        upgrade, upgrade_refusal, rollback_of, rollback_refusal, keeps, can_protect
    )
