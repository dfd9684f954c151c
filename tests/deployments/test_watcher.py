"""Operations woken by watches (`watch_cells`): with polling slowed to a minute, an operation
still finishes in seconds, because the cell watcher sees the operator's status change and wakes
it (listing again when a compaction answers its watch 410 Gone); one watcher per cell, by a
lease that a second process takes over once it expires, and that fences every write of the one
that lost it."""

import json
import threading
import time
import uuid
from datetime import timedelta

import pytest
import yaml
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from accounts.audit import Actor
from bench.support import row_updates
from deployments import runner, services
from deployments import watcher as watcher_module
from deployments.models import Cell, CellWatchLease, Instance, Operation
from deployments.status import StatusRule
from deployments.watcher import (
    LEASE_TTL,
    CellWatcher,
    Kind,
    KindWatch,
    Lease,
    event_handle,
    lease_renew,
    lease_take,
    operations_wake,
)
from deployments.workflow import engine
from sandbox.core import Ctx
from tests.concurrency import race
from tests.deployments.conftest import SPEC, wait_done, wait_for
from tests.deployments.factories import BACKUPS, make_instances

SLOW_POLL = 60.0  # seconds: no operation below gets a second look from polling alone
CLUSTER_KIND = ("postgresql.cnpg.io/v1", "Cluster")
BY_PHASE = StatusRule(CLUSTER_KIND[0], "Cluster", {"phase": "status.phase"})  # the status rule


def watcher_started(*cells: Cell) -> tuple[CellWatcher, threading.Thread]:
    """`watch_cells` as it runs, in a thread of this process (its watches too), once it holds
    `cells`."""
    watcher = CellWatcher(holder=f"test-{uuid.uuid4().hex[:8]}", stopping=threading.Event())
    thread = threading.Thread(target=watcher.run, name="test-watch-cells", daemon=True)
    thread.start()
    wait_for(lambda: all(watcher.holds(c.pk) for c in cells), timeout=10, what="the cells taken")
    return watcher, thread


@pytest.fixture
def cell_watcher(cell, settings):
    settings.OPSDECK_WATCH_TIMEOUT = 2  # a stopping watch returns within this
    watcher, thread = watcher_started(cell)
    yield watcher
    watcher.stopping.set()
    thread.join(30)


@pytest.fixture
def quiet_cluster(sandbox_cluster, settings, monkeypatch):
    """Watches as a real cluster serves them when nothing changes: the server ends one after a
    minute, and sends a bookmark about as often."""
    settings.OPSDECK_WATCH_TIMEOUT = 60
    monkeypatch.setattr(sandbox_cluster.core, "bookmark_seconds", 60.0)


def streaming(cell: Cell, kind: tuple[str, str] = ("postgresql.cnpg.io/v1", "Cluster")) -> bool:
    """Whether the cell's watcher says its watch of `kind` streams (`CellWatchLease.watching`)."""
    lease = CellWatchLease.objects.filter(cell=cell, expires_at__gt=timezone.now()).first()
    return lease is not None and "/".join(kind) in lease.watching


def test_an_operation_moves_on_the_operators_change_not_on_a_poll(
    worker, cell, plan, tenant, owner, settings, cell_watcher
):
    settings.OPSDECK_POLL_FIRST = settings.OPSDECK_POLL_MAX = SLOW_POLL

    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="w-1",
    )  # fmt: skip

    # Well before the first poll would look again.
    assert wait_done(create, timeout=SLOW_POLL / 2).state == Operation.State.SUCCEEDED, create.error
    instance = Instance.objects.get(pk=create.instance_id)
    assert instance.state == Instance.State.RUNNING

    # The status the portal shows comes from the watch (nothing polls it), which may write the
    # last change a moment after the engine read it for itself.
    def observed():
        return Instance.objects.get(pk=create.instance_id).observed

    wait_for(lambda: observed().get("ready") == 2, timeout=10, what="the watched status")
    assert observed().get("total") == 2


