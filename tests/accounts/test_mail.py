"""Emails go out through the mail queue and its worker to a real SMTP server: the page that
asked for one never waits on the mail server, and a server that fails for a while gets the
email once it answers again."""

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.conf import settings as django_settings

from accounts import mail
from tests.celery_worker import threads_worker
from tests.conftest import PASSWORD
from tests.deployments.conftest import wait_for
from tests.servers import Recorder, blackhole_server, smtp_server


def _signup(client, email="new@example.com"):
    return client.post(
        "/accounts/signup/",
        {"email": email, "password1": PASSWORD, "password2": PASSWORD, "organization": "Initech"},
    )


@contextmanager
def mail_worker(settings, handler: Recorder) -> Iterator[Recorder]:
    """The mail worker (one thread, on the mail queue only) and the SMTP server it sends to."""
    with (
        smtp_server(settings, handler),
        threads_worker(concurrency=1, queues=[settings.OPSDECK_MAIL_QUEUE]),
    ):
        yield handler


@pytest.mark.django_db(transaction=True)
def test_a_sign_up_gets_its_page_while_the_mail_server_never_answers_and_its_email_later(
    client, settings
):
    with blackhole_server(settings) as hole:
        response = _signup(client)

        assert response.status_code == 302
        assert response["Location"] == "/accounts/confirm-email/"
        assert hole.accepted == []  # the web process never called the mail server

    # The mail server answers again: the mail worker sends the email the sign-up queued.
    with mail_worker(settings, Recorder()) as server:
        wait_for(lambda: server.messages, timeout=20, what="the email")

    [(recipients, message)] = server.messages
    assert recipients == ["new@example.com"]
    assert message["To"] == "new@example.com"
    assert message["From"] == django_settings.DEFAULT_FROM_EMAIL
    assert message["Subject"].startswith("[Opsdeck] ")
    link = re.search(r"https?://\S+(/accounts/confirm-email/\S+/)", message.get_content())
    assert client.post(link.group(1)).status_code == 302
    assert client.get("/", follow=True).request["PATH_INFO"].startswith("/t/")  # signed in


@pytest.mark.usefixtures("mail_at_commit")
def test_a_mail_server_answering_an_error_gets_the_email_when_it_accepts_it(client, settings):
    handler = Recorder(data_replies=["421 4.3.2 Service not available, closing channel"])
    with smtp_server(settings, handler):
        assert _signup(client).status_code == 302

    assert handler.attempts == 2
    assert len(handler.messages) == 1  # sent again, and once


@pytest.mark.usefixtures("mail_at_commit")
def test_an_address_the_mail_server_refuses_is_not_tried_again(settings):
    handler = Recorder(refused={"gone@example.com"})
    with smtp_server(settings, handler):
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["gone@example.com"])
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["here@example.com"])

    assert handler.recipients_tried == ["gone@example.com", "here@example.com"]
    assert [recipients for recipients, _ in handler.messages] == [["here@example.com"]]


@pytest.mark.django_db(transaction=True)
def test_an_email_of_a_transaction_rolled_back_is_never_sent(settings):
    from django.db import transaction

    with mail_worker(settings, Recorder()) as server:
        with pytest.raises(RuntimeError), transaction.atomic():
            mail.send(subject="[Opsdeck] Rolled back", body=".", to=["a@example.com"])
            raise RuntimeError
        mail.send(subject="[Opsdeck] Committed", body=".", to=["a@example.com"])
        # One thread takes the queue in order: one queued before would have gone first.
        wait_for(lambda: server.messages, timeout=20, what="the email")

    assert [message["Subject"] for _, message in server.messages] == ["[Opsdeck] Committed"]
