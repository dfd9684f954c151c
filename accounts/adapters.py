from urllib.parse import urlsplit

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.utils import get_next_redirect_url
from allauth.core import context as allauth_context
from allauth.core import ratelimit
from allauth.mfa.adapter import DefaultMFAAdapter
from django.conf import settings
from django.contrib import messages
from django.contrib.sites.requests import RequestSite
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import Resolver404, resolve

from accounts import crypto, mail, selectors, services
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


def _organization_named_after(email: str) -> str:
    """The first organization of a user who named none: "kim's organization", from the
    address's local part, or "My organization" when that would not make a name
    (`services.organization_name_clean`)."""
    suffix = "'s organization"
    limit = Tenant._meta.get_field("name").max_length - len(suffix)
    try:
        return services.organization_name_clean(email.rsplit("@", 1)[0][:limit] + suffix)
    except ValidationError:
        return "My organization"


def _on_public_address(request, context: dict) -> dict:
    """The context's links to this portal on OPSDECK_BASE_URL, as every other email's are, not
    on the host the request named (any ALLOWED_HOSTS lets in). allauth builds them from the
    request in several places (the confirmation and reset links through adapter methods, the
    sign-up and reset links of its unknown-account and account-exists emails in its flows):
    each reaches the email through here."""
    public = settings.OPSDECK_BASE_URL.rstrip("/")
    if not public:
        return context
    here = request.build_absolute_uri("/")
    return {
        key: f"{public}/{value.removeprefix(here)}"
        if isinstance(value, str) and value.startswith(here)
        else value
        for key, value in context.items()
    }


class AccountAdapter(DefaultAccountAdapter):
    def send_mail(self, template_prefix: str, email: str, context: dict) -> None:
        """Emails name the product, not the host the request came to (there is no Sites app),
        and link to the portal's public address. The mail worker sends them (`accounts.mail`):
        a mail server that is slow or never answers holds no web process, and a sign-up still
        gets its page."""
        request = allauth_context.request
        site = RequestSite(request)
        site.name = SITE_NAME
        base = {"request": request, "email": email, "current_site": site}
        message = self.render_mail(
            template_prefix,
            email,
            {**base, "base_url": settings.OPSDECK_BASE_URL, **_on_public_address(request, context)},
        )
        alternatives = getattr(message, "alternatives", [])
        html = next((content for content, kind in alternatives if kind == "text/html"), None)
        mail.send(subject=message.subject, body=message.body, to=message.to, html=html)

    def save_user(self, request, user, form, commit=True):
        """Sign-up: the new user owns a first organization from the start (both or neither).

        An invitee joins the inviting organization instead: with a blank name they get none,
        whether they came from the invitation's link or signed up with the invited address.
        """
        if not commit:
            return super().save_user(request, user, form, commit=False)
        with transaction.atomic():
            user = super().save_user(request, user, form, commit=True)
            dropped = self._claim_sign_in_address(user)
            name = (form.cleaned_data.get("organization") or "").strip()
            if name or not (
                _signs_up_from_invitation(request)
                or selectors.invitations_open_to(user.email).exists()
            ):  # else they find their invitations once they confirm the address
                services.tenant_create(
                    actor=Actor.from_request(request, user=user),
                    name=name or _organization_named_after(user.email),
                )
            if dropped:
                # Adding a copy mailed the address moments ago perhaps, which began allauth's
                # cooldown for it (one email per address every few minutes): the sign-up's own
                # confirmation must not wait for it, or the only link its owner holds would be
                # the other account's. Cleared last, once nothing can refuse the sign-up: one
                # refused (rolled back, dropping nothing) must not leave the address open to
                # any number of emails.
                ratelimit.clear(request, action="confirm_email", key=user.email.lower())
        return user

    def clean_email(self, email: str) -> str:
        """Every address a form takes (sign-up, Email page, password reset) as the mail server
        reads it (`services.email_address_clean`): a look-alike of an address (a full-width
        letter) is that address, and the rules about who owns it hold for it."""
        return services.email_address_clean(super().clean_email(email))

    def _claim_sign_in_address(self, user) -> int:
        """The address a new account signs in with is its own to confirm: the copies other
        accounts added and never confirmed go, with the confirmation links they mailed to it.
        How many went."""
        return services.email_address_claim(
            user.email, owner=user, reason="another account signed up with it"
        )

    def confirm_email(self, request, email_address) -> bool:
        """As allauth's; refused for an address another account signs in with (or owns): only
        that account may confirm it. (Its sign-up dropped other accounts' copies; one added at
        the same moment would otherwise be confirmable by its link.) Every account's copy of
        the address is locked first, in one order, so that two accounts confirming it at the
        same moment go one after the other: the second finds the first owns it."""
        with transaction.atomic():
            services.email_address_lock(email_address.email)
            if selectors.email_address_unclaimed(email_address.email, besides=email_address.user):
                return super().confirm_email(request, email_address)
        self.add_message(
            request,
            messages.ERROR,
            "account/messages/email_confirmation_taken.txt",
            {"email": email_address.email},
        )
        return False


class MFAAdapter(DefaultMFAAdapter):
    """TOTP secrets and recovery-code seeds are stored encrypted, like every secret."""

    def encrypt(self, text: str) -> str:
        return crypto.encrypt(text)

    def decrypt(self, encrypted_text: str) -> str:
        return crypto.decrypt(encrypted_text)