def test_a_cell_given_another_kubeconfig_is_watched_there_and_wakes_its_operations(
    worker, cell, plan, tenant, owner, settings, cell_watcher
):
    from sandbox.api import Sandbox

    settings.OPSDECK_POLL_FIRST = settings.OPSDECK_POLL_MAX = SLOW_POLL
    with Sandbox(speed=200) as moved:
        # `add_cell` again with the cluster's new address (or rotated credentials).
        services.cell_register(name=cell.name, kubeconfig=yaml.safe_dump(moved.kubeconfig()))
        create = services.instance_create(
            actor=Actor(user=owner), tenant=tenant, plan=plan, name="moved",
            parameters={}, request_id="w-moved",
        )  # fmt: skip

        # Woken by the watches of the new cluster, well before a poll would look again.
        done = wait_done(create, timeout=SLOW_POLL / 2)
        assert done.state == Operation.State.SUCCEEDED, done.error


def test_the_watcher_streams_the_kinds_templates_wait_on_not_those_they_only_write(plan):
    # The plan writes Secrets but never waits on one: their events could move no run on.
    kinds = CellWatcher(holder="kinds").kinds()

    assert ("postgresql.cnpg.io/v1", "Cluster") in kinds
    assert ("v1", "Pod") in kinds
    assert ("v1", "Secret") not in kinds


def running_operation(cell, tenant, owner) -> Operation:
    """A running operation in the cell waiting on its instance's Cluster (any change of it,
    its conditions not rendered yet), its next look a minute away."""
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex, cell=cell,
    )  # fmt: skip
    later = timezone.now() + timedelta(seconds=SLOW_POLL)
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.RUNNING, next_step_at=later)
    operation = Operation.objects.select_related("instance").get(pk=create.pk)
    _waits_on_cluster(operation, None)
    operation.refresh_from_db(fields=["waiting_on"])
    return operation


@pytest.fixture
def waiting(db, tenant, owner):
    """A running operation whose next look is a minute away."""
    cell = Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    return running_operation(cell, tenant, owner)


@pytest.fixture
def waiting_in_sandbox(cell, tenant, owner, kube):
    """`waiting`, in the sandbox's cell, its instance's namespace made there."""
    operation = running_operation(cell, tenant, owner)
    namespace = operation.instance.namespace
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    return operation


def test_a_watch_whose_version_was_compacted_lists_again_and_still_wakes_the_operation(
    waiting_in_sandbox, faults, sandbox_cluster, cell_watcher
):
    waiting, cell_id = waiting_in_sandbox, waiting_in_sandbox.instance.cell_id
    namespace = waiting.instance.namespace
    faults(frozen=["cnpg"])  # the status below is the test's, not the operator's

    def listed():  # the watch of the status object's kind has listed, and watches from there
        watch = cell_watcher.cells[cell_id][2].get(("postgresql.cnpg.io/v1", "Cluster"))
        return watch is not None and watch.resource_version is not None

    wait_for(listed, timeout=10, what="the status object's kind to be listed")
    core, ctx = sandbox_cluster.core, Ctx(field_manager="test")
    clusters = core.resolve("postgresql.cnpg.io", "v1", "clusters")
    body = {
        "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "metadata": {"name": namespace},
        "spec": {"instances": 2, "storage": {"size": "1Gi"}},
    }  # fmt: skip

    # In one hold of the sandbox's lock: no watch reads the change before the compaction
    # forgets it, so the watcher learns of it only by listing again after its 410.
    with core.lock:
        made = core.create(clusters, namespace, body, ctx)
        made["status"] = {"phase": "Cluster in healthy state", "instances": 2, "readyInstances": 2}
        core.update(clusters, namespace, namespace, made, ctx, "status")
        sandbox_cluster.compact()

    def observed():
        return Instance.objects.get(pk=waiting.instance_id).observed

    wait_for(lambda: observed().get("ready") == 2, timeout=15, what="the observed status")
    assert observed() == {
        "phase": "Cluster in healthy state", "ready": 2, "total": 2,
        "healthy": True, "healthReason": "",
    }  # fmt: skip
    # Woken, a minute before its poll (the wake-up is the statement after the status's).
    wait_for(lambda: _due(waiting), timeout=15, what="the wake-up")


