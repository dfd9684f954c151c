"""Stripe's error bodies: `{"error": {"type", "code", "message", "param"}}` with its HTTP codes."""

from __future__ import annotations

from typing import Any


class StripeError(Exception):
    """An error answered in Stripe's JSON shape; raising one inside a handler changes nothing."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.should_retry = should_retry

    def body(self) -> dict[str, Any]:
        """The JSON body; like Stripe, fields without a value are left out."""
        error = {"type": self.type, "code": self.code, "message": self.message, "param": self.param}
        return {"error": {k: v for k, v in error.items() if v is not None}}

    def headers(self) -> dict[str, str]:
        """`Stripe-Should-Retry` when Stripe would send it (the SDK honours it)."""
        if self.should_retry is None:
            return {}
        return {"Stripe-Should-Retry": "true" if self.should_retry else "false"}


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> StripeError:
    """A 400 invalid_request_error."""
    return StripeError(400, message, param=param, code=code)


def missing(param: str) -> StripeError:
    """A required parameter was not sent."""
    return invalid(f"Missing required param: {param}.", param=param, code="parameter_missing")


def unknown(param: str) -> StripeError:
    """A parameter this endpoint does not take (Stripe refuses them rather than ignore them)."""
    return invalid(f"Received unknown parameter: {param}", param=param, code="parameter_unknown")


def no_such(kind: str, object_id: str, *, param: str = "id", status: int = 404) -> StripeError:
    """A reference to an object that does not exist (404 in the path, 400 in a parameter)."""
    return StripeError(
        status, f"No such {kind}: '{object_id}'", param=param, code="resource_missing"
    )
