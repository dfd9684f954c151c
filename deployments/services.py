"""Writes for deployments: plans from specs, cells, instances and their operations.

Every instance action checks the role, the instance's state and the plan's
entitlements, records an audit event, and queues an Operation that a worker
runs (dispatched after commit). A repeated request id returns the operation
it created the first time.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from copy import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from queue import Empty, Queue
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from accounts import idempotency
from accounts.audit import REDACTED, SYSTEM, Actor, audit_event, audit_record, audited_action
from accounts.errors import ActionDenied, database_trouble
from accounts.models import AuditEvent, RequestKey, Tenant
from accounts.services import permission_require, tenant_lock
from accounts.text import name_plain, text_visible
from billing import entitlements
from billing import services as billing_services
from billing.models import Plan, Subscription
from deployments import cells, executor, lifecycle, rows, schedules, selectors
from deployments.entitlement_usage import entitlement_require, moves_require
from deployments.kube import KubeDriver, api_client_from_kubeconfig, api_client_in_cluster
from deployments.models import (
    INSTANCE_ID,
    BackupSchedule,
    Cell,
    Instance,
    InstanceStateChange,
    Operation,
    PlanVersion,
    PlatformSecret,
    Snapshot,
)
from deployments.parameters import (
    instance_values,
    split_values,
    values_after,
    values_for_version,
)
from deployments.spec.loader import load_spec
from deployments.spec.model import PlanSpec, Verb
from deployments.spec.params import IMMUTABLE, ParameterErrors, validate_parameters
from deployments.spec.params import check as check_value
from deployments.spec.validation import NAMESPACE_NAME
from deployments.transitions import instance_state_set, operation_dispatch, snapshots_expire_by
from deployments.workflow.driver import DriverError, TransientError

logger = logging.getLogger(__name__)


# --- plans ------------------------------------------------------------------------------


@dataclass
class PlanLoad:
    """What loading one spec changed."""

    plan: Plan
    version: PlanVersion
    plan_changed: bool
    version_created: bool
    warnings: list[str] = field(default_factory=list)
    # With a version created: the earlier version of the same text, when the spec went back to it.
    same_as: PlanVersion | None = None


def _service_name(spec) -> str:
    """The spec's `x-opsdeck.serviceName`, as the catalog reads it ("" without one)."""
    name = spec.extensions.get("serviceName")
    return name.strip()[:200] if isinstance(name, str) else ""


def plan_load(*, text: str) -> PlanLoad:
    """Create or update the plan a spec describes; a changed spec adds a plan version.

    A new plan or version is first checked against every registered cell its instances may
    run on (`cells_for_plan`): one that lacks what it needs refuses the load, which changes
    nothing; one that cannot be asked is a warning. Raises SpecError (with every error) when
    the spec is invalid, ValidationError (with every cell's lack) when a cell refuses it.
    """
    spec = load_spec(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    unchecked = []
    # No cluster call in the load's transaction: the cells are asked before it. An unchanged
    # text was checked when it was released.
    if selectors.plan_digest_latest(spec.key) != digest:
        unchecked = plan_cells_check(spec)
    loaded = _plan_save(spec, text, digest)
    loaded.warnings += unchecked
    return loaded


@transaction.atomic
def _plan_save(spec: PlanSpec, text: str, digest: str) -> PlanLoad:
    limits = {**spec.entitlements, **spec.subscription}
    if spec.max_instances is not None:
        limits["max_instances"] = spec.max_instances
    plan, plan_changed = billing_services.plan_upsert(
        key=spec.key,
        name=spec.name,
        service=spec.service,
        service_name=_service_name(spec),
        description=spec.description,
        limits=limits,
    )
    prices_changed = billing_services.plan_prices_replace(
        plan=plan,
        currency=spec.currency,
        prices=[
            {
                "dimension": item["dimension"],
                "unit": item["unit"],
                "time_unit": item["timeUnit"],
                "unit_price": item["price"],
            }
            for item in spec.pricing
        ],
        # An instance made on it runs (or ran) and is billed from its first hour.
        in_use=Instance.objects.filter(plan_version__plan=plan).exists(),
    )
    plan_changed = plan_changed or prices_changed
    warnings = [*spec.warnings, *_secrets_unset(text)]
    # Serialized by the plan's row lock (`plan_upsert`). A text the latest version has changes
    # nothing; any other text — an earlier version's too, when a change is taken back — is the
    # next version: new instances get it, as they get the latest.
    latest = selectors.plan_version_latest(plan)
    if latest is not None and latest.digest == digest:
        return PlanLoad(plan, latest, plan_changed, False, warnings)
    version = PlanVersion.objects.create(
        plan=plan,
        number=(latest.number + 1) if latest else 1,
        spec_text=text,
        parsed=spec.raw,  # the document the bounded loader read
        digest=digest,
    )
    same_as = plan.versions.filter(digest=digest).exclude(pk=version.pk).order_by("-number").first()
    return PlanLoad(plan, version, plan_changed, True, warnings, same_as=same_as)


def _secrets_unset(text: str) -> list[str]:
    """A warning for each platform secret the spec reads (`$secret.NAME`) that is not set yet:
    not an error, since the platform team may set it after loading, but every run that renders
    it fails until they do."""
    read = sorted(selectors.secrets_read(text))
    known = set(PlatformSecret.objects.filter(name__in=read).values_list("name", flat=True))
    return [
        f"$secret.{name} is read, but no platform secret is called {name} yet: add it in the "
        "admin before an instance of this plan runs, or its runs fail."
        for name in read
        if name not in known
    ]


# --- cells --------------------------------------------------------------------------------


# The settings of a cell (`add_cell`'s options) that give the `$sys` variables a plan may
# read: on a cell without one they render empty, and what holds them is refused or broken.
_CELL_SETTINGS = {  # variable: (the cell's field, what it is, add_cell's option)
    "backup.destinationPath": ("backup_destination", "backup destination", "--backup-destination"),
    "backup.credentialsSecret": (
        "backup_credentials",
        "backup credentials",
        "--backup-credentials",
    ),
}


@dataclass
class _SettingMissing:
    variable: str  # what the plans read, e.g. "backup.destinationPath"
    setting: str  # what the cell lacks, e.g. "backup destination"
    option: str  # add_cell's option that gives it
    plans: list[str]  # the keys of the plans that read it


def _settings_missing(cell: Cell, plans: list[PlanSpec]) -> list[_SettingMissing]:
    """Each setting the cell is not given that some of the plans read (`$sys.backup` whole
    reads them all)."""
    missing = []
    for variable, (field_name, setting, option) in _CELL_SETTINGS.items():
        if getattr(cell, field_name):
            continue
        read = {variable, variable.split(".")[0]}
        keys = [spec.key for spec in plans if read & spec.system_read]
        if keys:
            missing.append(_SettingMissing(variable, setting, option, keys))
    return missing


# (connect, read) seconds for each request of a cell's check: a few small discovery reads, which
# a cluster that answers at all answers at once. A cell that never answers is reported as such
# in 15 s, not kube.TIMEOUT's 35: loading a plan checks every cell it may run in, one by one.
CHECK_TIMEOUT = (5, 10)


def _kinds_unserved(kubeconfig: str, context: str, plans: list[PlanSpec]) -> dict[str, list[str]]:
    """`_kinds_missing` on the cell's cluster, asked anew: the client's discovery would
    otherwise be read from the file an earlier client left for that address (in the system's
    temporary directory), which says a cluster down since, or an operator removed since, still
    serves. DriverError when the cluster does not answer or the configuration cannot be used."""
    api = (
        api_client_from_kubeconfig(kubeconfig, context=context or None)
        if kubeconfig
        else api_client_in_cluster()
    )
    with tempfile.TemporaryDirectory(prefix="opsdeck-cell-check-") as fresh:
        driver = KubeDriver(
            api, cache_file=os.path.join(fresh, "discovery.json"), timeout=CHECK_TIMEOUT
        )
        try:
            driver.serves("v1", "Namespace")  # the cluster answers: what every instance needs
            return _kinds_missing(driver, plans)
        finally:
            driver.close()


def _kinds_missing(driver: KubeDriver, plans: list[PlanSpec]) -> dict[str, list[str]]:
    """The kinds the plans need that the cluster does not serve, grouped by what to do about
    them (": install … first", or ", which plan <key> uses" when the spec does not say)."""
    served: dict[tuple[str, str], bool] = {}
    missing: dict[str, list[str]] = {}
    for spec in plans:
        install = (spec.extensions.get("operator") or {}).get("install")
        todo = f": {install.rstrip('.')}" if install else f", which plan {spec.key} uses"
        for api_version, kind in spec.required_kinds:
            if (api_version, kind) not in served:
                served[api_version, kind] = driver.serves(api_version, kind)
            if not served[api_version, kind] and kind not in missing.get(todo, []):
                missing.setdefault(todo, []).append(kind)
    return missing


def _not_answering(exc: DriverError) -> str:
    """Why the cluster could not be asked, as a sentence."""
    if exc.status in (401, 403):
        # A 401's message (`kube.UNAUTHORIZED`) is said to the customers whose operations wait.
        detail = "Unauthorized" if exc.status == 401 else exc.message
        return f"The cluster refuses the kubeconfig's credentials: {detail}"
    if exc.status is None and isinstance(exc, TransientError):
        return exc.message  # no answer: it says so itself ("The cluster could not be reached…")
    return f"The cluster cannot be reached: {exc.message}"


def _lacks(missing: dict[str, list[str]]) -> str:
    return "; ".join(f"{', '.join(kinds)}{todo}" for todo, kinds in missing.items())


def cell_check(*, cell: Cell) -> None:
    """Raise ValidationError unless the cell's cluster answers, serves every kind the plans
    that may run on the cell write, and the cell is given every setting they read (its backup
    destination); a refusal names what is missing and what each plan's
    `x-opsdeck.operator.install` says to do about the kinds."""
    plans = selectors.plans_for_cell(cell.name)
    try:
        kinds = _kinds_unserved(cell.kubeconfig, cell.context, plans)
    except DriverError as exc:
        raise ValidationError(_not_answering(exc)) from exc
    problems = [f"The cluster does not serve {_lacks(kinds)}."] if kinds else []
    problems += [
        f"The cell has no {lack.setting}, which plan{'s' if len(lack.plans) > 1 else ''} "
        f"{', '.join(lack.plans)} read{'' if len(lack.plans) > 1 else 's'} "
        f"($sys.{lack.variable}): give {lack.option}."
        for lack in _settings_missing(cell, plans)
    ]
    if problems:
        raise ValidationError(" ".join(problems))


def plan_cells_check(spec: PlanSpec) -> list[str]:
    """Check the plan against every registered cell its instances may run on: raise
    ValidationError with a message for each lack of a cell (a kind the plan writes that its
    cluster does not serve, a setting the plan reads that it is not given); return a warning
    for each cell whose cluster could not be asked, rather than refuse: a cell down for a
    while must not hold back every plan. A cell the plan's instances run in that the plan
    now leaves out is not checked (the version is meant for others) but named: its instances
    stay on their version, an upgrade to this one refused there."""
    problems, warnings = [], []
    allowed = selectors.plan_cells(spec)
    if allowed is not None:
        left = (
            Instance.objects.active()
            .filter(plan_version__plan__key=spec.key)
            .exclude(cell__name__in=allowed)
            .order_by("cell__name")
            .values_list("cell__name", flat=True)
            .distinct()
        )
        warnings += [
            f"instances of this plan run in cell {name}, which it leaves out: they stay on the "
            "version they run, and cannot upgrade to this one."
            for name in left
        ]
    for cell in selectors.cells_for_plan(spec):
        unset = [
            f"Cell {cell.name} has no {lack.setting}, which this plan reads "
            f"($sys.{lack.variable}): give add_cell --name {cell.name} {lack.option}."
            for lack in _settings_missing(cell, [spec])
        ]
        try:
            kinds = _kinds_unserved(cell.kubeconfig, cell.context, [spec])
        except DriverError as exc:
            reason = _not_answering(exc)
            warnings.append(
                f"cell {cell.name} was not checked ({reason[0].lower()}{reason[1:]}): creates "
                "of this plan there fail unless it serves the kinds the plan writes."
            )
            kinds = {}
        if kinds:
            problems.append(f"Cell {cell.name} does not serve {_lacks(kinds)}.")
        problems += unset
    if problems:
        raise ValidationError(problems)
    return warnings


_KEPT = None  # `cell_register`'s "as it is" for a setting not given


# What a registration's cluster check reads of a cell: a registration that finds one of these
# changed by another since its check checks again.
_CHECKED = ("kubeconfig", "context", "backup_destination", "backup_credentials")
REGISTER_ROUNDS = 3  # checks one registration makes while others keep changing its cell


def cell_register(
    *,
    name: str,
    kubeconfig: str,
    context: str | None = _KEPT,
    region: str | None = _KEPT,
    cloud: str | None = _KEPT,
    deployment_model: str | None = _KEPT,
    backup_destination: str | None = _KEPT,
    backup_credentials: dict | None = _KEPT,
    operator_namespace: str | None = _KEPT,
    customer_sources: list[str] | None = _KEPT,
    make_default: bool = False,
) -> Cell:
    """Register the cell `name`, or update it, after checking that its cluster answers and
    serves what the plans that may run on it need. Updating changes only what is given (a
    new kubeconfig to rotate its credentials keeps its region, backup destination and the
    rest); a setting not given is empty on a new cell (its deployment model hosted).
    `customer_sources`: the address ranges (CIDR) customers reach their instances' port from,
    as each new instance's network policy admits them (an empty list: none). A change of
    what the instances' guard rails are rendered with leaves the cell's guard rails behind
    (`Cell.guard_rails_behind`) until `cell_namespaces_apply` applied them again.

    The cluster is asked outside any transaction (a call may take its whole timeout); the
    save is short, one registration at a time: two at once of one name would both insert it,
    and two that both make their cell the default would both take it. One that finds what
    it checked changed meanwhile by another checks again."""
    if customer_sources is not _KEPT:
        customer_sources = _customer_networks(customer_sources)
    given = {
        "kubeconfig": kubeconfig,
        "context": context,
        "region": region,
        "cloud": cloud,
        "deployment_model": deployment_model,
        "backup_destination": backup_destination,
        "backup_credentials": _KEPT,
        "operator_namespace": operator_namespace,
        "customer_sources": customer_sources,
    }
    if backup_credentials is not _KEPT:
        given["backup_credentials"] = json.dumps(backup_credentials) if backup_credentials else ""
    for _ in range(REGISTER_ROUNDS):
        checked = _cell_given(Cell.objects.filter(name=name).first() or Cell(name=name), given)
        cell_check(cell=checked)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtext('opsdeck.cell_register'))")
            # Its row locked: a pass's mark of its guard rails, or the status sync's time,
            # written meanwhile is not saved over with what was read before.
            cell = Cell.objects.select_for_update().filter(name=name).first() or Cell(name=name)
            was = cells.namespace_settings(cell)
            cell = _cell_given(cell, given)
            if any(getattr(cell, f) != getattr(checked, f) for f in _CHECKED):
                continue  # another registration changed what was checked: check again
            if cell.pk and cells.namespace_settings(cell) != was:
                cell.settings_generation += 1  # its instances' guard rails are behind
            others = Cell.objects.exclude(pk=cell.pk).filter(is_default=True)
            if make_default or not others.exists():
                others.update(is_default=False)
                cell.is_default = True
            cell.full_clean()
            cell.save()
            return cell
    raise ValidationError(f"The cell {name} kept changing while it was checked: register it again.")