def database_restarted() -> None:
    """A database restart, as far as the watcher can tell: every connection but this test's is
    cut."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchall()  # the watcher's connections among them


def test_a_watch_whose_database_connection_was_cut_reconnects_and_still_wakes_the_operation(
    waiting_in_sandbox, faults, sandbox_cluster, cell_watcher
):
    waiting, namespace = waiting_in_sandbox, waiting_in_sandbox.instance.namespace
    faults(frozen=["cnpg"])  # the status below is the test's, not the operator's
    watches = cell_watcher.cells[waiting.instance.cell_id][2].values()
    wait_for(lambda: all(w.resource_version for w in watches), timeout=10, what="the lists")
    database_restarted()

    core, ctx = sandbox_cluster.core, Ctx(field_manager="test")
    clusters = core.resolve("postgresql.cnpg.io", "v1", "clusters")
    made = core.create(clusters, namespace, {
        "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "metadata": {"name": namespace},
        "spec": {"instances": 1, "storage": {"size": "1Gi"}},
    }, ctx)  # fmt: skip
    made["status"] = {"phase": "Cluster in healthy state", "instances": 1, "readyInstances": 1}
    core.update(clusters, namespace, namespace, made, ctx, "status")

    def observed():
        return Instance.objects.get(pk=waiting.instance_id).observed

    wait_for(lambda: observed().get("ready") == 1, timeout=15, what="the observed status")
    # Woken, a minute before its poll (the wake-up is the statement after the status's).
    wait_for(lambda: _due(waiting), timeout=15, what="the wake-up")


def test_a_watcher_stopping_right_after_a_database_restart_still_releases_its_cell(
    cell, cell_watcher
):
    database_restarted()
    cell_watcher.stopping.set()  # before its next round would have reconnected

    def released():
        return CellWatchLease.objects.get(cell_id=cell.pk).expires_at <= timezone.now()

    # Released for the next process at once, not left to expire (15 s).
    wait_for(released, timeout=10, what="the lease to be released")


def test_the_lease_is_one_holders_until_it_expires_then_the_next_one_fences_the_first(waiting):
    cell_id = waiting.instance.cell_id
    first = lease_take(cell_id, "a")
    assert first is not None
    assert lease_take(cell_id, "b") is None  # a holds it
    assert lease_renew(cell_id, "a", first)

    # a stops renewing (dead, or stuck in a call): once its lease expires, b takes over.
    CellWatchLease.objects.filter(cell_id=cell_id).update(expires_at=timezone.now())
    second = lease_take(cell_id, "b")
    assert second == first + 1
    assert not lease_renew(cell_id, "a", first)

    old, new = Lease(cell_id, "a", first), Lease(cell_id, "b", second)
    kind = Kind(*CLUSTER_KIND, {waiting.instance.plan_version_id: BY_PHASE})
    name = waiting.instance.namespace
    event_handle(old, kind, _cluster(name, "stale"))  # a's writes are refused
    waiting.refresh_from_db()
    assert waiting.next_step_at > timezone.now() + timedelta(seconds=SLOW_POLL / 2)
    assert Instance.objects.get(pk=waiting.instance_id).observed == {}

    event_handle(new, kind, _cluster(name, HEALTHY))
    waiting.refresh_from_db()
    assert waiting.next_step_at <= timezone.now()  # due: the step sent finds it so
    assert Instance.objects.get(pk=waiting.instance_id).observed == {"phase": HEALTHY}


def test_an_event_of_the_status_object_is_one_statement_unless_it_wakes_an_operation(
    waiting, django_assert_num_queries
):
    lease = Lease(waiting.instance.cell_id, "a", lease_take(waiting.instance.cell_id, "a"))
    kind = Kind(*CLUSTER_KIND, {waiting.instance.plan_version_id: BY_PHASE})
    Operation.objects.filter(pk=waiting.pk).update(waiting_on=[])  # moving on: nothing to wake
    name = waiting.instance.namespace

    with django_assert_num_queries(1):  # the status stored, the operations looked up
        event_handle(lease, kind, _cluster(name, "Setting up primary"))
    assert Instance.objects.get(pk=waiting.instance_id).observed == {"phase": "Setting up primary"}

    _waits_on_cluster(waiting, None)
    with django_assert_num_queries(2):  # ... and the operation waiting on it woken
        event_handle(lease, kind, _cluster(name, HEALTHY))
    assert Instance.objects.get(pk=waiting.instance_id).observed == {"phase": HEALTHY}
    assert _due(waiting)


def test_the_status_the_watcher_writes_updates_instances_in_their_pages_however_full(waiting):
    instance = waiting.instance
    make_instances(instance.tenant, instance.plan_version, instance.cell, 300)
    with connection.cursor() as cursor:  # one instance of each page the rows filled
        cursor.execute(
            "SELECT DISTINCT ON ((ctid::text::point)[0]) id FROM deployments_instance"
            " ORDER BY (ctid::text::point)[0], ctid"
        )
        firsts = [pk for (pk,) in cursor.fetchall()][:-1]  # the last page may have room left
    assert len(firsts) >= 2
    cell_id = instance.cell_id
    lease = Lease(cell_id, "a", lease_take(cell_id, "a"))
    kind = Kind(*CLUSTER_KIND, {instance.plan_version_id: BY_PHASE})
    before = row_updates(Instance)

    for pk in firsts:
        event_handle(lease, kind, _cluster(pk, HEALTHY))

    assert Instance.objects.filter(pk__in=firsts, observed={"phase": HEALTHY}).count() == len(
        firsts
    )
    updated, in_place = (
        now - then for now, then in zip(row_updates(Instance), before, strict=True)
    )
    # No new entry in any of the table's eight indexes: each page kept room for it.
    assert updated == len(firsts) and in_place == updated


@pytest.mark.django_db(transaction=True)
def test_two_processes_racing_for_a_free_cell_get_one_lease(tenant, owner):
    cell = Cell.objects.create(name="local", region="eu-local", **BACKUPS)

    def take():
        try:
            return lease_take(cell.pk, f"holder-{threading.get_ident()}")
        finally:
            connection.close()

    epochs = race(take)

    assert sorted(epochs, key=lambda e: e is None) == [1, None, None, None]


def test_a_wake_up_during_a_move_is_not_lost_to_the_moves_poll_delay(
    waiting, django_capture_on_commit_callbacks
):
    lease = Lease(waiting.instance.cell_id, "a", lease_take(waiting.instance.cell_id, "a"))
    now = timezone.now()
    token = runner._claim(str(waiting.pk), now, early=True).claim_token  # a worker is moving it ...
    moving = Operation.objects.get(pk=waiting.pk)

    # ... when the operator changes what it waits on: the watcher makes it due but sends no
    # step (a step would find the operation claimed and do nothing) ...
    with django_capture_on_commit_callbacks() as sent:
        assert operations_wake(lease, waiting.instance_id) == [str(waiting.pk)]
    assert sent == []
    assert runner._step(str(waiting.pk)) == (None, None)

    # The move, which may have read the objects before that change, ends waiting: its next
    # move follows at once, not after the poll delay.
    with transaction.atomic():
        delay = runner._wait(
            moving, _state(moving), engine.Step(progressed=False), now, token,
            due=moving.next_step_at,
        )  # fmt: skip
    waiting.refresh_from_db()
    assert delay == 0 and waiting.next_step_at <= timezone.now()
    assert waiting.claim_token is None


def test_a_move_nobody_woke_waits_its_poll_delay(waiting):
    now = timezone.now()
    token = runner._claim(str(waiting.pk), now, early=True).claim_token
    moving = Operation.objects.get(pk=waiting.pk)

    with transaction.atomic():
        delay = runner._wait(
            moving, _state(moving), engine.Step(progressed=False), now, token,
            due=moving.next_step_at,
        )  # fmt: skip
    waiting.refresh_from_db()
    assert delay == runner.poll_delay(1) and waiting.next_step_at > now


def test_the_watched_status_is_read_by_the_rule_of_the_instances_own_plan_version(waiting):
    cell_id, name = waiting.instance.cell_id, waiting.instance.namespace
    lease = Lease(cell_id, "a", lease_take(cell_id, "a"))
    version = waiting.instance.plan_version_id
    by_primary = StatusRule(CLUSTER_KIND[0], "Cluster", {"primary": "status.currentPrimary"})
    cluster = _cluster(name, HEALTHY) | {"status": {"phase": HEALTHY, "currentPrimary": "p-1"}}

    def observed():
        return Instance.objects.get(pk=waiting.instance_id).observed

    # No version of its plan reads its status from this kind: nothing is written.
    event_handle(lease, Kind(*CLUSTER_KIND, {version + 1: BY_PHASE}), cluster)
    assert observed() == {}

    event_handle(lease, Kind(*CLUSTER_KIND, {version: BY_PHASE}), cluster)
    assert observed() == {"phase": HEALTHY}

    # Versions that read it differently: the instance's own version's rule.
    event_handle(lease, Kind(*CLUSTER_KIND, {version: by_primary, version + 1: BY_PHASE}), cluster)
    assert observed() == {"primary": "p-1"}


def _state(operation: Operation) -> engine.RunState:
    """The run's saved state (a fresh one for an operation made running by hand)."""
    if operation.engine_state:
        return engine.RunState.from_json(json.loads(operation.engine_state))
    return engine.RunState(operation_id=str(operation.pk), started_at=0, deadline_at=0)


