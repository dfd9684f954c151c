"""Patches (JSON, merge, strategic merge) and server-side apply field ownership."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from .errors import ApiError, bad_request

# Strategic-merge keys of core lists, by field name (the struct tags of k8s.io/api).
SMP_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "secrets": "name",
}
# Lists of scalars merged as sets.
SMP_SETS = {"finalizers"}

# KeyResolver: given the field-name path of a list, its merge keys (None = atomic).
KeyResolver = Callable[[tuple[str, ...]], "list[str] | None"]


def core_list_keys(path: tuple[str, ...]) -> list[str] | None:
    """Merge keys for core kinds: ports by port number, the rest from SMP_KEYS."""
    if not path:
        return None
    name = path[-1]
    if name == "ports":
        return ["containerPort", "protocol"] if "containers" in path else ["port", "protocol"]
    if name in SMP_KEYS:
        return [SMP_KEYS[name]]
    return None


def schema_list_keys(schema: dict[str, Any] | None) -> KeyResolver:
    """Merge keys from a CRD schema's x-kubernetes-list-type: map."""

    def resolve(path: tuple[str, ...]) -> list[str] | None:
        node = schema
        for name in path:
            if not isinstance(node, dict):
                return None
            if node.get("type") == "array":
                node = node.get("items")
            if not isinstance(node, dict):
                return None
            props = node.get("properties") or {}
            if name in props:
                node = props[name]
            elif isinstance(node.get("additionalProperties"), dict):
                node = node["additionalProperties"]
            else:
                return None
        if isinstance(node, dict) and node.get("x-kubernetes-list-type") == "map":
            return list(node.get("x-kubernetes-list-map-keys") or [])
        if path and path[-1] == "ownerReferences":
            return ["uid"]
        return None

    return resolve


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer must start with /: {path}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for part in parts:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise _jp_error(f"doc is missing path: {path}")
    return cur


