"""CPU and memory of every running instance's servers, sampled each minute, and the Metrics
tab's charts of them.

A plan's spec describes its servers (`x-opsdeck.servers`): the label selector that finds an
instance's pods, the label naming each one's role, and each server's limits as CEL over the
instance's parameters (cpu in cores, memory in bytes). Beat calls `samples_take()` every
minute: per cell, one LIST of the metrics API's PodMetrics per distinct selector in all
namespaces (each instance is its own namespace, so never one LIST per instance), matched to the
cell's running instances by namespace and inserted in bulk, one row per server and minute.

Minutes are kept a day (the charts of the last hour and the last day read them); once an hour
has ended, each server's minutes of it are averaged into one `ServerHour`, kept 7 days (the
week's chart, averaged each hour, reads them, and the minutes of the hours not rolled up yet).
At 10,000 instances of three servers that is about 50 million rows rather than 300 million.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from itertools import chain
from typing import Any

from django.db import connection
from django.db.models import (
    Avg,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Func,
    Max,
    Min,
    Q,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone
from kubernetes.utils.quantity import parse_quantity

from deployments import selectors
from deployments.cells import driver_for
from deployments.kube import KubeDriver
from deployments.models import Cell, Instance, Operation, ServerHour, ServerSample
from deployments.servers import ServersRule, servers_rule
from deployments.workflow.driver import DriverError
from deployments.workflow.evaluator import ProgramError, ProgramLimitError, evaluate_cel

log = logging.getLogger(__name__)

METRICS_API = "metrics.k8s.io/v1beta1"
METRICS_KIND = "PodMetrics"
# The day's chart begins less than 24 hours ago, the week's less than 7 days ago.
MINUTES_KEPT = timedelta(hours=25)
HOURS_KEPT = timedelta(days=7, hours=1)
# An hour is rolled up this long after it ended: its last minute's sample is in by then.
ROLL_UP_AFTER = timedelta(minutes=5)
# The most one roll-up reads (the first one, of a week's minutes, takes a minute a day).
ROLLED_UP_AT_MOST = timedelta(days=1)
MIB = 1024 * 1024


# --- sampling ----------------------------------------------------------------------------------


def usage_of(pod_metrics: dict[str, Any]) -> tuple[int, int]:
    """A pod's (millicores, bytes): the sum of its containers' usage. ValueError when a
    quantity is not one."""
    cores = memory = Decimal(0)
    for container in pod_metrics.get("containers") or []:
        usage = container.get("usage") or {}
        cores += parse_quantity(usage.get("cpu", 0))
        memory += parse_quantity(usage.get("memory", 0))
    if cores < 0 or memory < 0:
        raise ValueError("negative usage")
    millicores = (cores * 1000).to_integral_value(ROUND_HALF_UP)
    return int(millicores), int(memory.to_integral_value(ROUND_HALF_UP))


def cell_sample(cell: Cell, driver: KubeDriver, at: datetime) -> int:
    """Sample the servers of the cell's running instances for the minute of `at`, one LIST per
    distinct selector of their plans; how many samples were offered (a minute already sampled
    keeps its rows)."""
    minute = at.replace(second=0, microsecond=0)
    # selector -> {namespace: (instance id, role label)}
    wanted: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    running = Instance.objects.filter(cell=cell, state=Instance.State.RUNNING)
    for instance in running.only("id", "plan_version_id"):
        spec = selectors.plan_version_loaded(instance.plan_version_id).spec
        servers = servers_rule(spec.extensions)
        if servers is not None:
            wanted[servers.selector][instance.namespace] = (instance.pk, servers.role_label)
    samples = []
    for selector, namespaces in wanted.items():
        for pod_metrics in driver.list_objects(METRICS_API, METRICS_KIND, label_selector=selector):
            meta = pod_metrics.get("metadata") or {}
            found = namespaces.get(meta.get("namespace", ""))
            if found is None or not meta.get("name"):
                continue
            instance_id, role_label = found
            try:
                cpu, memory = usage_of(pod_metrics)
            except (ValueError, ArithmeticError):
                log.warning("pod %s/%s: unreadable usage", meta.get("namespace"), meta["name"])
                continue
            role = (meta.get("labels") or {}).get(role_label, "") if role_label else ""
            samples.append(
                ServerSample(
                    instance_id=instance_id,
                    server=meta["name"][:253],
                    role=str(role)[:63],
                    minute=minute,
                    cpu=cpu,
                    memory=memory,
                )
            )
    ServerSample.objects.bulk_create(samples, ignore_conflicts=True, batch_size=1000)
    return len(samples)


def hours_roll_up(now: datetime | None = None) -> int:
    """Average each server's minute samples of every hour that ended ROLL_UP_AFTER ago into
    one `ServerHour`, from the first sample after the last hour rolled up, a day of hours at
    most per call; how many were made. One statement: nothing leaves the database."""
    now = now or timezone.now()
    after = _rolled_until()
    unrolled = ServerSample.objects.filter(minute__gte=after) if after else ServerSample.objects
    first = unrolled.aggregate(first=Min("minute"))["first"]  # along its index
    if first is None:
        return 0
    since = _bucket_start(first, _HOUR)
    until = min(_bucket_start(now - ROLL_UP_AFTER, _HOUR), since + ROLLED_UP_AT_MOST)
    if since >= until:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {ServerHour._meta.db_table}
                   (instance_id, server, role, hour, cpu, memory, samples)
            SELECT instance_id, server, max(role), date_bin(%s, minute, %s),
                   avg(cpu), avg(memory), count(*)
              FROM {ServerSample._meta.db_table}
             WHERE minute >= %s AND minute < %s
             GROUP BY instance_id, server, 4
                ON CONFLICT ON CONSTRAINT serverhour_once DO NOTHING
            """,  # noqa: S608 - our own table names
            [_HOUR, _ORIGIN, since, until],
        )
        return cursor.rowcount