def _cluster(name: str, phase: str) -> dict:
    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": name},
        "status": {"phase": phase},
    }


HEALTHY = "Cluster in healthy state"


def _waits_on_cluster(operation: Operation, conditions: list | None) -> None:
    entry = {"object": f"Cluster/{operation.instance.namespace}",
             "apiVersion": "postgresql.cnpg.io/v1"}  # fmt: skip
    if conditions is not None:
        entry["conditions"] = conditions
    Operation.objects.filter(pk=operation.pk).update(waiting_on=[entry])


def _due(operation: Operation) -> bool:
    operation.refresh_from_db()
    return operation.next_step_at <= timezone.now()


def test_only_a_change_of_what_an_operation_waits_on_wakes_it(
    waiting, django_capture_on_commit_callbacks
):
    lease = Lease(waiting.instance.cell_id, "a", lease_take(waiting.instance.cell_id, "a"))
    name = waiting.instance.namespace
    _waits_on_cluster(waiting, None)  # its conditions not rendered yet: any change of it

    # The operator's other objects change all the time (pods, claims, secrets): no move for them.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-1", "namespace": name}}
    assert operations_wake(lease, waiting.instance_id, pod) == []
    assert not _due(waiting)

    with django_capture_on_commit_callbacks() as sent:
        woken = operations_wake(lease, waiting.instance_id, _cluster(name, "Setting up primary"))
    assert woken == [str(waiting.pk)]
    assert _due(waiting)
    assert len(sent) == 1  # its step, sent once the wake-up commits


