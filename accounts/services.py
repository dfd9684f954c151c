"""Writes for accounts: tenants, memberships and invitations.

Every function here checks the actor's role, changes data in one transaction
and records the outcome in the audit log (refusals included).
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from allauth.account.models import EmailAddress
from allauth.mfa.models import Authenticator
from anyascii import anyascii
from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import get_random_string
from django.utils.text import slugify

from accounts import idempotency, mail, roles, selectors
from accounts.audit import SYSTEM, Actor, audit_record, audited_action
from accounts.errors import ActionDenied, InvitationInvalid
from accounts.models import ApiToken, AuditEvent, Invitation, Membership, Tenant, User
from accounts.roles import Role
from accounts.text import (
    NOT_INTERNET,
    email_reaches_someone,
    organization_name_plain,
    text_visible,
)

_INVITATION_SALT = "accounts.invitation"
_SLUG_SUFFIX_CHARS = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: read aloud safely


def permission_require(*, actor: Actor, tenant: Tenant, action: str) -> str | None:
    """The actor's role in `tenant` if it may perform `action` there; else ActionDenied.

    Platform staff acting through the admin pass without a membership (None). The tenant is
    locked here first (`tenant_lock`), for staff as for members, as every change of the tenant
    takes it: the action holds it to its end. A member's role is read under it: of two admins
    removing or demoting each other at once, the second is refused once the first commits,
    rather than acting with the role it lost meanwhile. A deleted tenant refuses its members
    everything: what was under way when it was deleted is refused once the deletion commits.
    Call it inside the action's transaction, before locking any other of the tenant's rows.
    An API token acts with its own role, read under the lock: one revoked or expired
    meanwhile is refused.
    """
    if actor.token is not None:
        deleted = tenant_lock(tenant.pk)
        role = _token_role(actor.token, tenant.pk)
        if deleted or role is None:
            raise ActionDenied(TOKEN_INVALID)
        if not roles.can(role, action):
            raise ActionDenied(roles.denial_message(role, action))
        return role
    if actor.user is None:
        raise ActionDenied("You are not a member of this organization.")
    deleted = tenant_lock(tenant.pk)
    if actor.is_platform_staff:
        return None
    if deleted:
        raise ActionDenied(f"{tenant.name} has been deleted.")
    role = _role_of(tenant.pk, actor.user.pk)
    if role is None:
        raise ActionDenied("You are not a member of this organization.")
    if not roles.can(role, action):
        raise ActionDenied(roles.denial_message(role, action))
    return role


def _role_of(tenant_id: int, user_id: int) -> str | None:
    """The user's role in the tenant; None for a non-member. In SQL: every request that
    changes anything reads it first, and building the query cost five times running it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT role FROM {Membership._meta.db_table} WHERE tenant_id = %s AND user_id = %s",  # noqa: S608 - our table
            [tenant_id, user_id],
        )
        row = cursor.fetchone()
    return row[0] if row is not None else None


TOKEN_INVALID = "This API token is not valid: it may have been revoked or have expired."  # noqa: S105


def _token_role(token: ApiToken, tenant_id: int) -> str | None:
    """The API token's role if it is still live in the tenant; None otherwise."""
    return (
        ApiToken.objects.live()
        .filter(pk=token.pk, tenant_id=tenant_id)
        .values_list("role", flat=True)
        .first()
    )


