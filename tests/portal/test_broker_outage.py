"""A broker that cannot be reached when a request commits neither undoes what was committed
nor shows the member an error: an operation stays queued, and the sweeper sends its step once
the broker answers again; an invitation is kept, and beat sends its email then; a subscription
is kept, and so is its email, which beat asks the mail worker for once the broker is back.
A broker host that stops answering, or a broker that never answers a command, is given up on
in seconds."""

import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from django.core import mail as outbox
from django.utils import timezone

from accounts import mail
from accounts import services as accounts_services
from accounts.audit import Actor
from accounts.models import Invitation, OutgoingEmail
from billing import services as billing_services
from billing.models import Plan, Subscription
from deployments import runner, services
from deployments.models import Cell, Operation
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS
from tests.servers import Blackhole


def test_a_create_sent_while_the_broker_is_down_is_queued_and_swept_once_it_is_back(
    transactional_db, owner, tenant, broker, settings
):
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
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


def test_an_invitation_made_while_the_broker_is_down_is_kept(
    transactional_db, owner, tenant, broker
):
    """... and its email is sent by beat once the broker is back (`test_invitation_outbox`)."""
    broker.down()

    invitation = accounts_services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="viewer"
    )

    assert Invitation.objects.filter(pk=invitation.pk, revoked_at=None, emailed_at=None).exists()


@pytest.mark.unsubscribed
def test_a_subscription_made_while_the_broker_is_down_is_kept_and_its_email_sent_later(
    transactional_db, owner, tenant, broker
):
    plan = Plan.objects.create(key="hobby", name="Hobby", service="postgresql")
    broker.down()

    subscription = billing_services.subscribe(actor=Actor(user=owner), tenant=tenant, plan=plan)

    assert Subscription.objects.get(pk=subscription.pk).status == "active"
    [email] = OutgoingEmail.objects.all()
    assert email.to == [owner.email]
    broker.back()
    assert mail.send_due(now=timezone.now() + timedelta(minutes=1)) == 1
    assert broker.sent == [("accounts.tasks.email_send", [email.pk])]
    assert mail.deliver(email.pk)
    [sent] = outbox.outbox
    assert (sent.to, sent.subject) == ([owner.email], email.subject)


@contextmanager
def _black_hole():
    """A port on this host whose connections are neither accepted nor refused, as a broker
    host behind a network that drops its packets: its accept queue is full, so the kernel drops
    every new connection's first packet."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    port = hole.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        hole.close()


def _dispatch_through(port: int) -> tuple[subprocess.CompletedProcess, float]:
    """Send a step, after a commit as a request does, from a process whose broker is the
    Redis at `port` of this host; it prints "answered" once the send gave up. With the seconds
    the process took (Django's start included)."""
    sending = (
        "import django; django.setup()\n"
        "from deployments.transitions import operation_dispatch\n"
        "operation_dispatch('00000000-0000-0000-0000-000000000000')\n"
        "print('answered')\n"
    )
    environment = {**os.environ, "CELERY_BROKER_URL": f"redis://127.0.0.1:{port}/0"}
    environment.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    began = time.monotonic()
    sent = subprocess.run(  # noqa: S603 - our interpreter and a fixed program
        [sys.executable, "-c", sending], cwd=Path(__file__).resolve().parents[2],
        env=environment, timeout=90, capture_output=True, text=True,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    return sent, time.monotonic() - began


def test_a_broker_host_that_stops_answering_is_given_up_on_in_seconds():
    """Not after the system's two minutes of connection attempts: a request that committed
    answers once its step's send gave up (the sweeper sends the step later)."""
    with _black_hole() as port:
        sent, seconds = _dispatch_through(port)

    assert sent.stdout.split() == ["answered"] and seconds < 30, seconds
    assert "Timeout connecting" in sent.stderr  # the send gave up, and said why


def test_a_broker_that_takes_the_connection_but_never_answers_is_given_up_on_in_seconds():
    """Connecting succeeds, so only a timeout on the answer ends the send: without one, the
    request that committed would never answer."""
    with Blackhole() as hung:  # a hung Redis, or one behind a half-open connection
        sent, seconds = _dispatch_through(hung.port)

    assert sent.stdout.split() == ["answered"] and seconds < 30, seconds
    assert "Timeout reading from" in sent.stderr  # the send gave up, and said why
