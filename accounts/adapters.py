from urllib.parse import urlsplit

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.utils import get_next_redirect_url
from allauth.core import context as allauth_context
from allauth.mfa.adapter import DefaultMFAAdapter
from django.conf import settings
from django.contrib.sites.requests import RequestSite
from django.db import transaction
from django.urls import Resolver404, resolve

from accounts import crypto, services
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

        An invitee joins the inviting organization instead: with a blank name they get none.
        """
        if not commit:
            return super().save_user(request, user, form, commit=False)
        with transaction.atomic():
            user = super().save_user(request, user, form, commit=True)
            name = (form.cleaned_data.get("organization") or "").strip()
            if not name and _signs_up_from_invitation(request):
                return user
            if not name:
                suffix = "'s organization"
                limit = Tenant._meta.get_field("name").max_length - len(suffix)
                name = user.email.split("@")[0][:limit] + suffix
            services.tenant_create(actor=Actor.from_request(request, user=user), name=name)
        return user


class MFAAdapter(DefaultMFAAdapter):
    """TOTP secrets and recovery-code seeds are stored encrypted, like every secret."""

    def encrypt(self, text: str) -> str:
        return crypto.encrypt(text)

    def decrypt(self, encrypted_text: str) -> str:
        return crypto.decrypt(encrypted_text)