def tenant_lock(tenant_id: int) -> bool:
    """Lock the tenant's row for the rest of the transaction: what checks or changes the
    tenant's limits, members or subscriptions runs one at a time, and takes this lock before
    any of the tenant's other rows (an instance), as every such service does, so none waits
    for another in the opposite order. FOR NO KEY UPDATE: rows that only name the tenant (an
    audit event, an operation) are written beside it, which FOR UPDATE blocked (a deadlock
    with a request holding an instance). In SQL: it reads only whether the tenant is deleted
    (what it returns), and every change of a tenant's instances takes it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT deleted_at IS NOT NULL FROM {Tenant._meta.db_table} WHERE id = %s FOR NO KEY UPDATE",  # noqa: S608, E501 - our table
            [tenant_id],
        )
        row = cursor.fetchone()
        if row is None:
            raise Tenant.DoesNotExist(f"No organization {tenant_id}.")
    return row[0]


def _unique_slug(name: str) -> str:
    """A slug from the name (transliterated to ASCII) plus a random suffix, so a slug never
    tells whether another organization already has the name; a collision takes another."""
    base = slugify(anyascii(name))[:40].strip("-") or "org"
    while True:
        slug = f"{base}-{get_random_string(6, _SLUG_SUFFIX_CHARS)}"
        if not Tenant.objects.filter(slug=slug).exists():
            return slug


def organization_name_clean(name: object) -> str:
    """The organization name to store (whitespace runs as one space, compatibility forms as
    their plain letters: a full-width "A" is "A", so that two names no one tells apart
    are one); ValidationError on `name` when it is blank, holds characters no one can see or
    type, or is longer than a name may be once its letters are plain (one character, like
    "\ufdfa", may stand for many)."""
    if not isinstance(name, str):
        raise ValidationError({"name": "Give the organization a name."})
    name = organization_name_plain(name)  # no newlines or tabs: it goes into email subjects
    if not name:
        raise ValidationError({"name": "Give the organization a name."})
    if not name.isprintable():
        raise ValidationError({"name": "Use letters, digits, spaces and punctuation only."})
    if not text_visible(name):  # blank letters only: the switcher and headings show nothing
        raise ValidationError({"name": "Give the organization a name people can see."})
    limit = Tenant._meta.get_field("name").max_length
    if len(name) > limit:
        raise ValidationError(
            {"name": f"Use at most {limit} characters (this has {len(name)} once written out)."}
        )
    return name


def email_address_clean(email: str) -> str:
    """The email address to store and compare: as the mail server it reaches reads it. Its
    domain as IDNA writes it (compatibility forms as their plain letters, invisible characters
    dropped: "victim@\uff45xample.com" reaches example.com, so it is "victim@example.com"),
    its local part in NFKC, both lowercase; ValidationError when what is left is not an
    address, or holds characters no one can see or type."""
    local, _, domain = unicodedata.normalize("NFKC", email).rpartition("@")
    try:
        domain = domain.encode("idna").decode("idna")
    except UnicodeError:
        raise ValidationError("Enter a valid email address.") from None
    address = f"{local}@{domain}".lower()
    if not address.isprintable():
        raise ValidationError("Use letters, digits and punctuation only.")
    # Who owns an address is asked of PostgreSQL in capitals (`iexact`), a letter at a time: a
    # letter whose capital is a plain one (a dotless i, U+0131, is an I) would pass for another
    # address, and its owner could keep the real one's from ever being confirmed.
    twin = next((c for c in address if not c.isascii() and _capital_ascii(c)), None)
    if twin is not None:
        raise ValidationError(
            f"“{twin}” reads as “{twin.upper()}” in capitals, as in another address: an "
            "address holding it cannot be used here."
        )
    validate_email(address)
    return address


def _capital_ascii(letter: str) -> bool:
    capital = letter.upper()
    return len(capital) == 1 and capital.isascii()


def tenant_create(*, actor: Actor, name: str, request_id: str = "") -> Tenant:
    """A new organization with the acting user as its owner; a repeated request id returns the
    organization that request created (one per user and request id, however many race)."""
    if actor.user is None:
        raise ValueError("an organization needs a user to own it")
    request_id = idempotency.request_id_clean(request_id)
    submitted = name
    name = organization_name_clean(name)
    scope = idempotency.user_scope(actor.user)
    for _ in range(3):  # two sign-ups racing for one slug: take the next one
        try:
            with transaction.atomic():
                claim = idempotency.request_claim(
                    scope=scope, request_id=request_id, action="tenant.create", raw=submitted
                )
                if claim.earlier is not None:
                    return _made_before(actor.user, claim.earlier.target_id)
                _name_free_for(actor.user, name)
                tenant = Tenant(name=name, slug=_unique_slug(name), request_id=request_id)
                # The unique constraint, not a read before the write, settles a slug race.
                tenant.full_clean(validate_unique=False)
                tenant.save()
                Membership.objects.create(tenant=tenant, user=actor.user, role=Role.OWNER)
                claim.bind(tenant)
                audit_record(
                    actor=actor,
                    action="tenant.create",
                    tenant=tenant,
                    target=tenant,
                    payload={"name": tenant.name, "slug": tenant.slug},
                )
                return tenant
        except IntegrityError:
            continue
    raise ValidationError({"name": "That name is taken; try another."})


def _made_before(user: User, tenant_id: str) -> Tenant:
    """The organization a repeated new-organization form made, while the user is still in it;
    sent again after they left it or deleted it, the form is refused, saying so (it would lead
    nowhere)."""
    tenant = Tenant.objects.get(pk=tenant_id)
    gone = "deleted" if tenant.deleted_at else "left"
    if tenant.deleted_at or not tenant.memberships.filter(user=user).exists():
        raise ValidationError(
            f"This form was sent before and made “{tenant.name}”, which you have {gone} since. "
            "Send it again to make another organization."
        )
    return tenant


def _name_free_for(user: User, name: str) -> None:
    """Refuse a second organization of the same name (whatever its case) to one user: their
    switcher would list two alike. Under the user's row lock, so that two tabs sending the
    form at once make one."""
    User.objects.select_for_update().only("pk").get(pk=user.pk)
    if Tenant.objects.for_user(user).filter(name__iexact=name).exists():
        raise ValidationError(
            {"name": f"You already belong to an organization called “{name}”: choose another name."}
        )


def _name_free_among_members(tenant: Tenant, name: str, *, actor: Actor) -> None:
    """Refuse a rename of `tenant` to a name (whatever its case) that one of its members has
    for another organization they belong to: their switcher would list two alike. The
    others' organizations are not named: the renaming owner learns only that the name is
    taken. Under the tenant's lock (no one joins meanwhile) and its members' row locks, in one
    order, which a new organization's name is checked under too."""
    members = list(
        User.objects.select_for_update()
        .filter(memberships__tenant=tenant)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    holders = set(
        Membership.objects.filter(
            user_id__in=members, tenant__deleted_at=None, tenant__name__iexact=name
        )
        .exclude(tenant=tenant)
        .values_list("user_id", flat=True)
    )
    if actor.user is not None and actor.user.pk in holders:
        raise ValidationError(
            {"name": f"You already belong to an organization called “{name}”: choose another name."}
        )
    if holders:
        raise ValidationError(
            {
                "name": f"A member of {tenant.name} already belongs to another organization "
                f"called “{name}”: choose another name."
            }
        )


def tenant_rename(*, actor: Actor, tenant: Tenant, name: str) -> Tenant:
    """Give the organization another name, checked as a new organization's is; the same name
    again changes nothing and records nothing."""
    name = organization_name_clean(name)
    with audited_action(actor=actor, action="tenant.rename", tenant=tenant, target=tenant):
        permission_require(actor=actor, tenant=tenant, action="tenant.rename")
        tenant = Tenant.objects.get(pk=tenant.pk)  # as the lock found it
        before = tenant.name
        if name == before:
            return tenant
        _name_free_among_members(tenant, name, actor=actor)
        tenant.name = name
        tenant.save(update_fields=["name"])
        for hook in _RENAME_HOOKS:
            hook(tenant)
        audit_record(
            actor=actor,
            action="tenant.rename",
            tenant=tenant,
            target=tenant,
            payload={"name": name, "from": before},
        )
    return tenant


# What follows a rename elsewhere: functions of the renamed tenant, called inside the renaming
# transaction (what they tell the outside, they tell once it commits). Billing registers its
# own (accounts does not import it).
_RENAME_HOOKS: list[Callable[[Tenant], None]] = []


def tenant_rename_hook_register(hook: Callable[[Tenant], None]) -> None:
    """Name a function to call with each renamed tenant, inside the renaming transaction."""
    if hook not in _RENAME_HOOKS:
        _RENAME_HOOKS.append(hook)


# What stands in the way of deleting organizations: functions of the tenants, each giving
# sentences by tenant id (a tenant it leaves out: nothing stands in its way). Billing and
# deployments register theirs (accounts imports neither). Each reads all the tenants asked
# about in a constant number of queries, so a page asking about many reads no more for it; a
# delete asks under the tenant's lock, which every create of an instance or a subscription
# takes too.
Blocker = Callable[[Sequence[Tenant]], dict[int, list[str]]]
_DELETE_BLOCKERS: list[Blocker] = []


def tenant_delete_blocker_register(blocker: Blocker, *, first: bool = False) -> None:
    """Name a function that says what keeps tenants from being deleted (by tenant id);
    `first`: said before the others, as it must be cleared first (deployments before the
    subscriptions they run on, which cannot be cancelled while they do)."""
    if blocker not in _DELETE_BLOCKERS:
        _DELETE_BLOCKERS.insert(0 if first else len(_DELETE_BLOCKERS), blocker)


def tenants_delete_blockers(tenants: Sequence[Tenant]) -> dict[int, list[str]]:
    """What keeps each of `tenants` from being deleted now, as sentences by tenant id (an
    empty list when it may be), in a constant number of queries however many they are."""
    said: dict[int, list[str]] = {tenant.pk: [] for tenant in tenants}
    if said:
        for blocker in _DELETE_BLOCKERS:
            for pk, sentences in blocker(tenants).items():
                said[pk] += sentences
    return said


def tenant_delete_blockers(tenant: Tenant) -> list[str]:
    """What keeps `tenant` from being deleted now, as sentences; none when it may be."""
    return tenants_delete_blockers([tenant])[tenant.pk]


def tenant_delete(*, actor: Actor, tenant: Tenant, confirm_name: str) -> Tenant:
    """Delete the organization, once `confirm_name` is its name as typed: it is marked deleted
    (gone from its members' switchers and pages, its invitations withdrawn, its API tokens
    revoked) and kept, with its
    memberships, invoices and audit log, for the records. Refused, saying what stands in the
    way, while anything registered with `tenant_delete_blocker_register` does (deployments
    not deleted, operations under way, a subscription or an unpaid invoice). Two deletes at
    once: the second finds it deleted and is refused. The other members are told by email
    (not those whose accounts staff closed)."""
    with audited_action(actor=actor, action="tenant.delete", tenant=tenant, target=tenant):
        permission_require(actor=actor, tenant=tenant, action="tenant.delete")
        tenant = Tenant.objects.get(pk=tenant.pk)
        typed = organization_name_plain(str(confirm_name))
        if typed != tenant.name:  # compared as names are stored (`organization_name_clean`)
            raise ValidationError(
                {"confirm_name": f"Type the organization's name, {tenant.name}, to delete it."}
            )
        blockers = tenant_delete_blockers(tenant)
        if blockers:
            raise ActionDenied(f"{tenant.name} cannot be deleted yet. " + " ".join(blockers))
        now = timezone.now()
        tenant.deleted_at = now
        tenant.save(update_fields=["deleted_at"])
        withdrawn = Invitation.objects.filter(tenant=tenant, accepted_at=None, revoked_at=None)
        audit_record(
            actor=actor,
            action="tenant.delete",
            tenant=tenant,
            target=tenant,
            payload={
                "name": tenant.name,
                "slug": tenant.slug,
                "members": tenant.memberships.count(),
                "invitations_withdrawn": withdrawn.update(revoked_at=now),
                # Its API tokens die with it, and stay dead should staff restore it.
                "api_access_revoked": ApiToken.objects.filter(
                    tenant=tenant, revoked_at=None
                ).update(revoked_at=now),
            },
        )
        # Not an account staff closed: it signs in no more, and hears nothing more of us.
        told = list(
            tenant.memberships.filter(user__is_active=True)
            .exclude(user=actor.user)
            .select_related("user")
            .order_by("pk")
        )
        _members_tell_deleted(tenant, told, actor)
    return tenant


def _members_tell_deleted(tenant: Tenant, memberships: list[Membership], actor: Actor) -> None:
    """Email each of `memberships` that the organization was deleted, by whom and when, once
    the delete commits (`accounts.mail`)."""
    deleted_by = actor.user.email if actor.user is not None else "The platform team"
    for membership in memberships:
        context = {
            "tenant": tenant,
            "deleted_by": deleted_by,
            "role": membership.get_role_display(),
        }
        mail.send(
            subject=f"[Opsdeck] {tenant.name} was deleted",
            body=render_to_string("accounts/email/organization_deleted.txt", context),
            to=[membership.user.email],
        )


def tenant_restore(*, actor: Actor, tenant: Tenant) -> Tenant:
    """Undo a delete, for platform staff (a customer who deleted the wrong organization): it
    is back in its members' switchers with its pages, memberships and records as they were.
    The invitations withdrawn when it was deleted stay withdrawn (their links had stopped
    working; its members invite again). Refused for one not deleted, and for one none of whose
    members can sign in any more (their accounts deleted or closed since): no one could open
    it."""
    with audited_action(actor=actor, action="tenant.restore", tenant=tenant, target=tenant):
        if not actor.is_platform_staff:
            raise ActionDenied("Only platform staff can restore a deleted organization.")
        if not tenant_lock(tenant.pk):
            raise ValidationError(f"{tenant.name} is not deleted.")
        tenant = Tenant.objects.get(pk=tenant.pk)
        if not tenant.memberships.filter(user__is_active=True).exists():
            raise ValidationError(
                f"No member of {tenant.name} can sign in any more (their accounts were deleted "
                "or closed): restored, no one could open it."
            )
        deleted_at = tenant.deleted_at
        tenant.deleted_at = None
        tenant.save(update_fields=["deleted_at"])
        audit_record(
            actor=actor,
            action="tenant.restore",
            tenant=tenant,
            target=tenant,
            payload={"name": tenant.name, "deleted_at": deleted_at.isoformat()},
        )
    return tenant


def _guard_owner_change(
    *, actor: Actor, tenant: Tenant, membership: Membership, new_role: str | None
) -> None:
    """Owner rights are granted or revoked only by owners, and one owner who can sign in
    always remains (`selectors.owners_active`): a closed account does not count.

    `new_role` None means the membership is being removed.
    """
    touches_owner = membership.role == Role.OWNER or new_role == Role.OWNER
    if touches_owner:
        permission_require(actor=actor, tenant=tenant, action="member.manage_owners")
    gives_up_owner = membership.role == Role.OWNER and new_role != Role.OWNER
    if gives_up_owner and not _another_owner_active(membership, lock=True):
        raise ActionDenied(
            "An organization needs at least one owner: make someone else owner first."
        )


def _another_owner_active(membership: Membership, *, lock: bool) -> bool:
    """Whether the member's organization has an owner who can sign in besides them. `lock`:
    with those owners' memberships locked (not their accounts) until the transaction ends, so
    two owners leaving or demoting each other at once cannot leave none."""
    others = selectors.owners_active(membership.tenant).exclude(pk=membership.pk)
    if lock:
        others = others.select_for_update(of=("self",))
    return bool(list(others.values_list("pk", flat=True)))


def _lock_membership(tenant: Tenant, membership: Membership) -> Membership:
    """Lock the tenant, then re-read the membership: every membership change of one tenant
    takes its locks in this order, so two owners demoting each other cannot deadlock."""
    tenant_lock(tenant.pk)
    current = Membership.objects.filter(pk=membership.pk, tenant=tenant).first()
    if current is None:
        try:
            said = f"{membership.user.email} is no longer a member."
        except User.DoesNotExist:  # read after the account was deleted, with its memberships
            said = "That member deleted their account: they are no longer a member."
        raise ValidationError(said)
    return current


def _invitations_outgrown(
    *,
    actor: Actor,
    tenant: Tenant,
    membership: Membership,
    role: str | None,
    reason: str = "its sender left the organization",
) -> list[str]:
    """Withdraw the pending invitations the member sent that `role` (None: they are no longer
    a member) may not send; the addresses they were sent to. An invitation gives no more than
    its sender may still give: a member removed, or demoted below inviting (or below making
    owners), takes those they sent with them. Run under the tenant's lock, which inviting
    takes too (`permission_require`)."""
    outgrown = list(
        selectors.invitations_beyond_sender(tenant, membership.user_id, role).order_by("email")
    )
    reason = f"its sender became {Role(role).label}" if role is not None else reason
    return _invitations_withdraw(actor=actor, tenant=tenant, invitations=outgrown, reason=reason)


def _invitations_withdraw(
    *, actor: Actor, tenant: Tenant, invitations: list[Invitation], reason: str
) -> list[str]:
    """Withdraw the tenant's pending `invitations`, each audited with `reason`; their
    addresses."""
    if not invitations:
        return []
    Invitation.objects.filter(pk__in=[i.pk for i in invitations]).update(revoked_at=timezone.now())
    for invitation in invitations:
        audit_record(
            actor=actor,
            action="invitation.revoke",
            tenant=tenant,
            target=invitation,
            payload={"email": invitation.email, "reason": reason},
        )
    return [invitation.email for invitation in invitations]


def membership_change_role(*, actor: Actor, membership: Membership, role: str) -> list[str]:
    """Give the member `role`; the addresses of the invitations they sent that it may not send,
    withdrawn with the change (`_invitations_outgrown`)."""
    if role not in Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}."})
    tenant = membership.tenant
    with audited_action(actor=actor, action="member.change_role", tenant=tenant, target=membership):
        permission_require(actor=actor, tenant=tenant, action="member.change_role")
        membership = _lock_membership(tenant, membership)
        old_role = membership.role
        # Checked even when nothing changes: an admin is not told an owner "is now Owner".
        _guard_owner_change(actor=actor, tenant=tenant, membership=membership, new_role=role)
        if old_role == role:
            return []
        membership.role = role
        membership.save(update_fields=["role"])
        audit_record(
            actor=actor,
            action="member.change_role",
            tenant=tenant,
            target=membership,
            payload={"email": membership.user.email, "from": old_role, "to": role},
        )
        return _invitations_outgrown(actor=actor, tenant=tenant, membership=membership, role=role)


