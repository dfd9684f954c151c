"""An invitation is its email's outbox: a worker claims each attempt before it sends, beat sends
again the email a lost message or a failing mail server left unsent, a few times, and the team
page says where each one stands."""

import socket
import threading
import time
from datetime import timedelta

from django.core import mail
from django.core.mail.backends.locmem import EmailBackend
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import services
from accounts.audit import Actor
from accounts.models import Invitation
from accounts.tasks import invitation_send, invitations_mail_unsent

SEND = "accounts.tasks.invitation_send"
LEASE = services.INVITATION_EMAIL_LEASE


def _invite(owner, tenant, email="new@example.com"):
    return services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email=email, role="viewer"
    )


def test_an_invitation_made_while_the_broker_was_down_is_mailed_once_it_is_back(
    transactional_db, owner, tenant, broker
):
    broker.down()
    invitation = _invite(owner, tenant)
    broker.back()
    now = timezone.now()

    # Not in its first minute (its own message may still be on the way), then once a minute.
    assert services.invitations_mail_unsent(now=now) == 0
    assert services.invitations_mail_unsent(now=now + timedelta(seconds=61)) == 1
    assert broker.sent == [(SEND, [invitation.pk])]

    invitation_send.apply(args=[invitation.pk])  # a worker takes it

    assert [m.to for m in mail.outbox] == [["new@example.com"]]
    assert Invitation.objects.get(pk=invitation.pk).emailed_at is not None
    # Sent: never again, by beat or by a late duplicate of the message.
    assert services.invitations_mail_unsent(now=now + timedelta(minutes=10)) == 0
    invitation_send.apply(args=[invitation.pk])
    assert len(mail.outbox) == 1


class SlowBackend(EmailBackend):
    """Django's in-memory mail backend, as slow as a distant mail server."""

    def send_messages(self, messages):
        time.sleep(0.5)
        return super().send_messages(messages)


def test_two_workers_handed_the_same_invitation_send_it_once(
    transactional_db, owner, tenant, broker, settings
):
    """Beat sent it again while the first message waited in a backlog: both messages reach a
    worker at once, and the mail server is slow."""
    broker.back()
    invitation = _invite(owner, tenant)
    settings.EMAIL_BACKEND = f"{__name__}.SlowBackend"
    start = threading.Barrier(2)

    def worker():
        start.wait()
        try:
            invitation_send.apply(args=[invitation.pk])
        finally:
            connection.close()

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(30)

    assert [m.to for m in mail.outbox] == [["new@example.com"]]
    assert Invitation.objects.get(pk=invitation.pk).email_attempts == 1


def test_an_email_the_mail_server_refuses_is_tried_a_few_times_then_said_on_the_team_page(
    transactional_db, owner, tenant, broker, settings, owner_client
):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # nothing listens: the connection is refused
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = closed.getsockname()
    broker.back()
    invitation = _invite(owner, tenant)
    now = timezone.now()

    result = invitation_send.apply(args=[invitation.pk])  # the first attempt, after the commit

    assert isinstance(result.result, ConnectionRefusedError)
    assert Invitation.objects.get(pk=invitation.pk).emailed_at is None
    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert "Being sent" in page and "Not sent" not in page
    # An attempt is made again only once the last one's lease has passed, by beat.
    assert services.invitations_mail_unsent(now=now + timedelta(seconds=61)) == 0
    made = [invitation.pk]
    for turn in range(1, Invitation.EMAIL_ATTEMPTS + 2):
        later = now + turn * (LEASE + timedelta(seconds=1))
        if services.invitations_mail_unsent(now=later):
            try:
                services.invitation_email_send(invitation_pk=invitation.pk, now=later)
            except ConnectionRefusedError:
                made.append(invitation.pk)
    assert len(made) == Invitation.EMAIL_ATTEMPTS  # the first and four more, then no more
    assert [pk for _, (pk,) in broker.sent] == [invitation.pk] * Invitation.EMAIL_ATTEMPTS
    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert "Not sent" in page and "Check the address and invite again" in page
    closed.close()

    # Invited again, to a mail server that takes it: the team page says when it went.
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    again = _invite(owner, tenant)
    invitation_send.apply(args=[again.pk])
    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert "Sent " in page and "Not sent" not in page and "Being sent" not in page
    assert [m.to for m in mail.outbox] == [["new@example.com"]]


def test_only_pending_invitations_are_sent_again(transactional_db, owner, tenant, broker):
    broker.back()
    withdrawn = _invite(owner, tenant, "withdrawn@example.com")
    services.invitation_revoke(actor=Actor(user=owner), invitation=withdrawn)
    expired = _invite(owner, tenant, "expired@example.com")
    Invitation.objects.filter(pk=expired.pk).update(created_at=timezone.now() - timedelta(days=8))
    waiting = _invite(owner, tenant, "waiting@example.com")
    broker.sent.clear()

    assert services.invitations_mail_unsent(now=timezone.now() + timedelta(minutes=2)) == 1
    assert broker.sent == [(SEND, [waiting.pk])]
    for pk in (withdrawn.pk, expired.pk):
        assert not services.invitation_email_send(invitation_pk=pk)
    assert mail.outbox == []


def test_the_team_page_reads_its_invitations_in_the_same_queries_however_many(
    db, owner, tenant, owner_client
):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert owner_client.get(f"/t/{tenant.slug}/team/").status_code == 200
        return len(captured)

    _invite(owner, tenant, "one@example.com")
    queries()  # the first request of a session reads what later ones find cached
    one = queries()
    for n in range(5):
        _invite(owner, tenant, f"more{n}@example.com")

    assert queries() == one


def test_beat_sends_unsent_invitation_emails_every_minute(settings, db):
    entry = settings.CELERY_BEAT_SCHEDULE["invitations-mail-unsent"]
    assert entry == {"task": invitations_mail_unsent.name, "schedule": 60.0}
    assert invitations_mail_unsent.apply().get() == 0