@dataclass
class NamespacesApplied:
    """What `cell_namespaces_apply` did: of the `total` instances it found, how many
    instances' guard rails it applied, how many it left (no namespace yet, or one being
    deleted), and the instances it could not reach, with why. `gave_up` when it stopped before
    the end because the cluster refused instance after instance alike (`SAME_REFUSAL_STOPS`):
    the last refusal's words."""

    total: int = 0
    applied: int = 0
    left: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    gave_up: str = ""

    @property
    def passed(self) -> int:
        """How many of the instances it went through, so far."""
        return self.applied + self.left + len(self.failed)


# Instances whose guard rails one pass applies at once: each is a few calls in a row to the
# cell's API server, which may be far from here (a cell in another region or cloud).
APPLY_AT_ONCE = 8
# Instances in a row the cluster refuses for the same reason (no answer at all, credentials
# refused, an admission webhook down) before a pass stops rather than going on through every
# instance: each may have waited out its own timeout first (5 s to connect to a cluster that
# drops packets), about 50 minutes for 5,000 instances at 8 at a time.
SAME_REFUSAL_STOPS = 20
# How long a pass holds the cell (`Cell.guard_rails_pass_until`) unless it renews: longer than
# one instance takes however slow its calls (a few, each at most its 30 s timeout).
PASS_HOLD = timedelta(minutes=5)


def cell_namespaces_apply(
    cell: Cell,
    *,
    each: Callable[[NamespacesApplied], None] | None = None,
    at_once: int = APPLY_AT_ONCE,
    unless_held: bool = False,
) -> NamespacesApplied | None:
    """Apply again, in the namespace of every instance the cell runs, its guard rails (the
    resource quota, the network policy, the object store's credentials) as the cell's settings
    and the instance's plan version render them now (for an instance an upgrade is under way
    on, its new version): what a change of the cell's customer sources, operator namespace or
    backup credentials means for the instances created before it, which a create applied them
    to once. Server-side apply, as a create's: an object already as it should be is left as it
    is. A namespace that does not exist yet is left to its create, which applies them itself;
    one being deleted, to its delete. One instance the cluster refuses is said and the others
    go on; but once `SAME_REFUSAL_STOPS` in a row are refused for the same reason (a cluster
    that does not answer, refuses the credentials, or whose admission webhook is down), the pass
    stops there, saying so (`gave_up`): the others would be refused alike. `at_once`
    instances at a time, each in a thread of its own (on its own database connection); `each`
    is called here, with what was done so far, after each instance.

    A pass that went through every instance with none refused marks the cell's guard rails as
    applied for the settings it found at its start (`Cell.guard_rails_behind`); one stopped
    half-way, or refused by the cluster, leaves the cell behind for the next.

    A pass holds the cell while it runs (`Cell.guard_rails_pass_until`, renewed as instances
    end, let go at its end), so that the cell watcher's catch-up, `unless_held`, does not run
    beside another: None, and nothing done, when one holds it. add_cell's pass runs whatever
    holds it: two at once are safe, and its operator asked for it."""
    held = _PassHold.take(cell.pk)
    if held is None and unless_held:
        return None
    try:
        return _namespaces_apply(cell, each, at_once, held)
    finally:
        if held is not None:
            held.release()


@dataclass
class _PassHold:
    """A pass's hold on its cell: until when (`Cell.guard_rails_pass_until`), as it last
    wrote it."""

    cell_id: int
    until: datetime

    @classmethod
    def take(cls, cell_id: int) -> _PassHold | None:
        """Hold the cell, unless another pass holds it (None)."""
        now = timezone.now()
        until = now + PASS_HOLD
        taken = (
            Cell.objects.filter(pk=cell_id)
            .filter(Q(guard_rails_pass_until=None) | Q(guard_rails_pass_until__lt=now))
            .update(guard_rails_pass_until=until)
        )
        return cls(cell_id, until) if taken else None

    def keep(self) -> None:
        """Renew it once half of it has passed, unless another pass took the cell over (this
        one outlasted its hold): then it is that one's."""
        now = timezone.now()
        if now >= self.until - PASS_HOLD / 2 and self._mine().update(
            guard_rails_pass_until=now + PASS_HOLD
        ):
            self.until = now + PASS_HOLD

    def release(self) -> None:
        self._mine().update(guard_rails_pass_until=None)

    def _mine(self):
        return Cell.objects.filter(pk=self.cell_id, guard_rails_pass_until=self.until)


def _namespaces_apply(
    cell: Cell,
    each: Callable[[NamespacesApplied], None] | None,
    at_once: int,
    held: _PassHold | None,
) -> NamespacesApplied:
    generation = Cell.objects.values_list("settings_generation", flat=True).get(pk=cell.pk)
    driver = cells.driver_for(cell)
    instances = list(
        Instance.objects.filter(cell=cell)
        .exclude(state__in=[Instance.State.DELETING, Instance.State.DELETED])
        .order_by("created_at")
        .values_list("pk", "tenant__slug")
    )
    done = NamespacesApplied(total=len(instances))

    def apply(instance: tuple[str, str], own_cell: Cell) -> bool | DriverError:
        """Whether its namespace was there, or why the cluster refused its guard rails."""
        try:
            return _guard_rails_apply(driver, own_cell, *instance)
        except DriverError as exc:
            return exc

    cause, alike = None, 0  # of the refusals in a row: what they have in common, how many
    for (instance_id, _), found in _in_threads(instances, apply, at_once, lambda: copy(cell)):
        if isinstance(found, DriverError):
            done.failed.append((instance_id, found.message))
            why = _refusal_cause(found)
            cause, alike = why, (alike + 1 if alike and why == cause else 1)
        else:
            alike = 0
            done.applied += found
            done.left += not found
        if held is not None:
            held.keep()
        if each is not None:
            each(done)
        if alike >= SAME_REFUSAL_STOPS:  # the instances under way end on their own
            done.gave_up = found.message
            break
    if not done.failed:  # a later change's pass may have ended first: its mark stays
        Cell.objects.filter(pk=cell.pk, guard_rails_generation__lt=generation).update(
            guard_rails_generation=generation
        )
    return done


def _refusal_cause(error: DriverError) -> tuple:
    """What refusals of different instances for the same reason have in common: the API's
    status and reason when it answered (its words name the object: a 403 names the namespace
    the credentials may not write in), its words when it did not (the cluster could not be
    reached, did not answer in time)."""
    return (error.status, error.reason) if error.status else (None, error.message)


def _in_threads(items: list, work: Callable, threads: int, own: Callable[[], Any]) -> Iterator:
    """(item, what `work(item, mine)` returned) for each item, as they end, from `threads`
    threads, each with `mine = own()` (what it changes, not shared) and its own database
    connection, closed when it ends. An exception in one is raised here once the others
    ended the item they were on; a KeyboardInterrupt (Ctrl-C) here at once, the threads
    (daemons, which do not hold the process's exit) taking no item more."""
    queue: Queue = Queue()
    for item in items:
        queue.put(item)
    ended: Queue = Queue()
    stopping = threading.Event()

    def run() -> None:
        try:
            mine = own()
            while not stopping.is_set():
                try:
                    item = queue.get_nowait()
                except Empty:
                    return
                ended.put((item, work(item, mine), None))
        except Exception as exc:  # raised in the caller's thread
            ended.put((None, None, exc))
        finally:
            connection.close()

    started = [
        threading.Thread(target=run, daemon=True) for _ in range(max(1, min(threads, len(items))))
    ]
    for thread in started:
        thread.start()
    try:
        for _ in items:
            item, result, raised = ended.get()
            if raised is not None:
                stopping.set()
                for thread in started:
                    thread.join()
                raise raised
            yield item, result
    finally:
        stopping.set()


