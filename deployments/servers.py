"""What the instance page shows from inside an instance, read live from its cell: its servers
(pods) and volume claims, the Kubernetes events of its namespace, and a server's log lines.

The plan spec says which pods are the instance's servers and what their roles are
(`x-opsdeck.servers`: a label selector, the label naming a server's role, the container whose
log is shown first), so no operator is named here. Every read goes through the cell's
`KubeDriver` (`deployments.kube`), one LIST or one log request at a time, and keeps only the
few fields a page shows. A cluster that cannot be reached raises `DriverError`; the page says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from deployments.kube import KubeDriver, event_seen

EVENTS_SHOWN = 200
LOG_TAILS = (100, 500, 2000)  # the line counts the Logs tab offers, the first by default


@dataclass(frozen=True)
class LogFields:
    """A plan's `x-opsdeck.servers.logs`: where a log line written as a JSON object says its
    level and its message, each as dotted paths into the object, the first found taken."""

    level: tuple[str, ...] = ()
    message: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServersRule:
    """A plan's `x-opsdeck.servers`."""

    selector: str
    role_label: str = ""  # the pod label naming a server's role; empty: servers have no roles
    container: str = ""
    limits: dict[str, str] = field(default_factory=dict)  # cpu (cores), memory (bytes): CEL
    logs: LogFields | None = None  # None: log lines are shown as written


def _paths(value: Any) -> tuple[str, ...]:
    """A `logs` entry: one dotted path, or a list of them."""
    values = value if isinstance(value, list) else [value] if value else []
    return tuple(str(path) for path in values if path)


def servers_rule(extensions: dict[str, Any]) -> ServersRule | None:
    """The plan's servers rule (None when its spec declares none)."""
    servers = extensions.get("servers")
    if not isinstance(servers, dict) or not servers.get("selector"):
        return None
    limits = servers.get("limits")
    limits = limits if isinstance(limits, dict) else {}
    logs = servers.get("logs")
    fields = None
    if isinstance(logs, dict) and _paths(logs.get("message")):
        fields = LogFields(level=_paths(logs.get("level")), message=_paths(logs.get("message")))
    return ServersRule(
        selector=str(servers["selector"]),
        role_label=str(servers.get("role") or ""),
        container=str(servers.get("container") or ""),
        limits={k: str(limits[k]) for k in ("cpu", "memory") if limits.get(k)},
        logs=fields,
    )


@dataclass(frozen=True)
class Server:
    name: str
    role: str
    status: str  # as kubectl's STATUS column: Running, Pending, CrashLoopBackOff, Terminating…
    ready: int  # containers ready …
    containers: tuple[str, ...]  # … of these
    restarts: int
    created: datetime | None
    node: str

    @property
    def healthy(self) -> bool:
        return self.status == "Running" and self.ready == len(self.containers)


@dataclass(frozen=True)
class Claim:
    name: str
    capacity: str
    requested: str
    status: str  # Bound, Pending, Lost
    storage_class: str


@dataclass(frozen=True)
class Event:
    type: str  # Normal, Warning
    reason: str
    object: str  # Kind/name
    message: str
    count: int
    last_seen: datetime | None


def _time(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) and value else None


def _pod_status(pod: dict[str, Any]) -> str:
    """The one word kubectl shows for a pod: a waiting or terminated container's reason first,
    else its phase; Terminating once it is being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        for waiting in ("waiting", "terminated"):
            reason = (state.get(waiting) or {}).get("reason")
            if reason:
                return str(reason)
    return str(status.get("phase") or "Unknown")


def _server(pod: dict[str, Any], rule: ServersRule) -> Server:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    labels = meta.get("labels") or {}
    return Server(
        name=str(meta.get("name", "")),
        role=str(labels.get(rule.role_label, "")) if rule.role_label else "",
        status=_pod_status(pod),
        ready=sum(1 for c in statuses if c.get("ready")),
        containers=tuple(str(c.get("name", "")) for c in spec.get("containers") or []),
        restarts=sum(int(c.get("restartCount") or 0) for c in statuses),
        created=_time(meta.get("creationTimestamp")),
        node=str(spec.get("nodeName") or ""),
    )


def servers_read(driver: KubeDriver, namespace: str, rule: ServersRule) -> list[Server]:
    """The instance's servers, by name (one LIST in its namespace)."""
    pods = driver.list_objects("v1", "Pod", namespace=namespace, label_selector=rule.selector)
    return sorted((_server(pod, rule) for pod in pods), key=lambda s: _natural(s.name))