class Withdrawn(NamedTuple):
    """The addresses of the invitations a member's removal or leaving withdrew: those they had
    sent (`_invitations_outgrown`), and those to addresses of their own
    (`_invitations_to_withdrawn`)."""

    sent: list[str]
    to_them: list[str]


def _invitations_to_withdrawn(
    *, actor: Actor, tenant: Tenant, user: User, reason: str, accepted: Invitation | None = None
) -> list[str]:
    """Withdraw the tenant's open invitations to the addresses `user` holds (signs in with, or
    confirmed), but the one they `accepted`: a member is never left with one open, and one left
    to their other address would let them back, in its role, once they left or were removed
    (a viewer leaving to come back as the admin another invitation named). Run under the
    tenant's lock, as inviting and accepting are. The addresses withdrawn."""
    confirmed = EmailAddress.objects.filter(user=user, verified=True).values_list(
        "email", flat=True
    )
    left_open = selectors.invitations_open_to(user.email, *confirmed).filter(tenant=tenant)
    if accepted is not None:
        left_open = left_open.exclude(pk=accepted.pk)
    return _invitations_withdraw(
        actor=actor, tenant=tenant, invitations=list(left_open), reason=reason
    )


def membership_remove(*, actor: Actor, membership: Membership) -> Withdrawn:
    """Remove a member; anyone may leave (`membership_leave`), removing others needs the role
    for it. The pending invitations withdrawn with them: those they had sent, and those to
    their own addresses."""
    tenant = membership.tenant
    if actor.user is not None and membership.user_id == actor.user.pk and not actor.staff:
        return membership_leave(actor=actor, tenant=tenant)
    with audited_action(actor=actor, action="member.remove", tenant=tenant, target=membership):
        permission_require(actor=actor, tenant=tenant, action="member.remove")
        membership = _lock_membership(tenant, membership)
        _guard_owner_change(actor=actor, tenant=tenant, membership=membership, new_role=None)
        audit_record(
            actor=actor,
            action="member.remove",
            tenant=tenant,
            target=membership,
            payload={"email": membership.user.email, "role": membership.role},
        )
        membership.delete()
        to_them = _invitations_to_withdrawn(
            actor=actor, tenant=tenant, user=membership.user, reason="its recipient was removed"
        )
        sent = _invitations_outgrown(actor=actor, tenant=tenant, membership=membership, role=None)
        return Withdrawn(sent, to_them)


