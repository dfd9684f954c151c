"""What a customer, and the platform team, are told when the instance namespace's ResourceQuota
(x-opsdeck.quota.storage, the guard rail Opsdeck itself writes) refuses a verb's change."""

import re
import uuid
from html import unescape
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from accounts import services as account_services
from accounts.audit import Actor
from deployments import services
from deployments.models import Instance, Operation
from tests.deployments.conftest import instance_object, wait_done, wait_for

ROOT = Path(__file__).resolve().parents[2]
VALKEY = ROOT / "specs" / "valkey.yaml"


def _with_quota(text: str, storage: str, *, deadline: int | None = None) -> str:
    """The spec with `x-opsdeck.quota.storage` set (and its hour-long deadlines cut short, so
    that a run that can only end at its deadline ends within the test)."""
    text = re.sub(r"(\nx-opsdeck:\n)", rf'\1  quota: {{storage: "{storage}"}}\n', text, count=1)
    if deadline is not None:
        text = text.replace("activeDeadlineSeconds: 3600", f"activeDeadlineSeconds: {deadline}")
    return text


def _text(response) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode())))


def _create(owner, tenant, plan, **parameters) -> Instance:
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="cache",
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    assert wait_done(create, timeout=90).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def _action(owner, instance, verb, **parameters) -> Operation:
    return services.instance_action(
        actor=Actor(user=owner), instance=instance, verb=verb,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


# --- a StatefulSet whose claims the quota refuses: the FailedCreate warning is never said ---


def test_a_scale_out_the_quota_refuses_fails_naming_the_quota_not_only_its_deadline(
    worker, cell, tenant, owner, kube, client
):
    """Valkey, 2 GiB a server, quota 5 GiB: a modify to 3 servers is applied, and the
    StatefulSet controller cannot make the third server's claim (FailedCreate: exceeded quota).
    The run waits for a ready replica that can never come, and ends at its deadline (an hour
    in the shipped spec) saying only that it was "still waiting on StatefulSet": the quota,
    which the cluster states in the StatefulSet's Warning event, is named nowhere."""
    plan = services.plan_load(text=_with_quota(VALKEY.read_text(), "5Gi", deadline=20)).plan
    instance = _create(owner, tenant, plan)

    modify = wait_done(_action(owner, instance, "modify", servers="3"), timeout=90)

    # The cluster said why, in the StatefulSet's events.
    statefulset = instance_object(kube, instance, "apps/v1", "StatefulSet", instance.pk)
    warning = kube.last_warning(statefulset, since=None)
    assert "exceeded quota" in warning, warning
    assert modify.state == Operation.State.FAILED
    # The operation (Operations tab, Overview, dashboard, email, admin) and the API say so too.
    assert "exceeded quota" in modify.error, modify.error
    secret = account_services.api_token_create(
        actor=Actor(user=owner), tenant=tenant, name="ci", role="viewer"
    )[1]
    api = client.get(
        f"/api/v1/deployments/{instance.pk}/operations/{modify.pk}",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    ).json()
    assert "exceeded quota" in api["error"], api["error"]


def test_a_task_waiting_on_what_the_quota_refuses_says_the_clusters_warning_while_it_waits(
    worker, cell, tenant, owner, owner_client, settings
):
    """The same scale-out with the shipped hour-long deadline: while the modify waits for the
    third server, its task on the Operations tab says what the StatefulSet's Warning event
    says (exceeded quota) instead of a bare "Running" for an hour."""
    settings.OPSDECK_WAIT_WARNING_AFTER = 1
    plan = services.plan_load(text=_with_quota(VALKEY.read_text(), "5Gi")).plan
    instance = _create(owner, tenant, plan)
    modify = _action(owner, instance, "modify", servers="3")

    def said() -> str:
        page = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/?tab=operations")
        return next((m for m in [_text(page)] if "exceeded quota" in m), "")

    shown = wait_for(said, timeout=60, what="the task to say the quota's warning")

    modify.refresh_from_db()
    assert modify.state == Operation.State.RUNNING  # long before its deadline
    assert f'Waiting on StatefulSet "{instance.pk}". Its last warning: "' in shown, shown
    services.operation_cancel(actor=Actor(user=owner), operation=modify, request_id="stop")
    assert wait_done(modify, timeout=90).state != Operation.State.RUNNING


def test_spec_test_names_the_quota_when_a_verb_outgrows_it(tmp_path):
    """spec_test's modify (servers 1 -> 2, 2 GiB each, quota 3 GiB) is failed at the verb
    timeout as "still waiting for main.statefulset": a spec author is not told that the plan
    outgrew its own quota, which the StatefulSet's FailedCreate event says."""
    spec = tmp_path / "valkey-quota.yaml"
    spec.write_text(_with_quota(VALKEY.read_text(), "3Gi"))
    out = StringIO()

    with pytest.raises(CommandError):
        call_command("spec_test", str(spec), "--speed", "200", "--timeout", "10", stdout=out)

    lines = out.getvalue().splitlines()
    modify = lines.index(next(line for line in lines if line.startswith("modify ")))
    assert "failed" in lines[modify]
    assert "exceeded quota" in lines[modify + 1], out.getvalue()


# --- the dashboard's "Failed in the last 7 days" cuts the cause off ----------------------


def test_the_dashboard_says_which_limit_refused_a_modify(worker, cell, tenant, owner, owner_client):
    """A valkey modify growing storage past the quota fails at once with the cluster's words
    ("… is forbidden: exceeded quota: opsdeck-quota, requested: requests.storage=8Gi, …,
    limited: requests.storage=5Gi"), but behind "grow-existing: 1 of 1 items failed; the
    first: persistentvolumeclaims "data-inst-…-0" is forbidden: ", so the dashboard's
    120-character Error cell shows "… is forbidden: exceeded qu…": neither the quota nor the
    limit."""
    plan = services.plan_load(text=_with_quota(VALKEY.read_text(), "5Gi")).plan
    instance = _create(owner, tenant, plan)
    modify = wait_done(_action(owner, instance, "modify", storageGi="10"), timeout=90)
    assert modify.state == Operation.State.FAILED
    assert "exceeded quota" in modify.error

    page = owner_client.get(f"/t/{tenant.slug}/").content.decode()
    table = page[page.index('id="operations-failed"') :]
    cell = unescape(re.search(r'<td class="operation-error">(.*?)</td>', table, re.S).group(1))
    assert "quota" in cell, cell
