"""Email, sent by the mail worker rather than by the process that has something to say.

A request, an operation's last move or one of beat's rounds renders its email into an
`OutgoingEmail` row, in its own transaction, and once that commits asks the mail worker to send
it, on the mail queue (`settings.OPSDECK_MAIL_QUEUE`), which only the Procfile's `mail` worker
consumes. A mail server that is slow, refuses or never answers therefore holds a mail worker's
thread, not the web process or the worker that moves operations.

The row is the email until the mail server takes it: a broker out of reach at commit, a message
lost or a mail worker that died leaves it waiting, and beat's minute (`send_due`) asks again; a
failed send is tried again later and later, for OPSDECK_EMAIL_GIVE_UP_HOURS. Delivery is at
least once: a worker killed between the mail server taking an email and deleting its row sends
it again once its claim has expired.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from smtplib import SMTPRecipientsRefused

from django.conf import settings
from django.core.mail import BadHeaderError, EmailMultiAlternatives
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import OutgoingEmail

log = logging.getLogger(__name__)

# An email's own message asks for it at once; beat asks for one no attempt took this long after.
DUE = timedelta(minutes=1)
# An attempt holds its email this long: longer than a send to a server that answers each step
# at the last moment of EMAIL_TIMEOUT. A worker that died holding one frees it when it ends.
CLAIM = timedelta(minutes=5)
# A message beat sent and no worker took this long after is presumed lost (the mail worker not
# running): beat sends another then, and the first, should it arrive later, is dropped.
REDISPATCH = timedelta(minutes=10)
# After a failed attempt: a minute, then twice as long each time up to a quarter of an hour.
BACKOFF_FIRST, BACKOFF_MAX = timedelta(minutes=1), timedelta(minutes=15)
DUE_PER_ROUND = 1000  # emails beat asks for in one minute; the rest the next
_TABLE = OutgoingEmail._meta.db_table


def send(*, subject: str, body: str, to: Sequence[str], html: str | None = None) -> None:
    """Send an email to `to` (one email, every address in its To) once the current transaction
    commits, at once outside one; nothing when the transaction rolls back."""
    email = OutgoingEmail.objects.create(
        # A subject is one header line: a line break in a name it holds would be refused
        # at every attempt to send it.
        to=list(to), subject=" ".join(subject.split()), body=body, html=html or "",
        next_attempt_at=timezone.now() + DUE,
    )  # fmt: skip
    # A broker out of reach at commit logs and loses the message, not the email: beat asks.
    transaction.on_commit(lambda: _dispatch(email.pk), robust=True)


def _dispatch(pk: int) -> None:
    from accounts.tasks import email_send  # the tasks import the services, which import this

    email_send.apply_async(args=[pk], expires=REDISPATCH.total_seconds())


def deliver(pk: int, *, now: datetime | None = None) -> bool:
    """Hand the waiting email `pk` to the mail server (the mail worker's part); whether this
    call sent it.

    The email is claimed first, in one UPDATE: two messages for one email (beat's and its own,
    or one delivered twice) never both send it. A failed send is tried again after the back-off
    (beat's `send_due`), until OPSDECK_EMAIL_GIVE_UP_HOURS after it was written; a mail server
    that refuses every recipient would refuse again, and is not asked again."""
    now = now or timezone.now()
    # Claimed and read in one statement, and deleted in one more: built with the ORM, these
    # cost the mail worker more than building and sending the email.
    claimed = list(
        OutgoingEmail.objects.raw(
            f"UPDATE {_TABLE} SET claimed_until = %s, attempts = attempts + 1"  # noqa: S608
            " WHERE id = %s AND given_up_at IS NULL"
            " AND (claimed_until IS NULL OR claimed_until < %s) RETURNING *",
            [now + CLAIM, pk, now],
        )
    )
    if not claimed:  # sent, given up on, or under way
        return False
    email = claimed[0]
    try:
        _smtp_send(email)
    except (OSError, BadHeaderError) as exc:  # every SMTPException is an OSError
        _failed(email, exc, now=now)
        return False
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {_TABLE} WHERE id = %s", [pk])  # noqa: S608 - our table
    return True


def _smtp_send(email: OutgoingEmail) -> None:
    message = EmailMultiAlternatives(
        subject=email.subject, body=email.body, from_email=settings.DEFAULT_FROM_EMAIL,
        to=email.to,
    )  # fmt: skip
    if email.html:
        message.attach_alternative(email.html, "text/html")
    message.send()


def _failed(email: OutgoingEmail, exc: OSError | BadHeaderError, *, now: datetime) -> None:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    give_up_at = email.created_at + timedelta(hours=settings.OPSDECK_EMAIL_GIVE_UP_HOURS)
    changes = {"claimed_until": None, "last_error": error}
    # Refused by the mail server, or a header no attempt can send: not tried again.
    if isinstance(exc, SMTPRecipientsRefused | BadHeaderError) or now >= give_up_at:
        changes["given_up_at"] = now
        log.error("email %s to %s given up on after %s attempts: %s",
                  email.pk, email.to, email.attempts, error)  # fmt: skip
    else:
        backoff = min(BACKOFF_FIRST * 2 ** (email.attempts - 1), BACKOFF_MAX)
        changes["next_attempt_at"] = now + backoff
        log.warning("email %s to %s not sent (attempt %s), tried again in %s: %s",
                    email.pk, email.to, email.attempts, backoff, error)  # fmt: skip
    OutgoingEmail.objects.filter(pk=email.pk).update(**changes)


def send_due(*, now: datetime | None = None) -> int:
    """Ask the mail worker for each email whose time has come (one whose own message was lost,
    or a failed one whose back-off has passed), and forget the given-up ones kept long enough;
    how many were asked for (run every minute by beat)."""
    now = now or timezone.now()
    OutgoingEmail.objects.filter(
        given_up_at__lt=now - timedelta(days=settings.OPSDECK_EMAIL_GIVEN_UP_KEPT_DAYS)
    ).delete()
    due = list(
        waiting()
        .filter(Q(claimed_until=None) | Q(claimed_until__lt=now), next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:DUE_PER_ROUND]
    )
    for pk in due:
        _dispatch(pk)  # a broker out of reach fails the round: the next one asks again
    # Asked for: asked again only if no worker has taken it by REDISPATCH (one that already
    # failed has set its back-off; one sent is gone).
    OutgoingEmail.objects.filter(pk__in=due, next_attempt_at__lte=now).update(
        next_attempt_at=now + REDISPATCH
    )
    return len(due)


def waiting():
    """The emails not sent yet and not given up on."""
    return OutgoingEmail.objects.filter(given_up_at=None)
