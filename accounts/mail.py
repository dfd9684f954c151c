"""Email, sent by the mail worker rather than by the process that has something to say.

A request, an operation's last move or one of beat's rounds renders its email and leaves it, once
its transaction commits, on the mail queue (`settings.OPSDECK_MAIL_QUEUE`), which only the
Procfile's `mail` worker consumes. A mail server that is slow, refuses or never answers
therefore holds a mail worker's thread, not the web process or the worker that moves operations,
and a send that failed is tried again (`accounts.tasks.email_send`). The message carries the
whole email, so the mail worker reads nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import transaction


def send(*, subject: str, body: str, to: Sequence[str], html: str | None = None) -> None:
    """Send an email to `to` (one email, every address in its To) once the current transaction
    commits, at once outside one; nothing when the transaction rolls back."""
    message = {"subject": subject, "body": body, "to": list(to)}
    if html is not None:
        message["html"] = html
    transaction.on_commit(lambda: _queue(message), robust=True)


def _queue(message: dict) -> None:
    from accounts.tasks import email_send  # the tasks import the services, which import this

    email_send.delay(message)


def deliver(message: dict) -> None:
    """Hand one queued email to the mail server (the mail worker's part)."""
    email = EmailMultiAlternatives(
        subject=message["subject"],
        body=message["body"],
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=message["to"],
    )
    if message.get("html"):
        email.attach_alternative(message["html"], "text/html")
    email.send()
