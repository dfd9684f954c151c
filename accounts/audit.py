"""The audit log's one writer, and the actor every service is told about."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from allauth.account.adapter import get_adapter
from django.core.exceptions import PermissionDenied
from django.db import models, transaction

from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Tenant

# Keys whose values are never written to the log, however a caller fills the payload.
_SECRET_KEY = re.compile(r"pass(word)?|secret|token|key|credential|kubeconfig", re.IGNORECASE)
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Actor:
    """Who is acting: a user, platform staff acting on a tenant, an organization's API token
    (`token`, with no user), or the system (neither)."""

    user: Any = None
    ip: str | None = None
    user_agent: str = ""
    staff: bool = False
    token: Any = None

    @classmethod
    def from_request(cls, request, *, user: Any = None, staff: bool = False) -> Actor:
        """The request's user (or `user`, during sign-up and sign-in) with its address."""
        if user is None and request.user.is_authenticated:
            user = request.user
        return cls(
            user=user,
            ip=_client_ip(request),
            user_agent=request.META.get("HTTP_USER_AGENT", "")[:300],
            staff=staff,
        )

    @classmethod
    def from_token(cls, request, token: Any) -> Actor:
        """An organization's API token calling the API, from the request's address."""
        return cls(
            token=token,
            ip=_client_ip(request),
            user_agent=request.META.get("HTTP_USER_AGENT", "")[:300],
        )

    @property
    def is_platform_staff(self) -> bool:
        """Platform staff acting through the admin: a staff user, acting as staff."""
        return self.staff and self.user is not None and self.user.is_staff

    @property
    def name(self) -> str:
        """How the audit log and an operation's reasons name them: the token's label, the
        user's address; "" for the system."""
        if self.token is not None:
            return self.token.label
        return getattr(self.user, "email", "")

    @property
    def kind(self) -> str:
        if self.token is not None:
            return AuditEvent.ActorKind.TOKEN
        if self.user is None:
            return AuditEvent.ActorKind.SYSTEM
        return AuditEvent.ActorKind.STAFF if self.staff else AuditEvent.ActorKind.USER


SYSTEM = Actor()


def _client_ip(request) -> str | None:
    """The client's address as allauth sees it (it honours ALLAUTH_TRUSTED_PROXY_COUNT), so
    the audit log and the sign-in rate limits agree."""
    try:
        return get_adapter(request).get_client_ip(request)
    except PermissionDenied:
        return None


def scrub(payload: Any) -> Any:
    """The payload with every secret-looking key's value replaced."""
    if isinstance(payload, dict):
        return {
            key: REDACTED if _SECRET_KEY.search(str(key)) else scrub(value)
            for key, value in payload.items()
        }
    if isinstance(payload, list | tuple):
        return [scrub(value) for value in payload]
    return payload


def audit_record(**event: Any) -> AuditEvent:
    """Append one event to the audit log; `event`: `audit_event`'s arguments."""
    made = audit_event(**event)
    made.save(force_insert=True)
    return made


def audit_event(
    *,
    actor: Actor,
    action: str,
    tenant: Tenant | None = None,
    target: models.Model | None = None,
    result: str = AuditEvent.Result.OK,
    payload: dict | None = None,
) -> AuditEvent:
    """The event `audit_record` appends, not saved yet: for a service that saves it in one
    statement with the rows it records."""
    return AuditEvent(
        tenant=tenant,
        actor=actor.user,
        actor_email=actor.name,
        actor_kind=actor.kind,
        action=action,
        target_type=target._meta.model_name if target is not None else "",
        target_id=str(target.pk) if target is not None and target.pk is not None else "",
        target_name=str(getattr(target, "audit_name", ""))[:200],
        ip=actor.ip,
        user_agent=actor.user_agent,
        result=result,
        payload=scrub(payload or {}),
    )


@contextmanager
def audited_action(
    *, actor: Actor, action: str, tenant: Tenant | None, target: models.Model | None = None
) -> Iterator[None]:
    """Run a mutating action in a transaction; a refusal rolls it back and is recorded after.

    The denied event is written once the action's transaction has rolled back,
    so the refusal leaves its trace while the change it refused leaves none.
    """
    try:
        with transaction.atomic():
            yield
    except ActionDenied as denial:
        audit_record(
            actor=actor,
            action=action,
            tenant=tenant,
            target=target,
            result=AuditEvent.Result.DENIED,
            payload={"reason": denial.reason},
        )
        raise
