"""Deployments ask billing before every create, change and verb: a tenant without an active
subscription, or past its plan's limits, is refused with a reason — audited, and said next to
the form."""

import re
import threading
import uuid
from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts.audit import SYSTEM, Actor, audit_record
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from accounts.services import tenant_lock
from billing import services as billing_services
from billing.models import PlanOverride, Subscription
from deployments import metering, services, transitions
from deployments.entitlement_usage import entitlement_require, usage_on_plan
from deployments.models import Cell, Instance, Operation, Snapshot
from tests.concurrency import beside_a_lock, race
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS

pytestmark = pytest.mark.unsubscribed

HOBBY = """
  entitlements:
    maxInstances: 2
    maxPerInstance: {replica: 2}
    maxTotal: {storage: 50}
    cells: [local]
    deniedVerbs: [restart, restore.pointInTime]
    maxBackupRetentionDays: 30
  subscription: {autoApprove: true, graceDays: 7, stopAfterDays: 7}
"""


def _hobby_text() -> str:
    text = SPEC.read_text()
    start = text.index("  entitlements:")
    end = text.index("\nservices:")
    text = text[:start] + HOBBY.lstrip("\n") + text[end:]
    text = text.replace("maxNumberOfInstancesAllowed: 10\n", "")
    return text.replace("plan: postgres-cnpg", "plan: pg-hobby").replace(
        "name: PostgreSQL\n", "name: Hobby\n", 1
    )


@pytest.fixture
def local(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)


@pytest.fixture
def hobby(db):
    return services.plan_load(text=_hobby_text()).plan


@pytest.fixture
def subscribed(tenant, hobby, owner):
    return billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=hobby)


def _create(owner, tenant, plan, name="orders", cell=None, request_id=None, **parameters):
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name, parameters=parameters,
        request_id=request_id or uuid.uuid4().hex, cell=cell,
    )  # fmt: skip


def _running(owner, tenant, plan, **parameters) -> Instance:
    op = _create(owner, tenant, plan, **parameters)
    Operation.objects.filter(pk=op.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=op.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=op.instance_id)


def _act(owner, instance, verb, **parameters):
    return services.instance_action(
        actor=Actor(user=owner), instance=instance, verb=verb, request_id=uuid.uuid4().hex,
        parameters=parameters,
    )  # fmt: skip


def _denied(tenant, action):
    return AuditEvent.objects.filter(tenant=tenant, action=action, result="denied")


def test_the_spec_entitlements_reach_the_plan(hobby):
    assert hobby.limits == {
        "max_instances": 2,
        "max_per_instance": {"replica": 2},
        "max_total": {"storage": 50},
        "cells": ["local"],
        "denied_verbs": ["restart", "restore.pointInTime"],
        "max_backup_retention_days": 30,
        "auto_approve": True,
        "grace_days": 7,
        "stop_after_days": 7,
    }
    assert hobby.max_instances == 2


def test_omnistrates_instance_limit_is_the_plans_max_instances(db):
    plan = services.plan_load(text=SPEC.read_text()).plan

    assert plan.max_instances == 10
    assert plan.limits["max_per_instance"] == {"replica": 5}


def test_a_tenant_without_a_subscription_cannot_create_and_is_told_how_to(
    local, hobby, tenant, owner
):
    with pytest.raises(ActionDenied) as refused:
        _create(owner, tenant, hobby)

    assert refused.value.reason == (
        "Subscribe to the Hobby plan on the Billing page to create instances on it."
    )
    assert not Instance.objects.exists()
    assert _denied(tenant, "instance.create").get().payload["reason"] == refused.value.reason


def test_a_pending_subscription_cannot_create_yet(local, tenant, owner):
    text = _hobby_text().replace("autoApprove: true", "autoApprove: false")
    plan = services.plan_load(text=text).plan
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)

    with pytest.raises(ActionDenied, match="awaiting approval"):
        _create(owner, tenant, plan)


def test_a_create_form_sent_anyway_is_refused_and_says_why_above_its_disabled_submit(
    local, hobby, tenant, owner, owner_client
):
    url = f"/t/{tenant.slug}/deployments/new/{hobby.key}/?request={uuid.uuid4().hex}"

    page = owner_client.post(url, {"name": "orders", "request_id": uuid.uuid4().hex})

    html = page.content.decode()
    assert page.status_code == 200
    assert "Acme is not subscribed to the Hobby plan" in html
    assert html.count("is not subscribed to the Hobby plan") == 1  # said once, not as a message too
    assert '<button type="submit" disabled aria-describedby="create-refused">' in html
    assert not Instance.objects.exists()
    assert _denied(tenant, "instance.create").exists()  # the service refused it, as ever


