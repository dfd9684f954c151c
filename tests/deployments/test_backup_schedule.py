"""Backup schedules: when backups fall due, who runs them, and how long snapshots are kept."""

import inspect
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import idempotency
from accounts.audit import SYSTEM, Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from accounts.services import tenant_lock
from deployments import schedules, selectors, services, views
from deployments.models import BackupSchedule, Cell, Instance, Operation, Snapshot
from tests.concurrency import beside_a_lock, race
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS, make_instances, make_operation


@pytest.fixture
def plan(db):
    return services.plan_load(text=SPEC.read_text()).plan


@pytest.fixture
def instance(owner, tenant, plan):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return _running(owner, tenant, plan, "orders")


def _running(owner, tenant, plan, name):
    """An instance as its create leaves it once it succeeded."""
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name, parameters={},
        request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=create.instance_id)


def _due(instance, ago=timedelta(minutes=1)) -> datetime:
    """Make the instance's next slot come `ago` before now; the slot."""
    slot = (timezone.now() - ago).replace(microsecond=0)
    BackupSchedule.objects.filter(instance=instance).update(next_run_at=slot)
    return slot


def _snapshot(instance, *, days_ago: float, scheduled=True, status="completed", expired=False):
    taken = timezone.now() - timedelta(days=days_ago)
    return Snapshot.objects.create(
        tenant=instance.tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-{taken:%Y%m%d%H%M%S}",
        status=status, scheduled=scheduled, created_at=taken,
        expires_at=taken + timedelta(days=1 if expired else 30),
    )  # fmt: skip


def _url(instance, suffix=""):
    return f"/t/{instance.tenant.slug}/deployments/{instance.pk}/{suffix}"


# --- when slots fall ---


def test_an_interval_schedule_falls_due_every_n_hours_and_skips_missed_slots():
    slot = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)

    assert schedules.slot_after(after=slot, interval_hours=6, cron="") == slot.replace(hour=12)
    # Beat was down for a day: the next slot is the first still to come, not a backlog.
    late = datetime(2026, 12, 1, 7, 30, tzinfo=UTC)
    assert schedules.slot_next(slot=slot, now=late, interval_hours=6, cron="") == datetime(
        2026, 12, 1, 12, 0, tzinfo=UTC
    )


def test_a_cron_schedule_falls_due_at_its_next_time():
    now = datetime(2026, 11, 30, 8, 37, 12, tzinfo=UTC)

    assert schedules.slot_after(after=now, interval_hours=None, cron="0 3 * * *") == datetime(
        2026, 12, 1, 3, 0, tzinfo=UTC
    )
    assert schedules.slot_after(after=now, interval_hours=None, cron="*/15 * * * *") == datetime(
        2026, 11, 30, 8, 45, tzinfo=UTC
    )
    exactly = datetime(2026, 11, 30, 8, 45, tzinfo=UTC)  # a slot is never its own successor
    assert schedules.slot_after(after=exactly, interval_hours=None, cron="*/15 * * * *") == (
        exactly + timedelta(minutes=15)
    )


def test_sunday_is_day_7_as_well_as_day_0():
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)  # a Tuesday
    sunday = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)

    schedules.cron_check("0 3 * * 7")
    assert schedules.slot_after(after=now, interval_hours=None, cron="0 3 * * 7") == sunday
    # A range that ends on 7 runs Friday, Saturday and Sunday.
    friday = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
    assert schedules.slot_after(after=now, interval_hours=None, cron="0 3 * * 5-7") == friday
    saturday = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)
    following = schedules.slot_next(
        slot=saturday, now=saturday, interval_hours=None, cron="0 3 * * 5-7"
    )
    assert following == sunday


def test_a_cron_stored_before_it_was_refused_still_falls_due_at_most_hourly():
    slot = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)

    following = schedules.slot_next(slot=slot, now=slot, interval_hours=None, cron="* * * * *")

    assert following == datetime(2026, 12, 1, 4, 0, tzinfo=UTC)  # not 03:01
    daily = schedules.slot_next(slot=slot, now=slot, interval_hours=None, cron="0 3 * * *")
    assert daily == datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "field"),
    [("-1 3 * * *", "minute"), ("0 3 , * *", "day-of-month"), ("0 0 1 13 *", "month"),
     ("0 0 32 * *", "day-of-month"), ("0 0 * * 8", "day-of-week"),
     # Digits that int() would read as 0-9 are not cron's digits.
     ("\u0660 3 * * *", "minute"), ("0 \uff13 * * *", "hour"),
     # Nor what int() takes beside them, nor a name in a field that takes none, or another's.
     ("+5 3 * * *", "minute"), ("0 1_5 * * *", "hour"), ("0 3 * * +1", "day-of-week"),
     ("0 3 mon * *", "day-of-month"), ("sun 3 * * *", "minute"), ("0 3 * mon *", "month"),
     ("0 3 * * jan", "day-of-week"), ("0 3 * * monday", "day-of-week")],
)  # fmt: skip
def test_a_cron_field_out_of_its_range_is_named(cron, field):
    with pytest.raises(ValueError, match=f'The {field} field "'):
        schedules.cron_check(cron)


