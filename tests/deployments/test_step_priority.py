"""Steps that move an operation under way on go before routine ones on the broker: a burst of
new operations (or of polls) does not hold back an operation whose awaited change just came."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

from bench.operations import queue_delete, task_queue
from deployments.transitions import operation_dispatch
from portal.celery import app

ROOT = Path(__file__).resolve().parents[2]
# The RabbitMQ these tests use; they are skipped where none answers.
AMQP_URL = os.environ.get("OPSDECK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture
def queue(transactional_db):
    """A queue of this test's own on the real broker, that no worker consumes."""
    name = f"test-priority-{uuid.uuid4().hex[:8]}"
    before = app.conf.task_default_queue
    app.conf.task_default_queue = name
    yield name
    app.conf.task_default_queue = before
    queue_delete(name)


def _taken_in_order(conn: Connection, queue: Queue) -> list[str]:
    """The operation ids of the steps on the queue, in the order a worker takes them."""
    taken = []
    inbox = conn.SimpleQueue(queue)
    while True:
        try:
            message = inbox.get(block=False)
        except inbox.Empty:
            return taken
        args, _kwargs, _embed = message.decode()
        taken.append(args[0])
        message.ack()


# The order a worker takes what `_send_steps` sends: the woken operation's step first.
TAKEN = ["woken", "new-0", "new-1", "new-2", "new-3"]


def _send_steps() -> None:
    for n in range(3):
        operation_dispatch(f"new-{n}")  # creates submitted in a burst
    operation_dispatch("woken", urgent=True)  # the change one under way waited for came
    operation_dispatch("new-3")


def test_a_woken_operation_goes_before_the_new_ones_already_waiting(queue):
    _send_steps()

    with app.connection_for_read() as conn:
        taken = _taken_in_order(conn, task_queue(queue, conn))

    assert taken == TAKEN


@pytest.fixture
def rabbitmq():
    """A connection to the RabbitMQ at AMQP_URL (the test is skipped where none answers)."""
    conn = Connection(AMQP_URL, connect_timeout=3)
    try:
        conn.ensure_connection(max_retries=1)
    except Exception as exc:  # whatever keeps it from answering
        conn.release()
        pytest.skip(f"no RabbitMQ answers at {AMQP_URL}: {exc}")
    yield conn
    conn.release()


def test_on_rabbitmq_a_woken_operation_goes_before_the_new_ones_already_waiting(rabbitmq):
    """RabbitMQ delivers the highest priority first, and only from a queue declared with a
    maximum priority: the steps are sent as a process configured with an amqp broker sends them
    (its settings, its Celery app)."""
    name = f"test-priority-{uuid.uuid4().hex[:8]}"
    sending = (
        "import django; django.setup()\n"
        "from celery import current_app\n"
        "from tests.deployments.test_step_priority import _send_steps\n"
        "_send_steps()\n"
        "print(current_app.conf.task_queue_max_priority)\n"
    )
    environment = {**os.environ, "CELERY_BROKER_URL": AMQP_URL, "CELERY_QUEUE": name}
    environment.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    try:
        sent = subprocess.run(  # noqa: S603 - our interpreter and a fixed program
            [sys.executable, "-c", sending], cwd=ROOT, env=environment, timeout=60,
            capture_output=True, text=True,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        # The queue as that process declared it: RabbitMQ refuses a declaration whose
        # arguments differ from the queue's.
        highest = int(sent.stdout.split()[-1])
        queue = Queue(name, Exchange(name), routing_key=name, max_priority=highest)
        taken = _taken_in_order(rabbitmq, queue)
    finally:
        with rabbitmq.channel() as channel:
            channel.queue_delete(name)

    assert taken == TAKEN