def test_the_create_form_says_why_before_it_is_filled_in_and_offers_no_submit_that_would_fail(
    local, hobby, tenant, owner, owner_client
):
    url = f"/t/{tenant.slug}/deployments/new/{hobby.key}/?request={uuid.uuid4().hex}"

    unsubscribed = owner_client.get(url).content.decode()
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=hobby)
    subscribed = owner_client.get(url).content.decode()

    assert (
        'id="create-refused" role="status">Acme is not subscribed to the Hobby plan: instances on '
        f'it can be created once it is. <a href="/t/{tenant.slug}/billing/#plan-{hobby.key}">'
        'Subscribe<span class="visually-hidden"> to Hobby</span> on the Billing page</a>'
    ) in unsubscribed
    assert '<button type="submit" disabled aria-describedby="create-refused">' in unsubscribed
    assert 'id="create-refused"' not in subscribed and 'name="name"' in subscribed
    assert '<button type="submit">Create instance</button>' in subscribed


def _card(page: str, plan) -> str:
    start = page.index(f'id="plan-{plan.key}"')
    return page[start : page.index("</article>", start)]


def test_the_catalog_offers_to_subscribe_to_a_plan_not_subscribed_in_place_of_create(
    local, hobby, tenant, owner, owner_client
):
    url = f"/t/{tenant.slug}/deployments/new/"
    create = f"/t/{tenant.slug}/deployments/new/{hobby.key}/"

    unsubscribed = _card(owner_client.get(url).content.decode(), hobby)
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=hobby)
    subscribed = _card(owner_client.get(url).content.decode(), hobby)

    assert (
        f'<p class="muted" id="refusal-{hobby.key}">Acme is not subscribed to the Hobby plan: '
        "instances on it can be created once it is.</p>"
    ) in unsubscribed
    assert (
        f'<a role="button" href="/t/{tenant.slug}/billing/#plan-{hobby.key}" '
        f'aria-describedby="refusal-{hobby.key}">Subscribe<span class="visually-hidden"> to '
        "Hobby</span> on the Billing page</a>"
    ) in unsubscribed
    assert create not in unsubscribed and "Create instance" not in unsubscribed
    assert f'<a role="button" href="{create}">Create instance' in subscribed
    assert f'id="refusal-{hobby.key}"' not in subscribed
    assert not _denied(tenant, "instance.create").exists()  # a look is not a refused request


def test_a_member_who_cannot_subscribe_sees_create_disabled_and_whom_to_ask(
    local, hobby, tenant, add_member, client
):
    client.force_login(add_member("dev@example.com", "member"))

    card = _card(client.get(f"/t/{tenant.slug}/deployments/new/").content.decode(), hobby)

    assert (
        f'<p class="muted" id="refusal-{hobby.key}">Acme is not subscribed to the Hobby plan: ask '
        "someone who manages billing for Acme to subscribe to it.</p>"
    ) in card
    assert (
        f'<button type="button" disabled aria-describedby="refusal-{hobby.key}">Create instance'
    ) in card
    assert "/billing/" not in card and f"/deployments/new/{hobby.key}/" not in card


def test_the_instance_limit_counts_instances_not_deleted(local, hobby, subscribed, tenant, owner):
    first = _running(owner, tenant, hobby, name="a", storageGi=5)
    _running(owner, tenant, hobby, name="b", storageGi=5)

    with pytest.raises(ActionDenied) as refused:
        _create(owner, tenant, hobby, name="c", storageGi=5)
    Instance.objects.filter(pk=first.pk).update(state=Instance.State.DELETED)
    _create(owner, tenant, hobby, name="d", storageGi=5)

    assert refused.value.reason == (
        "The Hobby plan allows at most 2 instances per organization and you have 2; "
        "delete one or ask the platform team for more."
    )


def test_a_refusal_only_the_platform_team_can_lift_offers_no_billing_link(
    local, hobby, subscribed, tenant, owner, owner_client
):
    _running(owner, tenant, hobby, name="a", storageGi=5)
    _running(owner, tenant, hobby, name="b", storageGi=5)

    for page in (
        f"/t/{tenant.slug}/deployments/new/",
        f"/t/{tenant.slug}/deployments/new/{hobby.key}/?request={uuid.uuid4().hex}",
    ):
        html = owner_client.get(page).content.decode()
        assert "delete one or ask the platform team for more." in html, page
        assert "Open Billing" not in html, page
        assert re.search(r'<button type="(button|submit)" disabled aria-describedby', html), page


def test_a_total_across_the_tenant_is_a_limit(local, hobby, subscribed, tenant, owner):
    _running(owner, tenant, hobby, name="a", storageGi=20, instances=2)  # 40 GiB

    with pytest.raises(ActionDenied) as refused:
        _create(owner, tenant, hobby, name="b", storageGi=11)

    assert refused.value.reason == (
        "The Hobby plan allows at most 50 GiB of storage across your organization's instances "
        "and this would make 51 GiB of storage; free some or ask the platform team for more."
    )
    _create(owner, tenant, hobby, name="c", storageGi=10)  # exactly 50


