"""The portal's status of an instance comes from one LIST per cell and kind, not a GET each."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.audit import Actor
from deployments import services, status
from deployments.cells import driver_for
from deployments.models import Cell, CellWatchLease, Instance, Operation
from deployments.watcher import Lease, event_handle, kinds_of, lease_take
from deployments.workflow.driver import DriverError
from tests.deployments.conftest import wait_done


def _create(owner, tenant, plan, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def test_every_instance_gets_what_its_spec_points_at_in_the_operators_object(
    worker, cell, plan, tenant, owner, sandbox_cluster
):
    ops = [_create(owner, tenant, plan, instances="2"), _create(owner, tenant, plan, "billing")]
    for op in ops:
        assert wait_done(op).state == Operation.State.SUCCEEDED, op.error
    gone = _create(owner, tenant, plan, "gone")  # deleted: its status is no longer read
    assert wait_done(gone).state == Operation.State.SUCCEEDED, gone.error
    delete = services.instance_delete(
        actor=Actor(user=owner), instance=gone.instance, request_id="d"
    )
    assert wait_done(delete).state == Operation.State.SUCCEEDED, delete.error

    with CaptureQueriesContext(connection) as queries:
        found = status.cell_observe(cell, driver_for(cell))

    assert found == 2
    first, second = (Instance.objects.get(pk=op.instance_id) for op in ops)
    assert first.observed["phase"] == "Cluster in healthy state"
    assert (first.observed["ready"], first.observed["total"]) == (2, 2)
    assert first.observed["primary"] == f"{first.pk}-1"
    assert {"type": "Ready", "status": "True"}.items() <= first.observed["conditions"][0].items()
    assert (second.observed["ready"], second.observed["total"]) == (1, 1)
    # ... and the plan's health rule's verdict on it (its reason only when it fails).
    assert set(first.observed) == {
        "phase", "ready", "total", "primary", "conditions", "healthy", "healthReason",
    }  # fmt: skip
    assert first.observed["healthy"] is True and first.observed["healthReason"] == ""
    assert first.observed_at is not None
    # One read of the instances and one bulk write, whatever their number.
    assert len([q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]) == 1
    # Read a page at a time: one object a page still finds both (among other tests' clusters).
    listed = driver_for(cell).list_objects(
        "postgresql.cnpg.io/v1", "Cluster", label_selector=status.INSTANCE_LABEL, page=1
    )
    names = [o["metadata"]["name"] for o in listed]
    assert len(names) == len(set(names))  # no page read twice
    assert {op.instance_id for op in ops} <= set(names)
    assert gone.instance_id not in names


def _running(owner, tenant, plan, *names):
    ops = [_create(owner, tenant, plan, name) for name in names]
    for op in ops:
        assert wait_done(op).state == Operation.State.SUCCEEDED, op.error
    return [Instance.objects.get(pk=op.instance_id) for op in ops]


def _updates(queries) -> int:
    return len([q for q in queries.captured_queries if q["sql"].startswith("UPDATE")])


def test_a_status_that_holds_still_is_stored_again_only_to_confirm_it_once_it_is_old(
    worker, cell, plan, tenant, owner, settings
):
    orders, billing = _running(owner, tenant, plan, "orders", "billing")
    driver = driver_for(cell)
    status.cell_observe(cell, driver)  # stored, as the watcher would have
    stored = {i.pk: i.observed_at for i in Instance.objects.filter(pk__in=[orders.pk, billing.pk])}

    with CaptureQueriesContext(connection) as queries:
        assert status.cell_observe(cell, driver) == 2  # both found ...

    assert _updates(queries) == 0  # ... and neither written: nothing changed
    # Once a status was stored OPSDECK_STATUS_CONFIRM_AFTER ago, the next read confirms it.
    old = timezone.now() - timedelta(seconds=settings.OPSDECK_STATUS_CONFIRM_AFTER + 1)
    Instance.objects.filter(pk=orders.pk).update(observed_at=old)
    status.cell_observe(cell, driver)
    orders.refresh_from_db()
    billing.refresh_from_db()
    assert orders.observed_at > stored[orders.pk] and orders.observed["ready"] == 1
    assert billing.observed_at == stored[billing.pk]


def test_the_status_the_cell_watcher_streams_is_read_again_only_once_the_cells_read_is_old(
    worker, cell, plan, tenant, owner, settings, faults
):
    _running(owner, tenant, plan, "orders")
    driver = driver_for(cell)
    status.cell_observe(cell, driver)
    cell.refresh_from_db()
    assert cell.status_read_at is None  # no watcher: nothing to record
    CellWatchLease.objects.create(
        cell=cell, holder="watcher-1", expires_at=timezone.now() + timedelta(seconds=15),
        watching=["postgresql.cnpg.io/v1/Cluster"],
    )  # fmt: skip
    status.cell_observe(cell, driver)  # read, and the read recorded
    cell.refresh_from_db()
    assert cell.status_read_at is not None
    faults(error_500=1.0)  # from here, any request the sync makes fails

    with CaptureQueriesContext(connection) as queries:
        assert status.cell_observe(cell, driver) == 0  # nothing read: the watcher streams it
    assert not [q for q in queries.captured_queries if '"observed"' in q["sql"]]  # nor stored

    old = timezone.now() - timedelta(seconds=settings.OPSDECK_STATUS_CONFIRM_AFTER + 1)
    Cell.objects.filter(pk=cell.pk).update(status_read_at=old)
    cell.refresh_from_db()
    with pytest.raises(DriverError):  # read again: its read is old
        status.cell_observe(cell, driver)
    CellWatchLease.objects.filter(cell=cell).update(expires_at=timezone.now())
    Cell.objects.filter(pk=cell.pk).update(status_read_at=timezone.now())
    cell.refresh_from_db()
    with pytest.raises(DriverError):  # read at each call: no live watcher streams it
        status.cell_observe(cell, driver)


def test_a_status_the_watcher_stores_while_a_read_is_under_way_is_not_overwritten_by_it(
    worker, cell, plan, tenant, owner, faults
):
    [orders] = _running(owner, tenant, plan, "orders")
    driver = driver_for(cell)
    [cluster] = [
        obj
        for obj in driver.list_objects("postgresql.cnpg.io/v1", "Cluster")
        if obj["metadata"]["name"] == str(orders.pk)
    ]
    # The row holds an older status than the cluster's: the next read has a change to store.
    Instance.objects.filter(pk=orders.pk).update(observed={"phase": "Setting up primary"})
    # While the read waits for its LIST, the cluster moves on and the watcher stores that.
    lease = Lease(cell.pk, "watcher-1", lease_take(cell.pk, "watcher-1"))
    kind = kinds_of([orders.plan_version])[("postgresql.cnpg.io/v1", "Cluster")]
    cluster["status"]["phase"] = "Switchover in progress"

    def watcher_stores():
        try:
            time.sleep(0.5)
            event_handle(lease, kind, cluster)
        finally:
            connection.close()

    faults(latency_ms=2000)  # each request waits 2 s before the API server answers it
    storing = threading.Thread(target=watcher_stores)
    storing.start()
    status.cell_observe(cell, driver)  # its LIST found the cluster as it was
    storing.join()

    orders.refresh_from_db()
    assert orders.observed["phase"] == "Switchover in progress"