def test_an_operation_waiting_on_no_object_is_left_to_the_move_under_way(
    waiting, django_capture_on_commit_callbacks
):
    # Between two moves that progressed (or in a retry's backoff) a run waits on no object:
    # a change of its Cluster wakes nothing, and the move under way is not made to store twice.
    lease = Lease(waiting.instance.cell_id, "a", lease_take(waiting.instance.cell_id, "a"))
    Operation.objects.filter(pk=waiting.pk).update(waiting_on=[])

    with django_capture_on_commit_callbacks() as sent:
        woken = operations_wake(
            lease, waiting.instance_id, _cluster(waiting.instance.namespace, "Setting up primary")
        )
    assert woken == [] and sent == []
    assert not _due(waiting)
    # Told that anything may have changed, every running operation looks again.
    assert operations_wake(lease, waiting.instance_id) == [str(waiting.pk)]


def test_a_change_that_leaves_the_condition_pending_does_not_wake_it(waiting):
    lease = Lease(waiting.instance.cell_id, "a", lease_take(waiting.instance.cell_id, "a"))
    name = waiting.instance.namespace
    _waits_on_cluster(waiting, [f'cel: self.status.phase == "{HEALTHY}"', "status.phase == Failed"])

    # The operator writes its status many times on the way: each would be a move finding it
    # still pending.
    for phase in ("Setting up primary", "Creating a new replica", "Waiting for the instances"):
        assert operations_wake(lease, waiting.instance_id, _cluster(name, phase)) == []
        assert not _due(waiting)

    # The change that satisfies its successCondition wakes it ...
    assert operations_wake(lease, waiting.instance_id, _cluster(name, HEALTHY)) == [str(waiting.pk)]
    assert _due(waiting)


