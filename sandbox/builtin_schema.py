"""The fields and types of built-in kinds, checked as kube-apiserver checks them.

kube-apiserver decodes a built-in object into its Go struct: a value of the wrong type is a 400
(`json: cannot unmarshal string into Go struct field StatefulSetSpec.spec.replicas of type
int32`), an unknown field is dropped, reported (`fieldValidation=Warn`) or refused
(`fieldValidation=Strict`). A server-side apply is typed by structured-merge-diff instead, which
refuses unknown fields and wrong types whatever `fieldValidation` says, with a 500 (kubernetes
issue 122480). The fields and their types come from the official Python client's models
(`V1StatefulSet.openapi_types` and `.attribute_map`), which are generated from the same OpenAPI
document as the server's; nothing here is written by hand but what the models leave out: Go's
integer widths, the `[]byte` maps and the quantities (the models say `str` for a
`resource.Quantity`, which also takes a number, and `dict[str, str]` for a `ResourceList`).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from kubernetes.client import models

from . import errors as E
from . import patch as P
from .resources import ResourceType

# The models say `int` for Go's int32 and int64; these fields (by JSON name) are int64.
_INT64_FIELDS = {
    "activeDeadlineSeconds",
    "deletionGracePeriodSeconds",
    "expirationSeconds",
    "fsGroup",
    "generation",
    "gid",
    "maxItems",
    "maxLength",
    "maxProperties",
    "minItems",
    "minLength",
    "minProperties",
    "observedGeneration",
    "revision",
    "runAsGroup",
    "runAsUser",
    "seconds",
    "supplementalGroups",
    "terminationGracePeriodSeconds",
    "tolerationSeconds",
    "uid",
}
# Maps the models call `dict[str, str]` that are `map[string][]byte` in Go (base64 on the wire).
_BYTE_MAPS = {("V1Secret", "data"), ("V1ConfigMap", "binaryData")}
# Fields (by JSON name) the models call `str` that are a `resource.Quantity`, and those they
# call `dict[str, str]` that are a `ResourceList` (a map of quantities).
_QUANTITY_FIELDS = {"divisor", "sizeLimit"}
_RESOURCE_LISTS = {
    "allocatable",
    "allocatedResources",
    "capacity",
    "default",
    "defaultRequest",
    "hard",
    "limits",
    "max",
    "maxLimitRequestRatio",
    "min",
    "overhead",
    "podFixed",
    "requests",
    "used",
}
# resource.ParseQuantity's errors.
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_QUANTITY_SUFFIX = re.compile(r"^(|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][-+]?[0-9]+)$")
_QUANTITY_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_INT_RANGE = {"int32": 2**31, "int64": 2**63}
# The JSON value each scalar but int and quantity takes.
_ACCEPTS = {
    "float": "number",
    "string": "string",
    "time": "string",
    "bytes": "string",
    "bool": "bool",
}
# The models' scalar type names.
_SCALARS = {
    "str": "string",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "datetime": "time",
    "date": "time",
    "object": "any",
}
# Model names: an optional group prefix (`CoreV1Event`, `RbacV1Subject`), the Go package
# (`v1`, `v1beta1`) and the Go type name.
_MODEL_NAME = re.compile(r"^(?:[A-Z][a-z]+)*?(V\d+(?:(?:alpha|beta)\d+)?)([A-Z]\w*)$")


@dataclass(frozen=True)
class FieldType:
    """The type of one field: a struct (a model), list, map, or scalar (`string`, `int`,
    `float`, `bool`, `time`, `bytes`, `quantity`, or `any` for IntOrString and raw JSON);
    `go`: its Go name where the structure does not say it (`v1.ResourceList`)."""

    kind: str
    model: str = ""
    item: FieldType | None = None
    go: str = ""


@functools.cache
def _parse(text: str) -> FieldType:
    if text.startswith("list["):
        return FieldType("list", item=_parse(text[5:-1]))
    if text.startswith("dict[str, "):
        return FieldType("map", item=_parse(text[10:-1]))
    if text in _SCALARS:
        return FieldType(_SCALARS[text])
    return FieldType("struct", model=text)


@functools.cache
def _fields(model: str) -> dict[str, FieldType]:
    """A model's fields by JSON name."""
    cls = getattr(models, model)
    out = {}
    for attr, text in cls.openapi_types.items():
        name = cls.attribute_map[attr]
        if (model, name) in _BYTE_MAPS:
            out[name] = FieldType("map", item=FieldType("bytes"))
        elif text == "str" and name in _QUANTITY_FIELDS:
            out[name] = FieldType("quantity")
        elif text == "dict[str, str]" and name in _RESOURCE_LISTS:
            out[name] = FieldType("map", item=FieldType("quantity"), go="v1.ResourceList")
        else:
            out[name] = _parse(text)
    return out


