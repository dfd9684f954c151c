"""Secrets at rest: Fernet encryption with rotation (OPSDECK_ENCRYPTION_KEYS).

The first key encrypts; every key decrypts, so a new key is put first, the
data re-encrypted with `manage.py rotate_encryption_key`, and the old key then
dropped.
"""

import functools
import zlib

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


# A decrypted payload that starts with these bytes is zlib data, not text: no text PostgreSQL
# stores starts with NUL.
_COMPRESSED = b"\x00z"
# A compressed payload is padded to a multiple of this many bytes, so that a token's length
# tells little of how well its text compressed: compression before encryption otherwise lets
# one who reads the tokens and chooses part of the text learn the rest, length by length.
_PAD = 256


def encrypt(plaintext: str, *, compress: bool = False) -> str:
    """The Fernet token of `plaintext`; compressed first if `compress` (a long text written
    often, whose stored size costs more than the compression: a run's state)."""
    data = plaintext.encode()
    if compress:
        data = _COMPRESSED + zlib.compress(data, 1)
        data += b"\x00" * (-len(data) % _PAD)
    return _fernet().encrypt(data).decode()


def decrypt(token: str) -> str:
    """The text of a token `encrypt` made, compressed or not."""
    try:
        data = _fernet().decrypt(token.encode())
    except InvalidToken as exc:
        raise ImproperlyConfigured(
            "A stored secret cannot be decrypted with any key in OPSDECK_ENCRYPTION_KEYS."
        ) from exc
    if data.startswith(_COMPRESSED):
        data = zlib.decompressobj().decompress(data[len(_COMPRESSED) :])  # the padding is left
    return data.decode()


class EncryptedTextField(models.TextField):
    """Text stored as a Fernet token; the model sees plain text.

    Not searchable or orderable by value. Saving a value re-encrypts it with
    the current key, which is what rotation relies on. With `compressed`, the text
    is compressed before it is encrypted (see `encrypt`); values stored either way
    read back alike, so the option can change without rewriting any row.
    """

    def __init__(self, *args, compressed: bool = False, **kwargs):
        self.compressed = compressed
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        if self.compressed:
            kwargs["compressed"] = True
        return name, path, args, kwargs

    def from_db_value(self, value, expression, connection):
        if value is None or value == "":
            return value
        return decrypt(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encrypt(value, compress=self.compressed)