def _guard_rails_apply(driver: KubeDriver, cell: Cell, instance_id: str, tenant_slug: str) -> bool:
    """Apply the instance's guard rails as the cell's settings and the version they were last
    applied for render them (`selectors.guard_rails_version`: an upgrade's under way, not the
    version the instance is on until it ends); False, and nothing applied, when its namespace
    is not there or is being deleted.

    An upgrade or roll back that starts meanwhile applies its version's before its workflow,
    and another add_cell its settings': either may do so before these reach the cluster. So
    once these are applied the version and the cell's settings (into `cell`) are read again,
    and while either changed they are applied again, as they render them."""
    applied_for = None  # the version they were last applied for here
    while True:
        moved = cells.namespace_settings_read(cell)
        version_id = selectors.guard_rails_version(instance_id)
        if version_id == applied_for and not moved:
            return True
        where = cells.placement(cell, instance_id=instance_id, tenant_slug=tenant_slug)
        namespace, *guard_rails = executor.namespace_objects(
            selectors.plan_version_loaded(version_id).spec, where
        )
        found = driver.get(namespace)
        if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
            return False
        for obj in guard_rails:
            driver.apply(obj)
        applied_for = version_id


def _customer_networks(sources: list[str]) -> list[str]:
    """Address ranges in CIDR form (`203.0.113.0/24`, `2001:db8::/32`), each as the network
    policy's `ipBlock` takes it, once each, in the order given; a ValidationError naming the
    first that is not one."""
    found: list[str] = []
    for source in (source.strip() for source in sources):
        try:
            network = ipaddress.ip_network(source)
        except ValueError:
            try:  # an address inside the range given, not its first one
                meant = ipaddress.ip_network(source, strict=False)
            except ValueError:
                raise ValidationError(
                    f"The customer source “{source}” is not an address range: give it in CIDR "
                    "form, such as 203.0.113.0/24 or 2001:db8::/32."
                ) from None
            raise ValidationError(
                f"The customer source “{source}” has an address inside its range, not the "
                f"range's first: did you mean {meant}?"
            ) from None
        if str(network) not in found:
            found.append(str(network))
    return found


def _cell_given(cell: Cell, given: dict) -> Cell:
    """`cell` with the settings `given` (those not `_KEPT`), its operator namespace checked."""
    for setting, value in given.items():
        if value is not _KEPT:
            setattr(cell, setting, value)
    if cell.operator_namespace and not NAMESPACE_NAME.fullmatch(cell.operator_namespace):
        raise ValidationError(
            f"The operator namespace “{cell.operator_namespace}” is not a namespace name: use at "
            "most 63 lowercase letters, digits and '-', starting and ending with a letter or digit."
        )
    return cell


# --- instances ------------------------------------------------------------------------------

NAME_MAX = Instance._meta.get_field("name").max_length
TIME_ZONE_NEEDED = "Give the point in time with its time zone, e.g. 2026-11-30T12:00:00Z."


def instance_parameters(instance: Instance) -> dict:
    """All of an instance's parameter values, Password ones included."""
    return instance_values(instance)


def _verb_of(op: Operation):
    """The operation's verb in its plan version's spec (loaded by id, once per process)."""
    spec = selectors.plan_version_loaded(op.plan_version_id).spec
    return spec.main.verbs.get(lifecycle.workflow_verb(op.verb))


def _projected_state(instance: Instance) -> str:
    """The state the instance will be in once its queued operations have run."""
    state = instance.state
    for op in selectors.operations_pending(instance).only("instance_id", "verb", "plan_version_id"):
        verb = _verb_of(op)
        after = lifecycle.rule(op.verb, custom=bool(verb and verb.custom)).after
        state = after or state
    return state


# What `values_after` reads of an operation (and its instance, which the ORM reads): not its
# run's state, nor what it applied.
_REQUESTED = (
    "instance_id",
    "verb",
    "plan_version_id",
    "requested",
    "requested_secret",
    "arguments",
)


def instance_parameters_projected(instance: Instance) -> dict:
    """The instance's parameter values once its queued operations have run: what a modify
    changes from (and what its form shows)."""
    values = instance_parameters(instance)
    for op in selectors.operations_pending(instance).only(*_REQUESTED):
        verb = _verb_of(op)
        if verb is not None:
            values = values_after(op, verb, values) or values
    return values


def _parameter_errors(exc: ParameterErrors) -> ValidationError:
    return ValidationError({key: message for key, message in exc.errors.items()})


def _given_mapping(values: Any) -> dict:
    """Parameters as given by a caller: a mapping of names to values, or nothing."""
    if values is None:
        return {}
    if not isinstance(values, dict) or not all(isinstance(key, str) for key in values):
        raise ValidationError(
            {"parameters": "Give the parameters as a mapping of names to values."}
        )
    return values


NAME_ONCE = "instance_name_once"  # Instance's constraint: one live instance per name
NAME_TAKEN = "Another instance of your organization is called “{}”: choose another name."
NAME_LIKE_ID = (
    "Names of the form inst- and 8 letters or digits are kept for instance ids: choose another "
    "name."
)


def _constraint(exc: IntegrityError) -> str | None:
    """The name of the constraint a write broke (psycopg's diagnostics)."""
    return getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)


def _instance_name(typed: Any) -> str:
    name = name_plain(typed) if isinstance(typed, str) else ""
    if not name:
        raise ValidationError({"name": "Give the instance a name."})
    if len(name) > NAME_MAX:
        # A character may stand for several once its letters are plain ("㍻" is "平成"): a
        # name typed short is told what it counts.
        written_out = f" (this has {len(name)} once written out)" if len(typed) <= NAME_MAX else ""
        raise ValidationError({"name": f"Use at most {NAME_MAX} characters{written_out}."})
    if not name.isprintable():
        raise ValidationError({"name": "Use letters, digits, spaces and punctuation only."})
    if not text_visible(name):  # blank letters only: lists and headings would show nothing
        raise ValidationError({"name": "Give the instance a name people can see."})
    if INSTANCE_ID.fullmatch(name.lower()):  # lists and search find instances by id, any case
        raise ValidationError({"name": NAME_LIKE_ID})
    return name


def instance_name_errors(tenant: Tenant, name: Any) -> dict[str, str]:
    """What is wrong with `name` for a new instance of `tenant` ({} when nothing is known to
    be): the database's constraint settles a name taken meanwhile."""
    try:
        name = _instance_name(name)
    except ValidationError as exc:
        return {key: messages[0] for key, messages in exc.message_dict.items()}
    taken = selectors.instance_named(tenant, name)
    return {"name": NAME_TAKEN.format(taken.name)} if taken else {}


def _instance_checked(
    *,
    actor: Actor,
    tenant: Tenant,
    version: PlanVersion,
    cell: Cell | None,
    name: str,
    values: dict,
    base: dict | None = None,
    action: str = "create",
    point_in_time: bool = False,
) -> Instance:
    """A new instance (state creating, not saved yet: `_instance_insert`) after the checks
    every new instance passes: a cell offered to the tenant (its default one when none is
    given), a name, valid parameters (with `base`, the values a restore starts from, whose
    fixed ones cannot change), and the tenant's entitlements on the plan for `action` (create
    or restore), under the tenant's lock the caller took first (`permission_require`)."""
    # Read once, for the default cell and the entitlement check.
    limits = entitlements.limits_for(tenant, version.plan)
    if cell is None:
        cell = selectors.cell_default_offered(tenant.pk, limits.cells)
        if cell is None and limits.cells is not None:
            raise ValidationError(
                f"The {version.plan.name} plan runs in no region offered to your organization: "
                "ask the platform team."
            )
        if cell is None:
            raise ValidationError(
                "No region is offered to your organization yet: ask the platform team."
            )
    elif not selectors.cell_offered(cell.pk, tenant.pk):
        raise ValidationError({"cell": "This region is not offered to your organization."})
    spec = selectors.plan_spec(version)
    try:
        held = "it held {} at that point in time" if point_in_time else "the backup holds {}"
        typed = validate_parameters(spec.main.parameters, values, current=base, current_is=held)
    except ParameterErrors as exc:
        # The form says at once what else to change: the name too, when it cannot be used.
        raise ValidationError({**instance_name_errors(tenant, name), **exc.errors}) from exc
    name = _instance_name(name)
    # Under the tenant's lock (`permission_require`): two concurrent creates cannot both pass.
    entitlement_require(
        tenant=tenant,
        plan=version.plan,
        action=action,
        version=version,
        after=typed,
        cell=cell.name,
        point_in_time=point_in_time,
        limits=limits,
    )
    plain, hidden = split_values(spec.main.parameters, typed)
    return Instance(
        tenant=tenant,
        name=name,
        plan_version=version,
        cell=cell,
        parameters=plain,
        secret_parameters=hidden,
        created_by=actor.user,
        created_by_token=actor.token,
    )


@contextmanager
def _name_settled(tenant: Tenant, name: str) -> Iterator[None]:
    """Around an action that makes an instance named `name` (`_instance_insert`): once the
    action's transaction has rolled back for a name the tenant's instances already have (the
    database's constraint, which settles two requests at once), say which instance has it.
    Looking it up after the rollback spares every insert a savepoint."""
    try:
        yield
    except IntegrityError as exc:
        if _constraint(exc) != NAME_ONCE:
            raise
        taken = instance_name_errors(tenant, name)
        raise ValidationError(taken or {"name": NAME_TAKEN.format(_instance_name(name))}) from exc


def _instance_insert(
    instance: Instance, operation: Operation, event: AuditEvent, claim: idempotency.Claim
) -> None:
    """Save a checked new instance (`_instance_checked`) with its first state change, its
    backup schedule (a new instance has none), the `operation` that makes it and the audit
    `event` that records it, and bind the request's `claim` to the operation, in one
    statement; the operation is sent to a worker once the transaction commits."""
    new = [
        instance,
        InstanceStateChange(instance=instance, to_state=instance.state),
        selectors.backup_schedule_default(instance),
        operation,
        event,
    ]
    # A name taken breaks the database's constraint (`_name_settled`), which settles two
    # requests at once too.
    rows.writes(new, changed=claim.binding(operation)).run()
    operation_dispatch(operation.pk)


def _operation_row(
    *,
    actor: Actor,
    instance: Instance,
    verb: str,
    request_id: str,
    requested: dict | None = None,
    requested_secret: dict | None = None,
    arguments: dict | None = None,
    plan_version: PlanVersion | None = None,
) -> Operation:
    """A queued operation on `instance` (on its plan version unless an upgrade names the
    newer one), not saved yet."""
    secret = {key: value for key, value in (requested_secret or {}).items() if value}
    return Operation(
        instance=instance,
        verb=verb,
        requested_by=actor.user,
        requested_by_token=actor.token,
        request_id=request_id,
        plan_version=plan_version or instance.plan_version,
        requested=requested or {},
        requested_secret=json.dumps(secret) if secret else "",
        arguments=arguments or {},
    )


def _operation_new(**row: Any) -> Operation:
    """A queued operation (`_operation_row`), saved and sent to a worker once the transaction
    commits."""
    operation = _operation_row(**row)
    rows.insert(operation)
    operation_dispatch(operation.pk)
    return operation


def _claim(tenant: Tenant, request_id: str, action: str, raw: Any) -> idempotency.Claim:
    """Claim a request id in the organization (after the role check, inside the transaction)."""
    return idempotency.request_claim(
        scope=idempotency.tenant_scope(tenant), request_id=request_id, action=action, raw=raw
    )


def _repeat(earlier: RequestKey) -> Operation | None:
    """The operation an earlier request with the same id queued (None: it queued none)."""
    if earlier.target_type != Operation._meta.label_lower:
        return None
    return Operation.objects.get(pk=earlier.target_id)


