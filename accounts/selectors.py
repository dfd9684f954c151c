"""Reads for accounts. Tenant-owned queries start from the tenant."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from allauth.account.models import EmailAddress
from django.conf import settings
from django.db import connection
from django.db.models import Exists, Model, OuterRef, Q, QuerySet
from django.db.models.functions import Lower
from django.utils import timezone

from accounts import roles
from accounts.idempotency import request_target, user_scope
from accounts.models import ApiToken, AuditEvent, Invitation, Membership, Tenant, User


def membership_get(*, user, tenant_slug: str, deleted: bool = False) -> Membership | None:
    """The user's membership of the organization at `tenant_slug`; with `deleted`, of the
    deleted one there (kept with it: whether they were in it when it was deleted). None when
    there is none."""
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.select_related("tenant")
        .filter(user=user, tenant__slug=tenant_slug, tenant__deleted_at__isnull=not deleted)
        .first()
    )


def organization_made_by_request(user, request_id: str) -> Tenant | None:
    """The organization the user's new-organization form, sent with `request_id`, already
    made, if the user still belongs to it."""
    made = request_target(scope=user_scope(user), request_id=request_id, action="tenant.create")
    if made is None:
        return None
    return Tenant.objects.for_user(user).filter(pk=made[1]).first()


def memberships_for_user(user) -> QuerySet[Membership]:
    """The user's memberships of organizations not deleted, by organization name."""
    return (
        Membership.objects.filter(user=user, tenant__deleted_at=None)
        .select_related("tenant")
        .order_by("tenant__name")
    )


def tenant_members(tenant: Tenant) -> QuerySet[Membership]:
    """The tenant's members with what the team page shows of them (not their password hash)."""
    return (
        tenant.memberships.select_related("user")
        .only("tenant", "role", "created_at", "user__email", "user__is_active")
        .order_by("user__email")
    )


def owners_active(tenant: Tenant) -> QuerySet[Membership]:
    """The tenant's owners who can sign in: an owner whose account staff closed can manage
    nothing, so it never counts as the owner the organization must keep."""
    return tenant.memberships.filter(role=roles.Role.OWNER, user__is_active=True)


def tenants_owned_by_no_one_but(user: User) -> QuerySet[Tenant]:
    """The organizations (not deleted) `user` owns in which no other owner can sign in
    (`owners_active`), by name: closing their account leaves these without an owner."""
    others = Membership.objects.filter(
        tenant=OuterRef("pk"), role=roles.Role.OWNER, user__is_active=True
    ).exclude(user=user)
    return (
        Tenant.objects.filter(
            deleted_at=None, memberships__user=user, memberships__role=roles.Role.OWNER
        )
        .exclude(Exists(others))
        .order_by("name")
    )


def _invitations_pending(tenant: Tenant) -> QuerySet[Invitation]:
    """The tenant's pending invitations (`Invitation.status`): neither accepted nor withdrawn,
    and not expired."""
    unexpired = timezone.now() - timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE)
    return tenant.invitations.filter(accepted_at=None, revoked_at=None, created_at__gt=unexpired)


def invitations_pending(tenant: Tenant) -> list[Invitation]:
    invitations = _invitations_pending(tenant).only(
        "tenant",
        "email",
        "role",
        "created_at",
        "accepted_at",
        "revoked_at",
        "emailed_at",
        "email_attempts",
    )
    return list(invitations.order_by("email"))


def invitations_beyond_sender(
    tenant: Tenant, user_id: int, role: str | None
) -> QuerySet[Invitation]:
    """The tenant's pending invitations that member `user_id` sent and may not send with `role`
    (None: no longer a member): any, without `member.invite`; to be owner, without
    `member.manage_owners` (`roles.roles_managed_by`)."""
    sent = _invitations_pending(tenant).filter(invited_by_id=user_id)
    if role is None or not roles.can(role, "member.invite"):
        return sent
    return sent.exclude(role__in=roles.roles_managed_by(role))


def invitations_pending_count(tenant: Tenant) -> int:
    """How many of the tenant's invitations are pending, counted by the database."""
    return _invitations_pending(tenant).count()


def email_address_unclaimed(email: str, *, besides: User | None = None) -> bool:
    """Whether no account (but `besides`) has `email` as its own: none signs in with it, and
    none has confirmed it (others may have added it on their Email page without confirming
    it: that claims nothing)."""
    owned = EmailAddress.objects.filter(email__iexact=email).filter(
        Q(verified=True) | Q(primary=True)
    )
    users = User.objects.filter(email__iexact=email)
    if besides is not None:
        owned, users = owned.exclude(user=besides), users.exclude(pk=besides.pk)
    return not owned.exists() and not users.exists()


def email_address_confirmed(user, email: str) -> bool:
    """Whether `user` has confirmed `email` (whatever its case) as one of their addresses."""
    return EmailAddress.objects.filter(user=user, email__iexact=email, verified=True).exists()


def invitation_replaced(invitation: Invitation) -> Invitation | None:
    """The invitation to the same address that `invitation` replaced while its link still
    worked (`services.invitation_create` revokes it at the moment it makes the new one); None
    when there was none, or it had expired."""
    replaced = (
        Invitation.objects.filter(
            tenant_id=invitation.tenant_id,
            email__iexact=invitation.email,
            revoked_at=invitation.created_at,
        )
        .exclude(pk=invitation.pk)
        .first()
    )
    if replaced is None or replaced.expires_at <= replaced.revoked_at:
        return None
    return replaced


