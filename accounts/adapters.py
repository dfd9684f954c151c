from allauth.account.adapter import DefaultAccountAdapter
from allauth.mfa.adapter import DefaultMFAAdapter

from accounts import crypto, services
from accounts.audit import Actor


class AccountAdapter(DefaultAccountAdapter):
    def save_user(self, request, user, form, commit=True):
        """Sign-up: the new user owns a first organization from the start."""
        user = super().save_user(request, user, form, commit=commit)
        if commit:
            name = (form.cleaned_data.get("organization") or "").strip()
            services.tenant_create(
                actor=Actor.from_request(request, user=user),
                name=name or f"{user.email.split('@')[0]}'s organization",
            )
        return user


class MFAAdapter(DefaultMFAAdapter):
    """TOTP secrets and recovery-code seeds are stored encrypted, like every secret."""

    def encrypt(self, text: str) -> str:
        return crypto.encrypt(text)

    def decrypt(self, encrypted_text: str) -> str:
        return crypto.decrypt(encrypted_text)
