from smtplib import SMTPRecipientsRefused

from celery import shared_task

from accounts import idempotency, mail, services


# A mail server that cannot be reached, times out or answers an error (every SMTPException is an
# OSError) is tried again after 10 s, then twice as long each time up to 4 minutes, for about an
# hour; one that refuses every recipient would refuse again. The wait stays below the Redis
# broker's visibility timeout (300 s): a message held longer is delivered again, and the email
# would be sent twice.
@shared_task(
    autoretry_for=(OSError,),
    dont_autoretry_for=(SMTPRecipientsRefused,),
    retry_backoff=10,
    retry_backoff_max=240,
    retry_jitter=False,
    max_retries=18,
)
def email_send(message: dict) -> None:
    """Send one email `accounts.mail.send` queued (on the mail queue)."""
    mail.deliver(message)


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
