"""Emails go out through the mail queue and its worker to a real SMTP server: the page that
asked for one never waits on the mail server; an email is kept until the server takes it, so a
server that fails for a while, or a message lost on the way to the mail worker, delays it and
never loses it; one failing for a day is given up on, and the staff see it."""

import asyncio
import importlib
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from itertools import pairwise

import pytest
from django.conf import settings as django_settings
from django.core import mail as outbox
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from accounts import mail
from accounts.models import OutgoingEmail
from portal.broker import queue_forget, queue_length
from portal.celery import app
from tests.celery_worker import threads_worker
from tests.concurrency import race
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
        [email] = OutgoingEmail.objects.all()  # kept, with why it was not sent
        assert "421" in email.last_error
        assert handler.messages == []

        assert mail.send_due() == 0  # tried again after a minute, not at once
        assert mail.send_due(now=timezone.now() + timedelta(minutes=1)) == 1

    assert handler.attempts == 2
    assert len(handler.messages) == 1  # sent again, and once
    assert not OutgoingEmail.objects.exists()


@pytest.mark.usefixtures("mail_at_commit")
def test_a_subject_holding_a_line_break_is_sent_on_one_line(settings):
    """A name holding a line break (a plan's, from its spec) made a subject no attempt could
    send (Django refuses a header with one): the email waited, retried for good, with no error
    kept."""
    handler = Recorder()
    with smtp_server(settings, handler):
        mail.send(subject="[Opsdeck] Your subscription to Post\ngres is active", body="Hello.",
                  to=["here@example.com"])  # fmt: skip

    [(_, message)] = handler.messages
    assert message["Subject"] == "[Opsdeck] Your subscription to Post gres is active"
    assert not OutgoingEmail.objects.exists()


def test_an_email_whose_header_cannot_be_sent_is_given_up_on_at_once(settings, db):
    """One waiting from before subjects were made one line: the same refusal at every attempt,
    tried again for good."""
    handler = Recorder()
    email = OutgoingEmail.objects.create(
        to=["here@example.com"], subject="Post\ngres", body="Hello.", next_attempt_at=timezone.now()
    )
    with smtp_server(settings, handler):
        assert mail.deliver(email.pk) is False

    email.refresh_from_db()
    assert email.given_up_at is not None
    assert email.last_error.startswith("BadHeaderError: Header values can't contain newlines")
    assert handler.messages == []


@pytest.mark.usefixtures("mail_at_commit")
def test_an_address_the_mail_server_refuses_is_not_tried_again(settings):
    handler = Recorder(refused={"gone@example.com"})
    with smtp_server(settings, handler):
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["gone@example.com"])
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["here@example.com"])
        assert mail.send_due(now=timezone.now() + timedelta(hours=1)) == 0

    assert handler.recipients_tried == ["gone@example.com", "here@example.com"]
    assert [recipients for recipients, _ in handler.messages] == [["here@example.com"]]
    [given_up] = OutgoingEmail.objects.all()
    assert given_up.to == ["gone@example.com"]
    assert given_up.given_up_at is not None
    assert "No such user here" in given_up.last_error


@pytest.mark.usefixtures("mail_at_commit")
def test_an_email_failing_for_a_day_is_given_up_on_and_the_admin_home_says_so(
    settings, staff_client
):
    settings.OPSDECK_EMAIL_GIVE_UP_HOURS = 24
    handler = Recorder(data_replies=["421 4.3.2 Service not available"] * 20)
    with smtp_server(settings, handler):
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["ann@example.com"])
        [email] = OutgoingEmail.objects.all()
        # Tried again later and later: 1, 2, 4, 8, then every 15 minutes.
        waits = []
        for _ in range(5):
            email.refresh_from_db()
            waits.append(email.next_attempt_at)
            mail.deliver(email.pk, now=email.next_attempt_at)
        email.refresh_from_db()
        waits.append(email.next_attempt_at)
        assert round((waits[0] - email.created_at).total_seconds() / 60) == 1
        assert [(b - a).total_seconds() / 60 for a, b in pairwise(waits)] == [
            2, 4, 8, 15, 15,
        ]  # fmt: skip
        assert email.given_up_at is None
        page = staff_client.get("/admin/").content.decode()
        assert "1 email waiting to be sent" in page

        assert not mail.deliver(email.pk, now=email.created_at + timedelta(hours=24))

    email.refresh_from_db()
    assert email.given_up_at is not None
    assert handler.messages == []
    assert mail.send_due(now=email.given_up_at + timedelta(days=1)) == 0  # no more attempts
    page = staff_client.get("/admin/").content.decode()
    assert "waiting to be sent" not in page
    assert "1 email could not be sent and was given up on" in page
    listed = staff_client.get("/admin/accounts/outgoingemail/?given_up_at__isempty=0")
    assert '<td class="field-recipients">ann@example.com</td>' in listed.content.decode()
    assert "421" in listed.content.decode()

    settings.OPSDECK_EMAIL_GIVEN_UP_KEPT_DAYS = 7
    mail.send_due(now=email.given_up_at + timedelta(days=7, seconds=1))
    assert not OutgoingEmail.objects.exists()  # forgotten after a week