@functools.cache
def _model_of(group: str, version: str, kind: str) -> str | None:
    """The client's model of a built-in kind: `V1StatefulSet`, or with its group's prefix
    where two groups share a kind name (`CoreV1Event` beside `EventsV1Event`)."""
    prefix = (group.split(".")[0] or "core").capitalize()
    for name in (f"{prefix}{version.capitalize()}{kind}", f"{version.capitalize()}{kind}"):
        if hasattr(models, name):
            return name
    return None


def _model(rt: ResourceType) -> str | None:
    return None if rt.crd else _model_of(rt.group, rt.version, rt.kind)


def _go_struct(model: str) -> tuple[str, str]:
    """(Go package, Go type name) of a model: `V1StatefulSetSpec` → (`v1`, `StatefulSetSpec`)."""
    match = _MODEL_NAME.match(model)
    return (match.group(1).lower(), match.group(2)) if match else ("v1", model)


def _go_type(ftype: FieldType, name: str) -> str:
    """The Go type as the decoder names it in its errors; `name` is the field's JSON name."""
    if ftype.go:
        return ftype.go
    if ftype.kind == "struct":
        return ".".join(_go_struct(ftype.model))
    if ftype.kind == "list":
        return "[]" + _go_type(ftype.item, name)
    if ftype.kind == "map":
        return "map[string]" + _go_type(ftype.item, name)
    if ftype.kind == "int":
        return "int64" if name in _INT64_FIELDS else "int32"
    names = {
        "float": "float64",
        "bytes": "[]uint8",
        "time": "string",
        "quantity": "resource.Quantity",
    }
    return names.get(ftype.kind, ftype.kind)


def _quantity_error(value: Any) -> str | None:
    """What resource.Quantity's decoder says of a value (a number or a string like `500m`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        return _QUANTITY_FORMAT
    if match.group(1).count(".") > 1:
        return "unable to parse numeric part of quantity"
    if not _QUANTITY_SUFFIX.match(match.group(2)):
        return "unable to parse quantity's suffix"
    return None


def json_type(value: Any) -> str:
    """How Go's JSON decoder names a value's type in its errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


# ---- the typed decoder (create, update, patch) ---------------------------------------------


def decode_error(rt: ResourceType, obj: dict[str, Any]) -> str | None:
    """The error Go's JSON decoder meets first decoding `obj` into the kind's struct, or None.

    As in Go, unknown fields are skipped here (see `prune`), nulls decode to nothing, and the
    field path of the message leaves out list indexes and map keys.
    """
    model = _model(rt)
    if model is None:
        return None
    return _decode(obj, FieldType("struct", model=model), _go_struct(model)[1], (), "")


def _decode(
    value: Any, ftype: FieldType, struct: str, path: tuple[str, ...], name: str
) -> str | None:
    if value is None or ftype.kind == "any":
        return None
    kind = ftype.kind
    if kind == "struct" and isinstance(value, dict):
        fields = _fields(ftype.model)
        inner = _go_struct(ftype.model)[1]
        for key, sub in value.items():
            if key in fields and (error := _decode(sub, fields[key], inner, (*path, key), key)):
                return error
        return None
    if kind == "list" and isinstance(value, list):
        for item in value:
            if error := _decode(item, ftype.item, struct, path, name):
                return error
        return None
    if kind == "map" and isinstance(value, dict):
        for item in value.values():
            if error := _decode(item, ftype.item, struct, path, name):
                return error
        return None
    if kind == "quantity":
        # Its own decoder answers, without the field's name.
        return _quantity_error(value)
    what = json_type(value)
    if kind == "int" and what == "number":
        width = _INT_RANGE[_go_type(ftype, name)]
        if isinstance(value, int) and -width <= value < width:
            return None
        what = f"number {value}"  # Go names the literal that is no integer of that size
    elif _ACCEPTS.get(kind) == what:
        return None
    where = ".".join(path)
    return (
        f"json: cannot unmarshal {what} into Go struct field {struct}.{where} of type "
        f"{_go_type(ftype, name)}"
    )


def prune(rt: ResourceType, obj: dict[str, Any]) -> list[str]:
    """Drop the fields the kind does not have (in place); their paths as strict decoding
    prints them (`spec.template.spec.containers[0].resource`), in the order of the body."""
    model = _model(rt)
    unknown: list[str] = []
    if model is not None:
        _prune(obj, FieldType("struct", model=model), "", unknown)
    return unknown


