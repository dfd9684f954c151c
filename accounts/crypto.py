"""Secrets at rest: Fernet encryption with rotation (OPSDECK_ENCRYPTION_KEYS).

The first key encrypts; every key decrypts, so a new key is put first, the
data re-encrypted with `manage.py rotate_encryption_key`, and the old key then
dropped.
"""

import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models


def _fernet() -> MultiFernet:
    return _fernet_of(tuple(settings.OPSDECK_ENCRYPTION_KEYS))


@functools.lru_cache(maxsize=4)
def _fernet_of(keys: tuple[str, ...]) -> MultiFernet:
    """Made once per set of keys: every secret field read or written uses it."""
    if not keys:
        raise ImproperlyConfigured("OPSDECK_ENCRYPTION_KEYS is empty.")
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(
            "OPSDECK_ENCRYPTION_KEYS must be comma-separated Fernet keys "
            "(32 url-safe base64-encoded bytes each)."
        ) from exc


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ImproperlyConfigured(
            "A stored secret cannot be decrypted with any key in OPSDECK_ENCRYPTION_KEYS."
        ) from exc


class EncryptedTextField(models.TextField):
    """Text stored as a Fernet token; the model sees plain text.

    Not searchable or orderable by value. Saving a value re-encrypts it with
    the current key, which is what rotation relies on.
    """

    def from_db_value(self, value, expression, connection):
        if value is None or value == "":
            return value
        return decrypt(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encrypt(value)
