"""Account security events, which django-allauth owns, recorded in the audit log."""

from allauth.account.signals import (
    email_added,
    email_changed,
    email_confirmed,
    email_removed,
    password_changed,
    password_reset,
    password_set,
)
from allauth.mfa.signals import authenticator_added, authenticator_removed, authenticator_reset
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import receiver

from accounts import services
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


@receiver(password_changed)
@receiver(password_set)
@receiver(password_reset)
def _password(sender, request, user, **kwargs):
    audit_record(actor=Actor.from_request(request, user=user), action="user.password", target=user)


@receiver(email_added)
@receiver(email_removed)
def _email(sender, request, user, email_address, **kwargs):
    action = "user.email_add" if kwargs["signal"] is email_added else "user.email_remove"
    audit_record(
        actor=Actor.from_request(request, user=user),
        action=action,
        target=user,
        payload={"email": email_address.email},
    )


@receiver(email_changed)
def _email_primary(sender, request, user, from_email_address, to_email_address, **kwargs):
    audit_record(
        actor=Actor.from_request(request, user=user),
        action="user.email_primary",
        target=user,
        payload={"email": to_email_address.email},
    )


@receiver(authenticator_reset)
def _mfa_reset(sender, request, user, authenticator, **kwargs):
    audit_record(
        actor=Actor.from_request(request, user=user),
        action="mfa.reset",
        target=user,
        payload={"type": authenticator.type},
    )


@receiver(email_confirmed)
def _email_confirmed(sender, request, email_address, **kwargs):
    """The account that confirmed an address owns it: other accounts' unconfirmed copies go."""
    services.email_address_claim(
        email_address.email, owner=email_address.user, reason="another account confirmed it"
    )
