"""A worker keeps its database connections from task to task (as a web process does from request
to request, `DATABASE_CONN_MAX_AGE`), instead of opening one — a PostgreSQL backend forked — for
every step of every operation."""

import threading

from django.db.backends.signals import connection_created

from accounts.audit import Actor
from deployments import services
from deployments.models import Operation
from tests.deployments.conftest import wait_done


def test_a_worker_reuses_its_database_connections_across_an_operations_steps(
    worker, cell, plan, tenant, owner
):
    opened_by_workers = []

    def opened(sender, connection, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            opened_by_workers.append(threading.current_thread().name)

    connection_created.connect(opened)
    try:
        creates = []
        for n in range(3):
            create = services.instance_create(
                actor=Actor(user=owner), tenant=tenant, plan=plan, name=f"orders-{n}",
                parameters={}, request_id=f"conn-{n}", cell=cell,
            )  # fmt: skip
            assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
            creates.append(create)
    finally:
        connection_created.disconnect(opened)

    # Many steps ran (each a task); the worker's two threads and the sweeper opened at most one
    # connection each.
    assert sum(create.moves for create in creates) >= 12
    assert len(opened_by_workers) <= 3, opened_by_workers