def test_a_modify_past_the_per_instance_limit_is_refused_and_audited(
    local, hobby, subscribed, tenant, owner
):
    instance = _running(owner, tenant, hobby, storageGi=5)

    with pytest.raises(ActionDenied) as refused:
        _act(owner, instance, "modify", instances=3)

    assert refused.value.reason == (
        "The Hobby plan allows at most 2 servers per instance and this asks for 3 servers; "
        "ask the platform team if you need more."
    )
    assert _denied(tenant, "instance.modify").exists()
    assert not instance.operations.filter(verb="modify").exists()
    _act(owner, instance, "modify", instances=2)


def test_a_modify_growing_the_total_past_the_limit_is_refused(
    local, hobby, subscribed, tenant, owner
):
    instance = _running(owner, tenant, hobby, storageGi=20)  # 20 GiB

    with pytest.raises(ActionDenied, match="at most 50 GiB of storage across"):
        _act(owner, instance, "modify", instances=2, storageGi=26)  # 52 GiB
    _act(owner, instance, "modify", storageGi=25)  # shrinking below is never the limit's business


def test_a_change_queued_but_not_run_yet_counts_against_the_total(
    local, hobby, subscribed, tenant, owner
):
    PlanOverride.objects.create(tenant=tenant, plan=hobby, limits={"max_instances": 3})
    a = _running(owner, tenant, hobby, name="a", storageGi=20)
    b = _running(owner, tenant, hobby, name="b", storageGi=10)
    _act(owner, a, "modify", storageGi=25)  # queued: a holds 20 GiB until it has run

    with pytest.raises(ActionDenied, match="this would make 51 GiB of storage"):
        _act(owner, b, "modify", storageGi=26)
    with pytest.raises(ActionDenied, match="this would make 51 GiB of storage"):
        _create(owner, tenant, hobby, name="c", storageGi=16)
    assert not b.operations.filter(verb="modify").exists()
    _act(owner, b, "modify", storageGi=25)  # exactly 50 once a's change has run


def test_a_change_below_a_queued_peak_adds_nothing_to_the_total(
    local, hobby, subscribed, tenant, owner
):
    a = _running(owner, tenant, hobby, name="a", storageGi=20)  # 20 GiB x 1 server
    _running(owner, tenant, hobby, name="b", storageGi=10)
    _act(owner, a, "modify", instances=2)  # queued: 40 GiB while it runs, 50 in all
    _act(owner, a, "modify", instances=1)  # queued after it: back to 20

    # 25 GiB on one server, once both have run: a never holds more than the 40 counted.
    assert _act(owner, a, "modify", storageGi=25)
    with pytest.raises(ActionDenied, match="this would make 62 GiB of storage"):
        _act(owner, a, "modify", instances=2, storageGi=26)  # 52: 12 beyond the 40 counted


@pytest.fixture
def moving_onto_hobby(local, hobby, subscribed, tenant, owner) -> Instance:
    """An instance of 30 GiB on another plan, its upgrade onto `hobby` queued."""
    other = services.plan_load(
        text=_hobby_text()
        .replace("plan: pg-hobby", "plan: pg-other")
        .replace("name: Hobby\n", "name: Other\n", 1)
    ).plan
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=other)
    moving = _running(owner, tenant, other, name="moving", storageGi=30)
    Operation.objects.create(
        instance=moving, verb="upgrade", state=Operation.State.QUEUED, request_id="move",
        plan_version=hobby.versions.get(),
    )  # fmt: skip
    return moving


def test_an_instance_moving_onto_a_plan_counts_there_before_it_has_moved(
    moving_onto_hobby, hobby, tenant, owner
):

    with pytest.raises(ActionDenied, match="this would make 51 GiB of storage"):
        _create(owner, tenant, hobby, name="c", storageGi=21)
    _create(owner, tenant, hobby, name="c", storageGi=20)  # 50 with the one moving


def test_an_instance_moving_onto_a_plan_is_measured_once_not_on_every_check(
    moving_onto_hobby, hobby, tenant
):
    """The version it moves to generates a password anew on every check: left out of what is
    measured and remembered (nothing measures a password), it makes no values new."""
    assert usage_on_plan(tenant, hobby, dimensions=True, pending=True).totals["storage"] == 30
    measured = metering._stored_quantities.cache_info().misses

    usage_on_plan(tenant, hobby, dimensions=True, pending=True)

    assert metering._stored_quantities.cache_info().misses == measured