def user_invitations_withdraw(*, actor: Actor, user: User) -> list[str]:
    """Withdraw the pending invitations `user` sent, in each organization they are in, as
    staff closed their account (`is_active` off): a closed account's invitations must not
    let others in. The addresses they were sent to. Each organization under its lock."""
    withdrawn = []
    for membership in Membership.objects.filter(user=user).select_related("tenant"):
        with transaction.atomic():
            tenant_lock(membership.tenant_id)
            withdrawn += _invitations_outgrown(
                actor=actor,
                tenant=membership.tenant,
                membership=membership,
                role=None,
                reason="its sender's account was closed",
            )
    return withdrawn


def leave_refusal(membership: Membership, *, lock: bool = False) -> str | None:
    """Why the member cannot leave the organization (None: they may): its last owner who can
    sign in may not while others remain (an owner whose account staff closed does not count),
    nor when no one else is in it. `lock`: with its owners locked, as leaving reads them."""
    if membership.role != Role.OWNER:
        return None
    tenant = membership.tenant
    if _another_owner_active(membership, lock=lock):
        return None
    if Membership.objects.filter(tenant=tenant).exclude(pk=membership.pk).exists():
        return (
            f"You are the only owner of {tenant.name}: make someone else an owner first, then "
            "leave."
        )
    return f"You are the only member of {tenant.name}: delete the organization instead."


def membership_leave(*, actor: Actor, tenant: Tenant) -> Withdrawn:
    """The acting user leaves the organization, whatever their role. Its last owner may not
    while others remain (someone must be able to manage it), nor when no one else is in it:
    they delete it instead. Under the tenant's lock, with its owners locked: of the last two
    owners leaving at once, the second is refused once the first has left. The pending
    invitations withdrawn as they leave (`Withdrawn`)."""
    with audited_action(actor=actor, action="member.leave", tenant=tenant):
        permission_require(actor=actor, tenant=tenant, action="tenant.view")
        membership = Membership.objects.select_related("user").get(tenant=tenant, user=actor.user)
        refusal = leave_refusal(membership, lock=True)
        if refusal:
            raise ActionDenied(refusal)
        audit_record(
            actor=actor,
            action="member.leave",
            tenant=tenant,
            target=membership,
            payload={"email": membership.user.email, "role": membership.role},
        )
        membership.delete()
        to_them = _invitations_to_withdrawn(
            actor=actor, tenant=tenant, user=membership.user, reason="its recipient left"
        )
        sent = _invitations_outgrown(actor=actor, tenant=tenant, membership=membership, role=None)
        return Withdrawn(sent, to_them)