def instance_create(
    *,
    actor: Actor,
    tenant: Tenant,
    plan: Plan,
    name: str,
    parameters: dict,
    request_id: str,
    cell: Cell | None = None,
) -> Operation:
    """A new instance of `plan` for `tenant`, and the operation that creates it.

    One instance per request id in the tenant: a repeat returns the first one's operation.
    """
    values = _given_mapping(parameters)
    with (
        _name_settled(tenant, name),
        audited_action(actor=actor, action="instance.create", tenant=tenant),
    ):
        permission_require(actor=actor, tenant=tenant, action="instance.create")
        request_id = idempotency.request_id_clean(request_id)
        submitted = {
            "plan": plan.key,
            "name": name,
            "parameters": values,
            "cell": cell.pk if cell else None,
        }
        claim = _claim(tenant, request_id, "instance.create", submitted)
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        version = selectors.plan_version_latest(plan)
        if version is None:
            raise ValidationError("This plan has no released version yet.")
        instance = _instance_checked(
            actor=actor, tenant=tenant, version=version, cell=cell, name=name, values=values
        )
        operation = _operation_row(
            actor=actor,
            instance=instance,
            verb="create",
            request_id=request_id,
            requested=instance.parameters,
        )
        event = audit_event(
            actor=actor,
            action="instance.create",
            tenant=tenant,
            target=instance,
            payload={"name": instance.name, "plan": plan.key, "parameters": instance.parameters},
        )
        _instance_insert(instance, operation, event, claim)
    return operation


def _origin(instance: Instance) -> Operation | None:
    """The operation that made the instance: its create, or the restore it came from."""
    return (
        instance.operations.filter(verb__in=lifecycle.MAKES_INSTANCE).order_by("created_at").first()
    )


def current_is(instance: Instance, projected: dict) -> str:
    """How a refusal names the value a modify changes from (`validate_parameters`): what the
    instance has now, or, once queued changes move its values (`projected`), what it will be."""
    queued = any(projected.get(key) != value for key, value in instance.parameters.items())
    return "it will be {} once the changes queued on it have run" if queued else "it is {} now"


def _modify_request(spec, instance: Instance, values: dict) -> tuple[dict, dict]:
    """The changes a modify asks for: the values that differ from what the instance will hold
    once the operations queued before it have run (plain ones, and the Password ones apart)."""
    projected = instance_parameters_projected(instance)
    try:
        typed = validate_parameters(
            spec.main.parameters, values, current=projected,
            current_is=current_is(instance, projected),
        )  # fmt: skip
    except ParameterErrors as exc:
        raise _parameter_errors(exc) from exc
    changes = {k: v for k, v in typed.items() if k not in projected or projected[k] != v}
    if not changes:
        raise ValidationError("The instance already has these values: change one to modify it.")
    plain, hidden = split_values(spec.main.parameters, changes)
    return plain, {"parameters": json.loads(hidden or "{}")}


def _verb_request(spec, verb: Verb, values: dict) -> tuple[dict, dict]:
    """A verb's own parameters, checked (also against the rules of the instance parameters
    its success sets): the Password ones to keep encrypted, and the arguments with the rest."""
    try:
        given = validate_parameters(verb.parameters, values)
        errors = {}
        for target, source in verb.updates.items():
            try:
                check_value(spec.parameter(target), given[source])
            except ValueError as exc:
                errors[source] = str(exc)
        if errors:
            raise ParameterErrors(errors)
    except ParameterErrors as exc:
        raise _parameter_errors(exc) from exc
    plain, hidden = split_values(verb.parameters, given)
    arguments = {"verb_parameters": plain} if plain else {}
    return {"verb_parameters": json.loads(hidden or "{}")}, arguments


def _sets_something(instance: Instance, verb: Verb, arguments: dict) -> None:
    """ValidationError when a custom verb that only sets instance parameters (each of its
    parameters is one its success sets, `x-opsdeck.updates`, none a Password) would set each
    to the value the instance will hold anyway, as a modify that changes nothing is refused."""
    given = arguments.get("verb_parameters") or {}
    sources = set(verb.updates.values())
    if not verb.updates or {p.key for p in verb.parameters} != sources or set(given) != sources:
        return  # it does more than set values, or sets a secret (never compared)
    if selectors.instance_setting_left(instance) is not None:
        return  # its servers may run another value than the instance holds: either may be set
    projected = instance_parameters_projected(instance)
    if all(projected.get(target) == given[source] for target, source in verb.updates.items()):
        name = verb.display_name or verb.name
        raise ValidationError(
            f"The instance already has these values: change one to {name[:1].lower()}{name[1:]}."
        )


def _retry_arguments(instance: Instance, verb: str, failed: Operation | None) -> dict:
    """A retry of the create or restore that failed the instance (`failed`, the instance's
    `selectors.instance_retry_source`): its arguments again (a restore's source and target);
    the namespace is applied anew (server-side apply)."""
    if failed is None or failed.verb != verb:
        raise ValidationError(f"Only an instance whose {verb} failed can have it run again.")
    origin = _origin(instance)
    # Read under the tenant's lock, which a deletion of the backup takes.
    refusal = selectors.restore_again_refusal(instance, origin) if verb == "restore" else None
    if refusal:
        raise ActionDenied(refusal)
    return {"sys": origin.arguments["sys"]} if "sys" in origin.arguments else {}


def instance_action(
    *,
    actor: Actor,
    instance: Instance,
    verb: str,
    request_id: str,
    parameters: dict | None = None,
) -> Operation:
    """Queue `verb` (modify, stop, start, restart, backup, failover, a custom verb, or create
    and restore to retry a failed instance's) on an instance; it runs after the operations
    queued before it. A repeated request id returns the operation it queued.

    A modify records only the values it changes; they apply on top of whatever the
    operations before it leave.
    """
    values = _given_mapping(parameters)
    tenant = instance.tenant
    spec = selectors.plan_spec(instance.plan_version)
    if not isinstance(verb, str):
        raise ValidationError("Name the action to run.")
    if verb == "delete":
        raise ValidationError("Deleting an instance is an action of its own.")
    if verb == "deleteBackup":  # it names a backup: the Backups tab's Delete does
        raise ValidationError("Deleting a backup is done from the Backups tab.")
    if verb == lifecycle.RETENTION_APPLY:  # saving the schedule's retention queues it
        raise ValidationError("The backup retention is set on the Backups tab's schedule.")
    spec_verb = spec.main.verbs.get(verb)
    if spec_verb is None:
        raise ValidationError(f"This plan has no {verb} action.")
    rule = lifecycle.rule(verb, custom=spec_verb.custom)
    with audited_action(actor=actor, action=f"instance.{verb}", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action=rule.action)
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(
            tenant, request_id, f"instance.{verb}", {"instance": instance.pk, "parameters": values}
        )
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        if verb == "modify":
            tenant_lock(tenant.pk)  # `_entitled_to_modify` checks the totals under it
        read = instance.plan_version_id
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        if instance.plan_version_id != read:  # an upgrade ended meanwhile: its rules hold
            spec = selectors.plan_spec(instance.plan_version)
            spec_verb = spec.main.verbs.get(verb)
            if (
                spec_verb is None
                or lifecycle.rule(verb, custom=spec_verb.custom).action != rule.action
            ):
                raise ValidationError(f"This plan version has no {verb} action.")
        failed = selectors.instance_retry_source(instance)
        reason = selectors.action_refusal(
            instance, verb, _projected_state(instance), custom=spec_verb.custom,
            retry=failed is not None and failed.verb == verb,
            parameters=instance_parameters_projected(instance),
        )  # fmt: skip
        if reason or _upgrading(instance):
            raise ActionDenied(reason or UPGRADING)
        requested, requested_secret, arguments, changed = {}, {}, {}, {}
        if verb == "modify":
            requested, requested_secret = _modify_request(spec, instance, values)
            changed = {**requested, **{k: REDACTED for k in requested_secret["parameters"]}}
            _entitled_to_modify(instance, requested)
        else:
            _entitled(instance, "retry" if verb in lifecycle.MAKES_INSTANCE else verb)
            requested_secret, arguments = _verb_request(spec, spec_verb, values)
            _sets_something(instance, spec_verb, arguments)
        if verb == "backup" and selectors.backup_pending(instance):  # read under the lock
            raise ActionDenied(selectors.BACKUP_PENDING)
        if verb in lifecycle.MAKES_INSTANCE:
            arguments = _retry_arguments(instance, verb, failed)
        if verb == "backup":
            arguments.update(_snapshot_start(instance))
        operation = _operation_new(
            actor=actor,
            instance=instance,
            verb=verb,
            request_id=request_id,
            requested=requested,
            requested_secret=requested_secret,
            arguments=arguments,
        )
        if verb == "backup":
            Snapshot.objects.filter(pk=arguments["snapshot"]).update(operation=operation)
        claim.bind(operation)
        # What was asked, as the Activity tab says it: a modify's changed values, a verb's own
        # (a Password one as redacted).
        given = {
            **arguments.get("verb_parameters", {}),
            **{k: REDACTED for k in requested_secret.get("verb_parameters", {})},
        }
        payload = {"changed": changed} if verb == "modify" else {"given": given} if given else {}
        audit_record(
            actor=actor, action=f"instance.{verb}", tenant=tenant, target=instance, payload=payload
        )
    return operation


def _entitled(instance: Instance, action: str, **request: Any) -> None:
    """ActionDenied (with billing's reason) unless the tenant's subscription and limits on the
    instance's plan allow `action` now."""
    entitlement_require(
        tenant=instance.tenant, plan=instance.plan_version.plan, action=action, **request
    )


def _entitled_to_modify(instance: Instance, requested: dict) -> None:
    """A modify's sizes against the plan's limits: the values once the operations queued
    before it have run, and with its changes. The caller holds the tenant's lock, as a create
    does, so two concurrent changes cannot both pass a total."""
    projected = instance_parameters_projected(instance)
    _entitled(
        instance,
        "modify",
        version=instance.plan_version,
        before=projected,
        after={**projected, **requested},
        instance_id=instance.pk,
    )


def _snapshot_start(instance: Instance, *, scheduled: bool = False) -> dict:
    """A pending snapshot for a backup, and the $sys.snapshot values its workflow sees. It
    expires when the object store's retention policy prunes its data."""
    now = timezone.now()
    snapshot = Snapshot.objects.create(
        tenant=instance.tenant,
        instance=instance,
        source_instance_id=instance.pk,
        plan_version=instance.plan_version,
        scheduled=scheduled,
        expires_at=now + timedelta(days=selectors.backup_retention_days(instance)),
    )
    # The name of the object its backup makes in the cluster: when it was taken, as people read
    # it, and the snapshot's own id, so that two backups in one second are two objects (the
    # second failed on the first's, and deleting that failed one deleted the first's object).
    name = f"{instance.pk}-{now:%Y%m%d%H%M%S}-{snapshot.pk}"
    Snapshot.objects.filter(pk=snapshot.pk).update(name=name)
    return {"snapshot": snapshot.pk, "sys": {"snapshot": {"id": name, "time": now.isoformat()}}}