@pytest.mark.parametrize("ended", [Operation.State.FAILED, Operation.State.CANCELLED])
def test_a_failed_change_counts_against_the_total_until_it_is_rolled_back(
    local, hobby, subscribed, tenant, owner, ended
):
    """Failed, or cancelled once the cluster had taken some of it: either leaves the instance
    failed, its cluster possibly holding the change."""
    a = _running(owner, tenant, hobby, name="a", storageGi=20)
    failed = Operation.objects.create(
        instance=a, verb="modify", request_id="grew", plan_version=a.plan_version,
        state=ended, parameters={**a.parameters, "storageGi": 30}, started_at=timezone.now(),
    )  # fmt: skip
    transitions.instance_state_set(a, Instance.State.FAILED, operation=failed, reason=ended)

    # Stored 20 GiB, but the cancelled change may have grown the volume to 30 (it cannot shrink).
    with pytest.raises(ActionDenied, match="this would make 60 GiB of storage"):
        _create(owner, tenant, hobby, name="b", storageGi=30)
    _create(owner, tenant, hobby, name="b", storageGi=20)  # 50
    # The roll back keeps the 30 GiB and is never refused for a size it cannot take back.
    rollback = services.instance_rollback(actor=Actor(user=owner), instance=a, request_id="rb")
    assert rollback.requested == {"storageGi": 30}


def test_a_check_reads_the_tenants_usage_in_one_statement_however_much_it_holds(
    local, hobby, subscribed, tenant, owner, django_assert_num_queries
):
    """Its limits, its usage of the plan (instances, the changes queued on them, a failed one's
    last change) and its subscription: three statements, for a few instances as for many."""
    PlanOverride.objects.create(tenant=tenant, plan=hobby, limits={"max_instances": 20})
    version = hobby.versions.get()
    failed = _running(owner, tenant, hobby, name="failed", storageGi=1)
    transitions.instance_state_set(failed, Instance.State.FAILED, reason="cancelled")
    Operation.objects.create(
        instance=failed, verb="modify", request_id="grew", plan_version=version,
        state=Operation.State.FAILED, parameters={**failed.parameters, "storageGi": 2},
        started_at=timezone.now(),
    )  # fmt: skip

    def check():
        entitlement_require(
            tenant=tenant, plan=hobby, action="create", version=version,
            after=failed.parameters, cell="local",
        )  # fmt: skip

    for n in range(5):
        _act(
            owner, _running(owner, tenant, hobby, name=f"a{n}", storageGi=1), "modify", storageGi=2
        )
        with django_assert_num_queries(3):
            check()


def test_a_cell_outside_the_plan_is_refused(hobby, subscribed, tenant, owner):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    elsewhere = Cell.objects.create(name="us-1", region="us-east", **BACKUPS)

    with pytest.raises(ActionDenied) as refused:
        _create(owner, tenant, hobby, cell=elsewhere)

    assert refused.value.reason == (
        "The Hobby plan does not run in the us-1 cell; choose one of: local."
    )


def test_a_verb_the_plan_denies_is_refused(local, hobby, subscribed, tenant, owner):
    instance = _running(owner, tenant, hobby)

    with pytest.raises(ActionDenied) as refused:
        _act(owner, instance, "restart")

    assert refused.value.reason == (
        "The Hobby plan does not include the restart action; ask the platform team if you need it."
    )
    assert _denied(tenant, "instance.restart").exists()


def _completed_snapshot(instance) -> Snapshot:
    return Snapshot.objects.create(
        tenant=instance.tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-snap",
        status=Snapshot.Status.COMPLETED, created_at=timezone.now() - timedelta(hours=2),
        parameters=instance.parameters,
    )  # fmt: skip


def test_point_in_time_restore_is_refused_where_denied_but_a_plain_restore_runs(
    local, hobby, subscribed, tenant, owner
):
    snapshot = _completed_snapshot(_running(owner, tenant, hobby, storageGi=5))

    with pytest.raises(ActionDenied) as refused:
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="pitr",
            target_time=timezone.now() - timedelta(hours=1),
        )  # fmt: skip
    restore = services.snapshot_restore(
        actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="plain"
    )

    assert "does not include point-in-time restore" in refused.value.reason
    assert _denied(tenant, "instance.restore").exists()
    assert restore.verb == "restore"


def test_a_backup_retention_beyond_the_plan_is_refused(local, hobby, subscribed, tenant, owner):
    instance = _running(owner, tenant, hobby)

    def schedule(days):
        return services.backup_schedule_update(
            actor=Actor(user=owner), instance=instance, interval_hours=24, cron="",
            retention_days=days, retention_count=None, enabled=True,
        )  # fmt: skip

    with pytest.raises(ActionDenied) as refused:
        schedule(31)
    schedule(30)

    assert refused.value.reason == (
        "The Hobby plan keeps backups for at most 30 days; choose 30 or fewer, "
        "or ask the platform team for longer."
    )
    assert _denied(tenant, "backup.schedule").exists()


