"""A mail server that never answers does not hold the worker that moves operations: the email at
an operation's end waits on the mail queue for the mail worker, which the Procfile runs apart."""

import pytest
from django.core import mail

from accounts.audit import Actor
from deployments import services
from deployments.models import Operation
from tests.celery_worker import threads_worker
from tests.deployments.conftest import wait_done, wait_for
from tests.servers import blackhole_server


@pytest.fixture
def blackhole(settings):
    with blackhole_server(settings) as hole:
        yield hole


def test_operations_end_and_the_next_ones_run_while_the_mail_server_never_answers(
    transactional_db, cell, plan, tenant, owner, blackhole, settings
):
    def create(name):
        return services.instance_create(
            actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
            parameters={}, request_id=f"mail-{name}",
        )  # fmt: skip

    # One worker thread, on the queue operations' steps and beat's rounds go to (as the
    # Procfile's `worker`): had it sent the first "ready" email, it would wait on the mail
    # server for two minutes before it could move the second create.
    with threads_worker(concurrency=1, queues=[settings.CELERY_TASK_DEFAULT_QUEUE]):
        first = create("orders")
        assert wait_done(first, timeout=30).state == Operation.State.SUCCEEDED
        second = create("billing")
        assert wait_done(second, timeout=30).state == Operation.State.SUCCEEDED

    assert blackhole.accepted == []  # the engine's worker never called the mail server
    assert mail.outbox == []

    # The mail worker, once the mail server answers, sends both emails it kept.
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    with threads_worker(concurrency=1, queues=[settings.OPSDECK_MAIL_QUEUE]):
        wait_for(lambda: len(mail.outbox) >= 2, timeout=30, what="the two emails")
    assert sorted(m.subject for m in mail.outbox) == [
        "[Opsdeck] billing is ready",
        "[Opsdeck] orders is ready",
    ]
    assert all(m.to == [owner.email] for m in mail.outbox)