def instance_delete(
    *, actor: Actor, instance: Instance, request_id: str, last_backup: bool = True
) -> Operation:
    """Delete an instance: always accepted; queued operations are cancelled and a running
    one stops at its next step before the delete workflow runs. A delete while another is
    pending (or after it finished) returns that one. When the plan says
    `snapshotBeforeDeletion`, a last backup is taken first, unless `last_backup` is False
    (asked for without one); the delete runs only if that backup completed (`runner`)."""
    tenant = instance.tenant
    with audited_action(actor=actor, action="instance.delete", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action="instance.delete")
        request_id = idempotency.request_id_clean(request_id)
        asked = {"instance": instance.pk, **({} if last_backup else {"last_backup": False})}
        claim = _claim(tenant, request_id, "instance.delete", asked)
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        if instance.deletion_protected:
            raise ActionDenied(selectors.DELETION_PROTECTED)
        deletes = instance.operations.filter(verb="delete")
        pending = deletes.filter(
            state__in=[Operation.State.QUEUED, Operation.State.RUNNING]
        ).first()
        if pending is None and instance.state == Instance.State.DELETED:
            pending = deletes.order_by("-created_at").first()
        if pending is not None:
            claim.bind(pending)
            return pending
        now = timezone.now()
        queued = instance.operations.filter(state=Operation.State.QUEUED)
        _snapshots_unqueued(queued)
        ended = list(queued.only("pk", "request_id", "instance_id"))
        queued.update(
            state=Operation.State.CANCELLED,
            finished_at=now,
            error="Cancelled: the instance is being deleted.",
        )
        for operation in ended:  # a fleet run's wave may have ended with them
            _fleet_told(operation)
        # A running one stops now (due at once, as a cancel makes it), saying why: a user's
        # own cancel before it is kept.
        running = list(
            instance.operations.filter(state=Operation.State.RUNNING).values_list("pk", flat=True)
        )
        instance.operations.filter(pk__in=running, cancel_reason="").update(
            cancel_reason="The instance is being deleted."
        )
        instance.operations.filter(pk__in=running).update(next_step_at=now)
        for pk in running:
            operation_dispatch(pk, urgent=True)
        after = {}
        if last_backup and selectors.last_backup_taken(instance):
            # A last snapshot, taken before the delete workflow runs (it queues first).
            extra = _snapshot_start(instance)
            last = _operation_new(
                actor=actor,
                instance=instance,
                verb="backup",
                request_id=idempotency.derived_request_id(request_id, "last-snapshot"),
                arguments=extra,
            )
            Snapshot.objects.filter(pk=extra["snapshot"]).update(operation=last)
            after = {"last_backup": str(last.pk)}
        operation = _operation_new(
            actor=actor, instance=instance, verb="delete", request_id=request_id, arguments=after
        )
        claim.bind(operation)
        audit_record(
            actor=actor, action="instance.delete", tenant=tenant, target=instance,
            payload={} if last_backup else {"last_backup": False},
        )  # fmt: skip
    return operation


def _snapshots_unqueued(queued) -> None:
    """What cancelling the `queued` operations of an instance being deleted leaves of the
    snapshots they name: a backup's is cancelled (it never ran), a deletion's is deleted, as
    deleting a backup of a deleted instance does (`_snapshot_forget`)."""
    arguments = list(queued.values_list("arguments", flat=True))
    taking = [a["snapshot"] for a in arguments if a.get("snapshot")]
    forgetting = [a["forget_snapshot"] for a in arguments if a.get("forget_snapshot")]
    Snapshot.objects.filter(pk__in=taking).exclude(status=Snapshot.Status.DELETED).update(
        status=Snapshot.Status.CANCELLED
    )
    Snapshot.objects.filter(pk__in=forgetting).update(status=Snapshot.Status.DELETED)


# --- upgrade, roll back, protection ---

# An operation queued behind an upgrade would run the version the instance is leaving.
UPGRADING = "The instance is being upgraded; try again once the upgrade has finished."


def _upgrading(instance: Instance) -> bool:
    return selectors.operations_pending(instance).filter(verb="upgrade").exists()


class UpgradeMoved(ValidationError):
    """An upgrade asked for the version its requester was shown (`seen`), and the plan's
    newest is another (`newest`): one published since, whose changes they have not read."""

    def __init__(self, newest: int, seen: int) -> None:
        self.newest, self.seen = newest, seen
        super().__init__(
            f"Version {newest} was published after this was opened: read what it changes "
            "above, then upgrade again."
        )


def instance_upgrade(
    *, actor: Actor, instance: Instance, request_id: str, seen: int | None = None
) -> Operation:
    """Upgrade an instance to its plan's newest version: the operation runs that version's
    modify with the instance's values (those the version drops left out, those it adds at
    their defaults); on success the instance is on the new version. Refused when there is no
    newer version, the state forbids it, operations are pending, the newer version does not
    run in the instance's cell, or it cannot take the instance's values; with `seen`, the
    version number the person was shown, also when a newer one was published since (what it
    changes was not shown). A repeated request id returns the operation it queued."""
    tenant = instance.tenant
    with audited_action(actor=actor, action="instance.upgrade", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action=lifecycle.rule("upgrade").action)
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(
            tenant, request_id, "instance.upgrade", {"instance": instance.pk, "version": seen}
        )
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        tenant_lock(tenant.pk)  # `_entitled_to_upgrade` checks the totals under it
        instance = (
            Instance.objects.select_related("plan_version__plan")
            .select_for_update(of=("self",))
            .get(pk=instance.pk)
        )
        # Its state first: a deleted instance is not "on the newest version already".
        reason = selectors.lifecycle_refusal(instance, "upgrade")
        if reason:
            raise ActionDenied(reason)
        preview = selectors.upgrade_preview(instance, instance_parameters(instance))
        if preview is None:
            raise ActionDenied("The instance runs its plan's newest version already.")
        if seen is not None and seen != preview.target.number:
            raise UpgradeMoved(preview.target.number, seen)
        _entitled_to_upgrade(instance, preview.target)
        if preview.problems:
            raise ValidationError(list(preview.problems.values()))
        versions = {"from": preview.current.number, "to": preview.target.number}
        operation = _operation_new(
            actor=actor,
            instance=instance,
            verb="upgrade",
            request_id=request_id,
            arguments={"upgrade": versions},
            plan_version=preview.target,
        )
        claim.bind(operation)
        audit_record(
            actor=actor,
            action="instance.upgrade",
            tenant=tenant,
            target=instance,
            payload={
                **versions,
                "added": [c.key for c in preview.added],
                "removed": [c.key for c in preview.removed],
            },
        )
    return operation


def _entitled_to_upgrade(instance: Instance, target: PlanVersion) -> None:
    """An upgrade's sizes against the plan's limits: the newer version may measure the same
    values differently (its usage rules), so the values it will run with are measured by its
    rules and those before by the rules of the version left. The caller holds the tenant's
    lock, as for a modify. Then the cells the newer version runs in: one published for other
    cells only would run its workflows where they were never checked."""
    projected = instance_parameters_projected(instance)
    _entitled(
        instance,
        "upgrade",
        version=target,
        before=projected,
        before_version=instance.plan_version,
        after=values_for_version(selectors.plan_spec(target).main.parameters, projected),
    )
    refusal = selectors.upgrade_cell_refusal(instance, target)
    if refusal:
        raise ActionDenied(refusal)


@dataclass(frozen=True)
class PlanChange:
    """What a change of plan queued: an upgrade per instance that moves, in creation order."""

    source: Plan
    target: Plan
    operations: list[Operation]


def plan_change(
    *, actor: Actor, tenant: Tenant, source: Plan, target: Plan, request_id: str
) -> PlanChange:
    """Move the tenant's instances from `source` to `target`, another plan of the same service:
    each through an upgrade to `target`'s newest version, which runs that version's modify
    with the instance's values; once it succeeds the instance is on `target`, metered and
    billed on it from that moment. All or nothing: refused, with nothing queued, when the
    plans are not of one service, the tenant is not subscribed to `target`, `target`'s limits
    cannot take the instances (measured by its usage rules), or one of them cannot move now
    (its state, queued operations, values the target refuses). A repeated request id returns
    what the first one queued."""
    with audited_action(actor=actor, action="plan.change", tenant=tenant):
        permission_require(actor=actor, tenant=tenant, action="billing.manage")
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(tenant, request_id, "plan.change", {"from": source.pk, "to": target.pk})
        prefix = idempotency.derived_request_id(request_id, "plan-change")[:48]
        if claim.earlier is not None:
            return PlanChange(source, target, _plan_change_operations(tenant, prefix))
        if target.pk == source.pk:
            raise ValidationError(f"Choose a plan to move to other than {target.name}.")
        if target.service != source.service:
            raise ValidationError(
                f"{target.name} is not another plan of {source.name}'s service: instances move "
                "only between plans of one service."
            )
        version = selectors.plan_version_latest(target)
        if version is None:
            raise ValidationError(f"The {target.name} plan has no version to run yet.")
        tenant_lock(tenant.pk)  # one change of limits at a time
        instances = list(
            Instance.objects.for_tenant(tenant)
            .active()
            .filter(plan_version__plan=source)
            .select_related("plan_version__plan", "cell")
            .select_for_update(of=("self",))
            .order_by("created_at", "pk")
        )
        if not instances:
            raise ValidationError(f"No instance runs on {source.name}: there is nothing to move.")
        moves = []
        for instance in instances:
            refusal = selectors.lifecycle_refusal(instance, "upgrade")
            if refusal:
                raise ActionDenied(f"{instance.name}: {refusal}")
            current = instance_parameters(instance)  # nothing is queued: as it runs now
            preview = selectors.upgrade_preview(instance, current, version)
            if preview.problems:
                raise ValidationError(f"{instance.name}: {' '.join(preview.problems.values())}")
            values = values_for_version(selectors.plan_spec(version).main.parameters, current)
            moves.append((instance, preview, values))
        moves_require(
            tenant=tenant,
            plan=target,
            version=version,
            moves=[(i.name, values, i.cell.name) for i, _, values in moves],
        )
        operations = []
        for instance, preview, _ in moves:
            versions = {"from": preview.current.number, "to": version.number}
            operation = _operation_new(
                actor=actor,
                instance=instance,
                verb="upgrade",
                request_id=f"{prefix}-{instance.pk}",
                arguments={"upgrade": versions, "plan": {"from": source.key, "to": target.key}},
                plan_version=version,
            )
            operations.append(operation)
            audit_record(
                actor=actor,
                action="instance.upgrade",
                tenant=tenant,
                target=instance,
                payload={**versions, "plan_from": source.key, "plan_to": target.key},
            )
        claim.bind(operations[0])
        audit_record(
            actor=actor,
            action="plan.change",
            tenant=tenant,
            payload={
                "from": source.key,
                "to": target.key,
                "instances": [instance.pk for instance, _, _ in moves],
            },
        )
    return PlanChange(source, target, operations)


def _plan_change_operations(tenant: Tenant, prefix: str) -> list[Operation]:
    return list(
        Operation.objects.filter(
            instance__tenant=tenant, verb="upgrade", request_id__startswith=f"{prefix}-"
        ).order_by("instance__created_at", "instance_id")  # as the change queued them
    )


def instance_rollback(*, actor: Actor, instance: Instance, request_id: str) -> Operation:
    """After a modify or an upgrade failed the instance: re-apply the parameters and plan
    version it holds (stored = deployed: what last ran) through that version's modify, as a
    new operation. A repeated request id returns the operation it queued."""
    tenant = instance.tenant
    with audited_action(actor=actor, action="instance.rollback", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action=lifecycle.rule("rollback").action)
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(tenant, request_id, "instance.rollback", {"instance": instance.pk})
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        reason = selectors.lifecycle_refusal(instance, "rollback")
        if reason:
            raise ActionDenied(reason)
        # Sizes are not checked: the plan's totals count a failed instance at what its failed
        # change may have left in the cluster already (`entitlement_usage`), and a roll back
        # takes back what it can (a per-instance limit lowered meanwhile must not strand it).
        _entitled(instance, "rollback")
        failed = selectors.instance_rollback_source(instance)
        if failed is None:
            raise ActionDenied(
                "Only an instance that a failed modify or upgrade left failed can be rolled back."
            )
        operation = _operation_new(
            actor=actor,
            instance=instance,
            verb="rollback",
            request_id=request_id,
            requested=selectors.rollback_grown(instance, failed),
            arguments={"rollback_of": str(failed.pk)},
        )
        claim.bind(operation)
        audit_record(
            actor=actor,
            action="instance.rollback",
            tenant=tenant,
            target=instance,
            payload={"operation": str(failed.pk), "verb": failed.verb},
        )
    return operation


def instance_protect(*, actor: Actor, instance: Instance, on: bool) -> Instance:
    """Turn deletion protection on or off: while on, a delete is refused. `on` that is no
    bool is refused once the role is allowed."""
    tenant = instance.tenant
    with audited_action(actor=actor, action="instance.protect", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action="instance.protect")
        if not isinstance(on, bool):
            raise ValidationError("Say whether deletion protection is to be on or off.")
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        deleting = instance.operations.filter(
            verb="delete", state__in=[Operation.State.QUEUED, Operation.State.RUNNING]
        ).exists()
        if instance.state == Instance.State.DELETED:
            raise ActionDenied("The instance is deleted.")
        if deleting or instance.state not in lifecycle.PROTECTABLE:
            raise ActionDenied("The instance is being deleted: protecting it is too late.")
        if instance.deletion_protected != on:
            instance.deletion_protected = on
            instance.save(update_fields=["deletion_protected"])
        audit_record(
            actor=actor,
            action="instance.protect",
            tenant=tenant,
            target=instance,
            payload={"on": on},
        )
    return instance


