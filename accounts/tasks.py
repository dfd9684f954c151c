from celery import shared_task

from accounts import idempotency, services


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
