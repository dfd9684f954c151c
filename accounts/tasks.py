from celery import shared_task

from accounts import services
from accounts.models import Invitation


@shared_task
def invitation_send(invitation_pk: int) -> None:
    invitation = Invitation.objects.select_related("tenant").filter(pk=invitation_pk).first()
    if invitation is not None:
        services.invitation_email_send(invitation=invitation)