class AccountDeletion(NamedTuple):
    """What deleting a person's account does to the organizations they are in (not deleted),
    each list by name: `refused`, why it may not be deleted yet, each reason with the
    organization and the page of it that fixes it ("team" or "organization_settings");
    `deleted`, those they alone are in with nothing running or to pay, deleted with it
    (`tenant_delete`); `left`, the others, which they leave as a member leaving does."""

    refused: list[tuple[Tenant, str, str]]
    deleted: list[Tenant]
    left: list[Tenant]


def account_deletion_plan(user: User) -> AccountDeletion:
    """What deleting `user`'s account would do now (`AccountDeletion`). Refused while they are
    the only owner who can sign in (`selectors.owners_active`) of an organization with other
    members (someone must be able to manage it), or of one they alone are in that cannot be
    deleted yet (`tenants_delete_blockers`: deployments, a subscription, an invoice to come).
    In a constant number of queries, however many organizations they are in."""
    memberships = (
        Membership.objects.filter(user=user, tenant__deleted_at=None)
        .select_related("tenant")
        .order_by("tenant__name", "tenant_id")
    )
    alone_owned = set(selectors.tenants_owned_by_no_one_but(user).values_list("pk", flat=True))
    with_others = set(
        Membership.objects.filter(tenant_id__in=alone_owned)
        .exclude(user=user)
        .values_list("tenant_id", flat=True)
    )
    memberships = list(memberships)
    blockers = tenants_delete_blockers(
        [m.tenant for m in memberships if m.tenant_id in alone_owned - with_others]
    )
    plan = AccountDeletion([], [], [])
    for membership in memberships:
        tenant = membership.tenant
        if tenant.pk not in alone_owned:
            plan.left.append(tenant)
        elif tenant.pk in with_others:
            why = (
                f"You are the only owner of {tenant.name}, which has other members: make one "
                "of them an owner first, or remove them."
            )
            plan.refused.append((tenant, why, "team"))
        elif blockers[tenant.pk]:
            why = f"You are the only member of {tenant.name}, which cannot be deleted yet. "
            plan.refused.append(
                (tenant, why + " ".join(blockers[tenant.pk]), "organization_settings")
            )
        else:
            plan.deleted.append(tenant)
    return plan


def account_email_confirm(user: User, typed: object) -> None:
    """ValidationError on `confirm_email` unless `typed` is the address `user` signs in with
    (whatever its case, or the spaces around it)."""
    if not isinstance(typed, str) or not typed.strip():
        raise ValidationError({"confirm_email": "Type your email address to delete your account."})
    if typed.strip().lower() != user.email.lower():
        raise ValidationError(
            {"confirm_email": f"Type your email address, {user.email}, to delete your account."}
        )


def user_delete(*, actor: Actor, confirm_email: str, deleting: Collection[int] = ()) -> str:
    """Delete the acting user's own account, once `confirm_email` is its address as typed;
    the address it had (free again: anyone may sign up with it). Refused, naming the
    organizations, as `account_deletion_plan` says; refused too when it would delete an
    organization that `deleting` (the ones the page showed) does not name.

    They leave each organization as a member leaving does (`membership_leave`: audited in it,
    the invitations they sent withdrawn), those they alone are in are deleted
    (`tenant_delete`); their addresses and second factors go. The account is deleted as staff
    delete one in the admin, when it is in no organization any more; one still in a deleted
    organization (a restore brings its members back, as the admin keeps them) is kept with
    nothing of the person: an address no one has, no password, no sign-in. Its sessions end
    with it. The audit log keeps the address as text. An email tells the address.

    Every organization they are in is locked first, in one order, then the account: a change
    of its members (a co-owner stepping down, or demoting them) waits, or makes this one wait
    and then be refused, as two owners leaving at once are; two deletions at once delete it
    once (the second finds it gone)."""
    user = actor.user
    with audited_action(actor=actor, action="user.delete", tenant=None, target=user):
        account_email_confirm(user, confirm_email)
        user_delete_lock(user)
        plan = user_delete_check(user, deleting)
        for tenant in plan.deleted:
            tenant_delete(actor=actor, tenant=tenant, confirm_name=tenant.name)
        for tenant in plan.left:
            membership_leave(actor=actor, tenant=tenant)
        address = user.email
        EmailAddress.objects.filter(user=user).delete()  # with their confirmation links
        Authenticator.objects.filter(user=user).delete()
        audit_record(
            actor=actor,
            action="user.delete",
            target=user,
            payload={
                "email": address,
                "left": [tenant.name for tenant in plan.left],
                "deleted": [tenant.name for tenant in plan.deleted],
            },
        )
        context = {"email": address, "left": plan.left, "deleted": plan.deleted}
        mail.send(
            subject="[Opsdeck] Your account was deleted",
            body=render_to_string("accounts/email/account_deleted.txt", context),
            to=[address],
        )
        if Membership.objects.filter(user=user).exists():
            user.email = f"deleted-{user.pk}@deleted.invalid"
            user.first_name = user.last_name = ""
            user.is_active = False
            user.set_unusable_password()
            user.save(update_fields=["email", "first_name", "last_name", "is_active", "password"])
        else:
            user.delete()
    return address


def user_delete_lock(user: User) -> None:
    """Lock what deleting `user`'s account depends on until the transaction ends, as its
    deletion does: every organization they are in, in one order, then the account. A change of
    those organizations' members (a co-owner leaving, an invitation accepted) or of what keeps
    one from being deleted waits, and so does the acceptance of an invitation elsewhere.
    ValidationError when the account was deleted meanwhile, or joined an organization while
    they were being locked."""
    live = Membership.objects.filter(user=user, tenant__deleted_at=None)
    locked = sorted(live.values_list("tenant_id", flat=True))
    for tenant_id in locked:
        tenant_lock(tenant_id)
    if not User.objects.select_for_update().filter(pk=user.pk, is_active=True).exists():
        raise ValidationError("Your account has already been deleted.")
    if sorted(live.values_list("tenant_id", flat=True)) != locked:  # joined one meanwhile
        raise ValidationError(_deletion_changed(""))


def user_delete_precheck(*, actor: Actor, deleting: Collection[int] = ()) -> None:
    """`user_delete_check` for the acting user, a refusal (ActionDenied) audited as
    `user_delete` audits one: its form asks it before taking a second factor's code."""
    with audited_action(actor=actor, action="user.delete", tenant=None, target=actor.user):
        user_delete_check(actor.user, deleting)


def user_delete_check(user: User, deleting: Collection[int] = ()) -> AccountDeletion:
    """What deleting `user`'s account does now (`account_deletion_plan`), or the refusal
    `user_delete` would make: ActionDenied while it may not be deleted, ValidationError when it
    would delete an organization `deleting` (the page's) does not name. Asked again under the
    locks by `user_delete`; asked first by its form, before a second factor's code is taken
    (a recovery code is used up once checked)."""
    if user.is_staff:
        raise ActionDenied("This is a platform staff account: a superuser removes it in the admin.")
    plan = account_deletion_plan(user)
    if plan.refused:
        said = " ".join(why for _, why, _ in plan.refused)
        raise ActionDenied("Your account cannot be deleted yet. " + said)
    unsaid = [tenant.name for tenant in plan.deleted if tenant.pk not in set(deleting)]
    if unsaid:
        raise ValidationError(_deletion_changed(f"it would now delete {', '.join(unsaid)} too. "))
    return plan