def test_a_retention_beyond_any_plan_is_told_the_range_the_plan_allows(
    local, hobby, subscribed, tenant, owner, owner_client
):
    instance = _running(owner, tenant, hobby)

    response = owner_client.post(
        f"/t/{tenant.slug}/deployments/{instance.pk}/backups/schedule/",
        {"timing": "interval", "interval_hours": "24", "retention_days": "3651", "enabled": "on"},
    )

    assert response.status_code == 400
    html = response.content.decode()
    # The field says what the form offers (at most 30 on Hobby), not any schedule's ceiling.
    error = html[html.index('id="schedule-retention_days-error"') :][:300]
    assert "Give a whole number of days from 1 to 30." in error
    instance.backup_schedule.refresh_from_db()
    assert instance.backup_schedule.retention_days != 3651


def test_a_retention_beyond_the_plan_is_said_beside_its_field_keeping_what_was_typed(
    local, hobby, subscribed, tenant, owner, owner_client
):
    instance = _running(owner, tenant, hobby)

    response = owner_client.post(
        f"/t/{tenant.slug}/deployments/{instance.pk}/backups/schedule/",
        {"timing": "interval", "interval_hours": "12", "retention_days": "31", "enabled": "on"},
    )

    assert response.status_code == 400
    html = response.content.decode()
    error = html[html.index('id="schedule-retention_days-error"') :][:400]
    assert "The Hobby plan keeps backups for at most 30 days" in error
    assert 'name="retention_days"' in html and 'value="31"' in html
    assert 'value="12"' in html  # the interval typed, kept too
    instance.backup_schedule.refresh_from_db()
    assert instance.backup_schedule.retention_days != 31
    assert _denied(tenant, "backup.schedule").exists()


def test_the_backups_tab_offers_retention_up_to_the_plans_limit(
    local, hobby, subscribed, tenant, owner, owner_client
):
    from billing.models import PlanOverride

    instance = _running(owner, tenant, hobby)
    url = f"/t/{tenant.slug}/deployments/{instance.pk}/?tab=backups"

    html = owner_client.get(url).content.decode()
    PlanOverride.objects.create(
        tenant=tenant, plan=hobby, limits={"max_backup_retention_days": 90},
        effective_from=timezone.now() - timedelta(minutes=1),
    )  # fmt: skip
    overridden = owner_client.get(url).content.decode()

    assert "Keep backups for (days, at most 30)" in html and 'max="30"' in html
    assert "Keep backups for (days, at most 90)" in overridden and 'max="90"' in overridden


@pytest.mark.parametrize("verb", ["start", "backup", "modify", "reloadConfiguration"])
def test_a_suspended_subscription_refuses_every_verb_but_stop_and_delete(
    local, hobby, subscribed, tenant, owner, verb
):
    instance = _running(owner, tenant, hobby)
    if verb == "start":
        Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)
    billing_services.subscription_suspend(actor=SYSTEM, subscription=subscribed)

    with pytest.raises(ActionDenied, match="is suspended, so its instances can only be stopped"):
        _act(owner, instance, verb, **({"instances": 2} if verb == "modify" else {}))


def test_a_suspended_subscription_still_stops_deletes_and_forgets_backups(
    local, hobby, subscribed, tenant, owner
):
    instance = _running(owner, tenant, hobby)
    snapshot = _completed_snapshot(instance)
    billing_services.subscription_suspend(actor=SYSTEM, subscription=subscribed)

    assert _act(owner, instance, "stop").verb == "stop"
    forget = services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="f")
    delete = services.instance_delete(actor=Actor(user=owner), instance=instance, request_id="d")

    assert forget.verb == "deleteBackup"
    assert delete.verb == "delete"
    with pytest.raises(ActionDenied, match="is suspended"):
        _create(owner, tenant, hobby, name="more")


def test_past_due_within_grace_still_runs_and_beyond_it_is_refused(
    local, hobby, subscribed, tenant, owner
):
    instance = _running(owner, tenant, hobby)
    billing_services.subscription_mark_past_due(
        actor=SYSTEM, subscription=subscribed, since=timezone.now() - timedelta(days=6)
    )
    _act(owner, instance, "backup")

    Subscription.objects.filter(pk=subscribed.pk).update(
        past_due_since=timezone.now() - timedelta(days=8)
    )
    with pytest.raises(ActionDenied, match="is suspended"):
        _act(owner, instance, "backup")


def test_reactivation_restarts_nothing_but_allows_it(local, hobby, subscribed, tenant, owner):
    instance = _running(owner, tenant, hobby)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)
    billing_services.subscription_suspend(actor=SYSTEM, subscription=subscribed)
    billing_services.subscription_reactivate(actor=SYSTEM, subscription=subscribed)

    assert not instance.operations.filter(verb="start").exists()
    assert _act(owner, instance, "start").verb == "start"


