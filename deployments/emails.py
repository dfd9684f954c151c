"""The email that tells whoever started an operation how it ended; for one Opsdeck started on
its own (a scheduled backup, an expired backup's deletion, a suspended subscription's stop) or
platform staff queued across the fleet, the organization's owners and admins, when it failed.

Rendered by the worker that finished the run, from the operation and instance it has in hand
(nothing read again), and sent by the mail worker once the run's end commits
(`runner`, `accounts.mail`).
"""

from __future__ import annotations

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from accounts import idempotency, mail
from accounts.models import Membership, Tenant
from accounts.roles import Role
from deployments import fleet, lifecycle, selectors
from deployments.models import Operation

# Who hears of what befalls an organization's instances when nobody of it asked for it.
TOLD_ROLES = (Role.OWNER, Role.ADMIN)


def organization_told(tenant: Tenant) -> list[str]:
    """The addresses of the organization's owners and admins (not of an account staff
    closed: it signs in no more)."""
    return sorted(
        Membership.objects.filter(tenant=tenant, role__in=TOLD_ROLES, user__is_active=True)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )


def operation_ended(operation: Operation, *, belongs: bool | None = None) -> None:
    """Tell whoever started an operation that it failed (or was cancelled), or that the
    instance its create or restore made is ready (its `instance` and `requested_by` loaded);
    the organization's owners and admins that one Opsdeck started on its own, or platform
    staff queued across the fleet, or a member since removed asked for, failed (nobody heard
    of a scheduled backup failing night after night, nor of their database failing a restart
    staff asked for), and that an instance a member since removed asked for is ready. Staff
    are sent the admin's page of the operation: they may not open the organization's. A
    member removed is told nothing more. `belongs`: whether its requester belongs to the
    organization, when the caller read it already (with the instance's lock)."""
    user = operation.requested_by
    instance = operation.instance
    succeeded = operation.state == Operation.State.SUCCEEDED
    if succeeded and operation.verb not in lifecycle.MAKES_INSTANCE:
        return
    staff = not succeeded and user is not None and fleet.fleet_queued(operation)
    # A member removed since, or whose account staff closed, is told nothing more of the
    # organization's instances.
    if belongs is None and user is not None and not staff and user.is_active:
        belongs = Membership.objects.filter(tenant_id=instance.tenant_id, user=user).exists()
    member = user is not None and (staff or (user.is_active and bool(belongs)))
    requester = [user.email] if member and user.email else []
    left = user is not None and not member
    if succeeded:
        subject = f"[Opsdeck] {instance.name} is ready"
        _send(operation, requester, subject)
        if left:  # the organization has an instance it is billed for: someone should know
            asked = "asked for by a member who has since left or whose account was closed"
            _send(operation, organization_told(instance.tenant), subject, asked=asked)
        return
    subject = f"[Opsdeck] {instance.name}: {_said(operation)} {operation.state}"
    _send(operation, requester, subject, asked="you asked for", staff=staff)
    ours = user is None and idempotency.system_made(operation.request_id)
    if operation.state == Operation.State.FAILED and (ours or staff or left):
        told = [to for to in organization_told(instance.tenant) if to not in requester]
        if staff:
            asked = "that the platform team started"
        elif left:
            asked = "that a member who has since left, or whose account was closed, asked for"
        else:
            asked = "that Opsdeck started on its own"
        _send(operation, told, subject, asked=asked)


def _send(operation: Operation, to: list[str], subject: str, *, asked="", staff=False) -> None:
    """The email of how the operation ended, to `to`: who asked for it as `asked` says, with a
    link to the instance's page, or for `staff` to the admin's page of the operation (and the
    organization named)."""
    if not to:
        return
    instance = operation.instance
    if staff:
        path = reverse("admin:deployments_operation_change", args=[operation.pk])
    else:
        path = reverse("instance_list", kwargs={"tenant_slug": instance.tenant.slug})
        path += f"{instance.pk}/"
    context = {
        "operation": operation,
        "verb": _said(operation),
        "instance": instance,
        "asked": asked,
        "organization": instance.tenant.name if staff else "",
        "link": f"{settings.OPSDECK_BASE_URL.rstrip('/')}{path}",
    }
    mail.send(
        subject=subject,
        body=render_to_string("deployments/email/operation_ended.txt", context),
        to=to,
    )


def _said(operation: Operation) -> str:
    """The operation's verb as the portal names it, within a sentence: "set eviction policy",
    not the spec's `setEvictionPolicy`."""
    labels = selectors.verb_labels_of(operation.plan_version_id)
    label = labels.get(operation.verb, operation.verb)
    return label[:1].lower() + label[1:]