def operation_cancel(*, actor: Actor, operation: Operation, request_id: str) -> Operation:
    """Cancel an operation: a queued one ends at once; a running one stops at its next step
    (its onExit still runs) and ends `cancelled`. The instance goes back to the state it had
    when none of the run's writes reached the cluster, else becomes failed; the instance a
    queued create or restore was to make is failed; a cancelled backup's snapshot fails. A
    delete cannot be cancelled, nor a running backup (`Rule.runs_through`)."""
    instance = operation.instance
    tenant = instance.tenant
    verb = _verb_of(operation)
    rule = lifecycle.rule(operation.verb, custom=bool(verb and verb.custom))
    with audited_action(actor=actor, action="operation.cancel", tenant=tenant, target=operation):
        permission_require(actor=actor, tenant=tenant, action=rule.action)
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(tenant, request_id, "operation.cancel", {"operation": str(operation.pk)})
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        if operation.verb == "delete":
            raise ActionDenied("A delete cannot be cancelled.")
        # The instance first, as the runner locks it before it writes the operation.
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        operation = Operation.objects.select_for_update().get(pk=operation.pk)
        if operation.state not in {Operation.State.QUEUED, Operation.State.RUNNING}:
            raise ValidationError(f"The operation has ended ({operation.get_state_display()}).")
        if operation.cancel_reason:  # another tab's cancel, or a delete, came first
            raise ValidationError(f"The operation is stopping already: {operation.cancel_reason}")
        if operation.state == Operation.State.RUNNING and rule.runs_through:
            raise ValidationError(rule.runs_through)
        reason = f"Cancelled by {actor.name or 'the platform'}."
        if operation.state == Operation.State.QUEUED:
            operation.state = Operation.State.CANCELLED
            operation.finished_at = timezone.now()
            operation.error = reason
            operation.save(update_fields=["state", "finished_at", "error"])
            if operation.arguments.get("snapshot"):
                Snapshot.objects.filter(pk=operation.arguments["snapshot"]).exclude(
                    status=Snapshot.Status.DELETED
                ).update(status=Snapshot.Status.CANCELLED)
            if rule.makes_instance:
                # Nothing was sent: the instance it was to make is failed, as a run that ends
                # before the cluster took anything leaves it (its Retry or Delete follows).
                instance_state_set(instance, Instance.State.FAILED, operation=operation,
                                   reason=reason)  # fmt: skip
            _fleet_told(operation)  # a fleet run's wave may have ended with it
        else:
            operation.cancel_reason = reason
            # Due now, as the watcher wakes one: a step sent for a time not come yet is taken
            # for an early duplicate and dropped, and the cancel waited for the next poll.
            operation.next_step_at = timezone.now()
            operation.save(update_fields=["cancel_reason", "next_step_at"])
            operation_dispatch(operation.pk, urgent=True)  # stop it now, not at its next poll
        claim.bind(operation)
        audit_record(
            actor=actor,
            action="operation.cancel",
            tenant=tenant,
            target=operation,
            payload={"verb": operation.verb, "instance": instance.pk},
        )
    return operation


NOTHING_TO_CONNECT = "The instance is deleted: nothing runs to connect to."


def instance_credentials_reveal(*, actor: Actor, instance: Instance) -> str:
    """The password of the instance's connection user (`x-opsdeck.connection.password`),
    for one showing; the reveal is audited, never with the password."""
    tenant = instance.tenant
    action = "instance.reveal_credentials"
    with audited_action(actor=actor, action=action, tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action=action)
        if instance.state == Instance.State.DELETED:
            raise ValidationError(NOTHING_TO_CONNECT)
        key = selectors.plan_spec(instance.plan_version).connection.get("password")
        password = instance_parameters(instance).get(key) if key else None
        if not password:
            raise ValidationError("This plan does not say which password connects to it.")
        audit_record(
            actor=actor, action=action, tenant=tenant, target=instance, payload={"parameter": key}
        )
    return str(password)


def _restore_base(snapshot: Snapshot, target_time: datetime | None) -> dict:
    """The values a restore starts from: the snapshot's own (older snapshots without them take
    the source instance's), or for a point in time those its source ran with then; and the
    source's passwords while it exists."""
    source = snapshot.instance
    base = selectors.snapshot_values(snapshot, target_time)
    if source is not None and source.secret_parameters:
        base.update(json.loads(source.secret_parameters))
    return base


def _point_in_time_check(snapshot: Snapshot, target_time: datetime) -> None:
    """Refuse a target outside what can be recovered (`selectors.recovery_window`)."""
    now = timezone.now()
    if target_time > now:
        raise ValidationError({"target_time": "The point in time is in the future."})
    low, high = selectors.recovery_window(snapshot, now)
    if target_time < snapshot.taken:
        raise ValidationError({"target_time": "The point in time is before the backup was taken."})
    if not low <= target_time <= high:
        raise ValidationError(
            {
                "target_time": f"The point in time must be between {_utc_text(low)} and "
                f"{_utc_text(high)}: that is what the backups can recover."
            }
        )


def _utc_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


RESTORE_COMPLETED = "Only a completed backup can be restored."
NO_POINT_IN_TIME = "This plan restores a backup as it was taken: it cannot recover a point in time."
RESTORE_FORGETTING = selectors.RESTORE_FORGETTING
FORGET_RESTORING = (
    "A new instance is being restored from this backup: delete the backup once the restore"
    " has finished."
)


def snapshot_restore(
    *,
    actor: Actor,
    snapshot: Snapshot,
    name: str,
    request_id: str,
    parameters: dict | None = None,
    target_time: datetime | None = None,
) -> Operation:
    """A NEW instance from a completed snapshot, on the snapshot's plan version; with
    `target_time`, recovered to that instant (`$sys.restore.targetTime`) instead.

    Parameters start from the snapshot's: those that cannot change after creation (the
    version, the database) stay as the snapshot holds them, the others may be changed within
    the plan's rules. The snapshot's metadata reaches the restore workflow as
    `$sys.restore.metadata.*`.
    """
    values = _given_mapping(parameters)
    if target_time is not None and (
        not isinstance(target_time, datetime) or target_time.utcoffset() is None
    ):
        raise ValidationError({"target_time": TIME_ZONE_NEEDED})
    tenant = snapshot.tenant
    with (
        _name_settled(tenant, name),
        audited_action(actor=actor, action="instance.restore", tenant=tenant, target=snapshot),
    ):
        permission_require(actor=actor, tenant=tenant, action="backup.restore")
        request_id = idempotency.request_id_clean(request_id)
        submitted = {
            "snapshot": snapshot.pk,
            "name": name,
            "parameters": values,
            "target_time": target_time.isoformat() if target_time else None,
        }
        claim = _claim(tenant, request_id, "instance.restore", submitted)
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        # As stored now: a deletion of it takes the tenant's lock too, so none slips between.
        status, forgetting = selectors.snapshot_restorable(snapshot)
        if status != Snapshot.Status.COMPLETED:
            raise ValidationError(RESTORE_COMPLETED)
        if forgetting:
            raise ValidationError(RESTORE_FORGETTING)
        version = snapshot.plan_version
        spec = selectors.plan_spec(version)
        if "restore" not in spec.main.verbs:
            raise ValidationError("This plan cannot restore backups.")
        if target_time is not None:
            if not selectors.restores_to_point_in_time(version):
                raise ValidationError({"target_time": NO_POINT_IN_TIME})
            _point_in_time_check(snapshot, target_time)
        base = _restore_base(snapshot, target_time)
        values = selectors.restore_changes(snapshot, values, target_time)
        try:
            instance = _instance_checked(
                actor=actor,
                tenant=tenant,
                version=version,
                # Where its backup is, the source's cell, while it is offered; else the default.
                cell=Cell.objects.offered_to(tenant)
                .filter(instances__pk=snapshot.source_instance_id)
                .first(),
                name=name,
                values=values,
                base=base,
                action="restore",
                point_in_time=target_time is not None,
            )
        except ValidationError as exc:
            raise _fixed_by_snapshot(exc, base) from exc
        restore = {
            "snapshotId": snapshot.name,
            "snapshotTime": snapshot.taken.isoformat(),
            # Point in time: recover up to this instant (RFC 3339, UTC); "" means the snapshot.
            "targetTime": target_time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if target_time
            else "",
            "metadata": snapshot.metadata,
        }
        operation = _operation_row(
            actor=actor,
            instance=instance,
            verb="restore",
            request_id=request_id,
            requested=instance.parameters,
            arguments={
                "sys": {
                    "restore": restore,
                    "sourceInstanceId": snapshot.source_instance_id,
                    "targetInstanceId": instance.pk,
                }
            },
        )
        event = audit_event(
            actor=actor,
            action="instance.restore",
            tenant=tenant,
            target=instance,
            payload={
                "name": instance.name,
                "snapshot": snapshot.name,
                "source": snapshot.source_instance_id,
            },
        )
        _instance_insert(instance, operation, event, claim)
    return operation


def _fixed_by_snapshot(exc: ValidationError, base: dict) -> ValidationError:
    """A restore's "cannot be changed" errors, said as what they are: the snapshot's value."""
    if not hasattr(exc, "error_dict"):
        return exc
    errors = {}
    for key, messages in exc.message_dict.items():
        if IMMUTABLE in messages and key in base:
            errors[key] = f"Fixed by the backup, which holds {base[key]}."
        else:
            errors[key] = messages
    return ValidationError(errors)


def snapshot_delete(*, actor: Actor, snapshot: Snapshot, request_id: str) -> Operation | None:
    """Forget a snapshot: its instance runs the plan's deleteBackup workflow when it still
    exists; otherwise the snapshot is only marked deleted (the object store's retention
    policy prunes the data)."""
    tenant = snapshot.tenant
    with audited_action(actor=actor, action="backup.delete", tenant=tenant, target=snapshot):
        permission_require(actor=actor, tenant=tenant, action="backup.delete")
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(tenant, request_id, "backup.delete", {"snapshot": snapshot.pk})
        if claim.earlier is not None:
            return _repeat(claim.earlier)
        operation = _snapshot_forget(actor=actor, snapshot=snapshot, request_id=request_id)
        claim.bind(operation or snapshot)
    return operation