# --- the stop sweep ---


def _suspended_days_ago(subscription, days):
    billing_services.subscription_suspend(actor=SYSTEM, subscription=subscription)
    Subscription.objects.filter(pk=subscription.pk).update(
        suspended_at=timezone.now() - timedelta(days=days)
    )


def _stopped_once_a_week_and_a_day_after_suspension(subscription) -> Operation:
    """Nothing stopped while the suspension is younger than the plan's 7 days; 8 days on, the
    sweep stops the running instance, once however often it runs. Its stop."""
    assert services.suspended_instances_stop() == {"stopped": 0, "unstoppable": 0}
    Subscription.objects.filter(pk=subscription.pk).update(
        suspended_at=timezone.now() - timedelta(days=8)
    )
    first = services.suspended_instances_stop()
    second = services.suspended_instances_stop()

    assert first == {"stopped": 1, "unstoppable": 0}
    assert second == {"stopped": 0, "unstoppable": 0}
    (stop,) = Operation.objects.filter(verb="stop")
    return stop


def test_the_sweep_stops_running_instances_after_the_second_grace_once(
    local, hobby, subscribed, tenant, owner
):
    running = _running(owner, tenant, hobby, name="a")
    stopped = _running(owner, tenant, hobby, name="b")
    Instance.objects.filter(pk=stopped.pk).update(state=Instance.State.STOPPED)
    _suspended_days_ago(subscribed, 6)

    stop = _stopped_once_a_week_and_a_day_after_suspension(subscribed)

    assert stop.instance_id == running.pk
    assert stop.requested_by is None  # the system
    assert AuditEvent.objects.filter(
        tenant=tenant, action="instance.stop", actor_kind="system", result="ok"
    ).exists()
    assert AuditEvent.objects.filter(action="subscription.instances_stop").count() == 1
    assert not Operation.objects.filter(verb="delete").exists()


def _ended_days_ago(subscription, days):
    """Ended as Stripe ends one (its instances may run), `days` ago."""
    billing_services.subscription_cancel(
        actor=SYSTEM, subscription=subscription, instances_may_run=True
    )
    Subscription.objects.filter(pk=subscription.pk).update(
        cancelled_at=timezone.now() - timedelta(days=days)
    )


@pytest.mark.usefixtures("mail_at_commit")
def test_instances_still_running_when_stripe_ends_a_suspended_subscription_are_stopped(
    local, hobby, subscribed, tenant, owner
):
    running = _running(owner, tenant, hobby, name="a")
    _suspended_days_ago(subscribed, 6)
    _ended_days_ago(subscribed, 0)  # Stripe gave up on the payment before the stop came

    stop = _stopped_once_a_week_and_a_day_after_suspension(subscribed)

    assert stop.instance_id == running.pk
    event = AuditEvent.objects.get(action="instance.stop", actor_kind="system", result="ok")
    assert event.payload == {"reason": "the subscription ended"}
    # The email a worker sends of it (after the sweep commits) tells why.
    subscribed.refresh_from_db()
    billing_services.subscription_email_send(subscription=subscribed, event="stopped")
    told = mail.outbox[-1].body
    assert f"has ended, and instances still ran on it {hobby.stop_after_days} days later" in told


@pytest.mark.usefixtures("mail_at_commit")
def test_the_email_of_a_subscription_ended_with_instances_on_it_says_when_they_stop(
    local, hobby, subscribed, tenant, owner
):
    _running(owner, tenant, hobby, name="a")
    _ended_days_ago(subscribed, 0)
    subscribed.refresh_from_db()

    billing_services.subscription_email_send(subscription=subscribed, event="cancel")

    due = subscribed.stop_due_at()
    assert (
        "plan is cancelled. 1 instance is still on it: running ones are stopped on "
        f"{due:%-d %b %Y %H:%M} UTC unless you are subscribed to the plan again by then."
    ) in mail.outbox[-1].body


def test_instances_of_a_subscription_stripe_ended_stop_after_the_grace_unless_resubscribed(
    local, hobby, subscribed, tenant, owner
):
    running = _running(owner, tenant, hobby, name="a")
    _ended_days_ago(subscribed, 6)
    assert services.suspended_instances_stop() == {"stopped": 0, "unstoppable": 0}

    # Subscribed again: its instances run on the new subscription.
    again = billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=hobby)
    Subscription.objects.filter(pk=subscribed.pk).update(
        cancelled_at=timezone.now() - timedelta(days=30)
    )
    assert services.suspended_instances_stop() == {"stopped": 0, "unstoppable": 0}
    # That one ended too, a week ago and a day: now they are stopped.
    _ended_days_ago(again, 8)

    assert services.suspended_instances_stop() == {"stopped": 1, "unstoppable": 0}
    assert Operation.objects.get(verb="stop").instance_id == running.pk