def _deletion_changed(how: str) -> str:
    return (
        f"What deleting your account does has changed since this page was shown: {how}"
        "Nothing was deleted: read the page again."
    )


def email_address_lock(email: str) -> None:
    """Lock every account's copy of `email`, in one order, until the transaction ends."""
    locked = EmailAddress.objects.select_for_update().filter(email__iexact=email).order_by("pk")
    list(locked.values_list("pk", flat=True))


def email_address_claim(email: str, *, owner: User, reason: str) -> int:
    """Drop the copies of `email` that accounts other than `owner` added on their Email page and
    never confirmed, once `owner` holds it more strongly: it confirmed the address (an address
    belongs to whoever proves they read its mail, not to whoever typed it first), or signed up
    with it (a sign-in address is its own account's to confirm: a copy's confirmation link,
    mailed to the address before its owner signed up, would otherwise confirm it for the wrong
    account). Each drop is recorded in its account's audit trail, with `reason`. How many."""
    unconfirmed = EmailAddress.objects.filter(
        email__iexact=email, verified=False, primary=False
    ).exclude(user_id=owner.pk)
    dropped = 0
    for copy in unconfirmed.select_related("user"):
        copy.delete()  # and with it, the copy's confirmation link
        dropped += 1
        audit_record(  # in the account's own record, as a removal it made would be
            actor=SYSTEM,
            action="user.email_remove",
            target=copy.user,
            payload={"email": copy.email, "reason": reason},
        )
    return dropped


def unconfirmed_sign_ups_close(*, now: datetime | None = None) -> int:
    """Close the accounts that signed up more than OPSDECK_UNCONFIRMED_SIGN_UP_DAYS ago and
    never confirmed an address or signed in: their sign-in address is released, so that its
    owner may sign up with it, or add it to an account of their own and confirm it (a sign-up
    no one confirms would otherwise hold someone's address for ever). A closed account keeps
    its rows and audit trail, cannot sign in, and signs in with an address no one has. Each is
    recorded in its audit trail. How many (run daily by beat)."""
    now = now or timezone.now()
    since = now - timedelta(days=settings.OPSDECK_UNCONFIRMED_SIGN_UP_DAYS)
    # Sign-ups only: an account made by staff (`createsuperuser`, the admin) has no address
    # waiting for its confirmation, and confirms it at its first sign-in, however late.
    stale = (
        User.objects.filter(
            is_active=True, is_staff=False, last_login=None, date_joined__lt=since,
            emailaddress__primary=True, emailaddress__verified=False,
        )
        .exclude(emailaddress__verified=True)
        .distinct()
    )  # fmt: skip
    closed = 0
    for pk in stale.values_list("pk", flat=True):
        with transaction.atomic():
            # Locked, with its addresses (a confirmation writes one), and read again: a
            # confirmation or a first sign-in meanwhile keeps it.
            user = User.objects.select_for_update().get(pk=pk)
            list(EmailAddress.objects.select_for_update().filter(user=user).values_list("pk"))
            if not stale.filter(pk=pk).exists():
                continue
            address = user.email
            EmailAddress.objects.filter(user=user).delete()  # with their confirmation links
            user.email = f"closed-{user.pk}@closed.invalid"
            user.is_active = False
            user.set_unusable_password()
            user.save(update_fields=["email", "is_active", "password"])
            audit_record(
                actor=SYSTEM,
                action="user.close",
                target=user,
                payload={"email": address, "reason": "its address was never confirmed"},
            )
            closed += 1
    return closed


def invitation_token(invitation: Invitation) -> str:
    return signing.dumps(invitation.pk, salt=_INVITATION_SALT)


def invitation_links(user) -> list[tuple[Invitation, str]]:
    """The user's open invitations (`selectors.invitations_for_user`), each with its link."""
    return [
        (invitation, reverse("invitation_accept", args=[invitation_token(invitation)]))
        for invitation in selectors.invitations_for_user(user)
    ]


def invitation_create(
    *, actor: Actor, tenant: Tenant, email: str, role: str, request_id: str = ""
) -> Invitation:
    """Invite someone by email; a newer invitation to the same address replaces older ones.

    A repeated request id returns the invitation that request made (and sends nothing again).
    Invitations of one organization are made one at a time, under its lock: of several sent to
    one address at once, the last stays open (the database holds one open per address).
    """
    submitted = {"email": email, "role": role}
    try:
        email = email_address_clean(email.strip())
    except ValidationError as exc:
        raise ValidationError({"email": exc.messages}) from None
    if not email_reaches_someone(email):
        raise ValidationError({"email": NOT_INTERNET})
    if role not in Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}."})
    with audited_action(actor=actor, action="member.invite", tenant=tenant):
        permission_require(actor=actor, tenant=tenant, action="member.invite")
        if role == Role.OWNER:
            permission_require(actor=actor, tenant=tenant, action="member.manage_owners")
        request_id = idempotency.request_id_clean(request_id)
        claim = idempotency.request_claim(
            scope=idempotency.tenant_scope(tenant),
            request_id=request_id,
            action="member.invite",
            raw=submitted,
        )
        if claim.earlier is not None:
            return Invitation.objects.get(pk=claim.earlier.target_id)
        tenant_lock(tenant.pk)
        if selectors.member_with_address(tenant, email):
            raise ValidationError({"email": f"{email} is already a member."})
        now = timezone.now()
        _invitations_within_limits(tenant, email, now)
        replaced = Invitation.objects.filter(
            tenant=tenant, email__iexact=email, accepted_at=None, revoked_at=None
        )
        if replaced.filter(role=Role.OWNER).exists():  # replacing it withdraws it
            permission_require(actor=actor, tenant=tenant, action="member.manage_owners")
        replaced.update(revoked_at=now)
        invitation = Invitation(
            tenant=tenant,
            email=email,
            role=role,
            invited_by=actor.user,
            created_at=now,
            request_id=request_id,
        )
        invitation.full_clean()
        invitation.save()
        claim.bind(invitation)
        audit_record(
            actor=actor,
            action="member.invite",
            tenant=tenant,
            target=invitation,
            payload={"email": email, "role": role},
        )
        # A broker out of reach delays the email, never loses the invitation: beat sends it
        # again (`invitations_mail_unsent`).
        transaction.on_commit(lambda: _send_invitation_email(invitation.pk), robust=True)
    return invitation