@pytest.mark.parametrize(
    "conditions, obj, why",
    [
        (["status.phase == Ready", "status.phase == Failed"], _cluster("x", "Failed"),
         "its failureCondition holds"),
        (["status.phase == Ready", None], None, "the object was deleted"),
        (["cel: self.status.phase ==", None], _cluster("x", "Setting up"),
         "its condition cannot be evaluated: the move reports why"),
    ],
)  # fmt: skip
def test_a_change_that_decides_or_breaks_the_condition_wakes_it(waiting, conditions, obj, why):
    lease = Lease(waiting.instance.cell_id, "a", lease_take(waiting.instance.cell_id, "a"))
    name = waiting.instance.namespace
    _waits_on_cluster(waiting, conditions)
    changed = obj or _cluster(name, "Ready")
    changed["metadata"] = {"name": name, "namespace": name}

    woken = operations_wake(lease, waiting.instance_id, changed, deleted=obj is None)

    assert woken == [str(waiting.pk)], why
    assert _due(waiting)


def _wait_move(
    operation: Operation, *, conditions=(f'cel: self.status.phase == "{HEALTHY}"', None)
) -> float:
    """One move of `operation` that finds the Cluster it waits on (on `conditions`: by default
    to be healthy) still pending; its delay."""
    state = _state(operation)
    state.nodes["main.cluster"] = engine.Node(
        id="main.cluster", template="cluster", phase=engine.RUNNING, step="waiting",
        object={"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
                "metadata": {"name": operation.instance.namespace}},
        conditions=list(conditions),
    )  # fmt: skip
    now = timezone.now()
    token = runner._claim(str(operation.pk), now, early=True).claim_token
    moving = Operation.objects.select_related("instance").get(pk=operation.pk)
    with transaction.atomic():
        return runner._wait(
            moving, state, engine.Step(progressed=False), now, token,
            due=moving.next_step_at,
        )  # fmt: skip


def test_a_move_records_what_its_run_waits_on_with_its_conditions_as_rendered(waiting):
    _wait_move(waiting, conditions=["status.readyInstances == 2", None])

    waiting.refresh_from_db()
    assert waiting.waiting_on == [
        {
            "object": f"Cluster/{waiting.instance.namespace}",
            "apiVersion": "postgresql.cnpg.io/v1",
            "conditions": ["status.readyInstances == 2", None],
        }
    ]