def test_subscribing_again_without_paying_leaves_an_ended_subscriptions_instances_to_stop(
    local, hobby, subscribed, tenant, owner, owner_client
):
    running = _running(owner, tenant, hobby, name="a")
    _ended_days_ago(subscribed, 8)
    # Subscribed again, and the checkout left unpaid: it lets nothing run.
    Subscription.objects.create(tenant=tenant, plan=hobby, status=Subscription.Status.PENDING)

    swept = services.suspended_instances_stop()
    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()

    assert swept == {"stopped": 1, "unstoppable": 0}
    assert Operation.objects.get(verb="stop").instance_id == running.pk
    assert "Your subscription to this plan has ended, and 1 instance is still on it." in page


def test_a_subscription_awaiting_payment_is_withdrawn_and_the_ended_ones_clock_runs_on(
    local, hobby, subscribed, tenant, owner, owner_client
):
    running = _running(owner, tenant, hobby, name="a")
    _ended_days_ago(subscribed, 2)
    due = Subscription.objects.get(pk=subscribed.pk).stop_due_at()
    pending = Subscription.objects.create(
        tenant=tenant, plan=hobby, status=Subscription.Status.PENDING
    )
    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "It has not started, so cancelling withdraws it; the instances on this plan" in page
    assert f'<button type="submit" class="secondary">Cancel my {hobby.name} subscription' in page

    done = owner_client.post(
        f"/t/{tenant.slug}/billing/subscriptions/{pending.pk}/cancel/", follow=True
    ).content.decode()

    # It let nothing run: withdrawn although an instance is still on the plan.
    assert f"Your subscription to {hobby.name} is cancelled." in done
    assert Subscription.objects.get(pk=pending.pk).status == Subscription.Status.CANCELLED
    # Its end starts no clock: the instance stops when the ended one's grace runs out.
    assert f"{due:%-d %b %Y %H:%M} UTC</time> unless you are subscribed again by then" in done
    assert services.suspended_instances_stop() == {"stopped": 0, "unstoppable": 0}
    Subscription.objects.filter(pk=subscribed.pk).update(
        cancelled_at=timezone.now() - timedelta(days=8)
    )
    assert services.suspended_instances_stop() == {"stopped": 1, "unstoppable": 0}
    assert Operation.objects.get(verb="stop").instance_id == running.pk


def test_the_billing_page_says_when_an_ended_subscriptions_instances_stop(
    local, hobby, subscribed, tenant, owner, owner_client
):
    _running(owner, tenant, hobby, name="a")
    _ended_days_ago(subscribed, 2)
    due = Subscription.objects.get(pk=subscribed.pk).stop_due_at()

    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()

    assert "Your subscription to this plan has ended, and 1 instance is still on it." in page
    assert f'Running ones are stopped on <time datetime="{due:%Y-%m-%dT%H:%M:%S}' in page
    assert f"{due:%-d %b %Y %H:%M} UTC</time> unless you are subscribed again by then" in page

    Subscription.objects.filter(pk=subscribed.pk).update(
        cancelled_at=timezone.now() - timedelta(days=8)
    )
    page = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "Running ones are being stopped; start them again once you are subscribed" in page


def test_a_plan_without_stop_is_flagged_to_staff_instead(tenant, owner, caplog):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    text = _hobby_text()
    start = text.index("      stop:\n")
    end = text.index("      start:\n")
    plan = services.plan_load(text=text[:start] + text[end:]).plan
    subscription = billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    instance = _running(owner, tenant, plan)
    _suspended_days_ago(subscription, 8)

    first = services.suspended_instances_stop()
    services.suspended_instances_stop()

    assert first == {"stopped": 0, "unstoppable": 1}
    flag = AuditEvent.objects.get(action="subscription.instances_unstoppable")
    assert flag.payload["instances"] == [instance.pk]
    assert "has no stop verb" in caplog.text
    assert not Operation.objects.filter(verb="stop").exists()


# --- races ---