def test_a_cron_field_that_takes_names_says_which():
    with pytest.raises(ValueError) as refused:
        schedules.cron_check("0 3 * * monday")

    assert 'The day-of-week field "monday" is not valid: use numbers from 0 to 7 or sun to' in (
        str(refused.value)
    )


def test_a_cron_month_and_day_of_the_week_may_be_named():
    after = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)  # a Friday

    weekly = schedules.slot_after(after=after, interval_hours=None, cron="0 3 * * Mon-Wed")
    yearly = schedules.slot_after(after=after, interval_hours=None, cron="0 3 1 JAN *")

    assert weekly == datetime(2026, 12, 7, 3, 0, tzinfo=UTC)  # the Monday after
    assert yearly == datetime(2027, 1, 1, 3, 0, tzinfo=UTC)


def test_a_cron_stored_before_a_rule_refused_it_still_runs_as_it_was_read(instance):
    # "mon" as a month was read as January, and "+3" as 3, when they were saved.
    BackupSchedule.objects.filter(instance=instance).update(
        interval_hours=None, cron="0 +3 1 mon *"
    )
    slot = _due(instance)

    counts = services.backups_run_due()

    assert counts == {"ran": 1, "skipped": 0}
    following = BackupSchedule.objects.get(instance=instance).next_run_at
    assert (following.month, following.day, following.hour) == (1, 1, 3) and following > slot


def test_a_new_instance_gets_the_plans_default_schedule(instance):
    schedule = instance.backup_schedule

    # The spec's backupConfiguration: every 24 hours, kept 30 days.
    assert (schedule.interval_hours, schedule.cron, schedule.retention_days) == (24, "", 30)
    assert schedule.enabled and schedule.retention_count is None
    assert abs(schedule.next_run_at - (timezone.now() + timedelta(hours=24))) < timedelta(minutes=1)


# --- running due backups ---


def test_a_due_slot_queues_a_backup_as_the_system_that_the_role_check_would_refuse(instance):
    with pytest.raises(ActionDenied):  # the path every view takes refuses the system actor
        services.instance_action(actor=SYSTEM, instance=instance, verb="backup", request_id="x")
    slot = _due(instance)

    counts = services.backups_run_due()

    assert counts == {"ran": 1, "skipped": 0}
    backup = Operation.objects.get(instance=instance, verb="backup")
    assert backup.requested_by is None and backup.state == Operation.State.QUEUED
    snapshot = Snapshot.objects.get(operation=backup)
    assert snapshot.scheduled and snapshot.status == Snapshot.Status.PENDING
    assert abs(snapshot.expires_at - (snapshot.created_at + timedelta(days=30))) < timedelta(
        seconds=1
    )
    schedule = BackupSchedule.objects.get(instance=instance)
    assert schedule.last_outcome == "ran" and schedule.last_operation == backup
    assert schedule.last_slot_at == slot and schedule.next_run_at == slot + timedelta(hours=24)
    event = AuditEvent.objects.get(action="instance.backup", result="ok")
    assert event.actor_kind == "system" and event.payload == {"scheduled": slot.isoformat()}
    # The same slot again: nothing more.
    assert services.backups_run_due() == {"ran": 0, "skipped": 0}


def test_no_view_reaches_the_system_backup_path():
    source = inspect.getsource(views)

    assert "backups_run_due" not in source and "_backup_queue_scheduled" not in source


def test_a_stopped_instance_skips_its_slot_and_says_why(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)
    slot = _due(instance, ago=timedelta(hours=50))

    assert services.backups_run_due() == {"ran": 0, "skipped": 1}

    assert not Operation.objects.filter(verb="backup").exists()
    assert not Snapshot.objects.exists()
    schedule = BackupSchedule.objects.get(instance=instance)
    assert schedule.last_outcome == "skipped"
    assert schedule.last_reason == "The instance is stopped; backup needs it to be running."
    # The next slot is the first still to come (missed ones are not made up).
    assert schedule.next_run_at == slot + timedelta(hours=72) > timezone.now()
    denied = AuditEvent.objects.get(action="instance.backup", result="denied")
    assert denied.actor_kind == "system"
    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    assert "Skipped" in page and "backup needs it to be running" in page


def test_an_instance_made_before_schedules_shows_and_then_gets_the_plans_default(
    owner_client, instance
):
    BackupSchedule.objects.filter(instance=instance).delete()

    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    assert "Backups run every 24 hours" in page
    assert not BackupSchedule.objects.exists()  # reading the page writes nothing

    assert services.backups_run_due() == {"ran": 0, "skipped": 0}  # its first slot is to come
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.interval_hours, schedule.retention_days, schedule.enabled) == (24, 30, True)


