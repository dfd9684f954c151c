"""The email that tells whoever started an operation how it ended.

Rendered by the worker that finished the run, from the operation and instance it has in hand
(nothing read again), and sent by the mail worker once the run's end commits
(`runner`, `accounts.mail`).
"""

from __future__ import annotations

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from accounts import mail
from deployments import lifecycle
from deployments.models import Operation


def operation_ended(operation: Operation) -> None:
    """Tell whoever started an operation that it failed (or was cancelled), or that the
    instance its create or restore made is ready (its `instance` and `requested_by` loaded)."""
    user = operation.requested_by
    if user is None or not user.email:
        return
    instance = operation.instance
    if operation.state == Operation.State.SUCCEEDED:
        if operation.verb not in lifecycle.MAKES_INSTANCE:
            return
        subject = f"[Opsdeck] {instance.name} is ready"
    else:
        subject = f"[Opsdeck] {instance.name}: {operation.verb} {operation.state}"
    path = reverse("instance_list", kwargs={"tenant_slug": instance.tenant.slug})
    context = {
        "operation": operation,
        "instance": instance,
        "link": f"{settings.OPSDECK_BASE_URL.rstrip('/')}{path}{instance.pk}/",
    }
    mail.send(
        subject=subject,
        body=render_to_string("deployments/email/operation_ended.txt", context),
        to=[user.email],
    )
