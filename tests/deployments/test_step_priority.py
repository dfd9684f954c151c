"""Steps that move an operation under way on go before routine ones on the broker: a burst of
new operations (or of polls) does not hold back an operation whose awaited change just came."""

import uuid

import pytest
from kombu import Exchange, Queue

from bench.operations import queue_delete
from deployments.transitions import operation_dispatch
from portal.celery import app


@pytest.fixture
def queue(transactional_db):
    """A queue of this test's own on the real broker, that no worker consumes."""
    name = f"test-priority-{uuid.uuid4().hex[:8]}"
    before = app.conf.task_default_queue
    app.conf.task_default_queue = name
    yield name
    app.conf.task_default_queue = before
    queue_delete(name)


def _taken_in_order(name: str) -> list[str]:
    """The operation ids of the steps on the queue, in the order a worker takes them."""
    taken = []
    with app.connection_for_read() as conn:
        inbox = conn.SimpleQueue(Queue(name, Exchange(name), routing_key=name))
        while True:
            try:
                message = inbox.get(block=False)
            except inbox.Empty:
                return taken
            args, _kwargs, _embed = message.decode()
            taken.append(args[0])
            message.ack()


def test_a_woken_operation_goes_before_the_new_ones_already_waiting(queue):
    for n in range(3):
        operation_dispatch(f"new-{n}")  # creates submitted in a burst
    operation_dispatch("woken", urgent=True)  # the change one under way waited for came
    operation_dispatch("new-3")

    assert _taken_in_order(queue) == ["woken", "new-0", "new-1", "new-2", "new-3"]
