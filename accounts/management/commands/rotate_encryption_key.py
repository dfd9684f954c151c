from allauth.mfa.models import Authenticator
from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts import crypto

# django-allauth keeps MFA secrets in a JSON column, encrypted through our MFA adapter.
_AUTHENTICATOR_SECRETS = {
    Authenticator.Type.TOTP: "secret",
    Authenticator.Type.RECOVERY_CODES: "seed",
}


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored secret with the first key in OPSDECK_ENCRYPTION_KEYS. "
        "Run it after putting a new key first; then the old keys can be removed."
    )

    def handle(self, *args, **options):
        total = 0
        with transaction.atomic():
            for model in apps.get_models():
                fields = [
                    f.name
                    for f in model._meta.concrete_fields
                    if isinstance(f, crypto.EncryptedTextField)
                ]
                if not fields:
                    continue
                count = 0
                for obj in model._base_manager.select_for_update().only("pk", *fields):
                    # Saving writes each value again, encrypted with the current key.
                    model._base_manager.filter(pk=obj.pk).update(
                        **{name: getattr(obj, name) for name in fields}
                    )
                    count += 1
                self.stdout.write(f"{model._meta.label}: {count} row(s) re-encrypted")
                total += count

            count = 0
            for auth in Authenticator.objects.select_for_update().filter(
                type__in=list(_AUTHENTICATOR_SECRETS)
            ):
                key = _AUTHENTICATOR_SECRETS[auth.type]
                if key not in auth.data:  # recovery codes migrated from elsewhere carry no seed
                    continue
                auth.data[key] = crypto.encrypt(crypto.decrypt(auth.data[key]))
                auth.save(update_fields=["data"])
                count += 1
            self.stdout.write(f"mfa.Authenticator: {count} secret(s) re-encrypted")
            total += count
        self.stdout.write(self.style.SUCCESS(f"Done: {total} secret(s) now use the current key."))