def _prune(value: Any, ftype: FieldType, path: str, unknown: list[str]) -> None:
    if ftype.kind == "struct" and isinstance(value, dict):
        fields = _fields(ftype.model)
        for key in list(value):
            sub = f"{path}.{key}" if path else key
            if key in fields:
                _prune(value[key], fields[key], sub, unknown)
            else:
                unknown.append(sub)
                del value[key]
    elif ftype.kind == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            _prune(item, ftype.item, f"{path}[{i}]", unknown)
    elif ftype.kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            _prune(item, ftype.item, f"{path}.{key}", unknown)


# ---- server-side apply (structured-merge-diff) ---------------------------------------------


def check_apply(rt: ResourceType, config: dict[str, Any]) -> None:
    """Refuse an applied configuration that structured-merge-diff cannot type.

    kube-apiserver answers it with a 500 and no reason (the error is not a Status), whatever
    `fieldValidation` says: `failed to create typed patch object (ns/name; apps/v1,
    Kind=StatefulSet): .spec.replica: field not declared in schema`.
    """
    model = _model(rt)
    if model is None:
        return
    problems: list[str] = []
    _typed(config, FieldType("struct", model=model), (), (), problems)
    if not problems:
        return
    meta = config.get("metadata") if isinstance(config.get("metadata"), dict) else {}
    where = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    gvk = f"{rt.group}/{rt.version}, Kind={rt.kind}"
    listed = problems[0] if len(problems) == 1 else "errors:\n  " + "\n  ".join(problems)
    raise E.ApiError(500, "", f"failed to create typed patch object ({where}; {gvk}): {listed}")


def _typed(
    value: Any,
    ftype: FieldType,
    path: P.FieldPath,
    names: tuple[str, ...],
    problems: list[str],
) -> None:
    """structured-merge-diff's validation of one value; paths as it prints them
    (`.spec.template.spec.containers[name="valkey"].resource`)."""
    if value is None or ftype.kind == "any":
        return
    where = P.path_string(path)
    if ftype.kind == "quantity":
        # An untyped scalar to structured-merge-diff.
        if isinstance(value, (dict, list)):
            problems.append(f"{where}: expected any scalar, got &{{{_go_v(value)}}}")
        return
    if ftype.kind in ("struct", "map"):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected map, got &{{{_go_v(value)}}}")
            return
        fields = _fields(ftype.model) if ftype.kind == "struct" else {}
        for key, sub in value.items():
            sub_type = fields.get(key) if ftype.kind == "struct" else ftype.item
            sub_path = (*path, f"f:{key}")
            if sub_type is None:
                # It stops at the first unknown field of an object.
                problems.append(f"{P.path_string(sub_path)}: field not declared in schema")
                return
            _typed(sub, sub_type, sub_path, (*names, key), problems)
        return
    if ftype.kind == "list":
        if not isinstance(value, list):
            problems.append(f"{where}: expected list, got &{{{_go_v(value)}}}")
            return
        keys = P.core_list_keys(names)
        for i, item in enumerate(value):
            keyed = keys and isinstance(item, dict)
            element = P.key_element(item, keys) if keyed else f"i:{i}"
            _typed(item, ftype.item, (*path, element), names, problems)
        return
    if ftype.kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{where}: expected numeric (int or float), got {_go_t(value)}")
    elif ftype.kind == "bool":
        if not isinstance(value, bool):
            problems.append(f"{where}: expected boolean, got &{{{_go_v(value)}}}")
    elif not isinstance(value, str):
        problems.append(
            f"{where}: expected string, got &value.valueUnstructured{{Value:{_go_sharp_v(value)}}}"
        )


def _go_t(value: Any) -> str:
    """Go's %T of a decoded YAML value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "[]interface {}"
    return "map[string]interface {}"


def _go_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e21 else repr(value)


def _go_v(value: Any) -> str:
    """Go's %v of a decoded YAML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _go_number(value)
    if isinstance(value, list):
        return "[" + " ".join(_go_v(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_v(v)}" for k, v in sorted(value.items())) + "]"
    return "<nil>" if value is None else str(value)


def _go_sharp_v(value: Any) -> str:
    """Go's %#v of a decoded YAML value."""
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_sharp_v(v) for v in value) + "}"
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(k)}:{_go_sharp_v(v)}" for k, v in sorted(value.items()))
        return "map[string]interface {}{" + items + "}"
    return json.dumps(value) if isinstance(value, str) else _go_v(value)