def _jp_error(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise bad_request("Unexpected kind: missing op")
        kind = op["op"]
        path = op.get("path", "")
        parts = _pointer(path)
        if kind == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise _jp_error(f"testing value {path} failed: test failed")
            continue
        if kind in ("move", "copy"):
            src = op.get("from", "")
            value = copy.deepcopy(_walk(doc, _pointer(src), src))
            if kind == "move":
                doc = _remove(doc, _pointer(src), src)
            doc = _add(doc, parts, value, path)
        elif kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        elif kind == "remove":
            doc = _remove(doc, parts, path)
        elif kind == "replace":
            _walk(doc, parts, path)
            doc = _remove(doc, parts, path)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise _jp_error(f"add operation does not apply: doc is missing path: {path}")
    else:
        raise _jp_error(f"add operation does not apply: doc is missing path: {path}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        return None
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _jp_error(f"remove operation does not apply: doc is missing path: {path}")
    return doc


def strategic_merge(
    target: Any, patch: Any, keys: KeyResolver = core_list_keys, path: tuple[str, ...] = ()
) -> Any:
    """Strategic merge patch: merge-patch semantics plus list merging by the usual keys."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key.startswith("$deleteFromPrimitiveList/"):
            if key.startswith("$deleteFromPrimitiveList/"):
                name = key.split("/", 1)[1]
                result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if key in ("$retainKeys", "$patch"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge(result.get(key), value, keys, (*path, key))
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, keys, (*path, key))
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current: Any, patch: list[Any], keys: KeyResolver, path: tuple[str, ...]) -> Any:
    if path[-1] in SMP_SETS and isinstance(current, list):
        out = list(current)
        out.extend(v for v in patch if v not in out)
        return out
    mkeys = keys(path)
    if not mkeys or not isinstance(current, list) or not all(isinstance(i, dict) for i in patch):
        return [i for i in copy.deepcopy(patch) if not (isinstance(i, dict) and "$patch" in i)]
    key = mkeys[0]
    out = copy.deepcopy(current)
    for item in patch:
        idx = next(
            (n for n, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item.get(key)),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
        elif idx is None:
            out.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            out[idx] = strategic_merge(out[idx], item, keys, path)
    return out


# ---- server-side apply: field sets -------------------------------------------------------

# A field path is a tuple of elements like "f:spec", "k:{\"name\":\"x\"}", "v:\"a\"".
FieldPath = tuple[str, ...]
# metadata fields owned by managers; the rest is the server's.
_OWNED_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")


# Defaults of list-map key fields: an item that leaves one out is keyed by its default, as
# structured-merge-diff does (a container port applied without protocol is the TCP one).
_KEY_DEFAULTS = {"protocol": "TCP"}


def _identity(item: dict[str, Any], mkeys: list[str]) -> dict[str, Any]:
    return {
        k: item[k] if k in item else _KEY_DEFAULTS[k]
        for k in mkeys
        if k in item or k in _KEY_DEFAULTS
    }


def key_element(item: dict[str, Any], mkeys: list[str]) -> str:
    """The path element of a keyed list item (`k:{"name":"x"}`)."""
    return "k:" + json.dumps(_identity(item, mkeys), separators=(",", ":"), sort_keys=True)


def field_set(obj: dict[str, Any], keys: KeyResolver) -> set[FieldPath]:
    """The leaf field paths an object sets (what a manager owns after writing it)."""
    out: set[FieldPath] = set()
    for top, value in obj.items():
        if top in ("apiVersion", "kind"):
            continue
        if top == "metadata":
            if isinstance(value, dict):
                for mk in _OWNED_METADATA:
                    if mk in value:
                        _collect(value[mk], ("f:metadata", f"f:{mk}"), ("metadata", mk), keys, out)
            continue
        _collect(value, (f"f:{top}",), (top,), keys, out)
    return out


def _collect(
    value: Any, fpath: FieldPath, names: tuple[str, ...], keys: KeyResolver, out: set[FieldPath]
) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _collect(v, (*fpath, f"f:{k}"), (*names, k), keys, out)
        return
    if isinstance(value, list) and value:
        mkeys = keys(names)
        if mkeys and all(isinstance(i, dict) for i in value):
            for item in value:
                elem = (*fpath, key_element(item, mkeys))
                out.add((*elem, "."))
                for k, v in item.items():
                    _collect(v, (*elem, f"f:{k}"), (*names, k), keys, out)
            return
        if names[-1] in SMP_SETS or names == ("metadata", "finalizers"):
            for item in value:
                out.add((*fpath, "v:" + json.dumps(item)))
            return
    out.add(fpath)


def to_fields_v1(paths: set[FieldPath]) -> dict[str, Any]:
    """Render a field set as the FieldsV1 trie of managedFields."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for elem in path:
            node = node.setdefault(elem, {})
    return root


def from_fields_v1(trie: dict[str, Any] | None, prefix: FieldPath = ()) -> set[FieldPath]:
    """Parse a FieldsV1 trie back into leaf paths."""
    out: set[FieldPath] = set()
    for elem, sub in (trie or {}).items():
        path = (*prefix, elem)
        if sub:
            out |= from_fields_v1(sub, path)
        else:
            out.add(path)
    return out


def value_at(obj: Any, path: FieldPath) -> tuple[bool, Any]:
    """Follow a field path into an object: (found, value)."""
    cur = obj
    for elem in path:
        if elem == ".":
            continue
        kind, _, rest = elem.partition(":")
        if kind == "f":
            if not isinstance(cur, dict) or rest not in cur:
                return False, None
            cur = cur[rest]
        elif kind == "k":
            want = json.loads(rest)
            if not isinstance(cur, list):
                return False, None
            match = [
                i
                for i in cur
                if isinstance(i, dict) and all(i.get(k) == v for k, v in want.items())
            ]
            if not match:
                return False, None
            cur = match[0]
        elif kind == "v":
            want = json.loads(rest)
            if not isinstance(cur, list) or want not in cur:
                return False, None
            cur = want
        else:
            return False, None
    return True, cur


def remove_at(obj: Any, path: FieldPath) -> None:
    """Delete the field a path names, if present."""
    if path and path[-1] == ".":
        path = path[:-1]
    if not path:
        return
    found, parent = value_at(obj, path[:-1])
    if not found:
        return
    kind, _, rest = path[-1].partition(":")
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind in ("k", "v") and isinstance(parent, list):
        want = json.loads(rest)
        for i, item in enumerate(parent):
            hit = (
                item == want
                if kind == "v"
                else isinstance(item, dict) and all(item.get(k) == v for k, v in want.items())
            )
            if hit:
                del parent[i]
                break


def path_string(path: FieldPath) -> str:
    """Print a field path like structured-merge-diff: `.spec.containers[name="x"].image`."""
    out = ""
    for elem in path:
        kind, _, rest = elem.partition(":")
        if elem == ".":
            continue
        if kind == "f":
            out += "." + rest
        elif kind == "k":
            pairs = json.loads(rest)
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in pairs.items()) + "]"
        elif kind == "v":
            out += f"[={rest}]"
        else:
            out += f"[{rest}]"
    return out


def apply_merge(current: Any, applied: Any, keys: KeyResolver, names: tuple[str, ...] = ()) -> Any:
    """Merge an applied configuration into the live object (maps deep, keyed lists by key)."""
    if isinstance(applied, dict) and isinstance(current, dict):
        out = copy.deepcopy(current)
        for k, v in applied.items():
            out[k] = (
                apply_merge(current.get(k), v, keys, (*names, k))
                if k in current
                else copy.deepcopy(v)
            )
        return out
    if isinstance(applied, list) and isinstance(current, list) and names:
        mkeys = keys(names)
        if mkeys and all(isinstance(i, dict) for i in applied + current):
            out = copy.deepcopy(current)
            for item in applied:
                ident = _identity(item, mkeys)
                idx = next((n for n, c in enumerate(out) if _identity(c, mkeys) == ident), None)
                if idx is None:
                    out.append(copy.deepcopy(item))
                else:
                    out[idx] = apply_merge(out[idx], item, keys, names)
            return out
        if names[-1] in SMP_SETS:
            return list(current) + [v for v in applied if v not in current]
    return copy.deepcopy(applied)