def test_a_disabled_schedule_runs_nothing(instance):
    BackupSchedule.objects.filter(instance=instance).update(enabled=False)
    _due(instance)

    assert services.backups_run_due() == {"ran": 0, "skipped": 0}
    assert not Operation.objects.filter(verb="backup").exists()


@pytest.fixture
def raced_instance(transactional_db, owner, tenant):
    plan = services.plan_load(text=SPEC.read_text()).plan
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return _running(owner, tenant, plan, "orders")


def _running(owner, tenant, plan, name):
    """An instance as its create leaves it once it succeeded."""
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name, parameters={},
        request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=create.instance_id)


def test_a_slot_runs_once_when_beat_runs_twice_at_the_same_time(raced_instance):
    _due(raced_instance)
    now = timezone.now()

    results = race(lambda: services.backups_run_due(now=now), times=4)

    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(r["ran"] for r in results) == 1
    assert Operation.objects.filter(instance=raced_instance, verb="backup").count() == 1
    assert Snapshot.objects.filter(instance=raced_instance).count() == 1


def test_a_slot_coming_while_an_upgrade_is_queued_is_skipped_and_says_why(owner, instance):
    newer = SPEC.read_text().replace("description: Major version.", "description: Major.", 1)
    services.plan_load(text=newer)
    services.instance_upgrade(actor=Actor(user=owner), instance=instance, request_id="u-1")
    _due(instance)

    counts = services.backups_run_due()

    # Queued behind the upgrade, it would back up with the version the instance is leaving.
    assert counts == {"ran": 0, "skipped": 1}
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.last_outcome, schedule.last_reason) == ("skipped", services.UPGRADING)
    assert not Operation.objects.filter(instance=instance, verb="backup").exists()


def test_a_slot_coming_while_someone_saves_the_schedule_waits_and_both_are_done(
    owner, raced_instance
):
    _due(raced_instance)
    now = timezone.now()

    def lock():  # as a save does: the organization, then the instance
        tenant_lock(raced_instance.tenant_id)
        Instance.objects.select_for_update().get(pk=raced_instance.pk)

    def save():  # a change of retention only, which keeps the slot
        _update(Actor(user=owner), raced_instance, interval_hours=24, retention_days=9)

    saved, due = beside_a_lock(lock, save, lambda: services.backups_run_due(now=now))

    assert saved == "committed", saved
    assert isinstance(due, dict) and due["ran"] == 1, due
    assert BackupSchedule.objects.get(instance=raced_instance).retention_days == 9
    assert Operation.objects.filter(instance=raced_instance, verb="backup").count() == 1


# --- pruning ---


def test_pruning_by_days_forgets_expired_snapshots_but_never_the_newest_completed(instance):
    old = _snapshot(instance, days_ago=40, expired=True)
    manual = _snapshot(instance, days_ago=35, scheduled=False, expired=True)
    newest = _snapshot(instance, days_ago=33, expired=True)  # expired too, but the newest
    _snapshot(instance, days_ago=1, status="failed")  # newer, but not a backup to restore

    assert services.snapshots_prune() == 2

    forgets = Operation.objects.filter(instance=instance, verb="deleteBackup")
    assert sorted(op.arguments["forget_snapshot"] for op in forgets) == sorted([old.pk, manual.pk])
    assert all(op.requested_by is None for op in forgets)
    audited = AuditEvent.objects.filter(action="backup.delete", actor_kind="system")
    assert sorted(e.payload["reason"] for e in audited) == ["expired", "expired"]
    assert newest.pk not in [op.arguments["forget_snapshot"] for op in forgets]
    assert services.snapshots_prune() == 0  # their deleteBackup is already queued


def test_a_deleted_organizations_newest_backup_goes_once_its_retention_ends(instance, owner):
    """Kept as the newest whatever its age, a deleted organization's last backup stayed for
    ever: no one could restore it, nor delete it (the organization's pages are closed)."""
    from accounts import services as account_services
    from billing import services as billing_services
    from billing.models import Subscription

    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)
    newest = _snapshot(instance, days_ago=40, expired=True)
    assert services.snapshots_prune() == 0  # kept, while the organization lives
    for subscription in Subscription.objects.filter(tenant=instance.tenant):
        billing_services.subscription_cancel(actor=Actor(user=owner), subscription=subscription)
    account_services.tenant_delete(
        actor=Actor(user=owner), tenant=instance.tenant, confirm_name=instance.tenant.name
    )

    assert services.snapshots_prune() == 1

    newest.refresh_from_db()
    assert newest.status == Snapshot.Status.DELETED
    assert (
        AuditEvent.objects.get(action="backup.delete", target_id=str(newest.pk)).payload["reason"]
        == "expired"
    )