def _snapshot_forget(
    *, actor: Actor, snapshot: Snapshot, request_id: str, reason: str = ""
) -> Operation | None:
    """Queue the plan's deleteBackup for a snapshot whose instance still exists, else mark it
    deleted; the caller has checked who may (`reason`: why, for the audit log). None when no
    operation was queued; the one queued already when a deletion of it is pending.

    The tenant is locked first, as a restore locks it (for the system, which checks no
    role), then the instance before the snapshot, as the runner finishing an operation locks
    them (the other order deadlocked with a deleteBackup finishing). Refused (ActionDenied)
    while a restore from the snapshot is under way."""
    tenant_lock(snapshot.tenant_id)
    if snapshot.instance_id is not None:
        Instance.objects.select_for_update().filter(pk=snapshot.instance_id).first()
    snapshot = Snapshot.objects.select_for_update().get(pk=snapshot.pk)
    if snapshot.status == Snapshot.Status.DELETED:
        return None
    instance = snapshot.instance
    if instance is not None:
        pending = instance.operations.filter(
            verb="deleteBackup",
            state__in=[Operation.State.QUEUED, Operation.State.RUNNING],
            arguments__forget_snapshot=snapshot.pk,
        ).first()
        if pending is not None:
            return pending
    if selectors.snapshot_restoring(snapshot):
        raise ActionDenied(FORGET_RESTORING)
    runs = (
        instance is not None
        and instance.state not in {Instance.State.DELETING, Instance.State.DELETED}
        # The version the deletion runs on is the instance's, which an upgrade may have moved
        # to one without deleteBackup: then it is only forgotten, as on a plan without it.
        and "deleteBackup" in selectors.plan_spec(instance.plan_version).main.verbs
        # A delete queued runs first: a deletion behind it would find the instance gone.
        and not selectors.operations_pending(instance).filter(verb="delete").exists()
    )
    if runs and _upgrading(instance):
        raise ActionDenied(UPGRADING)
    audit_record(
        actor=actor,
        action="backup.delete",
        tenant=snapshot.tenant,
        target=snapshot,
        payload={"name": snapshot.name, **({"reason": reason} if reason else {})},
    )
    if not runs:
        snapshot.status = Snapshot.Status.DELETED
        snapshot.save(update_fields=["status"])
        return None
    return _operation_new(
        actor=actor,
        instance=instance,
        verb="deleteBackup",
        request_id=request_id,
        arguments={
            "forget_snapshot": snapshot.pk,
            "sys": {"snapshot": {"id": snapshot.name, "time": snapshot.taken.isoformat()}},
        },
    )


# --- backup schedules ---------------------------------------------------------------------

INTERVAL_MAX_HOURS = 24 * 366
SCHEDULE_CHANGED = (
    "Someone changed this schedule after you opened the page; it now reads as above."
    " Yours was not saved: the form holds their schedule with your changes, to save again."
)