def _rolled_until() -> datetime | None:
    """The end of the last hour rolled up (the end of its index), None before the first."""
    last = ServerHour.objects.aggregate(last=Max("hour"))["last"]
    return None if last is None else last + _HOUR


def samples_prune(now: datetime | None = None) -> int:
    """Forget the minutes older than MINUTES_KEPT whose hour is rolled up (a minute is never
    forgotten before) and the hours older than HOURS_KEPT, in one DELETE each; how many rows
    went."""
    now = now or timezone.now()
    minutes = 0
    rolled_until = _rolled_until()
    if rolled_until is not None:
        cutoff = min(now - MINUTES_KEPT, rolled_until)
        minutes, _ = ServerSample.objects.filter(minute__lt=cutoff).delete()
    hours, _ = ServerHour.objects.filter(hour__lt=now - HOURS_KEPT).delete()
    return minutes + hours


def samples_take(now: datetime | None = None) -> int:
    """Sample every cell's running instances for this minute (a cell that cannot be read is
    logged and skipped), roll up the hours that ended, then prune; how many samples were
    offered."""
    now = now or timezone.now()
    taken = 0
    for cell in Cell.objects.filter(instances__state=Instance.State.RUNNING).distinct():
        try:
            taken += cell_sample(cell, driver_for(cell), now)
        except DriverError as exc:
            log.warning("cell %s: metrics not read: %s", cell.name, exc.message)
    hours_roll_up(now)
    samples_prune(now)
    return taken


# --- charts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    span: timedelta
    bucket: timedelta  # samples are averaged over buckets this long: ~150 points a line at most
    averaged: str  # the bucket, as the page says it
    time_format: str


