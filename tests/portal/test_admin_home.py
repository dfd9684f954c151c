"""The staff's admin home says how many emails wait for the mail worker."""

import pytest
from django.conf import settings
from django.core import mail as outbox

from accounts import mail
from portal.broker import queue_forget
from portal.celery import app
from tests.celery_worker import threads_worker
from tests.deployments.conftest import wait_for


@pytest.mark.django_db(transaction=True)
def test_the_admin_home_says_how_many_emails_wait_until_the_mail_worker_sends_them(
    staff_client,
):
    queue_forget(app, settings.OPSDECK_MAIL_QUEUE)  # what earlier tests left is not this test's
    assert "waiting to be sent" not in staff_client.get("/admin/").content.decode()
    for n in range(2):  # no mail worker runs
        mail.send(subject=f"[Opsdeck] Hello {n}", body=".", to=["ann@example.com"])

    page = staff_client.get("/admin/").content.decode()

    assert "2 emails waiting to be sent" in page
    assert "check that it runs" in page
    with threads_worker(concurrency=1, queues=[settings.OPSDECK_MAIL_QUEUE]):
        wait_for(lambda: len(outbox.outbox) >= 2, timeout=20, what="the two emails")
    assert len(outbox.outbox) == 2
    assert "waiting to be sent" not in staff_client.get("/admin/").content.decode()