@pytest.mark.django_db(transaction=True)
def test_an_email_whose_message_was_lost_is_sent_by_beats_minute(settings):
    with smtp_server(settings, Recorder()) as server:
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["ann@example.com"])
        queue_forget(app, settings.OPSDECK_MAIL_QUEUE)  # its message is gone
        with threads_worker(concurrency=1, queues=[settings.OPSDECK_MAIL_QUEUE]):
            assert mail.send_due() == 0  # its own message may still come, for a minute
            assert mail.send_due(now=timezone.now() + timedelta(minutes=1)) == 1
            wait_for(lambda: server.messages, timeout=20, what="the email")
            # Asked for, it is not asked for again while the mail worker may still take it.
            assert mail.send_due(now=timezone.now() + timedelta(minutes=2)) == 0

    assert [message["Subject"] for _, message in server.messages] == ["[Opsdeck] Hello"]
    assert not OutgoingEmail.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_messages_for_one_email_at_the_same_moment_send_it_once(settings):
    """Beat's message and the email's own, or one the broker delivered twice."""
    with smtp_server(settings, Recorder()) as server:
        mail.send(subject="[Opsdeck] Hello", body="Hello.", to=["ann@example.com"])
        [email] = OutgoingEmail.objects.all()
        sent = race(lambda: mail.deliver(email.pk))

    assert sorted(sent) == [False, False, False, True]
    assert len(server.messages) == 1


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_emails_is_one_message_for_the_mail_worker_and_one_connection(settings):
    """A fleet upgrade ending tells every instance's requester at once: one message on the mail
    queue and one connection to the mail server carry them all, oldest first; a refused
    address is given up on and the rest go on."""
    queue_forget(app, settings.OPSDECK_MAIL_QUEUE)
    addresses = ["a@example.com", "gone@example.com", "b@example.com", "c@example.com"]
    with smtp_server(settings, Recorder(refused={"gone@example.com"})) as server:
        for address in addresses:
            mail.send(subject=f"[Opsdeck] Hello {address}", body="Hello.", to=[address])
        assert queue_length(app, settings.OPSDECK_MAIL_QUEUE) == 1
        with threads_worker(concurrency=1, queues=[settings.OPSDECK_MAIL_QUEUE]):
            wait_for(lambda: len(server.messages) == 3, timeout=20, what="the emails")

    assert server.recipients_tried == addresses
    assert [recipients for recipients, _ in server.messages] == [
        ["a@example.com"], ["b@example.com"], ["c@example.com"]
    ]  # fmt: skip
    assert len(server.connections) == 1
    [given_up] = OutgoingEmail.objects.all()
    assert (given_up.to, given_up.attempts) == (["gone@example.com"], 1)
    assert given_up.given_up_at is not None


@pytest.mark.django_db(transaction=True)
def test_emails_written_a_moment_apart_go_over_one_connection(settings):
    """Operations ending one after another, with the mail worker waiting for work: the first
    email's message waits a second, and the next ones go with it."""
    queue_forget(app, settings.OPSDECK_MAIL_QUEUE)
    with (
        smtp_server(settings, Recorder()) as server,
        threads_worker(concurrency=1, queues=[settings.OPSDECK_MAIL_QUEUE]),
    ):
        for n in range(3):
            mail.send(subject=f"[Opsdeck] Hello {n}", body=".", to=["a@example.com"])
            time.sleep(0.1)
        wait_for(lambda: len(server.messages) == 3, timeout=20, what="the emails")

    assert len(server.connections) == 1


@pytest.mark.django_db(transaction=True)
def test_emails_written_while_the_mail_worker_sends_others_are_each_sent_once(settings):
    """Four processes writing emails at once beside two mail worker threads sending them: an
    email written while a message for the new ones is on its way rides on it, and none is left
    waiting for beat or sent twice."""
    queue_forget(app, settings.OPSDECK_MAIL_QUEUE)

    def write(n: int = 10) -> None:
        me = threading.get_ident()
        for i in range(n):
            mail.send(subject=f"[Opsdeck] {me} {i}", body=".", to=["a@example.com"])

    with (
        smtp_server(settings, Recorder()) as server,
        threads_worker(concurrency=2, queues=[settings.OPSDECK_MAIL_QUEUE]),
    ):
        assert race(write) == [None] * 4
        wait_for(lambda: len(server.messages) >= 40, timeout=30, what="the emails")
        wait_for(lambda: not OutgoingEmail.objects.exists(), timeout=10, what="the rows gone")

    subjects = [message["Subject"] for _, message in server.messages]
    assert len(subjects) == len(set(subjects)) == 40


