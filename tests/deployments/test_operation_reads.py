"""What a run reads of the operations table stays the same however many operations are in
flight: each of its statements finds its operation by id, or its instance's operations by the
instance, and only the sweeper reads all those in flight.

Statistics are as old as the table's last ANALYZE, which may have run while nothing was in
flight (a quiet hour; the vacuum `bench.operations` runs between windows): hundreds of runs
then start. A plan that reads every operation in flight to find one costs each move of each
run as much as there are runs: measured in `bench.operations`, 170 to 330 page reads per
statement with 200 creates in flight, where a look-up by id takes a few."""

import math
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

from bench.support import rows_read
from deployments import runner
from deployments.models import Operation
from deployments.watcher import Lease, lease_take, operations_wake
from tests.deployments import factories

ENDED = 2000  # the operations of a platform's history
IN_FLIGHT = 200


@pytest.fixture
def busy(cell, tenant, created):
    """A platform with ENDED operations, analyzed while none but `created` was in flight;
    IN_FLIGHT of them running since."""
    version = created.plan_version
    instances = factories.make_instances(tenant, version, cell, ENDED, name="done")
    now = timezone.now()
    Operation.objects.bulk_create(
        Operation(
            instance=instance, verb="create", request_id=uuid.uuid4().hex, plan_version=version,
            state=Operation.State.SUCCEEDED, started_at=now, finished_at=now,
        )
        for instance in instances
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Operation._meta.db_table}")
    Operation.objects.filter(instance__in=instances[:IN_FLIGHT]).update(
        state=Operation.State.RUNNING, finished_at=None
    )
    return created


def test_a_runs_moves_read_a_few_operations_with_hundreds_in_flight(busy):
    with transaction.atomic():  # the counts are the transaction's
        before = rows_read(Operation)
        # The claim, the start (no other operation of its instance pending), its first move
        # and the next, each stored fenced by the claim.
        delay, held = runner._step(str(busy.pk), keep_until=math.inf)
        assert delay == 0 and held is not None
        runner._step(str(busy.pk), held)
        read = rows_read(Operation) - before

    busy.refresh_from_db()
    assert busy.moves == 2
    assert read <= 20, f"{read} index entries and rows read for a run's start and two moves"


def test_a_wake_up_reads_the_operations_it_wakes_alone(busy):
    Operation.objects.filter(pk=busy.pk).update(state=Operation.State.RUNNING)
    cell_id = busy.instance.cell_id
    lease = Lease(cell_id, "a", lease_take(cell_id, "a"))

    with transaction.atomic():
        before = rows_read(Operation)
        assert operations_wake(lease, busy.instance_id) == [str(busy.pk)]
        read = rows_read(Operation) - before

    assert read <= 5, f"{read} index entries and rows read to wake one operation"


def test_the_sweeper_reads_the_operations_in_flight_and_not_the_ended_ones(busy, broker):
    with transaction.atomic():
        before = rows_read(Operation)
        runner.operations_sweep()
        read = rows_read(Operation) - before

    assert read <= 2 * (IN_FLIGHT + 1), f"{read} index entries and rows read by the sweeper"
