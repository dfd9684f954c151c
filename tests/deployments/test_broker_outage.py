"""A broker that cannot be reached when a request commits neither undoes what was committed
nor shows the member an error: the operation is queued, and the sweeper sends its step once the
broker answers again."""

import uuid

import pytest
from celery import Celery
from kombu.exceptions import OperationalError

from accounts.audit import Actor
from deployments import runner, services
from deployments.models import Cell, Operation
from tests.deployments.conftest import SPEC


@pytest.fixture
def broker(monkeypatch):
    """The broker as Celery reaches it: `down()` makes every send fail as kombu fails when the
    broker refuses the connection; `sent` holds what was sent once it is back."""

    class Broker:
        def __init__(self):
            self.sent = []

        def down(self):
            def refuse(app, name, *args, **kwargs):
                raise OperationalError(
                    "Error 111 connecting to 127.0.0.1:6379. Connection refused."
                )

            monkeypatch.setattr(Celery, "send_task", refuse)

        def back(self):
            def send(app, name, args=None, **kwargs):
                self.sent.append((name, args))

            monkeypatch.setattr(Celery, "send_task", send)

    return Broker()


def test_a_create_sent_while_the_broker_is_down_is_queued_and_swept_once_it_is_back(
    transactional_db, owner, tenant, broker, settings
):
    Cell.objects.create(name="local", region="eu-local", is_default=True)
    plan = services.plan_load(text=SPEC.read_text()).plan
    broker.down()

    operation = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip

    assert Operation.objects.get(pk=operation.pk).state == Operation.State.QUEUED
    broker.back()
    settings.OPSDECK_STALLED_AFTER = 0  # overdue at once (60 s in production)
    assert runner.operations_sweep() == 1
    assert broker.sent == [("deployments.tasks.operation_step", [str(operation.pk)])]