_MINUTE, _HOUR = timedelta(minutes=1), timedelta(hours=1)
WINDOWS = {
    w.key: w
    for w in (
        Window("1h", "Last hour", _HOUR, _MINUTE, "each minute", "%H:%M"),
        Window("24h", "Last 24 hours", 24 * _HOUR, 10 * _MINUTE, "10 minutes", "%H:%M"),
        Window("7d", "Last 7 days", 7 * 24 * _HOUR, _HOUR, "each hour", "%d %b %H:%M"),
    )
}
DEFAULT_WINDOW = "1h"
_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # buckets are aligned on it, here and in SQL


def window_of(key: str | None) -> Window:
    """The window a query string names; any other value is the default one."""
    return WINDOWS.get(key or "", WINDOWS[DEFAULT_WINDOW])


class _DateBin(Func):
    """PostgreSQL's date_bin(stride, source, origin): the start of the bucket of `source`."""

    function = "date_bin"
    output_field = DateTimeField()


def _bucket_start(moment: datetime, bucket: timedelta) -> datetime:
    return _ORIGIN + (moment - _ORIGIN) // bucket * bucket


@dataclass
class MetricsCharts:
    window: Window
    cpu: dict
    memory: dict
    servers: list[str]

    @property
    def empty(self) -> bool:
        return not self.servers


def server_limits(parameters: dict, servers: ServersRule | None) -> dict[str, float]:
    """Each server's limits the plan declares, for these parameter values: {"cpu": cores,
    "memory": bytes}; a limit that cannot be worked out is left out."""
    limits: dict[str, float] = {}
    if servers is None:
        return limits
    for name, expression in servers.limits.items():
        try:
            value = evaluate_cel(expression, "var", parameters).value
        except (ProgramError, ProgramLimitError) as exc:
            log.warning("the %s limit failed: %s", name, exc)
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            limits[name] = float(value)
    return limits


def limits_in_effect(instance: Instance, ends: list[datetime]) -> list[dict[str, float]]:
    """Each server's limits in effect at each instant of `ends` (in order): those of the
    parameters the last operation to succeed before it ran with, by its plan version's rule (a
    modify or an upgrade changes them when it succeeds); none before the first one. An instance
    without a succeeded operation up to the last instant has its stored parameters' throughout.
    One query, whatever the window."""
    succeeded = instance.operations.filter(
        state=Operation.State.SUCCEEDED, finished_at__lt=ends[-1]
    ).exclude(parameters={})
    earlier = succeeded.filter(finished_at__lt=ends[0]).order_by("-finished_at").values("pk")[:1]
    changes = list(
        succeeded.filter(Q(finished_at__gte=ends[0]) | Q(pk=Subquery(earlier)))
        .order_by("finished_at")
        .values("finished_at", "plan_version_id", "parameters")
    )
    if not changes:
        changes = [{"finished_at": None, "plan_version_id": instance.plan_version_id,
                    "parameters": instance.parameters}]  # fmt: skip
    worked_out: dict[str, dict[str, float]] = {}

    def limits(change: dict) -> dict[str, float]:
        key = json.dumps([change["plan_version_id"], change["parameters"]], sort_keys=True)
        if key not in worked_out:
            spec = selectors.plan_version_loaded(change["plan_version_id"]).spec
            worked_out[key] = server_limits(change["parameters"], servers_rule(spec.extensions))
        return worked_out[key]

    found, current, following = [], {}, iter(changes)
    change = next(following, None)
    for end in ends:
        while change is not None and (change["finished_at"] is None or change["finished_at"] < end):
            current = limits(change)
            change = next(following, None)
        found.append(current)
    return found


def _chart(labels: list[str], lines: dict[str, list], unit: str, limit: list) -> dict:
    """A line chart as `includes/chart.html` draws it: a line per server, the limit in effect
    at each point as one more line (none where there was none), and the same figures as table
    rows (empty where a server had no sample)."""
    series = [{"label": label, "values": values} for label, values in lines.items()]
    if any(value is not None for value in limit):
        series.append({"label": "Limit per server", "values": limit, "limit": True})
    rows = [
        [label, ["" if s["values"][i] is None else s["values"][i] for s in series]]
        for i, label in enumerate(labels)
    ]
    return {
        "kind": "line",
        "stacked": False,
        "labels": labels,
        "series": series,
        "unit": unit,
        "axis": "Time (UTC)",
        "rows": rows,
    }


