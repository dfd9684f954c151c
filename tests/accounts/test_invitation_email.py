"""The invitation email is sent by a real Celery worker, after the invitation is committed."""

import re
import time

import pytest
from django.core import mail

from accounts import services
from accounts.audit import Actor
from tests.celery_worker import threads_worker


@pytest.fixture
def worker(transactional_db):
    # A worker thread on this run's own queue, consuming from the real broker.
    with threads_worker(concurrency=1):
        yield


def _wait_for_mail(count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while len(mail.outbox) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_worker_mails_a_link_that_accepts_the_invitation(
    worker, owner, tenant, client, make_user
):
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="viewer"
    )

    _wait_for_mail(1)

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["new@example.com"]
    assert message.subject == "[Opsdeck] You are invited to Acme"
    link = re.search(r"http://127\.0\.0\.1:8000(/invitations/\S+/)", message.body).group(1)
    client.force_login(make_user("new@example.com"))
    assert client.post(link).url == f"/t/{tenant.slug}/"