def _invitations_within_limits(tenant: Tenant, email: str, now: datetime) -> None:
    """Refuse an invitation past what an organization sends in a day, in all or to one
    address (`OPSDECK_INVITATIONS_PER_DAY`, `OPSDECK_INVITATIONS_PER_ADDRESS_PER_DAY`): each
    one mails someone, with a name the organization chose. Under the tenant's lock."""
    today = Invitation.objects.filter(tenant=tenant, created_at__gt=now - timedelta(days=1))
    most = settings.OPSDECK_INVITATIONS_PER_DAY
    if today.count() >= most:
        raise ValidationError(
            f"{tenant.name} has sent {most} invitations in the last 24 hours, the most it may: "
            "send more tomorrow, or ask the platform team."
        )
    most = settings.OPSDECK_INVITATIONS_PER_ADDRESS_PER_DAY
    if today.filter(email__iexact=email).count() >= most:
        raise ValidationError(
            {
                "email": f"{email} was invited {most} times in the last 24 hours, the most it "
                "may be: the last invitation stays open; send it again tomorrow."
            }
        )


# An attempt to send an invitation's email that has not ended this long after it was claimed
# failed (its worker died, or its message sat in a backlog): beat may make another. Longer than
# a send may take (`EMAIL_TIMEOUT`).
INVITATION_EMAIL_LEASE = timedelta(minutes=2)
INVITATION_EMAIL_DUE = timedelta(seconds=60)  # no attempt this long after it was made: beat sends


def _send_invitation_email(invitation_pk: int) -> None:
    from accounts.tasks import invitation_send  # tasks import services: import late

    # A message older than the lease is dropped: beat has sent another by then.
    invitation_send.apply_async(
        args=[invitation_pk], expires=INVITATION_EMAIL_LEASE.total_seconds()
    )


def _email_unsent(now: datetime):
    """Pending invitations whose email was not sent, with attempts left."""
    return Invitation.objects.filter(
        emailed_at=None,
        accepted_at=None,
        revoked_at=None,
        created_at__gt=now - timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE),
        email_attempts__lt=Invitation.EMAIL_ATTEMPTS,
    )


def invitation_email_send(*, invitation_pk: int, now: datetime | None = None) -> bool:
    """Mail the invitation link; called by a worker after the invitation is committed. Whether
    this call sent it.

    The attempt is claimed first, in one UPDATE: two workers handed the same invitation (beat
    sent it again while the first message waited) never both send it, and an attempt under way
    is not made again before INVITATION_EMAIL_LEASE has passed. A send that failed (the mail
    server refused it or did not answer) leaves `emailed_at` unset, and beat tries again; a
    worker that died between the mail server taking it and recording it sends it twice."""
    now = now or timezone.now()
    claimed = (
        _email_unsent(now)
        .filter(pk=invitation_pk)
        .filter(Q(email_attempted_at=None) | Q(email_attempted_at__lt=now - INVITATION_EMAIL_LEASE))
        .update(email_attempted_at=now, email_attempts=F("email_attempts") + 1)
    )
    if not claimed:
        return False
    invitation = Invitation.objects.select_related("tenant").get(pk=invitation_pk)
    link = settings.OPSDECK_BASE_URL.rstrip("/") + reverse(
        "invitation_accept", kwargs={"token": invitation_token(invitation)}
    )
    context = {"invitation": invitation, "link": link}
    send_mail(
        subject=f"[Opsdeck] You are invited to {invitation.tenant.name}",
        message=render_to_string("accounts/email/invitation.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[invitation.email],
    )
    Invitation.objects.filter(pk=invitation_pk).update(emailed_at=timezone.now())
    return True


def invitations_mail_unsent(*, now: datetime | None = None) -> int:
    """Send again the email of each pending invitation that has none sent: no attempt began a
    minute after it was made (its message was lost), or the last one failed
    (INVITATION_EMAIL_LEASE ago); how many were sent to a worker (run every minute by beat)."""
    now = now or timezone.now()
    due = _email_unsent(now).filter(
        Q(email_attempted_at=None, created_at__lt=now - INVITATION_EMAIL_DUE)
        | Q(email_attempted_at__lt=now - INVITATION_EMAIL_LEASE)
    )
    pks = list(due.values_list("pk", flat=True))
    for pk in pks:
        _send_invitation_email(pk)  # a broker out of reach fails the run: the next one tries
    return len(pks)


def invitation_from_token(token: str) -> Invitation:
    """The invitation a link names, or InvitationInvalid saying why it cannot be used."""
    try:
        pk = signing.loads(
            token, salt=_INVITATION_SALT, max_age=settings.OPSDECK_INVITATION_MAX_AGE
        )
    except signing.SignatureExpired as exc:
        raise InvitationInvalid("This invitation has expired. Ask for a new one.") from exc
    except signing.BadSignature as exc:
        raise InvitationInvalid("This invitation link is not valid.") from exc
    invitation = Invitation.objects.select_related("tenant").filter(pk=pk).first()
    if invitation is None:
        raise InvitationInvalid("This invitation link is not valid.")
    if invitation.tenant.deleted_at is not None:  # its invitations were withdrawn with it
        raise InvitationInvalid(
            f"{invitation.tenant.name} has been deleted: this invitation can no longer be used."
        )
    status = invitation.status
    if status == "accepted":
        raise InvitationInvalid("This invitation has already been used.")
    if status == "revoked" and _invitation_replaced(invitation):
        raise InvitationInvalid(
            "This invitation was replaced by a newer one: use the link in the latest "
            "invitation email."
        )
    if status == "revoked":
        raise InvitationInvalid("This invitation was withdrawn.")
    if status == "expired":
        raise InvitationInvalid("This invitation has expired. Ask for a new one.")
    return invitation


def invitation_joined(token: str, user) -> Tenant | None:
    """The organization `user` joined by accepting the invitation this link names, while they
    still belong to it: the link followed again after accepting, or the page of a second tab,
    leads there rather than to "already used". None for anyone else."""
    if not user.is_authenticated:
        return None
    try:
        pk = signing.loads(token, salt=_INVITATION_SALT)
    except signing.BadSignature:
        return None
    return (
        Tenant.objects.for_user(user)
        .filter(invitations__pk=pk, invitations__accepted_by=user)
        .first()
    )


def _invitation_replaced(invitation: Invitation) -> bool:
    """Whether a newer invitation to the same address withdrew this one (`invitation_create`
    withdraws the older ones at the time it makes the new one), rather than someone."""
    return Invitation.objects.filter(
        tenant_id=invitation.tenant_id,
        email__iexact=invitation.email,
        created_at__gt=invitation.created_at,
        created_at__lte=invitation.revoked_at,
    ).exists()


def invitation_accept(*, actor: Actor, token: str) -> Membership:
    """Join the invitation's organization; the link works once, for its own address.

    Under the organization's lock, as inviting is: an invitation sent to the address while it
    is accepted either replaces it first (this link then no longer works) or finds its
    recipient a member already, never leaves a member with an invitation open."""
    with transaction.atomic():
        invitation = invitation_from_token(token)
        deleted = tenant_lock(invitation.tenant_id)
        invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
        if deleted or invitation.status != "pending":
            # Deleted, withdrawn or accepted by a concurrent request: read again, it says
            # why, as the link now would.
            invitation_from_token(token)
            raise InvitationInvalid("This invitation can no longer be used.")
        # Locked as its deletion locks it (after its organizations'): an account deleted in
        # another tab meanwhile joins nothing.
        if not User.objects.select_for_update().filter(pk=actor.user.pk, is_active=True).exists():
            raise InvitationInvalid("Your account has been deleted.")
        reason = selectors.invitation_refusal(actor.user, invitation)
        if not reason:
            membership, _ = Membership.objects.get_or_create(
                tenant=invitation.tenant, user=actor.user, defaults={"role": invitation.role}
            )
            invitation.accepted_at = timezone.now()
            invitation.accepted_by = actor.user
            invitation.save(update_fields=["accepted_at", "accepted_by"])
            _invitations_to_withdrawn(
                actor=actor,
                tenant=invitation.tenant,
                user=actor.user,
                reason="its recipient joined through another invitation",
                accepted=invitation,
            )
            audit_record(
                actor=actor,
                action="member.join",
                tenant=invitation.tenant,
                target=membership,
                payload={"email": actor.user.email, "role": membership.role},
            )
            return membership
    audit_record(
        actor=actor,
        action="member.join",
        tenant=invitation.tenant,
        target=invitation,
        result=AuditEvent.Result.DENIED,
        payload={"reason": reason},
    )
    raise InvitationInvalid(reason)


# Why an invitation cannot be withdrawn, by its status.
_NOT_WITHDRAWN = {
    "accepted": "The invitation to {email} was already accepted.",
    "revoked": "The invitation to {email} was already withdrawn.",
    "expired": "The invitation to {email} has already expired.",
}


def invitation_revoke(*, actor: Actor, invitation: Invitation) -> None:
    """Withdraw a pending invitation; one already accepted, withdrawn or expired is left as it
    is, with a ValidationError saying so."""
    tenant = invitation.tenant
    with audited_action(actor=actor, action="invitation.revoke", tenant=tenant, target=invitation):
        permission_require(actor=actor, tenant=tenant, action="member.invite")
        # Locked: an acceptance or another withdrawal at the same moment waits for this one.
        invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
        if invitation.role == Role.OWNER:  # only who may make an owner may undo making one
            permission_require(actor=actor, tenant=tenant, action="member.manage_owners")
        status = invitation.status
        if status != "pending":
            raise ValidationError(_NOT_WITHDRAWN[status].format(email=invitation.email))
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor,
            action="invitation.revoke",
            tenant=tenant,
            target=invitation,
            payload={"email": invitation.email},
        )


