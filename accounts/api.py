"""What every API endpoint shares: who is calling (an organization's API token, sent as
`Authorization: Bearer <secret>`, the only way in: no session, so no CSRF surface), what its
role allows, and errors as JSON `{"error": "..."}` with the services' own words."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    ValidationError,
)
from django.db import connections
from django.http import Http404, JsonResponse
from django.utils.log import log_response
from rest_framework import exceptions, parsers, permissions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

from accounts import idempotency, services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import ApiToken
from accounts.tenancy import role_refusal

UNAUTHENTICATED = (
    "Send an organization's API token as 'Authorization: Bearer <token>' (made on its Settings "
    "page)."
)
INTERNAL_ERROR = (
    "Something went wrong on our side; it is logged for the platform team. Try again later "
    "with the same Idempotency-Key: one key never does an action twice."
)
THROTTLED = (
    "Too many requests with this API token: try again in {seconds} s (Retry-After). The "
    "platform team sets how many a token may make."
)
KEY_REUSED = (
    "This Idempotency-Key was already sent with another action or other parameters: send a new "
    "key for a new request."
)


class JSONParser(parsers.JSONParser):
    """DRF's, refusing as bad input (400) two bodies that reached the views as faults: one
    nested too deeply for the decoder, and one whose text holds a NUL character, which no
    PostgreSQL text can hold."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply.") from None
        if _holds_nul(data):
            raise exceptions.ParseError("Text may not hold a NUL character (\\u0000).")
        return data


def _holds_nul(data) -> bool:
    pending = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


class BearerTokenAuthentication(BaseAuthentication):
    """An organization's API token from `Authorization: Bearer <secret>`; an unknown, revoked
    or expired one is a 401, as is a request without one."""

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(UNAUTHENTICATED)
        try:
            secret = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed(services.TOKEN_INVALID) from None
        token = services.api_token_authenticate(secret)
        if token is None:
            raise exceptions.AuthenticationFailed(services.TOKEN_INVALID)
        return (None, token)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class TokenAuthenticated(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        if not isinstance(request.auth, ApiToken):
            raise exceptions.NotAuthenticated(UNAUTHENTICATED)
        return True


class TokenRate(SimpleRateThrottle):
    """Requests one API token may make (`OPSDECK_API_RATE`), counted per token in the cache
    every web process shares; past it, a 429 with Retry-After. A request without a valid token
    is refused before it is counted."""

    setting = "OPSDECK_API_RATE"
    scope = "token"

    def get_rate(self) -> str:
        return getattr(settings, self.setting)

    def get_cache_key(self, request, view) -> str | None:
        if not isinstance(request.auth, ApiToken):
            return None
        return f"api-rate:{self.scope}:{request.auth.pk}"


class TokenWriteRate(TokenRate):
    """Of them, those that change something: POST, PATCH and DELETE (`OPSDECK_API_WRITE_RATE`)."""

    setting = "OPSDECK_API_WRITE_RATE"
    scope = "token-write"

    def allow_request(self, request, view) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return super().allow_request(request, view)


def token_actor(request) -> Actor:
    """The calling token as the actor services record (the audit log names it)."""
    return Actor.from_token(request._request, request.auth)


def token_require(request, action: str, *, target=None) -> None:
    """Refuse (403 with the reason, audited as the portal's pages do) a token whose role does
    not allow `action`, for a read the services do not check themselves."""
    token: ApiToken = request.auth
    reason = role_refusal(
        actor=token_actor(request), role=token.role, tenant=token.tenant, action=action,
        target=target, path=request.path,
    )  # fmt: skip
    if reason:
        raise ActionDenied(reason)


def _atomic_requests_rolled_back() -> None:
    """As DRF's own handler does (whose module cannot be imported here: it reads these
    settings, which name this module, as it loads)."""
    for db in connections.all():
        if db.settings_dict["ATOMIC_REQUESTS"] and db.in_atomic_block:
            db.set_rollback(True)


def _said(exc: ValidationError) -> str:
    return " ".join(exc.messages)


def exception_handler(exc, context):
    """Every refusal as `{"error": "..."}`: bad input 400 (with `fields` when the services name
    them), no valid token 401, a role or a state that forbids it 403, nothing of the token's
    organization there 404, an Idempotency-Key reused for another request 409, a body over
    DATA_UPLOAD_MAX_MEMORY_SIZE 413, too many requests with one token 429 (with Retry-After);
    a fault of ours 500, logged."""
    if isinstance(exc, ValidationError):
        _atomic_requests_rolled_back()
        if exc.messages == [idempotency.REUSED]:
            return Response({"error": KEY_REUSED}, status=409)
        data = {"error": _said(exc)}
        if hasattr(exc, "error_dict"):
            data["fields"] = {field: " ".join(said) for field, said in exc.message_dict.items()}
        return Response(data, status=400)
    if isinstance(exc, ActionDenied):
        _atomic_requests_rolled_back()
        return Response({"error": exc.reason}, status=403)
    if isinstance(exc, exceptions.Throttled):
        wait = max(1, math.ceil(exc.wait or 1))
        return Response(
            {"error": THROTTLED.format(seconds=wait)},
            status=429,
            headers={"Retry-After": str(wait)},
        )
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response({"error": f"The body is larger than {limit:,} bytes."}, status=413)
    if isinstance(exc, SuspiciousOperation):  # as Django answers it outside the API
        return Response({"error": "Bad request."}, status=400)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    if isinstance(exc, exceptions.APIException):
        _atomic_requests_rolled_back()
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        detail = exc.detail
        if isinstance(detail, dict | list):
            error = " ".join(
                str(v) for v in (detail.values() if isinstance(detail, dict) else detail)
            )
        else:
            error = str(detail)
        return Response({"error": error}, status=exc.status_code, headers=headers)
    # Anything else is a fault of ours: said in JSON too (a script reads the API), logged with
    # its traceback as Django logs a page's (and once), and what the request wrote rolled back.
    _atomic_requests_rolled_back()
    response = Response({"error": INTERNAL_ERROR}, status=500)
    request = context["request"]._request
    log_response(
        "Internal Server Error: %s", request.path, response=response, request=request,
        exception=exc,
    )  # fmt: skip
    return response


def not_found(request, rest: str = ""):
    """Any other address under the API: JSON, as the API answers, not the portal's page."""
    return JsonResponse({"error": "No such API endpoint."}, status=404)
