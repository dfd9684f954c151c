"""Email, sent by the mail worker rather than by the process that has something to say.

A request, an operation's last move or one of beat's rounds renders its email into an
`OutgoingEmail` row, in its own transaction, and once that commits asks the mail worker to send
it, on the mail queue (`settings.OPSDECK_MAIL_QUEUE`), which only the Procfile's `mail` worker
consumes. A mail server that is slow, refuses or never answers therefore holds a mail worker's
thread, not the web process or the worker that moves operations.

One message asks for every new email, not one each: the emails written in the second it
waits, or until the mail worker takes it, ride on it (`_ask`), and the mail worker sends them
all, oldest first, over one connection to the mail server (`send_new`). A burst of emails
(every instance of a fleet upgrade ending) is one message and one connection.

The row is the email until the mail server takes it: a broker out of reach at commit, a message
lost or a mail worker that died leaves it waiting, and beat's minute (`send_due`) asks again; a
failed send is tried again later and later, for OPSDECK_EMAIL_GIVE_UP_HOURS. Delivery is at
least once: a worker killed between the mail server taking an email and deleting its row sends
it again once its claim has expired.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import suppress
from datetime import datetime, timedelta
from smtplib import SMTPRecipientsRefused

from django.conf import settings
from django.core.cache import cache
from django.core.mail import BadHeaderError, EmailMultiAlternatives, get_connection
from django.core.mail.backends.base import BaseEmailBackend
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
# Set (in the cache every process shares) while a message asking the mail worker for the new
# emails is on its way: an email written meanwhile rides on it. It lapses after DUE, when beat
# asks for an email whose message was lost anyway.
ASKED = "mail:new-emails-asked"
# How long that message waits before the mail worker takes it: the emails written meanwhile
# (all those of a burst, one every few milliseconds while operations end in numbers) go with
# it, not each with a message of its own. Nobody waits on an email by the second.
GATHER = timedelta(seconds=1)
_TABLE = OutgoingEmail._meta.db_table


def send(*, subject: str, body: str, to: Sequence[str], html: str | None = None) -> None:
    """Send an email to `to` (one email, every address in its To) once the current transaction
    commits, at once outside one; nothing when the transaction rolls back."""
    OutgoingEmail.objects.create(
        # A subject is one header line: a line break in a name it holds would be refused
        # at every attempt to send it.
        to=list(to), subject=" ".join(subject.split()), body=body, html=html or "",
        next_attempt_at=timezone.now() + DUE,
    )  # fmt: skip
    # A broker out of reach at commit logs and loses the message, not the email: beat asks.
    transaction.on_commit(_ask, robust=True)


def _ask() -> None:
    """Ask the mail worker to send the new emails (`send_new`), unless a message asking for
    them is already on its way: it was sent before this email committed, and the worker reads
    the emails only after it took the message (it clears `ASKED` first, then reads), so it
    sends this one too."""
    from accounts.tasks import emails_send_new  # the tasks import the services, which import this

    if not cache.add(ASKED, True, timeout=DUE.total_seconds()):
        return
    try:
        emails_send_new.apply_async(
            countdown=GATHER.total_seconds(), expires=REDISPATCH.total_seconds()
        )
    except Exception:
        cache.delete(ASKED)  # none on its way: the next email asks again
        raise


def _dispatch(pk: int) -> None:
    from accounts.tasks import email_send  # the tasks import the services, which import this

    email_send.apply_async(args=[pk], expires=REDISPATCH.total_seconds())


def deliver(pk: int, *, now: datetime | None = None) -> bool:
    """Hand the waiting email `pk` to the mail server (the mail worker's part, on beat's
    message for it); whether this call sent it.

    The email is claimed first, in one UPDATE: two messages for one email (beat's and the one
    for the new emails, or one delivered twice) never both send it. A failed send is tried
    again after the back-off (beat's `send_due`), until OPSDECK_EMAIL_GIVE_UP_HOURS after it
    was written; a mail server that refuses every recipient would refuse again, and is not
    asked again."""
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


def send_new() -> int:
    """Send every email no attempt has taken yet, oldest first, over one connection to the mail
    server (the mail worker's part, on the message `_ask` sent); how many it sent.

    Each is claimed as `deliver` claims one, in the statement that deletes the one sent before
    it: a worker killed meanwhile sends again at most the email in hand. Several workers share
    the emails, each claiming the next no other holds. An email the mail server does not take
    is tried again after its back-off, as `deliver` does, and the next goes on a new connection;
    a server that cannot be reached (refused, or no answer in EMAIL_TIMEOUT) is not asked again
    for the rest, which beat's minute asks for (a mail worker thread waits out one timeout, not
    one per email)."""
    cache.delete(ASKED)  # before reading: an email committed from now on asks again
    backend = get_connection()
    sent, done = 0, None
    try:
        while (email := _claim_new(done)) is not None:
            done = None
            try:
                backend.open()  # a no-op while open: send_messages then leaves it open
            except OSError as exc:
                _failed(email, exc, now=timezone.now())
                break
            try:
                _smtp_send(email, backend)
            except (OSError, BadHeaderError) as exc:
                _failed(email, exc, now=timezone.now())
                if not isinstance(exc, SMTPRecipientsRefused | BadHeaderError):
                    _close(backend)  # the server may have closed it (a 421)
                continue
            done, sent = email.pk, sent + 1
    finally:
        if done is not None:
            OutgoingEmail.objects.filter(pk=done).delete()
        _close(backend)
    return sent


def _close(backend: BaseEmailBackend) -> None:
    with suppress(OSError):  # a server that failed may not answer a QUIT either
        backend.close()


def _claim_new(done: int | None) -> OutgoingEmail | None:
    """Claim the oldest email no attempt has taken and no other worker is claiming, deleting
    the email `done` (sent) in the same statement."""
    now = timezone.now()
    claimed = list(
        OutgoingEmail.objects.raw(
            f"WITH sent AS (DELETE FROM {_TABLE} WHERE id = %s)"  # noqa: S608 - our table
            f" UPDATE {_TABLE} SET claimed_until = %s, attempts = attempts + 1"
            f" WHERE id = (SELECT id FROM {_TABLE} WHERE attempts = 0 AND given_up_at IS NULL"
            "              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
            " RETURNING *",
            [done, now + CLAIM],
        )
    )
    return claimed[0] if claimed else None


def _smtp_send(email: OutgoingEmail, backend: BaseEmailBackend | None = None) -> None:
    """Send `email` over `backend`'s connection (a connection of its own without)."""
    message = EmailMultiAlternatives(
        subject=email.subject, body=email.body, from_email=settings.DEFAULT_FROM_EMAIL,
        to=email.to, connection=backend,
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