def claims_read(driver: KubeDriver, namespace: str) -> list[Claim]:
    """The volume claims of the instance's namespace, by name (one LIST)."""
    claims = []
    for claim in driver.list_objects("v1", "PersistentVolumeClaim", namespace=namespace):
        meta, spec, status = (claim.get(k) or {} for k in ("metadata", "spec", "status"))
        requests = (spec.get("resources") or {}).get("requests") or {}
        claims.append(
            Claim(
                name=str(meta.get("name", "")),
                capacity=str((status.get("capacity") or {}).get("storage", "")),
                requested=str(requests.get("storage", "")),
                status=str(status.get("phase") or "Pending"),
                storage_class=str(spec.get("storageClassName") or ""),
            )
        )
    return sorted(claims, key=lambda c: _natural(c.name))


def events_read(driver: KubeDriver, namespace: str) -> list[Event]:
    """The Kubernetes events of the instance's namespace, newest first (one LIST; at most
    EVENTS_SHOWN)."""
    events = []
    listed = driver.list_objects("v1", "Event", namespace=namespace)
    for position, event in enumerate(listed):
        involved = event.get("involvedObject") or {}
        series = event.get("series") or {}
        meta = event.get("metadata") or {}
        last = event_seen(event)
        shown = Event(
            type=str(event.get("type") or "Normal"),
            reason=str(event.get("reason") or ""),
            object=f"{involved.get('kind', '')}/{involved.get('name', '')}",
            message=str(event.get("message") or ""),
            count=int(event.get("count") or series.get("count") or 1),
            last_seen=last,
        )
        # Times are to the second: of one second's events, the one the cluster wrote last (the
        # higher resourceVersion, an etcd revision; else the later listed) is the newer.
        version = str(meta.get("resourceVersion") or "")
        written = (int(version) if version.isdigit() else 0, position)
        events.append((last or datetime.min.replace(tzinfo=UTC), written, shown))
    events.sort(key=lambda e: e[:2], reverse=True)
    return [shown for *_, shown in events[:EVENTS_SHOWN]]


@dataclass(frozen=True)
class LogLine:
    at: datetime | None
    text: str
    level: str = ""  # as a line written as JSON says it (`LogFields`)


def _found(obj: dict, paths: tuple[str, ...]) -> str | None:
    """The first of `paths` (dotted, through nested objects) that holds text or a number."""
    for path in paths:
        value: Any = obj
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str | int | float) and not isinstance(value, bool) and value != "":
            return str(value)
    return None


def _read(line: str, fields: LogFields) -> tuple[str, str]:
    """A line's level and message as a line written as a JSON object says them; a line that
    is no such object, or has no message where `fields` look, as written."""
    if not line.startswith("{"):
        return "", line
    try:
        obj = json.loads(line)
    except ValueError:
        return "", line
    message = _found(obj, fields.message) if isinstance(obj, dict) else None
    if message is None:
        return "", line
    return _found(obj, fields.level) or "", message


def log_read(
    driver: KubeDriver,
    namespace: str,
    server: Server,
    *,
    container: str,
    tail: int,
    contains: str = "",
    fields: LogFields | None = None,
) -> list[LogLine]:
    """The last `tail` lines of one container of a server, oldest first, those containing
    `contains` (any case) when given; with `fields`, a line written as JSON is its level and
    its message (which `contains` is looked for in)."""
    text = driver.pod_log(namespace, server.name, container=container, tail_lines=tail)
    lines = []
    needle = contains.casefold()
    for raw in text.splitlines():
        stamp, _, rest = raw.partition(" ")
        at = _time(stamp)
        line = rest if at is not None else raw
        level, shown = _read(line, fields) if fields is not None else ("", line)
        if needle and needle not in f"{level} {shown}".casefold():
            continue
        lines.append(LogLine(at, shown, level))
    return lines


def _natural(name: str) -> list:
    """`db-2` before `db-10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