def test_pruning_by_count_keeps_unscheduled_and_the_newest_scheduled(instance):
    BackupSchedule.objects.filter(instance=instance).update(retention_count=2)
    scheduled = [_snapshot(instance, days_ago=d) for d in (5, 4, 3, 2)]
    manual = _snapshot(instance, days_ago=6, scheduled=False)
    _snapshot(instance, days_ago=0.1, status="pending")

    assert services.snapshots_prune() == 2

    forgotten = set(
        Operation.objects.filter(verb="deleteBackup").values_list(
            "arguments__forget_snapshot", flat=True
        )
    )
    assert forgotten == {scheduled[0].pk, scheduled[1].pk}
    assert manual.pk not in forgotten


def test_a_count_of_one_never_forgets_the_newest_completed_snapshot(instance):
    BackupSchedule.objects.filter(instance=instance).update(retention_count=1)
    older = _snapshot(instance, days_ago=2)
    newest = _snapshot(instance, days_ago=1)

    services.snapshots_prune()

    forgotten = [
        op.arguments["forget_snapshot"] for op in Operation.objects.filter(verb="deleteBackup")
    ]
    assert forgotten == [older.pk] and newest.pk not in forgotten


def _kept_by_count_with_a_prune_queued(instance, count: int, name: str) -> None:
    """`count` more running instances like `instance`, each keeping 2 scheduled snapshots
    by count (and holding 2) and an expired one whose deleteBackup is queued already."""
    made = make_instances(instance.tenant, instance.plan_version, instance.cell, count, name=name)
    for other in made:
        BackupSchedule.objects.create(
            instance=other,
            interval_hours=24,
            retention_days=30,
            retention_count=2,
            next_run_at=timezone.now(),
        )
        pruned = _snapshot(other, days_ago=40, expired=True)
        _snapshot(other, days_ago=2)
        _snapshot(other, days_ago=1)
        operation = make_operation(other, verb="deleteBackup", state="queued")
        Operation.objects.filter(pk=operation.pk).update(request_id=f"prune-{pruned.pk}")


def test_a_pruning_round_reads_the_fleet_in_as_many_queries_however_many_instances(
    instance, django_assert_num_queries
):
    _kept_by_count_with_a_prune_queued(instance, 3, "few")
    with CaptureQueriesContext(connection) as few:
        assert services.snapshots_prune() == 0  # nothing beyond its count, nothing new to prune
    _kept_by_count_with_a_prune_queued(instance, 12, "many")

    with django_assert_num_queries(len(few.captured_queries)):
        assert services.snapshots_prune() == 0


def test_backups_that_failed_or_were_cancelled_leave_the_list_once_expired(instance):
    expired = [
        _snapshot(instance, days_ago=40 - n, status=status, expired=True)
        for n, status in enumerate(["failed", "cancelled", "failed"])
    ]
    recent = _snapshot(instance, days_ago=1, status="failed")

    assert services.snapshots_prune() == 3

    statuses = dict(Snapshot.objects.values_list("pk", "status"))
    assert [statuses[s.pk] for s in expired] == [Snapshot.Status.DELETED] * 3
    assert statuses[recent.pk] == Snapshot.Status.FAILED  # still within its retention
    assert not Operation.objects.filter(verb="deleteBackup").exists()  # nothing to delete
    page = selectors.snapshots_listed(instance)
    assert list(page.values_list("pk", flat=True)) == [recent.pk]


def test_expired_snapshots_of_a_deleted_instance_are_marked_deleted(instance):
    old = _snapshot(instance, days_ago=40, expired=True)
    newest = _snapshot(instance, days_ago=35, expired=True)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)

    assert services.snapshots_prune() == 1

    old.refresh_from_db()
    newest.refresh_from_db()
    assert old.status == Snapshot.Status.DELETED and newest.status == Snapshot.Status.COMPLETED
    assert not Operation.objects.filter(verb="deleteBackup").exists()


# --- changing the schedule ---


def _update(actor, instance, **changes):
    values = dict(interval_hours=12, cron="", retention_days=7, retention_count=None, enabled=True)
    values.update(changes)
    return services.backup_schedule_update(actor=actor, instance=instance, **values)


def test_a_schedule_change_is_audited(owner, instance):
    schedule = _update(Actor(user=owner), instance, interval_hours=None, cron="0 3 * * *")

    assert schedule.cron == "0 3 * * *" and schedule.interval_hours is None
    assert schedule.next_run_at.hour == 3 and schedule.next_run_at > timezone.now()
    event = AuditEvent.objects.get(action="backup.schedule", result="ok")
    assert event.actor == owner and event.payload["cron"] == "0 3 * * *"


