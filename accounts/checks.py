from cryptography.fernet import Fernet
from django.conf import settings
from django.core.checks import Error, register


@register()
def encryption_keys_check(app_configs, **kwargs):
    errors = []
    for position, key in enumerate(settings.OPSDECK_ENCRYPTION_KEYS, start=1):
        try:
            Fernet(key)
        except ValueError:
            errors.append(
                Error(
                    f"Key {position} in OPSDECK_ENCRYPTION_KEYS is not a Fernet key.",
                    hint="Generate one with: python -c 'from cryptography.fernet import "
                    "Fernet; print(Fernet.generate_key().decode())'",
                    id="accounts.E001",
                )
            )
    return errors