def _schedule_errors(
    *,
    spec,
    retention_most: int,
    interval_hours: Any,
    cron: Any,
    retention_days: Any,
    retention_count: Any,
    enabled: bool,
) -> dict[str, str]:
    """What is wrong with a schedule as given, field by field; `retention_most` is the most
    days the instance's plan keeps backups for."""
    errors = {}

    def whole(value: Any, least: int, most: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most

    if cron:
        if not isinstance(cron, str):
            errors["cron"] = "Give the cron expression as text."
        else:
            try:
                schedules.cron_check(cron)
            except ValueError as exc:
                errors["cron"] = str(exc)
        if interval_hours is not None:
            errors["interval_hours"] = "Give either a number of hours or a cron expression."
    elif not whole(interval_hours, 1, INTERVAL_MAX_HOURS):
        errors["interval_hours"] = f"Give a whole number of hours from 1 to {INTERVAL_MAX_HOURS}."
    if not whole(retention_days, 1, selectors.RETENTION_MAX_DAYS):
        # The range the form offers: the plan's limit refuses more, in its own words, after.
        errors["retention_days"] = f"Give a whole number of days from 1 to {retention_most}."
    if retention_count is not None and not whole(retention_count, 1, 10_000):
        errors["retention_count"] = "Give a whole number of backups from 1, or leave it empty."
    if enabled and "backup" not in spec.main.verbs:
        errors["enabled"] = "This plan cannot take backups."
    return errors


def backup_schedule_update(
    *,
    actor: Actor,
    instance: Instance,
    interval_hours: int | None,
    cron: str,
    retention_days: int,
    retention_count: int | None,
    enabled: bool,
    seen: str | None = None,
    request_id: str | None = None,
) -> BackupSchedule:
    """Set when an instance is backed up (every `interval_hours`, or at the times of a
    five-field UTC `cron`) and how long its snapshots are kept: `retention_days` for every
    snapshot (the object store's retention policy, `$sys.backup.retentionDays`), and with
    `retention_count`, only that many scheduled snapshots. A changed timing starts counting
    from now. `seen`, the schedule's `settings_token` as the caller showed it: when someone
    changed it since, nothing is saved and a ValidationError says so.

    A changed retention is queued to the cluster at once, through the plan's
    applyBackupRetention (one operation per `request_id`; a repeat returns the schedule): the
    object store prunes by it whether or not scheduled backups run. The snapshots taken before
    keep the expiry of the retention on the cluster until that run has put the new one there.
    (On a plan without it, the next operation that renders the retention takes it, and the
    snapshots' expiry moves now.)"""
    tenant = instance.tenant
    cron = cron.strip() if isinstance(cron, str) else cron
    with audited_action(actor=actor, action="backup.schedule", tenant=tenant, target=instance):
        permission_require(actor=actor, tenant=tenant, action="backup.create")
        request_id = idempotency.request_id_clean(request_id)
        claim = _claim(
            tenant,
            request_id,
            "backup.schedule",
            {
                "instance": instance.pk,
                "interval_hours": interval_hours,
                "cron": cron,
                "retention_days": retention_days,
                "retention_count": retention_count,
                "enabled": enabled,
            },
        )
        if claim.earlier is not None:
            return selectors.backup_schedule_of(instance)
        # Locked, as a delete locks it: one committing meanwhile is seen.
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        if instance.state in (Instance.State.DELETING, Instance.State.DELETED):
            raise ActionDenied("The instance is deleted: it takes no more backups.")
        now = timezone.now()
        schedule = BackupSchedule.objects.select_for_update().filter(
            instance=instance
        ).first() or selectors.backup_schedule_default(instance, now=now)
        # Before the fields: a form from before a teammate's change is told so first, and
        # the form it is given back is based on their schedule rather than on the old one.
        if seen is not None and seen != schedule.settings_token:
            raise ValidationError(SCHEDULE_CHANGED)
        errors = _schedule_errors(
            spec=selectors.plan_spec(instance.plan_version),
            retention_most=selectors.backup_retention_most(instance),
            interval_hours=interval_hours,
            cron=cron,
            retention_days=retention_days,
            retention_count=retention_count,
            enabled=enabled,
        )
        if errors:
            raise ValidationError(errors)
        _entitled(instance, "backup.schedule", retention_days=retention_days)
        before = schedule.retention_days
        applied = schedule.retention_days_applied or before  # what the cluster holds
        queues = _retention_apply_needed(instance, before=applied, after=retention_days)
        interval_hours = None if cron else interval_hours
        retimed = (schedule.interval_hours, schedule.cron) != (interval_hours, cron)
        if retimed or (enabled and not schedule.enabled) or schedule.next_run_at is None:
            schedule.next_run_at = schedules.slot_after(
                after=now, interval_hours=interval_hours, cron=cron
            )
        schedule.interval_hours = interval_hours
        schedule.cron = cron
        schedule.retention_days = retention_days
        schedule.retention_days_applied = applied
        schedule.retention_count = retention_count
        schedule.enabled = enabled
        schedule.updated_at = now
        schedule.full_clean()
        schedule.save()
        if retention_days != before and not _retention_applied(instance):
            # Snapshots taken before expire by the new rule, as the object store will prune
            # them once an operation renders it (a plan's applyBackupRetention moves them when
            # its run has put it on the cluster).
            snapshots_expire_by(instance, retention_days)
        operation = None
        if queues:
            operation = _operation_new(
                actor=actor, instance=instance, verb=lifecycle.RETENTION_APPLY,
                request_id=request_id,
            )  # fmt: skip
        claim.bind(operation or schedule)
        audit_record(
            actor=actor,
            action="backup.schedule",
            tenant=tenant,
            target=instance,
            payload={
                "interval_hours": interval_hours,
                "cron": cron,
                "retention_days": retention_days,
                "retention_count": retention_count,
                "enabled": enabled,
            },
        )
    return schedule


def _retention_applied(instance: Instance) -> bool:
    """Whether the instance's plan renders a changed backup retention into the cluster as soon
    as it changes (its applyBackupRetention)."""
    return lifecycle.RETENTION_APPLY in selectors.plan_spec(instance.plan_version).main.verbs


def _retention_apply_needed(instance: Instance, *, before: int, after: int) -> bool:
    """Whether a schedule's retention going from `before` days (what the cluster holds) to
    `after` is to be queued to the cluster (the caller holds the instance's lock): it changed,
    the plan has applyBackupRetention, and none is queued already (that one reads the schedule
    when it starts). ActionDenied when it could not run after the operations queued (an
    upgrade)."""
    verb = lifecycle.RETENTION_APPLY
    if before == after or not _retention_applied(instance):
        return False
    pending = selectors.operations_pending(instance)
    if pending.filter(verb=verb, state=Operation.State.QUEUED).exists():
        return False
    reason = selectors.action_refusal(instance, verb, _projected_state(instance))
    if reason or _upgrading(instance):  # behind an upgrade it would run the old version
        raise ActionDenied(reason or UPGRADING)
    return True


def backups_run_due(*, now: datetime | None = None) -> dict[str, int]:
    """Queue a backup for every schedule whose slot has come (run by beat every minute).

    Each slot is claimed by a conditional UPDATE of the schedule's next slot, so two beat
    processes never run one slot twice; an instance that cannot be backed up now (stopped,
    updating, failed) skips its slot and the schedule says why.
    """
    now = now or timezone.now()
    _backup_schedules_fill(now)
    due = (
        BackupSchedule.objects.filter(enabled=True, next_run_at__lte=now)
        .exclude(instance__state=Instance.State.DELETED)
        .values_list("instance_id", "next_run_at", "interval_hours", "cron")
    )
    counts = {"ran": 0, "skipped": 0}
    for instance_id, slot, interval_hours, cron in list(due):
        try:
            following = schedules.slot_next(
                slot=slot, now=now, interval_hours=interval_hours, cron=cron
            )
        except ValueError as exc:  # a cron no rule reads any more: the others still run
            logger.warning("Backup schedule of %s: %s", instance_id, exc)
            continue
        try:
            outcome = _backup_slot_run(instance_id, slot, following)
        except Exception as exc:
            if database_trouble(exc):
                raise  # a deadlock, a lost connection: the next round tries every slot again
            # A fault in one slot (its operation could not be made): logged, and the slot
            # skipped, saying so; the slots after it, other organizations' too, still run.
            logger.exception("Backup schedule of %s: the slot %s failed", instance_id, slot)
            outcome = _backup_slot_skipped(instance_id, slot, following)
        if outcome is not None:
            counts[outcome] += 1
    return counts


def _backup_schedules_fill(now: datetime) -> None:
    """Give the plan's default schedule to instances made before schedules existed."""
    missing = Instance.objects.active().filter(backup_schedule=None).select_related("plan_version")
    BackupSchedule.objects.bulk_create(
        [selectors.backup_schedule_default(instance, now=now) for instance in missing],
        ignore_conflicts=True,
    )


def _backup_slot_run(instance_id: str, slot: datetime, following: datetime) -> str | None:
    """Claim one slot and queue its backup, or record why it was skipped; None when another
    process claimed it first (or the schedule changed meanwhile)."""
    Outcome = BackupSchedule.Outcome
    with transaction.atomic():
        # The organization and the instance before the schedule, as a save of the schedule
        # and a backup someone asks for take them: neither waits for the other the other way.
        tenant_lock(Instance.objects.values_list("tenant_id", flat=True).get(pk=instance_id))
        Instance.objects.select_for_update().values_list("pk").get(pk=instance_id)
        claimed = BackupSchedule.objects.filter(
            instance_id=instance_id, enabled=True, next_run_at=slot
        ).update(next_run_at=following, last_slot_at=slot)
        if not claimed:
            return None
        instance = Instance.objects.select_related("tenant", "plan_version").get(pk=instance_id)
        try:
            operation = _backup_queue_scheduled(instance, slot)
            outcome, reason = Outcome.RAN, ""
        except ActionDenied as exc:
            operation, outcome, reason = None, Outcome.SKIPPED, exc.reason
        BackupSchedule.objects.filter(instance_id=instance_id).update(
            last_outcome=outcome, last_reason=reason[:500], last_operation=operation
        )
    return outcome


SLOT_BACKUP_PENDING = "A backup asked for just before is queued or running: it stands for this one."
SLOT_FAULT = (
    "An unexpected error kept this backup from being queued; the platform team can see why."
)


def _backup_slot_skipped(instance_id: str, slot: datetime, following: datetime) -> str | None:
    """Move the schedule past a slot whose backup could not be queued, recorded as skipped:
    left due, it failed again every minute and the instance was never backed up again."""
    skipped = BackupSchedule.objects.filter(
        instance_id=instance_id, enabled=True, next_run_at=slot
    ).update(
        next_run_at=following,
        last_slot_at=slot,
        last_outcome=BackupSchedule.Outcome.SKIPPED,
        last_reason=SLOT_FAULT,
        last_operation=None,
    )
    return BackupSchedule.Outcome.SKIPPED if skipped else None


def _backup_queue_scheduled(instance: Instance, slot: datetime) -> Operation:
    """The backup of a schedule's slot, queued as the system: no role is checked, so only beat
    (`backups_run_due`) calls this, never a view. ActionDenied when the instance's state
    forbids a backup now (audited as refused)."""
    tenant = instance.tenant
    with audited_action(actor=SYSTEM, action="instance.backup", tenant=tenant, target=instance):
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        if "backup" not in selectors.plan_spec(instance.plan_version).main.verbs:
            raise ActionDenied("This plan cannot take backups.")
        reason = selectors.action_refusal(instance, "backup", _projected_state(instance))
        if reason or _upgrading(instance):  # behind an upgrade it would run the old version
            raise ActionDenied(reason or UPGRADING)
        if selectors.backup_pending(instance):  # one asked for just before: the same data
            raise ActionDenied(SLOT_BACKUP_PENDING)
        _entitled(instance, "backup")
        arguments = _snapshot_start(instance, scheduled=True)
        # One operation per slot, also enforced by the (instance, request id) constraint.
        operation = _operation_new(
            actor=SYSTEM,
            instance=instance,
            verb="backup",
            request_id=idempotency.system_request_id("schedule", f"{slot:%Y%m%dT%H%M%SZ}"),
            arguments=arguments,
        )
        Snapshot.objects.filter(pk=arguments["snapshot"]).update(operation=operation)
        audit_record(
            actor=SYSTEM,
            action="instance.backup",
            tenant=tenant,
            target=instance,
            payload={"scheduled": slot.isoformat()},
        )
    return operation


def snapshots_prune(*, now: datetime | None = None) -> int:
    """Forget expired snapshots (run by beat): completed ones past `expires_at`, and the
    scheduled ones beyond their schedule's retention count, through the plan's deleteBackup
    (or only marked deleted when the instance is gone). An instance's newest completed
    snapshot is kept, but once its organization is deleted. One that failed or was cancelled
    holds nothing to restore: past its `expires_at` it is only marked deleted (the object
    store's retention prunes whatever it left), so an instance whose scheduled backups fail
    does not pile them up. The number of snapshots forgotten."""
    now = now or timezone.now()
    forgotten = Snapshot.objects.filter(
        status__in=[Snapshot.Status.FAILED, Snapshot.Status.CANCELLED], expires_at__lte=now
    ).update(status=Snapshot.Status.DELETED)
    completed = Snapshot.objects.filter(status=Snapshot.Status.COMPLETED)
    expired = set(completed.filter(expires_at__lte=now).values_list("pk", flat=True))
    # Each instance's scheduled snapshots past its schedule's count, newest first: one query
    # for the fleet (from the schedules that keep a count), not one per schedule.
    keep = "instance__backup_schedule__retention_count"
    beyond = (
        completed.filter(scheduled=True, **{f"{keep}__isnull": False})
        .annotate(
            keep=F(keep),
            rank=Window(
                RowNumber(), partition_by=F("instance_id"), order_by=F("created_at").desc()
            ),
        )
        .filter(rank__gt=F("keep"))
        .values_list("pk", flat=True)
    )
    doomed = expired | set(beyond)
    if not doomed:
        return forgotten
    candidates = list(
        Snapshot.objects.filter(pk__in=doomed).select_related("instance", "tenant", "plan_version")
    )
    # An instance's newest completed snapshot stays, whatever its age or count, for as long as
    # its organization does: once that is deleted no one can restore it, nor delete it.
    newest = set(
        completed.filter(source_instance_id__in={s.source_instance_id for s in candidates})
        .order_by("source_instance_id", "-created_at")
        .distinct("source_instance_id")
        .values_list("pk", flat=True)
    ) - {s.pk for s in candidates if s.tenant.deleted_at is not None}
    # Those whose deleteBackup is queued already (or ran and failed: it shows on the page).
    queued = set(
        Operation.objects.filter(
            instance_id__in={s.instance_id for s in candidates if s.instance_id},
            request_id__in=[idempotency.system_request_id("prune", s.pk) for s in candidates],
        ).values_list("instance_id", "request_id")
    )
    for snapshot in candidates:
        request_id = idempotency.system_request_id("prune", snapshot.pk)
        if snapshot.pk in newest or (snapshot.instance_id, request_id) in queued:
            continue
        try:
            with transaction.atomic():
                _snapshot_forget(
                    actor=SYSTEM,
                    snapshot=snapshot,
                    request_id=request_id,
                    reason="expired" if snapshot.pk in expired else "beyond the retention count",
                )
        except ActionDenied:
            continue  # an upgrade is pending: the next run prunes it on the new version
        except Exception as exc:
            if database_trouble(exc):
                raise
            # One that cannot be (its plan version no longer loads): logged; the rest go.
            logger.exception("Snapshot %s could not be pruned", snapshot.pk)
            continue
        forgotten += 1
    return forgotten


# --- suspended subscriptions -----------------------------------------------------------------


def suspended_instances_stop(*, now: datetime | None = None) -> dict[str, int]:
    """Stop the running instances of subscriptions suspended, or ended with instances still
    running (Stripe ends one whose payment failed for good), for longer than their plan's
    `stop_after_days` (run by beat): each through its plan's `stop` verb, queued by the
    system, never deleted. An instance whose plan has no stop verb is flagged to staff (an
    audit event and a log line) instead. Idempotent: each stop's request id derives from the
    suspension, so a second sweep queues nothing new."""
    now = now or timezone.now()
    counts = {"stopped": 0, "unstoppable": 0}
    Status = Subscription.Status
    running = Instance.objects.filter(
        tenant_id=OuterRef("tenant_id"),
        plan_version__plan_id=OuterRef("plan_id"),
        state=Instance.State.RUNNING,
    )
    reopened = Subscription.objects.filter(
        tenant_id=OuterRef("tenant_id"),
        plan_id=OuterRef("plan_id"),
        status__in=Subscription.LETS_RUN,
    )
    # Suspended ones, and ended ones whose instances still run without another subscription
    # (Stripe ended it; one awaiting payment lets nothing run, nor did one cancelled while it
    # awaited, whose end starts no clock: `Subscription.RAN`): the newest of each tenant and
    # plan. Each is read again under its tenant's lock before anything is stopped.
    stopping = (
        Subscription.objects.filter(
            Q(status=Status.SUSPENDED, suspended_at__isnull=False)
            | Q(Exists(running), ~Exists(reopened), Subscription.RAN, status=Status.CANCELLED)
        )
        .order_by("tenant_id", "plan_id", "-created_at")
        .distinct("tenant_id", "plan_id")
        .select_related("tenant", "plan")
    )
    for subscription in stopping:
        due = subscription.stop_due_at()
        if due is None or due > now:
            continue
        try:
            stopped, unstoppable = _suspended_stop(subscription)
        except Exception as exc:
            if database_trouble(exc):
                raise
            # A fault in one (an instance's plan version no longer loads): logged; the other
            # subscriptions' instances are stopped, and the next round tries this one again.
            logger.exception(
                "Suspended subscription %s: its instances not stopped", subscription.pk
            )
            continue
        counts["stopped"] += len(stopped)
        counts["unstoppable"] += len(unstoppable)
    return counts


def _stop_still_due(subscription: Subscription) -> bool:
    """Whether the subscription, read again under its tenant's lock (which a subscribe, a
    resume or a reactivation takes), still stops its plan's instances: unchanged, and when
    ended, with no subscription since on which they may run."""
    now = Subscription.objects.filter(pk=subscription.pk).values_list("status", "suspended_at")
    if now.first() != (subscription.status, subscription.suspended_at):
        return False
    if subscription.status != Subscription.Status.CANCELLED:
        return True
    return not Subscription.objects.filter(
        tenant_id=subscription.tenant_id,
        plan_id=subscription.plan_id,
        status__in=Subscription.LETS_RUN,
    ).exists()


def _suspended_stop(subscription: Subscription) -> tuple[list[str], list[str]]:
    """Queue `stop` for the running instances of one subscription suspended or ended; the ids
    stopped now and those that cannot be (flagged once per suspension or end)."""
    with transaction.atomic():
        tenant_lock(subscription.tenant_id)
        if not _stop_still_due(subscription):
            return [], []
        return _stops_queue(subscription)


def _stops_queue(subscription: Subscription) -> tuple[list[str], list[str]]:
    since = subscription.stop_counted_from()
    ended = subscription.status == Subscription.Status.CANCELLED
    request_id = idempotency.derived_request_id(
        f"{subscription.pk}:{since.isoformat()}", "suspended-stop"
    )
    running = (
        Instance.objects.for_tenant(subscription.tenant)
        .filter(plan_version__plan=subscription.plan, state=Instance.State.RUNNING)
        .select_related("plan_version", "tenant")
    )
    stopped, unstoppable = [], []
    for instance in running:
        if "stop" not in selectors.plan_spec(instance.plan_version).main.verbs:
            unstoppable.append(instance.pk)
            continue
        if instance.operations.filter(request_id=request_id).exists():
            continue
        try:
            _stop_queue_suspended(instance, request_id, ended=ended)
        except ActionDenied:
            continue  # busy or changed meanwhile: the next sweep tries again
        stopped.append(instance.pk)
    flagged = AuditEvent.objects.filter(
        action="subscription.instances_unstoppable",
        target_type=subscription._meta.model_name,
        target_id=str(subscription.pk),
        created_at__gte=since,
    ).exists()
    if unstoppable and not flagged:
        logger.warning(
            "Suspended subscription %s: plan %s has no stop verb; instances %s keep running",
            subscription.pk,
            subscription.plan.key,
            ", ".join(unstoppable),
        )
    else:
        unstoppable = []
    if stopped or unstoppable:
        billing_services.subscription_instances_stopped(
            subscription=subscription, stopped=stopped, unstoppable=unstoppable
        )
    return stopped, unstoppable


def _stop_queue_suspended(instance: Instance, request_id: str, *, ended: bool) -> Operation:
    """A suspended (or, `ended`, cancelled) subscription's stop, queued as the system: no role
    is checked, so only beat (`suspended_instances_stop`) calls this, never a view.
    ActionDenied when the instance's state forbids a stop now (audited as refused)."""
    tenant = instance.tenant
    with audited_action(actor=SYSTEM, action="instance.stop", tenant=tenant, target=instance):
        instance = Instance.objects.select_for_update().get(pk=instance.pk)
        reason = selectors.action_refusal(instance, "stop", _projected_state(instance))
        if reason or _upgrading(instance):
            raise ActionDenied(reason or UPGRADING)
        operation = _operation_new(
            actor=SYSTEM, instance=instance, verb="stop", request_id=request_id
        )
        audit_record(
            actor=SYSTEM,
            action="instance.stop",
            tenant=tenant,
            target=instance,
            payload={
                "reason": "the subscription ended" if ended else "the subscription is suspended"
            },
        )
    return operation


def _fleet_told(operation: Operation) -> None:
    """An operation that ended without running (cancelled while queued): the fleet run in waves
    that queued it, if one did, is sent again once this commits, as the runner sends it when
    one ends."""
    from deployments import fleet  # it queues its operations through this module

    fleet.operation_ended(operation)
