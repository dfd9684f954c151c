"""The portal's status of an instance comes from one LIST per cell and kind, not a GET each."""

import uuid

from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.audit import Actor
from deployments import services, status
from deployments.cells import driver_for
from deployments.models import Instance, Operation
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
