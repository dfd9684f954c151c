"""The email that tells whoever started an operation how it ended; for one Opsdeck started on
its own (a scheduled backup, an expired backup's deletion, a suspended subscription's stop),
the organization's owners and admins, when it failed.

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
from deployments import lifecycle, selectors
from deployments.models import Operation

# Who hears of what befalls an organization's instances when nobody of it asked for it.
TOLD_ROLES = (Role.OWNER, Role.ADMIN)


def organization_told(tenant: Tenant) -> list[str]:
    """The addresses of the organization's owners and admins."""
    return sorted(
        Membership.objects.filter(tenant=tenant, role__in=TOLD_ROLES)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )


def operation_ended(operation: Operation) -> None:
    """Tell whoever started an operation that it failed (or was cancelled), or that the
    instance its create or restore made is ready (its `instance` and `requested_by` loaded);
    the organization's owners and admins that one Opsdeck started on its own failed (nobody
    heard of a scheduled backup failing night after night)."""
    user = operation.requested_by
    instance = operation.instance
    if user is None:  # the system's, or its requester's account is gone
        ours = idempotency.system_made(operation.request_id)
        failed = operation.state == Operation.State.FAILED
        to = organization_told(instance.tenant) if ours and failed else []
    else:
        to = [user.email] if user.email else []
    if not to:
        return
    if operation.state == Operation.State.SUCCEEDED:
        if operation.verb not in lifecycle.MAKES_INSTANCE:
            return
        subject = f"[Opsdeck] {instance.name} is ready"
    else:
        subject = f"[Opsdeck] {instance.name}: {_said(operation)} {operation.state}"
    path = reverse("instance_list", kwargs={"tenant_slug": instance.tenant.slug})
    context = {
        "operation": operation,
        "verb": _said(operation),
        "instance": instance,
        "link": f"{settings.OPSDECK_BASE_URL.rstrip('/')}{path}{instance.pk}/",
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
