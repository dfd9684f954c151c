"""An invitation is its email's outbox: the email a lost message or a refusing mail server left
unsent is sent again by beat, a few times, and the team page says where each one stands."""

import socket
from datetime import timedelta

from django.core import mail
from django.utils import timezone

from accounts import services
from accounts.audit import Actor
from accounts.models import Invitation
from accounts.tasks import invitation_send, invitations_mail_unsent

SEND = "accounts.tasks.invitation_send"


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

    # Not in its first minute (its own send may still be on the way), then once a minute.
    assert services.invitations_mail_unsent(now=now) == 0
    assert services.invitations_mail_unsent(now=now + timedelta(seconds=61)) == 1
    assert broker.sent == [(SEND, [invitation.pk])]

    invitation_send.apply(args=[invitation.pk])  # a worker takes it

    assert [m.to for m in mail.outbox] == [["new@example.com"]]
    assert Invitation.objects.get(pk=invitation.pk).emailed_at is not None
    # Sent: never again, by beat or by a late duplicate of the message.
    assert services.invitations_mail_unsent(now=now + timedelta(seconds=121)) == 0
    invitation_send.apply(args=[invitation.pk])
    assert len(mail.outbox) == 1


def test_an_email_the_mail_server_refuses_is_retried_a_few_times_then_said_on_the_team_page(
    transactional_db, owner, tenant, broker, settings, owner_client
):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = closed.getsockname()  # nothing listens
    settings.EMAIL_TIMEOUT = 3
    broker.back()
    invitation = _invite(owner, tenant)
    now = timezone.now()

    result = invitation_send.apply(args=[invitation.pk])

    assert isinstance(result.result, ConnectionRefusedError)
    assert Invitation.objects.get(pk=invitation.pk).emailed_at is None
    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert "Being sent" in page and "Not sent" not in page
    sends = [
        services.invitations_mail_unsent(now=now + timedelta(minutes=minute))
        for minute in range(1, 9)
    ]
    assert sends == [1] * Invitation.EMAIL_RETRIES + [0, 0, 0]
    page = owner_client.get(f"/t/{tenant.slug}/team/").content.decode()
    assert "Not sent" in page and "withdraw it and invite again" in page
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


def test_beat_sends_unsent_invitation_emails_every_minute(settings, db):
    entry = settings.CELERY_BEAT_SCHEDULE["invitations-mail-unsent"]
    assert entry == {"task": invitations_mail_unsent.name, "schedule": 60.0}
    assert invitations_mail_unsent.apply().get() == 0