def test_a_longer_retention_is_queued_to_the_cluster_and_backups_keep_their_expiry_till_then(
    owner, instance
):
    snapshot = _snapshot(instance, days_ago=2)
    request_id = uuid.uuid4().hex

    for _ in range(2):  # a repeated submit queues nothing more
        _update(Actor(user=owner), instance, retention_days=60, request_id=request_id)

    applied = Operation.objects.get(instance=instance, verb="applyBackupRetention")
    assert applied.state == Operation.State.QUEUED
    # The object store prunes by 30 days until that has run.
    snapshot.refresh_from_db()
    assert snapshot.expires_at == snapshot.created_at + timedelta(days=30)


def test_a_retention_changed_again_before_it_reached_the_cluster_is_applied_once(owner, instance):
    snapshot = _snapshot(instance, days_ago=2)

    _update(Actor(user=owner), instance, retention_days=60)
    _update(Actor(user=owner), instance, retention_days=7)

    # One run, which reads the schedule when it starts; until it has, the cluster keeps 30.
    assert Operation.objects.filter(instance=instance, verb="applyBackupRetention").count() == 1
    snapshot.refresh_from_db()
    assert snapshot.expires_at == snapshot.created_at + timedelta(days=30)


def test_the_retention_is_applied_only_from_the_schedule(owner, instance):
    with pytest.raises(ValidationError, match="schedule"):
        services.instance_action(
            actor=Actor(user=owner), instance=instance, verb="applyBackupRetention",
            request_id=uuid.uuid4().hex,
        )  # fmt: skip


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"interval_hours": None, "cron": "0 3 * *"}, "cron"),
        ({"interval_hours": None, "cron": "0 25 * * *"}, "cron"),
        ({"interval_hours": None, "cron": "every day"}, "cron"),
        ({"interval_hours": -1}, "interval_hours"),
        ({"interval_hours": 0}, "interval_hours"),
        ({"retention_days": -5}, "retention_days"),
        ({"retention_days": "ten"}, "retention_days"),
        ({"retention_count": 0}, "retention_count"),
    ],
)
def test_a_bad_schedule_is_a_field_error_and_changes_nothing(owner, instance, changes, field):
    with pytest.raises(ValidationError) as refused:
        _update(Actor(user=owner), instance, **changes)

    assert list(refused.value.message_dict) == [field]
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.interval_hours, schedule.cron, schedule.retention_days) == (24, "", 30)


def test_the_backups_tab_shows_the_schedule_and_saves_it(owner_client, instance):
    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    assert "Schedule" in page and "Backups run every 24 hours" in page

    saved = owner_client.post(
        _url(instance, "backups/schedule/"),
        {"timing": "cron", "cron": "30 2 * * 1", "interval_hours": "24",
         "retention_days": "14", "retention_count": "5", "enabled": "on"},
    )  # fmt: skip

    assert saved.status_code == 302
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.cron, schedule.interval_hours) == ("30 2 * * 1", None)
    assert (schedule.retention_days, schedule.retention_count) == (14, 5)
    page = owner_client.get(saved.url).content.decode()
    assert "<code>30 2 * * 1</code>" in page and "the 5 newest scheduled ones" in page


@pytest.mark.parametrize(
    "field,typed",
    [("interval_hours", "1_2"), ("interval_hours", "١٢"), ("interval_hours", "\uff11\uff12"),
     ("interval_hours", "+12"), ("retention_days", "1_4"), ("retention_count", "1_0")],
)  # fmt: skip
def test_a_schedule_number_in_anything_but_plain_digits_is_refused(
    owner_client, instance, field, typed
):
    form = {"timing": "interval", "interval_hours": "24", "retention_days": "30", "enabled": "on"}

    refused = owner_client.post(_url(instance, "backups/schedule/"), {**form, field: typed})

    assert refused.status_code == 400
    assert "whole number" in refused.content.decode()
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.interval_hours, schedule.retention_days, schedule.retention_count) == (
        24, 30, None,
    )  # fmt: skip


def _seen(page: str) -> str:
    """The schedule as the page's form showed it (its hidden `seen` field)."""
    return re.search(r'name="seen" value="([^"]*)"', page).group(1)


def _kept_7_days_behind_bobs_tab(owner_client, instance) -> tuple[dict, str]:
    """Bob opens the Backups tab; Alice then keeps backups 7 days rather than 30. The form as
    it was, and Bob's tab."""
    form = {"timing": "interval", "interval_hours": "24", "retention_days": "30", "enabled": "on"}
    bobs_tab = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    alices = owner_client.post(
        _url(instance, "backups/schedule/"),
        {**form, "retention_days": "7", "seen": _seen(bobs_tab)},
    )
    assert alices.status_code == 302
    return form, bobs_tab


