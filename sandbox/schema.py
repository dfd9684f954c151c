"""Structural-schema handling of custom resources: pruning, defaulting, validation, CEL."""

from __future__ import annotations

import copy
import logging
import re
import threading
from typing import Any

from .errors import FieldError, go_repr, invalid, required

log = logging.getLogger("sandbox.schema")

_META_FIELDS = {
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "selfLink",
}


def prune(obj: Any, schema: dict[str, Any] | None, path: str = "", root: bool = True) -> list[str]:
    """Drop fields the schema does not declare (in place); return their paths."""
    unknown: list[str] = []
    if schema is None or not isinstance(obj, dict):
        return unknown
    _prune(obj, schema, path, unknown, root)
    return unknown


def _prune(value: Any, schema: dict[str, Any], path: str, unknown: list[str], root: bool) -> None:
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        embedded = root or schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            sub = f"{path}.{key}" if path else key
            if embedded and key in ("apiVersion", "kind"):
                continue
            if embedded and key == "metadata":
                if isinstance(value[key], dict):
                    for mk in list(value[key]):
                        if mk not in _META_FIELDS:
                            unknown.append(f"{sub}.{mk}")
                            del value[key][mk]
                continue
            if value[key] is None and not (props.get(key) or {}).get("nullable"):
                del value[key]
                continue
            if key in props:
                _prune(value[key], props[key], sub, unknown, False)
            elif isinstance(extra, dict):
                _prune(value[key], extra, sub, unknown, False)
            elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                continue
            else:
                unknown.append(sub)
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _prune(item, schema["items"], f"{path}[{i}]", unknown, False)


def apply_defaults(value: Any, schema: dict[str, Any] | None) -> None:
    """Fill in `default:` values of the schema, in place, where the parent object exists."""
    if schema is None:
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in props:
                    apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _type_ok(value: Any, want: str) -> bool:
    got = _type_of(value)
    if want == "number":
        return got in ("number", "integer")
    if want == "integer" and got == "number":
        return float(value).is_integer()
    return got == want


def validate(
    value: Any, schema: dict[str, Any] | None, old: Any = None, path: str = ""
) -> list[FieldError]:
    """Check a (pruned, defaulted) object against its schema; CEL rules included."""
    errors: list[FieldError] = []
    if schema is not None:
        _validate(value, schema, old, path, errors, True)
    return errors


def _validate(
    value: Any, schema: dict[str, Any], old: Any, path: str, errors: list[FieldError], root: bool
) -> None:
    if value is None:
        return
    want = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errors.append(
                invalid(
                    path,
                    value,
                    f'{path} in body must be of type integer,string: "{_type_of(value)}"',
                )
            )
            return
    elif want and not _type_ok(value, want):
        errors.append(
            invalid(path, value, f'{path} in body must be of type {want}: "{_type_of(value)}"')
        )
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(
            FieldError(
                "FieldValueNotSupported",
                path,
                value=value,
                supported=[s if isinstance(s, str) else go_repr(s) for s in schema["enum"]],
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if schema.get("exclusiveMinimum") and value <= low:
                errors.append(invalid(path, value, f"{path} in body should be greater than {low}"))
            elif value < low:
                errors.append(
                    invalid(path, value, f"{path} in body should be greater than or equal to {low}")
                )
        if "maximum" in schema:
            high = schema["maximum"]
            if schema.get("exclusiveMaximum") and value >= high:
                errors.append(invalid(path, value, f"{path} in body should be less than {high}"))
            elif value > high:
                errors.append(
                    invalid(path, value, f"{path} in body should be less than or equal to {high}")
                )
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                invalid(
                    path,
                    value,
                    f"{path} in body should be at least {schema['minLength']} chars long",
                )
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                FieldError(
                    "FieldValueTooLong", path, f"may not be more than {schema['maxLength']} bytes"
                )
            )
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(
                invalid(path, value, f"{path} in body should match '{schema['pattern']}'")
            )
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(
                invalid(
                    path,
                    len(value),
                    f"{path} in body should have at least {schema['minItems']} items",
                )
            )
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(
                FieldError(
                    "FieldValueTooMany", path, f"must have at most {schema['maxItems']} items"
                )
            )
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _validate(item, items, None, f"{path}[{i}]", errors, False)
    if isinstance(value, dict):
        for name in schema.get("required") or []:
            if name not in value and not (root and name == "metadata"):
                errors.append(required(f"{path}.{name}" if path else name))
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for key, sub_value in value.items():
            sub = f"{path}.{key}" if path else key
            if root and key in ("metadata", "apiVersion", "kind"):
                continue
            if key in props:
                _validate(sub_value, props[key], old_map.get(key), sub, errors, False)
            elif isinstance(extra, dict):
                _validate(sub_value, extra, old_map.get(key), sub, errors, False)
    for rule in schema.get("x-kubernetes-validations") or []:
        _check_rule(rule, value, old, path, errors)


# ---- CEL -----------------------------------------------------------------------------------

_cel_lock = threading.Lock()
_cel_cache: dict[str, Any] = {}


def _program(expr: str) -> Any:
    import celpy

    with _cel_lock:
        if expr not in _cel_cache:
            env = celpy.Environment()
            _cel_cache[expr] = env.program(env.compile(expr))
        return _cel_cache[expr]


def _check_rule(
    rule: dict[str, Any], value: Any, old: Any, path: str, errors: list[FieldError]
) -> None:
    expr = rule.get("rule", "")
    uses_old = "oldSelf" in expr
    if uses_old and old is None:
        # Transition rules only run on updates that have an old value.
        return
    try:
        import celpy

        activation = {"self": celpy.json_to_cel(value)}
        if uses_old:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = _program(expr).evaluate(activation)
    except Exception as exc:  # cel-python cannot evaluate every Kubernetes CEL extension
        log.debug("skipping CEL rule %r: %s", expr, exc)
        return
    if isinstance(result, Exception) or not isinstance(result, (bool, int)):
        return
    if bool(result):
        return
    message = rule.get("message") or f"failed rule: {expr}"
    field_path = path
    if rule.get("fieldPath"):
        field_path = (path + rule["fieldPath"]) if path else rule["fieldPath"].lstrip(".")
    errors.append(invalid(field_path, _type_of(value), message))