# An API token's secret: this mark (so a leaked one is recognised as ours), then random text.
API_TOKEN_MARK = "odt_"  # noqa: S105 - a marker, not a secret
_API_TOKEN_PREFIX_LENGTH = len(API_TOKEN_MARK) + 8


def api_token_digest(secret: str) -> str:
    """What is kept of a secret: its SHA-256 (the secret is random, long and used whole, so a
    slow hash would add nothing but time to every request)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_create(
    *,
    actor: Actor,
    tenant: Tenant,
    name: str,
    role: str,
    expires_in_days: int | None = None,
    request_id: str = "",
) -> tuple[ApiToken, str | None]:
    """A new API token of the organization and its secret, which nothing keeps: the caller
    shows it once. Its role allows nothing its creator's does not; it may expire, in
    `expires_in_days`. One token per request id: a repeat (a reload of the page that showed
    the secret, on whatever day) returns the first token and no secret, which is gone."""
    name = " ".join(str(name).split())
    errors = {}
    if not name or not text_visible(name):
        errors["name"] = "Enter a name that says what the token is for."
    elif len(name) > ApiToken._meta.get_field("name").max_length:
        errors["name"] = "Use at most 100 characters."
    if expires_in_days is not None and not (
        isinstance(expires_in_days, int) and expires_in_days > 0
    ):
        errors["expires"] = "Choose an expiry in the future."
    with audited_action(actor=actor, action="tenant.tokens", tenant=tenant):
        creator_role = permission_require(actor=actor, tenant=tenant, action="tenant.tokens")
        request_id = idempotency.request_id_clean(request_id)
        allowed = roles.token_roles_for(creator_role or Role.OWNER)
        if role not in allowed:
            errors["role"] = "Choose one of: " + ", ".join(Role(r).label for r in allowed) + "."
        if errors:
            raise ValidationError(errors)
        claim = idempotency.request_claim(
            scope=idempotency.tenant_scope(tenant),
            request_id=request_id,
            action="tenant.tokens",
            # As asked: sent again, "in 90 days" is a moment (or a day) later.
            raw={"name": name, "role": role, "expires": expires_in_days},
        )
        if claim.earlier is not None:
            return ApiToken.objects.get(pk=claim.earlier.target_id), None
        expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
        secret = API_TOKEN_MARK + get_random_string(40, _TOKEN_CHARS)
        token = ApiToken.objects.create(
            tenant=tenant,
            name=name,
            role=role,
            prefix=secret[:_API_TOKEN_PREFIX_LENGTH],
            digest=api_token_digest(secret),
            created_by=actor.user,
            created_by_email=getattr(actor.user, "email", ""),
            expires_at=expires_at,
        )
        audit_record(
            actor=actor,
            action="token.create",
            tenant=tenant,
            target=token,
            payload={
                "name": name,
                "role": role,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
        claim.bind(token)
    return token, secret


def api_token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    """Revoke the token: it is refused from then on, by a request under way too once this
    commits (services read a token's role under the organization's lock). Revoking one already
    revoked changes nothing and records nothing."""
    tenant = token.tenant
    with audited_action(actor=actor, action="tenant.tokens", tenant=tenant, target=token):
        permission_require(actor=actor, tenant=tenant, action="tenant.tokens")
        token = ApiToken.objects.select_for_update().get(pk=token.pk, tenant=tenant)
        if token.revoked_at is not None:
            return token
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor,
            action="token.revoke",
            tenant=tenant,
            target=token,
            payload={"name": token.name, "role": token.role},
        )
    return token


_TOKEN_CHARS = string.ascii_letters + string.digits


# How often a token's `last_used_at` is written: not on every request of a busy script.
_LAST_USED_EVERY = timedelta(minutes=1)


def api_token_authenticate(secret: str) -> ApiToken | None:
    """The live token (of an organization not deleted) whose secret this is, its organization
    loaded; None for any other text. Notes when it was used, to the minute."""
    if not isinstance(secret, str) or not secret.startswith(API_TOKEN_MARK):
        return None
    token = (
        ApiToken.objects.live()
        .select_related("tenant")
        .filter(digest=api_token_digest(secret))
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or token.last_used_at < now - _LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