def test_a_schedule_saved_from_a_page_opened_before_a_teammates_change_keeps_theirs(
    owner_client, instance
):
    form, bobs_tab = _kept_7_days_behind_bobs_tab(owner_client, instance)

    # Bob changes only the hours, from his tab that still shows 30 days.
    refused = owner_client.post(
        _url(instance, "backups/schedule/"),
        {**form, "interval_hours": "12", "seen": _seen(bobs_tab)},
    )

    assert refused.status_code == 400
    page = refused.content.decode()
    assert "Someone changed this schedule after you opened the page" in page
    assert "Nothing was done:" in page and "Please correct" not in page  # nothing to correct
    assert "Backups are kept 7 days" in page  # theirs, as it stands
    # The form holds his change over theirs, to save again.
    assert re.search(r'name="interval_hours"[^>]*\s+value="12"', page)
    assert re.search(r'name="retention_days"[^>]*\s+value="7"', page)
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.interval_hours, schedule.retention_days) == (24, 7)
    again = owner_client.post(
        _url(instance, "backups/schedule/"),
        {**form, "interval_hours": "12", "retention_days": "7", "seen": _seen(page)},
    )
    assert again.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.interval_hours, schedule.retention_days) == (12, 7)


def test_a_stale_schedule_with_a_mistake_is_told_of_the_teammates_change_before_the_mistake(
    owner_client, instance
):
    form, bobs_tab = _kept_7_days_behind_bobs_tab(owner_client, instance)

    # Bob, from his tab that still shows 30 days, types a cron with a mistake.
    mistaken = {**form, "timing": "cron", "cron": "0 25 * * *", "seen": _seen(bobs_tab)}
    refused = owner_client.post(_url(instance, "backups/schedule/"), mistaken)

    page = refused.content.decode()
    assert "Someone changed this schedule after you opened the page" in page
    assert re.search(r'name="retention_days"[^>]*\s+value="7"', page)  # theirs, in his form
    # Sent again from that form, his cron is refused for its hour alone ...
    corrected = {**mistaken, "retention_days": "7", "seen": _seen(page)}
    field_error = owner_client.post(_url(instance, "backups/schedule/"), corrected)
    page = field_error.content.decode()
    assert "Someone changed" not in page and "schedule-cron-error" in page
    # ... and once he corrects it, saving keeps Alice's change beside his.
    saved = owner_client.post(
        _url(instance, "backups/schedule/"), {**corrected, "cron": "0 3 * * *", "seen": _seen(page)}
    )
    assert saved.status_code == 302
    schedule = BackupSchedule.objects.get(instance=instance)
    assert (schedule.cron, schedule.retention_days) == ("0 3 * * *", 7)


@pytest.mark.parametrize("seen", ["", "x", "1|2|3", "24||30||2", "24|0 3|||||1"])
def test_a_forged_seen_schedule_is_told_as_changed_and_saves_nothing(owner_client, instance, seen):
    refused = owner_client.post(
        _url(instance, "backups/schedule/"),
        {"timing": "interval", "interval_hours": "6", "retention_days": "30", "enabled": "on",
         "seen": seen},
    )  # fmt: skip

    assert refused.status_code == 400
    assert "Someone changed this schedule after you opened the page" in refused.content.decode()
    assert BackupSchedule.objects.get(instance=instance).interval_hours == 24


def test_a_backup_run_moving_the_next_slot_is_no_change_to_the_schedule(owner_client, instance):
    tab = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    _due(instance)
    services.backups_run_due()

    saved = owner_client.post(
        _url(instance, "backups/schedule/"),
        {"timing": "interval", "interval_hours": "6", "retention_days": "30", "enabled": "on",
         "seen": _seen(tab)},
    )  # fmt: skip

    assert saved.status_code == 302
    assert BackupSchedule.objects.get(instance=instance).interval_hours == 6


def test_two_schedule_saves_from_one_page_at_once_keep_one_and_tell_the_other(
    owner, raced_instance
):
    seen = BackupSchedule.objects.get(instance=raced_instance).settings_token
    days = iter([5, 9])

    def save():
        return _update(Actor(user=owner), raced_instance, retention_days=next(days), seen=seen)

    results = race(save, times=2)

    saved = [r for r in results if isinstance(r, BackupSchedule)]
    told = [r for r in results if isinstance(r, ValidationError)]
    assert len(saved) == len(told) == 1, results
    assert told[0].messages == [services.SCHEDULE_CHANGED]
    stored = BackupSchedule.objects.get(instance=raced_instance)
    assert stored.retention_days == saved[0].retention_days


def test_a_deleted_instances_backups_tab_promises_no_more_backups(owner_client, instance):
    instance.state = Instance.State.DELETED
    instance.save(update_fields=["state"])

    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    assert f"Scheduled backups ended when {instance.name} was deleted" in page
    assert "Backups run every" not in page and "Change the schedule" not in page
    # With none left, it speaks of none: no backups "above", nor "yet".
    instance.snapshots.update(status="deleted")
    none_left = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    assert f"{instance.name} has no backups left." in none_left
    # What the page says, not its tags: a token in an attribute may spell "yet".
    said = re.sub(r"<[^>]+>", " ", none_left)
    assert "the backups above" not in said and not re.search(r"\byet\b", said)


