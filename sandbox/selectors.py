"""Label and field selectors, parsed like apimachinery's `labels.Parse` and `fields.Parse`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import bad_request

Matcher = Callable[[dict[str, Any]], bool]

_REQ = re.compile(
    r"""\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*
    (?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<val>\([^)]*\)|[A-Za-z0-9._-]*))?\s*$""",
    re.X,
)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> Matcher:
    """Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k` into a matcher over labels."""
    if not text:
        return lambda labels: True
    reqs: list[Matcher] = []
    for part in _split_top(text):
        m = _REQ.match(part)
        if not m or (m.group("neg") and m.group("op")):
            raise bad_request(f"unable to parse requirement: {part.strip()}")
        key, op, val = m.group("key"), (m.group("op") or "").strip(), m.group("val")
        if m.group("neg"):
            reqs.append(lambda lb, k=key: k not in lb)
        elif not op:
            reqs.append(lambda lb, k=key: k in lb)
        elif op in ("=", "=="):
            reqs.append(lambda lb, k=key, v=val: lb.get(k) == v)
        elif op == "!=":
            reqs.append(lambda lb, k=key, v=val: lb.get(k) != v)
        else:
            if not val or not val.startswith("("):
                raise bad_request(f"unable to parse requirement: {part.strip()}")
            values = {v.strip() for v in val[1:-1].split(",") if v.strip()}
            if op == "in":
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
    return lambda labels: all(r(labels) for r in reqs)


# Field selectors each kind supports besides metadata.name/metadata.namespace.
EXTRA_FIELDS = {
    "pods": ["spec.nodeName", "status.phase", "spec.restartPolicy", "spec.serviceAccountName"],
    "secrets": ["type"],
    "namespaces": ["status.phase"],
    "events": [
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ],
}


def _field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if path == "source" and isinstance(cur, dict):
        return str(cur.get("component", ""))
    return "" if cur is None else str(cur)


def parse_field_selector(text: str | None, plural: str, kind: str) -> Matcher:
    """Parse `metadata.name=x,metadata.namespace!=y` into a matcher over whole objects."""
    if not text:
        return lambda obj: True
    allowed = {"metadata.name", "metadata.namespace", *EXTRA_FIELDS.get(plural, [])}
    reqs: list[Matcher] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9._-]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        key, op, val = m.groups()
        if key not in allowed:
            raise bad_request(f"field label not supported: {key}")
        if op == "!=":
            reqs.append(lambda o, k=key, v=val: _field_value(o, k) != v)
        else:
            reqs.append(lambda o, k=key, v=val: _field_value(o, k) == v)
    return lambda obj: all(r(obj) for r in reqs)


def label_selector_string(selector: Any) -> str:
    """A `LabelSelector` object (matchLabels, matchExpressions) as a selector string.

    Written like apimachinery's `LabelSelectorAsSelector(...).String()`: requirements sorted
    by key, `=` for equality. This is the Scale subresource's `status.selector`.
    """
    if not isinstance(selector, dict):
        return ""
    reqs: list[tuple[str, str]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        reqs.append((key, f"{key}={value}"))
    for expr in selector.get("matchExpressions") or []:
        if not isinstance(expr, dict):
            continue
        key, op = str(expr.get("key", "")), expr.get("operator")
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        text = {
            "In": f"{key} in ({values})",
            "NotIn": f"{key} notin ({values})",
            "Exists": key,
            "DoesNotExist": f"!{key}",
        }.get(str(op))
        if text is not None:
            reqs.append((key, text))
    return ",".join(text for _, text in sorted(reqs))


def label_selector_matcher(selector: Any) -> Matcher:
    """A matcher over labels for a `LabelSelector` object (an empty one matches everything)."""
    return parse_label_selector(label_selector_string(selector))
