"""Account security events, which django-allauth owns, recorded in the audit log."""

from allauth.account.signals import (
    email_added,
    email_changed,
    email_confirmed,
    email_removed,
    password_changed,
    password_reset,
    password_set,
    user_signed_up,
)
from allauth.mfa.models import Authenticator
from allauth.mfa.signals import (
    authentication_failed,
    authenticator_added,
    authenticator_removed,
    authenticator_reset,
    authenticator_used,
)
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import receiver

from accounts import services
from accounts.audit import Actor, audit_record
from accounts.models import AuditEvent


def _record(request, user, action: str, payload: dict | None = None, **event) -> None:
    """One event of `user`'s account, by them (as `request` shows them), about them."""
    audit_record(
        actor=Actor.from_request(request, user=user),
        action=action,
        target=user,
        payload=payload or {},
        **event,
    )


@receiver(user_logged_in)
def _logged_in(sender, request, user, **kwargs):
    _record(request, user, "user.login")


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs):
    if user is not None:
        _record(request, user, "user.logout")


@receiver(user_signed_up)
def _signed_up(sender, request, user, **kwargs):
    _record(request, user, "user.signup", {"email": user.email})


@receiver(authenticator_used)
def _mfa_used(sender, request, user, authenticator, **kwargs):
    """A recovery code used up (each works once): a sign-in the person's authenticator app
    did not make. An app's code, used at every sign-in, is in `user.login` already."""
    if authenticator.type == Authenticator.Type.RECOVERY_CODES:
        # Read again: the code was marked used on a copy of its own.
        codes = Authenticator.objects.get(pk=authenticator.pk).wrap().get_unused_codes()
        _record(request, user, "mfa.recovery_code", {"left": len(codes)})


@receiver(authentication_failed)
def _mfa_failed(sender, request, user, authenticator=None, **kwargs):
    """A second-factor code refused: someone who knew the password, perhaps."""
    kind = {"type": authenticator.type} if authenticator is not None else {}
    _record(request, user, "mfa.verify", kind, result=AuditEvent.Result.DENIED)


@receiver(authenticator_added)
@receiver(authenticator_removed)
@receiver(authenticator_reset)
def _mfa_changed(sender, request, user, authenticator, **kwargs):
    verb = {authenticator_added: "add", authenticator_removed: "remove"}.get(
        kwargs["signal"], "reset"
    )
    _record(request, user, f"mfa.{verb}", {"type": authenticator.type})


@receiver(password_changed)
@receiver(password_set)
@receiver(password_reset)
def _password(sender, request, user, **kwargs):
    _record(request, user, "user.password")


@receiver(email_added)
@receiver(email_removed)
def _email(sender, request, user, email_address, **kwargs):
    action = "user.email_add" if kwargs["signal"] is email_added else "user.email_remove"
    _record(request, user, action, {"email": email_address.email})


@receiver(email_changed)
def _email_primary(sender, request, user, from_email_address, to_email_address, **kwargs):
    _record(request, user, "user.email_primary", {"email": to_email_address.email})


@receiver(email_confirmed)
def _email_confirmed(sender, request, email_address, **kwargs):
    """The account that confirmed an address owns it: other accounts' unconfirmed copies go."""
    services.email_address_claim(
        email_address.email, owner=email_address.user, reason="another account confirmed it"
    )
    _record(request, email_address.user, "user.email_confirm", {"email": email_address.email})