def invitation_elsewhere(user, invitation: Invitation) -> str:
    """Why `user` cannot accept the invitation because it was sent to an address that is not
    theirs ("" when it is theirs: the one they sign in with, or another on their Email page,
    which they sign in with too once confirmed): an invitation is accepted by the account
    that signs in with its address."""
    if user.email.lower() == invitation.email.lower() or (
        EmailAddress.objects.filter(user=user, email__iexact=invitation.email).exists()
    ):
        return ""
    return (
        f"This invitation was sent to {invitation.email}, but you are signed in "
        f"as {user.email}. Sign in with the invited address to accept it."
    )


def invitation_unconfirmed(user, invitation: Invitation) -> str:
    """Why `user` cannot accept it yet: they have not confirmed its address (accepting proves
    control of it); "" when they have."""
    if email_address_confirmed(user, invitation.email):
        return ""
    return (
        f"Confirm {invitation.email} first (follow the link we emailed you when you "
        "signed up, or send a new one from Email addresses), then open this link again."
    )


def invitation_refusal(user, invitation: Invitation) -> str:
    """Why `user` cannot accept the (pending) invitation ("" when they can); said on the
    invitation's page before its button."""
    if Membership.objects.filter(tenant_id=invitation.tenant_id, user=user).exists():
        return (
            f"You are already a member of {invitation.tenant.name}: an invitation cannot change "
            "your role. Ask one of its owners or admins to."
        )
    return invitation_elsewhere(user, invitation) or invitation_unconfirmed(user, invitation)


def member_with_address(tenant: Tenant, email: str) -> bool:
    """Whether a member of the tenant has `email` as their own: they sign in with it, or have
    confirmed it on their Email page (as an invitation to it would be theirs to accept)."""
    owned = Q(user__email__iexact=email) | Q(
        user__emailaddress__email__iexact=email, user__emailaddress__verified=True
    )
    return Membership.objects.filter(owned, tenant=tenant).exists()


def invitations_open_to(*emails: str) -> QuerySet[Invitation]:
    """Open invitations to any of `emails` (whatever their case), from any organization."""
    age = timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE)
    return Invitation.objects.annotate(address=Lower("email")).filter(
        address__in=[email.lower() for email in emails],
        accepted_at=None,
        revoked_at=None,
        created_at__gt=timezone.now() - age,
    )


def invitations_for_user(user) -> QuerySet[Invitation]:
    """Open invitations to the addresses the user has confirmed (the one they sign in with, or
    another on their Email page), from organizations they are not in: where an invitee who
    confirmed the address in another browser, or lost the email, finds them
    (`invitation_refusal` holds for each). An address not confirmed sees none (anyone may
    sign up with, or add, any address)."""
    confirmed = EmailAddress.objects.filter(user=user, verified=True).values_list(
        "email", flat=True
    )
    return (
        invitations_open_to(*confirmed)
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
    # Its actor as recorded (`actor_email`); the browser it came from is not shown.
    events = AuditEvent.objects.for_tenant(tenant).defer("actor", "user_agent")
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
    """The actions of the tenant's audit log, in order, along its index `audit_tenant_action_c`:
    a probe per action, not a read of every event. That index orders actions byte by byte
    (COLLATE "C"), which no filter of the log compares by, so the planner never counts a
    filter's events along it (a plain (tenant, action) index was chosen to count the admin's
    one-action filter, reading every entry)."""
    return indexed_values(AuditEvent, "action", collation="C", tenant=tenant.pk)


def indexed_values(
    model: type[Model], field_name: str, *, collation: str = "", **equal: object
) -> list[str]:
    """The distinct values of a field, in order, among the rows whose fields `equal` hold the
    values given, found by skipping through an index that leads with those fields and then
    this one (compared in `collation`, as the index's is): a probe per value, not a read of
    every row."""
    quote = connection.ops.quote_name
    column = quote(model._meta.get_field(field_name).column)
    if collation:
        column = f"{column} COLLATE {quote(collation)}"
    table = quote(model._meta.db_table)
    where = "".join(f" AND {quote(model._meta.get_field(name).column)} = %s" for name in equal)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE found (value) AS (
                (SELECT {column} FROM {table} WHERE {column} IS NOT NULL{where}
                  ORDER BY 1 LIMIT 1)
              UNION ALL
                SELECT (SELECT {column} FROM {table} WHERE {column} > found.value{where}
                         ORDER BY 1 LIMIT 1)
                  FROM found WHERE found.value IS NOT NULL
            )
            SELECT value FROM found WHERE value IS NOT NULL
            """,  # noqa: S608 - quoted names of our own table and columns
            [*equal.values()] * 2,
        )
        return [value for (value,) in cursor.fetchall()]


def api_tokens(tenant: Tenant) -> QuerySet[ApiToken]:
    """The organization's API tokens, newest first, with the columns its Settings page shows."""
    return tenant.api_tokens.only(
        "name", "role", "prefix", "created_by_email", "created_at", "last_used_at",
        "expires_at", "revoked_at", "tenant_id",
    )  # fmt: skip
