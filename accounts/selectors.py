"""Reads for accounts. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from allauth.account.models import EmailAddress
from django.conf import settings
from django.db.models import Q, QuerySet
from django.db.models.functions import Lower
from django.utils import timezone

from accounts.idempotency import request_target, user_scope
from accounts.models import AuditEvent, Invitation, Membership, Tenant, User


def membership_get(*, user, tenant_slug: str) -> Membership | None:
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.select_related("tenant")
        .filter(user=user, tenant__slug=tenant_slug)
        .first()
    )


def organization_made_by_request(user, request_id: str) -> Tenant | None:
    """The organization the user's new-organization form, sent with `request_id`, already
    made, if the user still belongs to it."""
    made = request_target(scope=user_scope(user), request_id=request_id, action="tenant.create")
    if made is None:
        return None
    return Tenant.objects.filter(pk=made[1], memberships__user=user).first()


def memberships_for_user(user) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__name")


def tenant_members(tenant: Tenant) -> QuerySet[Membership]:
    return tenant.memberships.select_related("user").order_by("user__email")


def invitations_pending(tenant: Tenant) -> list[Invitation]:
    invitations = tenant.invitations.filter(accepted_at=None, revoked_at=None).only(
        "tenant",
        "email",
        "role",
        "created_at",
        "accepted_at",
        "revoked_at",
        "emailed_at",
        "email_attempts",
    )
    return [i for i in invitations.order_by("email") if i.status == "pending"]


def email_address_unclaimed(email: str) -> bool:
    """Whether no account has `email` as its own: none signs in with it, and none has
    confirmed it (other users may have added it on their Email page without confirming it)."""
    confirmed = EmailAddress.objects.filter(email__iexact=email).filter(
        Q(verified=True) | Q(primary=True)
    )
    return not confirmed.exists() and not User.objects.filter(email__iexact=email).exists()


def invitations_for_user(user) -> QuerySet[Invitation]:
    """Open invitations to an address the user has confirmed, from organizations they are not
    in: where an invitee who confirmed the address in another browser, or lost the email,
    finds them. An address not confirmed sees none (anyone may sign up with any address)."""
    confirmed = EmailAddress.objects.filter(user=user, verified=True).values(address=Lower("email"))
    age = timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE)
    return (
        Invitation.objects.alias(address=Lower("email"))
        .filter(
            address__in=confirmed,
            accepted_at=None,
            revoked_at=None,
            created_at__gt=timezone.now() - age,
        )
        .exclude(tenant__memberships__user=user)
        .select_related("tenant")
        .only("email", "role", "created_at", "tenant__name")
        .order_by("-created_at")
    )


def audit_events_for_tenant(
    tenant: Tenant,
    *,
    action: str = "",
    actor: str = "",
    since: date | None = None,
    until: date | None = None,
) -> QuerySet[AuditEvent]:
    """The tenant's audit log, newest first; `until` includes the whole day."""
    events = AuditEvent.objects.for_tenant(tenant).select_related("actor")
    if action:
        events = events.filter(action__startswith=action)
    if actor:
        events = events.filter(actor_email__icontains=actor)
    if since:
        events = events.filter(created_at__gte=datetime.combine(since, time.min, tzinfo=UTC))
    if until:
        events = events.filter(created_at__lte=datetime.combine(until, time.max, tzinfo=UTC))
    return events


def audit_actions_for_tenant(tenant: Tenant) -> list[str]:
    return list(
        AuditEvent.objects.for_tenant(tenant)
        .order_by("action")
        .values_list("action", flat=True)
        .distinct()
    )
