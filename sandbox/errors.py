"""Kubernetes `Status` errors with the reasons and messages of the real API server."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class FieldError:
    """One field error, printed like apimachinery's `field.Error`."""

    kind: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    field: str
    detail: str = ""
    value: Any = None
    has_value: bool = False
    supported: list[str] | None = None

    def body(self) -> str:
        """The message without the field path (a StatusCause message)."""
        if self.kind == "FieldValueRequired":
            text = "Required value"
        elif self.kind == "FieldValueForbidden":
            text = "Forbidden"
        elif self.kind == "FieldValueDuplicate":
            text = f"Duplicate value: {go_repr(self.value)}"
        elif self.kind == "FieldValueNotSupported":
            text = f"Unsupported value: {go_repr(self.value)}"
            if self.supported:
                quoted = ", ".join(json.dumps(s) for s in self.supported)
                text += f": supported values: {quoted}"
        elif self.kind == "FieldValueTooLong":
            text = "Too long"
        elif self.kind == "FieldValueTypeInvalid":
            text = f"Invalid value: {go_repr(self.value)}"
        else:
            text = f"Invalid value: {go_repr(self.value)}" if self.has_value else "Invalid value"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def invalid(path: str, value: Any, detail: str) -> FieldError:
    """An `Invalid value` field error."""
    return FieldError("FieldValueInvalid", path, detail, value, True)


def required(path: str, detail: str = "") -> FieldError:
    """A `Required value` field error."""
    return FieldError("FieldValueRequired", path, detail)


def forbidden_field(path: str, detail: str) -> FieldError:
    """A `Forbidden` field error."""
    return FieldError("FieldValueForbidden", path, detail)


class RawValue(str):
    """A value printed verbatim in a field error (e.g. Go's `0x0`)."""


def go_repr(value: Any) -> str:
    """Render a value the way Go's %#v does in field errors (strings quoted, ints bare)."""
    if isinstance(value, RawValue):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(str(value))


class ApiError(Exception):
    """An error answered to the client as a `Status` body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.metadata = metadata

    def status(self) -> dict[str, Any]:
        """The `Status` object for the response body."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": self.metadata or {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # an error that is not a Status (a 500) has none
            body["reason"] = self.reason
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def qualified(plural: str, group: str) -> str:
    """`clusters.postgresql.cnpg.io`, or `secrets` for the core group."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    """404 NotFound for a named object."""
    return ApiError(
        404,
        "NotFound",
        f'{qualified(plural, group)} "{name}" not found',
        _details(name, group, plural),
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    """409 AlreadyExists."""
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified(plural, group)} "{name}" already exists',
        _details(name, group, plural),
    )


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    """409 Conflict (optimistic concurrency and friends)."""
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
        _details(name, group, plural),
    )


MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def stale(plural: str, group: str, name: str) -> ApiError:
    """409 Conflict for a write carrying an old resourceVersion."""
    return conflict(plural, group, name, MODIFIED)


def invalid_object(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid with one cause per field error."""
    qkind = f"{kind}.{group}" if group else kind
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    details = _details(name, group, kind)
    details["causes"] = [{"reason": e.kind, "message": e.body(), "field": e.field} for e in errors]
    return ApiError(422, "Invalid", f'{qkind} "{name}" is invalid: {listed}', details)


def webhook_denied(webhook: str, refusal: ApiError) -> ApiError:
    """A validating admission webhook's refusal, as the API server passes it on: the webhook's
    status, its message prefixed with the webhook's name."""
    return ApiError(
        refusal.code,
        refusal.reason,
        f'admission webhook "{webhook}" denied the request: {refusal.message}',
        refusal.details,
    )


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", message)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    """403 Forbidden."""
    return ApiError(
        403,
        "Forbidden",
        f'{qualified(plural, group)} "{name}" is forbidden: {why}',
        _details(name, group, plural),
    )


def gone(message: str, *, continue_token: str | None = None) -> ApiError:
    """410 Expired (too old resource version, expired continue token); for a continue token,
    with the token that goes on from the same place in the current state."""
    metadata = {"continue": continue_token} if continue_token else None
    return ApiError(410, "Expired", message, metadata=metadata)


def method_not_allowed() -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    """415 UnsupportedMediaType."""
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
    )


def path_not_found() -> ApiError:
    """404 for a URL the server does not serve."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")
