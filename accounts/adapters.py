from allauth.account.adapter import DefaultAccountAdapter
from allauth.mfa.adapter import DefaultMFAAdapter
from django.db import transaction

from accounts import crypto, services
from accounts.audit import Actor
from accounts.models import Tenant


class AccountAdapter(DefaultAccountAdapter):
    def save_user(self, request, user, form, commit=True):
        """Sign-up: the new user owns a first organization from the start (both or neither)."""
        if not commit:
            return super().save_user(request, user, form, commit=False)
        with transaction.atomic():
            user = super().save_user(request, user, form, commit=True)
            name = (form.cleaned_data.get("organization") or "").strip()
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
