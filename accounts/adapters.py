from urllib.parse import urlsplit

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.utils import get_next_redirect_url
from allauth.core import context as allauth_context
from allauth.core import ratelimit
from allauth.mfa.adapter import DefaultMFAAdapter
from django.conf import settings
from django.contrib import messages
from django.contrib.sites.requests import RequestSite
from django.db import transaction
from django.urls import Resolver404, resolve

from accounts import crypto, selectors, services
from accounts.audit import Actor
from accounts.models import Tenant

SITE_NAME = "Opsdeck"


def _signs_up_from_invitation(request) -> bool:
    """Whether the sign-up was opened from an invitation (which sends `next=/invitations/…`)."""
    next_url = get_next_redirect_url(request)
    if not next_url:
        return False
    try:
        return resolve(urlsplit(next_url).path).url_name == "invitation_accept"
    except Resolver404:
        return False


class AccountAdapter(DefaultAccountAdapter):
    def send_mail(self, template_prefix: str, email: str, context: dict) -> None:
        """Emails name the product, not the host the request came to (there is no Sites app)."""
        site = RequestSite(allauth_context.request)
        site.name = SITE_NAME
        base = {"current_site": site, "base_url": settings.OPSDECK_BASE_URL}
        super().send_mail(template_prefix, email, {**base, **context})

    def save_user(self, request, user, form, commit=True):
        """Sign-up: the new user owns a first organization from the start (both or neither).

        An invitee joins the inviting organization instead: with a blank name they get none,
        whether they came from the invitation's link or signed up with the invited address.
        """
        if not commit:
            return super().save_user(request, user, form, commit=False)
        with transaction.atomic():
            user = super().save_user(request, user, form, commit=True)
            self._claim_sign_in_address(request, user)
            name = (form.cleaned_data.get("organization") or "").strip()
            if not name and (
                _signs_up_from_invitation(request)
                or selectors.invitations_open_to(user.email).exists()
            ):
                return user  # they find their invitations once they confirm the address
            if not name:
                suffix = "'s organization"
                limit = Tenant._meta.get_field("name").max_length - len(suffix)
                name = user.email.split("@")[0][:limit] + suffix
            services.tenant_create(actor=Actor.from_request(request, user=user), name=name)
        return user

    def _claim_sign_in_address(self, request, user) -> None:
        """The address a new account signs in with is its own to confirm: the copies other
        accounts added and never confirmed go, with the confirmation links they mailed to it.
        Adding one mailed the address moments ago perhaps, which began allauth's cooldown for
        it (one email per address every few minutes): the sign-up's own confirmation must not
        wait for it, or the only link its owner holds would be the other account's."""
        dropped = services.email_address_claim(
            user.email, owner=user, reason="another account signed up with it"
        )
        if dropped:
            ratelimit.clear(request, action="confirm_email", key=user.email.lower())

    def confirm_email(self, request, email_address) -> bool:
        """As allauth's; refused for an address another account signs in with (or owns): only
        that account may confirm it. (Its sign-up dropped other accounts' copies; one added at
        the same moment would otherwise be confirmable by its link.)"""
        if not selectors.email_address_unclaimed(email_address.email, besides=email_address.user):
            self.add_message(
                request,
                messages.ERROR,
                "account/messages/email_confirmation_taken.txt",
                {"email": email_address.email},
            )
            return False
        return super().confirm_email(request, email_address)


class MFAAdapter(DefaultMFAAdapter):
    """TOTP secrets and recovery-code seeds are stored encrypted, like every secret."""

    def encrypt(self, text: str) -> str:
        return crypto.encrypt(text)

    def decrypt(self, encrypted_text: str) -> str:
        return crypto.decrypt(encrypted_text)