class QuitHeld(Recorder):
    """A mail server that answers a QUIT only once `release` is set."""

    def __init__(self):
        super().__init__()
        self.quitting, self.release = threading.Event(), threading.Event()

    async def handle_QUIT(self, server, session, envelope):
        self.quitting.set()
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 30)
        return "221 Bye"


@pytest.mark.django_db(transaction=True)
def test_an_email_written_as_the_mail_worker_ends_a_burst_is_sent_at_once(settings):
    """Written after the worker found no more new emails and before it was done (closing its
    connection): its own message asks for it, not beat's minute."""
    queue_forget(app, settings.OPSDECK_MAIL_QUEUE)
    with (
        smtp_server(settings, QuitHeld()) as server,
        threads_worker(concurrency=2, queues=[settings.OPSDECK_MAIL_QUEUE]),
    ):
        mail.send(subject="[Opsdeck] First", body=".", to=["a@example.com"])
        assert server.quitting.wait(20)  # sent, and found no other
        mail.send(subject="[Opsdeck] Second", body=".", to=["a@example.com"])
        try:
            wait_for(lambda: len(server.messages) == 2, timeout=20, what="the second email")
        finally:
            server.release.set()

    assert [message["Subject"] for _, message in server.messages] == [
        "[Opsdeck] First", "[Opsdeck] Second"
    ]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_mail_server_out_of_reach_holds_the_mail_worker_one_timeout_for_a_burst(settings):
    """Not one timeout per email: the first found the server silent, and beat's minute asks
    for the rest, which the server takes once it answers."""
    with blackhole_server(settings) as hole:
        settings.EMAIL_TIMEOUT = 1
        for n in range(3):
            mail.send(subject=f"[Opsdeck] Hello {n}", body="Hello.", to=["a@example.com"])
        assert mail.send_new() == 0
        assert len(hole.accepted) == 1

    first, *rest = OutgoingEmail.objects.order_by("pk")
    assert (first.attempts, "timed out" in first.last_error) == (1, True)
    assert [(email.attempts, email.last_error) for email in rest] == [(0, ""), (0, "")]
    with smtp_server(settings, Recorder()) as server:
        for pk in OutgoingEmail.objects.values_list("pk", flat=True):
            assert mail.deliver(pk, now=timezone.now() + timedelta(minutes=1))
    assert len(server.messages) == 3
    assert not OutgoingEmail.objects.exists()


@pytest.mark.usefixtures("mail_at_commit")
def test_an_email_queued_whole_before_emails_were_kept_is_still_sent():
    from accounts.tasks import email_send

    email_send.delay({"subject": "[Opsdeck] Hello", "body": "Hello.", "to": ["a@example.com"]})

    [sent] = outbox.outbox
    assert (sent.subject, sent.to) == ("[Opsdeck] Hello", ["a@example.com"])


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


@pytest.mark.django_db
def test_a_waiting_emails_link_is_not_stored_in_the_clear_and_is_sent_whole(settings):
    link = "https://opsdeck.example/accounts/password/reset/key/abc-s3cret/"
    mail.send(subject="[Opsdeck] Reset", body=f"Open {link}", to=["ann@example.com"],
              html=f'<a href="{link}">Reset</a>')  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("SELECT body, html FROM accounts_outgoingemail")
        stored = cursor.fetchone()
    assert all("abc-s3cret" not in column for column in stored)

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    [email] = OutgoingEmail.objects.all()
    assert mail.deliver(email.pk)
    [sent] = outbox.outbox
    assert link in sent.body and link in sent.alternatives[0][0]


@pytest.mark.django_db
def test_staff_do_not_read_a_waiting_password_reset_link_in_the_admin(client, owner, make_user):
    """The admin shows what waits and why, not the body: its link would let whoever reads it
    into the customer's account."""
    assert client.post("/accounts/password/reset/", {"email": owner.email}).status_code == 302
    email = OutgoingEmail.objects.get(to=[owner.email])
    key = re.search(r"/password/reset/key/(\S+?)/", email.body)[1]
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))

    page = client.get(f"/admin/accounts/outgoingemail/{email.pk}/change/")

    assert page.status_code == 200
    assert "Password Reset" in page.content.decode()  # its subject
    assert key not in page.content.decode()


@pytest.mark.django_db
def test_emails_waiting_from_before_bodies_were_encrypted_are_encrypted_by_the_migration():
    encrypting = importlib.import_module("accounts.migrations.0013_outgoing_email_encrypted")
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO accounts_outgoingemail ("to", subject, body, html, created_at,'
            " next_attempt_at, attempts, last_error) VALUES ('[\"a@example.com\"]', 'Hi',"
            " 'the link', '', now(), now(), 0, '')"
        )
    before = MigrationExecutor(connection).loader.project_state(("accounts", "0012_outgoing_email"))

    encrypting.encrypt_waiting(before.apps, None)

    [email] = OutgoingEmail.objects.all()
    assert email.body == "the link" and email.html == ""
