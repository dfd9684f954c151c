"""Server-side `meta.k8s.io/v1` Table output, as `kubectl get` asks for it."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from .resources import ResourceType

_NAME_COL = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, as kubectl prints ages."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 120:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        return f"{minutes}m{secs % 60}s" if secs % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    try:
        then = dt.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "<invalid>"
    return human_duration((dt.datetime.now(dt.UTC) - then).total_seconds())


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Evaluate the printer-column JSONPath subset: .a.b, [n], [*], [?(@.k=='v')]."""
    tokens = re.findall(
        r"\.([A-Za-z0-9_\-]+)|\[(\*|-?\d+|\?\(@\.([\w.\-]+)\s*==\s*['\"]([^'\"]*)['\"]\))\]", path
    )
    current = [obj]
    for name, bracket, fkey, fval in tokens:
        nxt: list[Any] = []
        for value in current:
            if name:
                if isinstance(value, dict) and name in value:
                    nxt.append(value[name])
            elif bracket == "*":
                if isinstance(value, list):
                    nxt.extend(value)
                elif isinstance(value, dict):
                    nxt.extend(value.values())
            elif fkey:
                if isinstance(value, list):
                    for item in value:
                        cur = item
                        for part in fkey.split("."):
                            cur = cur.get(part) if isinstance(cur, dict) else None
                        if cur is not None and str(cur) == fval:
                            nxt.append(item)
            elif isinstance(value, list):
                idx = int(bracket)
                if -len(value) <= idx < len(value):
                    nxt.append(value[idx])
        current = nxt
    return current


def _column_value(obj: dict[str, Any], col: dict[str, Any]) -> Any:
    found = jsonpath(obj, col.get("jsonPath", ""))
    if not found:
        return None
    value = found[0]
    if col.get("type") == "date" and isinstance(value, str):
        return _age(value)
    if col.get("type") == "string" and not isinstance(value, str):
        return str(value) if not isinstance(value, (dict, list)) else None
    return value


def _core_columns(rt: ResourceType) -> list[tuple[dict[str, Any], Any]]:
    """(definition, cell function) pairs for the built-in kinds kubectl shows most."""

    def col(name: str, typ: str = "string") -> dict[str, Any]:
        return {"name": name, "type": typ, "format": "", "description": name, "priority": 0}

    age = (col("Age"), lambda o: _age(o["metadata"].get("creationTimestamp")))
    plural = rt.plural
    if plural == "namespaces":
        return [(col("Status"), lambda o: (o.get("status") or {}).get("phase", "")), age]
    if plural == "secrets":
        return [
            (col("Type"), lambda o: o.get("type", "")),
            (col("Data", "integer"), lambda o: len(o.get("data") or {})),
            age,
        ]
    if plural == "configmaps":
        return [
            (
                col("Data", "integer"),
                lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            ),
            age,
        ]
    if plural == "services":

        def ports(o: dict[str, Any]) -> str:
            items = (o.get("spec") or {}).get("ports") or []
            return (
                ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in items) or "<none>"
            )

        return [
            (col("Type"), lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
            (col("Cluster-IP"), lambda o: (o.get("spec") or {}).get("clusterIP", "")),
            (col("External-IP"), lambda o: "<none>"),
            (col("Port(s)"), ports),
            age,
        ]
    if plural == "pods":

        def ready(o: dict[str, Any]) -> str:
            total = len((o.get("spec") or {}).get("containers") or [])
            statuses = (o.get("status") or {}).get("containerStatuses") or []
            return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"

        return [
            (col("Ready"), ready),
            (col("Status"), lambda o: (o.get("status") or {}).get("phase", "")),
            (
                col("Restarts", "integer"),
                lambda o: sum(
                    s.get("restartCount", 0)
                    for s in (o.get("status") or {}).get("containerStatuses") or []
                ),
            ),
            age,
        ]
    if plural == "persistentvolumeclaims":
        return [
            (col("Status"), lambda o: (o.get("status") or {}).get("phase", "")),
            (col("Volume"), lambda o: (o.get("spec") or {}).get("volumeName", "")),
            (
                col("Capacity"),
                lambda o: ((o.get("status") or {}).get("capacity") or {}).get("storage", ""),
            ),
            (
                col("Access Modes"),
                lambda o: ",".join(
                    {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX"}.get(
                        m, m
                    )
                    for m in (o.get("status") or {}).get("accessModes") or []
                ),
            ),
            (col("StorageClass"), lambda o: (o.get("spec") or {}).get("storageClassName", "")),
            age,
        ]
    if plural == "statefulsets":

        def containers(o: dict[str, Any]) -> list[dict[str, Any]]:
            return (((o.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "containers"
            ) or []

        return [
            (
                col("Ready"),
                lambda o: (
                    f"{(o.get('status') or {}).get('readyReplicas', 0)}/"
                    f"{(o.get('spec') or {}).get('replicas', 1)}"
                ),
            ),
            age,
            (
                {**col("Containers"), "priority": 1},
                lambda o: ",".join(c.get("name", "") for c in containers(o)),
            ),
            (
                {**col("Images"), "priority": 1},
                lambda o: ",".join(c.get("image", "") for c in containers(o)),
            ),
        ]
    if plural == "events":
        # Events show their name only with -o wide.
        return [
            ({**_NAME_COL, "priority": 1}, _name),
            (
                col("Last Seen"),
                lambda o: _age(o.get("lastTimestamp") or o["metadata"].get("creationTimestamp")),
            ),
            (col("Type"), lambda o: o.get("type", "")),
            (col("Reason"), lambda o: o.get("reason", "")),
            (
                col("Object"),
                lambda o: (
                    f"{(o.get('involvedObject') or {}).get('kind', '').lower()}/"
                    f"{(o.get('involvedObject') or {}).get('name', '')}"
                ),
            ),
            (col("Message"), lambda o: o.get("message", "")),
        ]
    return [age]


def _name(obj: dict[str, Any]) -> str:
    return obj["metadata"]["name"]


def to_table(
    rt: ResourceType, objs: list[dict[str, Any]], rv: str, include: str, cont: str | None = None
) -> dict[str, Any]:
    """Build a Table of objects with the CRD's printer columns (or the built-in ones)."""
    if rt.crd:
        custom = rt.printer_columns or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]
        defs = [dict(_NAME_COL)] + [
            {
                "name": c["name"],
                "type": c.get("type", "string"),
                "format": c.get("format", ""),
                "description": c.get("description", ""),
                "priority": c.get("priority", 0),
            }
            for c in custom
        ]
        cells = [_name] + [lambda o, c=c: _column_value(o, c) for c in custom]
    else:
        pairs = _core_columns(rt)
        if pairs[0][0].get("format") != "name":
            pairs.insert(0, (dict(_NAME_COL), _name))
        defs = [p[0] for p in pairs]
        cells = [p[1] for p in pairs]
    rows = []
    for obj in objs:
        row: dict[str, Any] = {"cells": [f(obj) for f in cells]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": defs,
        "rows": rows,
    }
