from celery import shared_task

from accounts import idempotency, mail, services


@shared_task
def email_send(email: int | dict) -> None:
    """Send one email `accounts.mail.send` wrote (on the mail queue)."""
    if isinstance(email, dict):  # queued whole, before emails were kept: kept now, and sent
        mail.send(**email)
    else:
        mail.deliver(email)


@shared_task
def emails_send_new() -> int:
    """Send the emails written since the last message asked for them (on the mail queue)."""
    return mail.send_new()


@shared_task
def emails_send_due() -> int:
    """Ask again for the emails a lost message or a failed send left waiting (run every minute
    by beat)."""
    return mail.send_due()


@shared_task
def invitation_send(invitation_pk: int) -> None:
    services.invitation_email_send(invitation_pk=invitation_pk)


@shared_task
def invitations_mail_unsent() -> int:
    """Send again the invitation emails a lost message or the mail server left unsent (run
    every minute by beat)."""
    return services.invitations_mail_unsent()


@shared_task
def unconfirmed_sign_ups_close() -> int:
    """Release the addresses of sign-ups never confirmed (run daily by beat)."""
    return services.unconfirmed_sign_ups_close()


@shared_task
def request_ids_prune() -> int:
    """Forget request ids used long ago (run daily by beat)."""
    return idempotency.request_ids_prune()