def test_while_a_watcher_covers_what_it_waits_on_polling_is_only_the_safety_net(waiting):
    cell_id = waiting.instance.cell_id

    # No watcher: the poll starts fast.
    assert _wait_move(waiting) == runner.poll_delay(1)

    # A watcher holds the cell, and its watch of Clusters streams: a change wakes it, the
    # poll is slow.
    epoch = lease_take(cell_id, "a")
    assert lease_renew(cell_id, "a", epoch, watching=[CLUSTER_KIND, ("v1", "Pod")])
    assert _wait_move(waiting) == runner.poll_delay(99)

    # ... but not while that watch fails, whatever else streams.
    assert lease_renew(cell_id, "a", epoch, watching=[("v1", "Pod")])
    assert _wait_move(waiting) == runner.poll_delay(3)

    # The watcher died: its lease expired, the poll is fast again.
    assert lease_renew(cell_id, "a", epoch, watching=[CLUSTER_KIND])
    CellWatchLease.objects.filter(cell_id=cell_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert _wait_move(waiting) == runner.poll_delay(4)


def test_a_watcher_whose_watches_fail_leaves_the_operations_of_its_cell_on_the_fast_poll(
    transactional_db, plan, tenant, owner
):
    cell = Cell.objects.create(name="gone", region="eu-local", is_default=True)
    waiting = running_operation(cell, tenant, owner)
    cell.kubeconfig = yaml.safe_dump(  # a cluster nobody answers at
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "gone",
            "clusters": [{"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}],
            "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}],
            "users": [{"name": "gone", "user": {"token": "t"}}],
        }
    )
    cell.save(update_fields=["kubeconfig"])
    watcher, thread = watcher_started(cell)
    try:
        wait_for(lambda: watcher.cells[cell.pk][2], timeout=10, what="its watches to start")
        time.sleep(watcher_module.RENEW_EVERY + 1)  # a renewal since: nothing streams
        lease = CellWatchLease.objects.get(cell=cell)
        assert lease.holder == watcher.holder and lease.watching == []

        # The watcher holds the cell, but a change there reaches nobody: the poll is fast.
        assert _wait_move(waiting) == runner.poll_delay(1)
    finally:
        watcher.stopping.set()
        thread.join(30)


@pytest.fixture
def two_cells_watched(cell, plan, sandbox_kubeconfig, quiet_cluster):
    """A watcher streaming the plan's kinds in two cells (one cluster), as a real cluster
    serves a quiet watch: (watcher, its thread, the first cell, the second)."""
    other = services.cell_register(
        name="second", kubeconfig=sandbox_kubeconfig, region="local",
        backup_destination="s3://backups/second", backup_credentials={"ACCESS_KEY_ID": "k"},
    )  # fmt: skip
    watcher, thread = watcher_started(cell, other)
    try:
        wait_for(lambda: streaming(cell) and streaming(other), timeout=20, what="the watches")
        yield watcher, thread, cell, other
    finally:
        watcher.stopping.set()
        thread.join(90)


def test_a_watcher_that_loses_a_cell_keeps_renewing_its_other_cells(two_cells_watched):
    watcher, _, cell, other = two_cells_watched

    # Another process takes the first cell over (this one was stuck past its lease) ...
    CellWatchLease.objects.filter(cell=cell).update(
        holder="elsewhere", epoch=F("epoch") + 1, expires_at=timezone.now() + LEASE_TTL
    )
    wait_for(lambda: not watcher.holds(cell.pk), timeout=10, what="the loss to be seen")

    # ... while its watches wait a minute for their next event, the other cell's lease is
    # renewed at the next round, long before it would expire and be lost too.
    renewed = CellWatchLease.objects.get(cell=other).expires_at
    wait_for(
        lambda: CellWatchLease.objects.get(cell=other).expires_at > renewed,
        timeout=watcher_module.RENEW_EVERY * 2 + 2, what="the other cell's renewal",
    )  # fmt: skip
    assert watcher.holds(other.pk)


def test_a_watcher_told_to_stop_exits_in_seconds_and_frees_its_cells(two_cells_watched):
    watcher, thread, _, _ = two_cells_watched

    # Every watch is blocked in its stream, a minute from its next event.
    watcher.stopping.set()
    thread.join(watcher_module.STOP_WAIT + 5)

    assert not thread.is_alive()
    assert not CellWatchLease.objects.filter(expires_at__gt=timezone.now()).exists()


def test_a_watch_of_a_kind_the_cluster_does_not_serve_tries_again_less_and_less_often(
    cell, monkeypatch, caplog
):
    # Each try discovers the cluster's whole API again, looking for the kind.
    monkeypatch.setattr(watcher_module, "RETRY_AFTER", 0.1)  # doubling: 0.1, 0.2, 0.4, 0.8 s
    stop = threading.Event()
    missing = Kind("example.com/v1", "Missing")
    watch = KindWatch(Lease(cell.pk, "a", 1), cell, missing, stop)

    with caplog.at_level("WARNING", logger="deployments.watcher"):
        watch.start()
        time.sleep(2.0)
        stop.set()
        watch.join(10)

    tries = [r for r in caplog.records if "does not serve Missing" in r.getMessage()]
    assert 3 <= len(tries) <= 6  # every 0.1 s, it would be some 20
    assert not watch.streaming