@pytest.mark.django_db(transaction=True)
def test_a_subscription_reactivated_while_the_stop_sweep_runs_has_nothing_stopped(tenant, owner):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=_hobby_text()).plan
    subscription = billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    _running(owner, tenant, plan)
    _suspended_days_ago(subscription, 8)  # its instances are due to stop

    def reactivate():
        billing_services.subscription_reactivate(
            actor=SYSTEM, subscription=Subscription.objects.get(pk=subscription.pk)
        )

    reactivated, swept = beside_a_lock(
        lambda: tenant_lock(tenant.pk), reactivate, services.suspended_instances_stop
    )

    assert reactivated == "committed", reactivated
    assert swept == {"stopped": 0, "unstoppable": 0}, swept
    assert not Operation.objects.filter(verb="stop").exists()


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_creates_at_the_limit_make_one_instance(tenant, owner):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=_hobby_text()).plan
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    PlanOverride.objects.create(tenant=tenant, plan=plan, limits={"max_instances": 1})

    results = race(lambda: _create(owner, tenant, plan, name="orders"))

    assert sum(isinstance(r, Operation) for r in results) == 1, results
    assert all(isinstance(r, Operation | ActionDenied) for r in results), results
    assert Instance.objects.filter(tenant=tenant).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_instances_grown_at_once_cannot_both_take_the_room_left(tenant, owner):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=_hobby_text()).plan
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    instances = iter([
        _running(owner, tenant, plan, name=name, storageGi=10) for name in ("a", "b")
    ])  # fmt: skip
    taken = threading.Lock()

    def grow():
        with taken:
            instance = next(instances)
        return _act(owner, instance, "modify", storageGi=30)  # 40 GiB alone, 60 together

    results = race(grow, times=2)

    assert sorted(type(r).__name__ for r in results) == ["ActionDenied", "Operation"], results
    assert Operation.objects.filter(verb="modify").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first", ["create", "cancel"])
def test_a_create_and_a_cancel_at_once_leave_no_instance_on_a_cancelled_subscription(
    tenant, owner, first
):
    """One request has made its change and not committed yet when the other comes: the cancel
    counted the tenant's instances, and the create checked the subscription, without waiting
    for each other, so both succeeded (an instance running on a cancelled subscription)."""
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=_hobby_text()).plan
    subscription = billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    create = lambda: _create(owner, tenant, plan, name="orders")  # noqa: E731
    cancel = lambda: billing_services.subscription_cancel(  # noqa: E731
        actor=Actor(user=owner), subscription=subscription
    )
    held, act = (create, cancel) if first == "create" else (cancel, create)

    committed, second = beside_a_lock(held, lambda: None, act)

    assert committed == "committed", committed
    assert isinstance(second, ActionDenied), second  # the second is refused, once it can tell
    cancelled = Subscription.objects.get(pk=subscription.pk).status == "cancelled"
    assert cancelled == (first == "cancel")
    assert Instance.objects.filter(tenant=tenant).count() == (0 if cancelled else 1)


@pytest.mark.django_db(transaction=True)
def test_a_modify_waiting_for_an_instance_another_request_holds_does_not_deadlock_it(tenant, owner):
    """A request holding the instance's lock (a backup being queued) writes rows naming the
    tenant (its audit event); a modify of the instance locks the tenant first, then waits for the
    instance. Locking the tenant FOR UPDATE blocked that write: a deadlock, one failed."""
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=_hobby_text()).plan
    billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)
    instance = _running(owner, tenant, plan, name="a", storageGi=10)

    held, modify = beside_a_lock(
        lambda: Instance.objects.select_for_update().get(pk=instance.pk),
        lambda: audit_record(
            actor=Actor(user=owner), action="instance.backup", tenant=tenant, target=instance
        ),
        lambda: _act(owner, instance, "modify", storageGi=12),
    )

    assert held == "committed", held
    assert isinstance(modify, Operation), modify


def test_an_unmeasurable_request_is_a_validation_error_not_a_crash(
    local, hobby, subscribed, tenant, owner
):
    with pytest.raises(ValidationError):
        _create(owner, tenant, hobby, instances="x")


def test_a_change_refused_at_its_start_does_not_hide_the_failed_change_before_it(
    local, hobby, subscribed, tenant, owner
):
    """A modify queued behind one that then failed the instance is refused when it would start
    (`runner._start_refusal`): it ends failed, with no parameters, as the newest failed modify.
    The failed change before it may have grown the volume all the same, and still counts."""
    from deployments import runner

    a = _running(owner, tenant, hobby, name="a", storageGi=20)
    grow = _act(owner, a, "modify", storageGi=30)
    behind = _act(owner, a, "modify", cpu=2)
    # The grow ran and failed after the cluster took some of it.
    Operation.objects.filter(pk=grow.pk).update(
        state=Operation.State.FAILED, started_at=timezone.now(), finished_at=timezone.now(),
        parameters={**a.parameters, "storageGi": 30},
    )  # fmt: skip
    grow.refresh_from_db()
    transitions.instance_state_set(a, Instance.State.FAILED, operation=grow, reason="failed")

    runner._step(str(behind.pk))  # refused: the instance is failed

    behind.refresh_from_db()
    assert behind.state == Operation.State.FAILED and behind.error.startswith("Did not start.")
    # Stored 20 GiB, but the failed grow may have made it 30: 30 more is 60, past the 50.
    with pytest.raises(ActionDenied, match="this would make 60 GiB of storage"):
        _create(owner, tenant, hobby, name="b", storageGi=30)