def test_a_bad_cron_in_the_form_is_shown_beside_the_field(owner_client, instance):
    response = owner_client.post(
        _url(instance, "backups/schedule/"),
        {"timing": "cron", "cron": "61 * * * *", "retention_days": "7", "enabled": "on"},
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="schedule-cron-error"' in html
    assert "The minute field &quot;61&quot; is not valid: use numbers from 0 to 59" in html
    assert 'value="61 * * * *"' in html  # what was typed is kept
    assert BackupSchedule.objects.get(instance=instance).cron == ""


@pytest.mark.parametrize(
    ("cron", "said"),
    [
        ("* * * * *", "At most one backup an hour"),
        ("0,30 3 * * *", "At most one backup an hour"),
        ("0 3 30 2 *", "This expression never falls due"),
        ("0 0 1 1 0", "Give a day of the month or a day of the week, not both"),
        ("", "Give a cron expression."),  # not "Give a whole number of hours"
    ],
)
def test_a_cron_schedule_runs_at_most_hourly_and_says_what_is_wrong_beside_it(
    owner_client, instance, cron, said
):
    response = owner_client.post(
        _url(instance, "backups/schedule/"),
        {"timing": "cron", "cron": cron, "retention_days": "7", "enabled": "on"},
    )

    assert response.status_code == 400
    html = response.content.decode()
    error = html[html.index('id="schedule-cron-error"') :][:400]
    assert said in error
    assert 'id="schedule-interval_hours-error"' not in html
    assert BackupSchedule.objects.get(instance=instance).cron == ""


@pytest.mark.parametrize("timing", ["bogus", ""])
def test_a_schedule_sent_without_a_timing_the_form_offers_is_refused(
    owner_client, instance, timing
):
    response = owner_client.post(
        _url(instance, "backups/schedule/"),
        {"timing": timing, "interval_hours": "2", "retention_days": "7", "enabled": "on"},
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert (
        '<a href="#schedule-timing">Choose when backups run: every few hours, or at the times of '
        "a cron expression.</a>"
    ) in html
    assert 'id="schedule-timing"' in html
    assert BackupSchedule.objects.get(instance=instance).interval_hours == 24


def test_a_deleted_instances_schedule_cannot_be_changed(owner, instance):
    instance.state = Instance.State.DELETED
    instance.save(update_fields=["state"])

    with pytest.raises(ActionDenied, match="The instance is deleted: it takes no more backups"):
        _update(Actor(user=owner), instance, interval_hours=1)

    assert BackupSchedule.objects.get(instance=instance).interval_hours == 24


def test_a_viewer_cannot_change_the_schedule_and_the_refusal_is_audited(
    client, instance, add_member
):
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)
    page = client.get(_url(instance), {"tab": "backups"}).content.decode()
    assert "Schedule" in page and "Save schedule" not in page

    forged = client.post(
        _url(instance, "backups/schedule/"),
        {"timing": "bogus", "interval_hours": "1", "retention_days": "1", "enabled": "on"},
    )  # refused for the role, before anything the form holds

    assert forged.status_code == 403
    assert BackupSchedule.objects.get(instance=instance).interval_hours == 24
    denied = AuditEvent.objects.get(action="backup.schedule", result="denied")
    assert denied.actor == viewer and denied.target_id == instance.pk
    assert denied.payload["reason"] == (
        "Your role (Viewer) does not allow taking backups or changing their schedule."
    )


def test_a_retention_whose_apply_was_cancelled_is_applied_when_saved_again(client, owner, instance):
    def apply_queued():
        return Operation.objects.filter(
            instance=instance, verb="applyBackupRetention", state=Operation.State.QUEUED
        ).first()

    _update(Actor(user=owner), instance, retention_days=60)
    services.operation_cancel(
        actor=Actor(user=owner), operation=apply_queued(), request_id=uuid.uuid4().hex
    )
    assert apply_queued() is None  # the cluster still keeps backups 30 days
    client.force_login(owner)
    page = client.get(f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=backups")
    assert "The object store still keeps them 30 days" in page.content.decode()

    _update(Actor(user=owner), instance, retention_days=60)
    page = client.get(f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=backups")
    assert "still keeps them" not in page.content.decode()  # on its way

    assert apply_queued() is not None
    services.operation_cancel(
        actor=Actor(user=owner), operation=apply_queued(), request_id=uuid.uuid4().hex
    )
    # Back to what the cluster holds: nothing to apply.
    _update(Actor(user=owner), instance, retention_days=30)
    assert apply_queued() is None


@pytest.mark.parametrize("verb", ["backup", "restart"])
def test_a_request_sent_with_the_id_of_a_coming_slot_is_refused_and_the_slot_runs(
    owner_client, instance, verb
):
    """The next slot shows on the Backups tab, and its backup's request id was made from it
    (`schedule-<slot>`): a backup or an action sent with that id in the form's hidden field
    took the operation's place (an instance holds one per request id), so beat's insert failed
    and its task died there every minute, every other organization's slot behind it. Such an
    id is now refused, and the slot runs."""
    slot = _due(instance)
    sent = owner_client.post(
        _url(instance, f"actions/{verb}/"),
        {"request_id": f"schedule-{slot:%Y%m%dT%H%M%SZ}"},
        follow=True,
    )

    assert idempotency.RESERVED in sent.content.decode()
    assert not Operation.objects.filter(instance=instance, verb=verb).exists()
    assert services.backups_run_due()["ran"] == 1
    assert Operation.objects.filter(instance=instance, verb="backup").exists()


def test_a_backup_sent_with_the_id_of_a_snapshots_pruning_is_refused_and_it_is_pruned(
    owner_client, instance
):
    """A backup sent with the request id pruning gives a snapshot's deletion (`prune-<id>`,
    the snapshot's id being in its Restore and Delete links) made pruning take the deletion as
    queued already: the expired backup was kept for ever."""
    old = _snapshot(instance, days_ago=40, expired=True)
    _snapshot(instance, days_ago=1)
    owner_client.post(_url(instance, "actions/backup/"), {"request_id": f"prune-{old.pk}"})

    services.snapshots_prune()

    assert not Operation.objects.filter(instance=instance, verb="backup").exists()
    assert Operation.objects.filter(
        instance=instance, verb="deleteBackup", arguments__forget_snapshot=old.pk
    ).exists()


def test_a_slot_whose_operation_cannot_be_made_leaves_the_others_to_run(
    owner, tenant, plan, instance
):
    """An operation holding a slot's request id already (sent by a customer before such ids
    were refused) failed beat's whole round, every minute: that slot is now left, logged, and
    the slots after it run."""
    other = _running(owner, tenant, plan, "billing")
    slot = _due(instance, ago=timedelta(minutes=2))
    _due(other, ago=timedelta(minutes=1))
    taken = make_operation(instance, verb="restart", state="succeeded")
    Operation.objects.filter(pk=taken.pk).update(request_id=f"schedule-{slot:%Y%m%dT%H%M%SZ}")

    services.backups_run_due()

    assert Operation.objects.filter(instance=other, verb="backup").exists()
    # That slot is skipped, saying why: left due, it failed every minute, and the instance
    # was never backed up again.
    schedule = BackupSchedule.objects.get(instance=instance)
    assert schedule.next_run_at > slot
    assert (schedule.last_outcome, schedule.last_reason) == ("skipped", services.SLOT_FAULT)
    services.backups_run_due(now=schedule.next_run_at)
    assert Operation.objects.filter(instance=instance, verb="backup").exists()


def test_a_snapshot_that_cannot_be_pruned_leaves_the_others_to_be(owner, tenant, plan, instance):
    """One expired snapshot of an instance whose plan version no longer loads failed beat's
    whole round, every time: every other organization's expired backups were kept, and paid
    for, for ever."""
    import hashlib

    from deployments.models import PlanVersion

    other = _running(owner, tenant, plan, "billing")
    text = "spec: [unclosed\n"
    broken = PlanVersion.objects.create(
        plan=instance.plan_version.plan, number=99, spec_text=text, parsed={},
        digest=hashlib.sha256(text.encode()).hexdigest(),
    )  # fmt: skip
    _snapshot(instance, days_ago=35, expired=True)
    _snapshot(instance, days_ago=1)
    Instance.objects.filter(pk=instance.pk).update(plan_version=broken)
    old = _snapshot(other, days_ago=40, expired=True)
    _snapshot(other, days_ago=1)

    services.snapshots_prune()

    assert Operation.objects.filter(
        instance=other, verb="deleteBackup", arguments__forget_snapshot=old.pk
    ).exists()


def test_a_slot_coming_while_a_backup_is_queued_is_skipped_and_says_why(owner, instance):
    """ "Back up now" is refused while a backup is queued or running; a slot coming then queued
    a second one, run right after the first, holding the same data (and billed as storage)."""
    asked = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="backup", request_id=uuid.uuid4().hex
    )
    _due(instance)

    assert services.backups_run_due()["skipped"] == 1

    assert list(Operation.objects.filter(instance=instance, verb="backup")) == [asked]
    schedule = BackupSchedule.objects.get(instance=instance)
    assert schedule.last_reason == services.SLOT_BACKUP_PENDING
