"""Whether a running instance serves as it should: its health, beside its lifecycle state.

A plan declares the rule (`x-opsdeck.health`): a condition over its status object, written as
a successCondition is (`cel: …` or Argo's selector syntax, bounded as every spec program is),
and the path in that object of the operator's reason. Whoever reads the status object (the
cell watcher, the status sync) keeps the verdict in `Instance.observed` (`verdict`: `healthy`
and `healthReason`), never the object.

`instances_assess` (beat, every 30 s) turns verdicts into health, for running instances only
(a stopped or updating instance is not unhealthy; its clock starts again when it runs, and
a Degraded one stopped stays so, from when its incident began, until it runs and passes), with
hysteresis: an instance is Degraded once its verdict has failed for `OPSDECK_DEGRADED_AFTER`
seconds (two minutes), and Healthy again at its first passing verdict. Each change is one
conditional UPDATE, so however many beat runs overlap, an incident is recorded in the
instance's history (its activity) and emailed to the organization's owners and admins once
when it begins and once when it ends — a verdict that flips back within the two minutes sends
nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from accounts import mail
from accounts.audit import SYSTEM, audit_record
from deployments import emails
from deployments.models import Instance
from deployments.workflow import conditions, evaluator
from deployments.workflow.outputs import MISSING, dotted_get

log = logging.getLogger(__name__)

H = Instance.Health
# The verdict the last read of the status object kept.
FAILING, PASSING = Q(observed__healthy=False), Q(observed__healthy=True)


def verdict(obj: dict[str, Any], condition: str, reason_path: str) -> dict[str, Any]:
    """`{"healthy": bool, "healthReason": text}` for the status object `obj`; `{}` when the
    rule could not be evaluated within its bounds (no verdict rather than a false alarm)."""
    try:
        healthy = conditions.parse_condition(condition).all_match(obj)
    except (conditions.ConditionError, evaluator.ProgramLimitError) as exc:
        log.warning("health rule not evaluated: %s", exc)
        return {}
    reason = "" if healthy or not reason_path else dotted_get(obj, reason_path)
    return {"healthy": healthy, "healthReason": "" if reason is MISSING else str(reason)[:500]}


def instances_assess(now: datetime | None = None) -> dict[str, int]:
    """Bring every running instance's health up to its verdicts (see the module docstring);
    how many became degraded and recovered."""
    now = now or timezone.now()
    running = Instance.objects.filter(state=Instance.State.RUNNING)
    # Not running: no clock runs (a stopped instance is not unhealthy). An incident under way
    # goes on from when it began: its end is the first passing verdict once the instance runs.
    Instance.objects.exclude(state=Instance.State.RUNNING).filter(
        health=H.HEALTHY, unhealthy_since__isnull=False
    ).update(unhealthy_since=None)
    # The clock starts at the first failing verdict, and stops at a passing one.
    running.filter(FAILING, unhealthy_since__isnull=True).update(unhealthy_since=now)
    running.filter(PASSING, health=H.HEALTHY, unhealthy_since__isnull=False).update(
        unhealthy_since=None
    )
    after = timedelta(seconds=settings.OPSDECK_DEGRADED_AFTER)
    degrading = running.filter(FAILING, health=H.HEALTHY, unhealthy_since__lte=now - after)
    recovering = running.filter(PASSING, health=H.DEGRADED)
    degraded = sum(_change(pk, H.DEGRADED, now) for pk in degrading.values_list("pk", flat=True))
    recovered = sum(_change(pk, H.HEALTHY, now) for pk in recovering.values_list("pk", flat=True))
    return {"degraded": degraded, "recovered": recovered}


def _change(instance_id: str, health: str, now: datetime) -> bool:
    """Move one instance to `health` if nobody did meanwhile: recorded, and its owners and
    admins emailed after the commit; whether this call made the change."""
    was = H.HEALTHY if health == H.DEGRADED else H.DEGRADED
    with transaction.atomic():
        instance = (
            Instance.objects.select_for_update()
            .select_related("tenant")
            .filter(pk=instance_id, health=was, state=Instance.State.RUNNING)
            .first()
        )
        if instance is None:
            return False  # another run of this task changed it first, or it stopped meanwhile
        reason = str(instance.observed.get("healthReason") or "") if health == H.DEGRADED else ""
        since = instance.unhealthy_since
        instance.health, instance.health_reason = health, reason
        instance.unhealthy_since = since if health == H.DEGRADED else None
        instance.save(update_fields=["health", "health_reason", "unhealthy_since"])
        audit_record(
            actor=SYSTEM,
            action=f"instance.{health}",
            tenant=instance.tenant,
            target=instance,
            payload={"reason": reason} if reason else {},
        )
        _email(instance, health, since or now)
    return True


def _email(instance: Instance, health: str, since: datetime) -> None:
    recipients = emails.organization_told(instance.tenant)
    if not recipients:
        return
    path = reverse(
        "instance_detail", kwargs={"tenant_slug": instance.tenant.slug, "instance_id": instance.pk}
    )
    state = "degraded" if health == H.DEGRADED else "healthy again"
    mail.send(
        subject=f"[Opsdeck] {instance.name} is {state}",
        body=render_to_string(
            "deployments/email/instance_health.txt",
            {
                "instance": instance,
                "degraded": health == H.DEGRADED,
                "since": since,
                "link": f"{settings.OPSDECK_BASE_URL.rstrip('/')}{path}",
            },
        ),
        to=recipients,
    )
