"""Sign-in and MFA events, which django-allauth owns, recorded in the audit log."""

from allauth.mfa.signals import authenticator_added, authenticator_removed
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import receiver

from accounts.audit import Actor, audit_record


@receiver(user_logged_in)
def _logged_in(sender, request, user, **kwargs):
    audit_record(actor=Actor.from_request(request, user=user), action="user.login", target=user)


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs):
    if user is not None:
        audit_record(
            actor=Actor.from_request(request, user=user), action="user.logout", target=user
        )


@receiver(authenticator_added)
def _mfa_added(sender, request, user, authenticator, **kwargs):
    audit_record(
        actor=Actor.from_request(request, user=user),
        action="mfa.add",
        target=user,
        payload={"type": authenticator.type},
    )


@receiver(authenticator_removed)
def _mfa_removed(sender, request, user, authenticator, **kwargs):
    audit_record(
        actor=Actor.from_request(request, user=user),
        action="mfa.remove",
        target=user,
        payload={"type": authenticator.type},
    )