def _binned(field: str, window: Window) -> _DateBin:
    return _DateBin(
        Value(window.bucket, output_field=DurationField()),
        field,
        Value(_ORIGIN, output_field=DateTimeField()),
    )


def _mean_of_hours(field: str) -> Sum:
    """The average of the minutes under the hours of a bucket (each hour weighs its samples)."""
    return Sum(F(field) * F("samples")) / Sum("samples")


def _window_buckets(instance: Instance, window: Window, start: datetime) -> Iterable[dict]:
    """Each server's averages per bucket of `window` from `start`, in time order per server,
    worked out in the database: for a window of hours, from the hours rolled up and then the
    minutes of those not rolled up yet (two queries); otherwise from the minutes (one)."""
    minutes = ServerSample.objects.filter(instance=instance, minute__gte=start)
    hours = ServerHour.objects.none()
    if window.bucket >= _HOUR:
        last = ServerHour.objects.order_by("-hour").values("hour")[:1]
        rolled_until = ExpressionWrapper(
            Subquery(last) + Value(_HOUR, output_field=DurationField()),
            output_field=DateTimeField(),
        )
        hours = ServerHour.objects.filter(instance=instance, hour__gte=start, hour__lt=rolled_until)
        minutes = minutes.filter(minute__gte=Coalesce(rolled_until, Value(start)))
    return chain(
        hours.annotate(bucket=_binned("hour", window))
        .values("server", "bucket")
        .annotate(cpu=_mean_of_hours("cpu"), memory=_mean_of_hours("memory"), role=Max("role"))
        .order_by("server", "bucket"),
        minutes.annotate(bucket=_binned("minute", window))
        .values("server", "bucket")
        .annotate(cpu=Avg("cpu"), memory=Avg("memory"), role=Max("role"))
        .order_by("server", "bucket"),
    )


def instance_charts(
    instance: Instance, window: Window, *, now: datetime | None = None
) -> MetricsCharts:
    """The CPU and memory charts of an instance's servers over `window`, averaged per bucket
    in the database (the same queries whatever the number of samples or servers)."""
    end = _bucket_start(now or timezone.now(), window.bucket)
    start = end - window.span + window.bucket
    count = int(window.span / window.bucket)
    times = [start + i * window.bucket for i in range(count)]
    index = {t: i for i, t in enumerate(times)}
    cpu: dict[str, list] = {}
    memory: dict[str, list] = {}
    roles: dict[str, str] = {}
    for row in _window_buckets(instance, window, start):
        i = index.get(row["bucket"])
        if i is None:  # a sample from the future (a clock ahead): not on this axis
            continue
        server = row["server"]
        cpu.setdefault(server, [None] * count)[i] = round(float(row["cpu"]) / 1000, 3)
        memory.setdefault(server, [None] * count)[i] = round(float(row["memory"]) / MIB, 1)
        roles[server] = row["role"]  # the latest bucket's: a server's rows come in time order

    def named(lines: dict[str, list]) -> dict[str, list]:
        return {(f"{s} ({roles[s]})" if roles[s] else s): v for s, v in lines.items()}

    # A bucket's limit is the one in effect at its end (the newest it saw).
    limits = limits_in_effect(instance, [t + window.bucket for t in times])
    memory_limits = [limit.get("memory") for limit in limits]
    labels = [t.strftime(window.time_format) for t in times]
    return MetricsCharts(
        window=window,
        cpu=_chart(labels, named(cpu), "cores", [limit.get("cpu") for limit in limits]),
        memory=_chart(
            labels,
            named(memory),
            "MiB",
            [None if m is None else round(m / MIB, 1) for m in memory_limits],
        ),
        servers=sorted(cpu),
    )
