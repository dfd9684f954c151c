import json

import pytest
from allauth.mfa.models import Authenticator
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from accounts import crypto
from accounts.crypto import EncryptedTextField


def test_a_secret_round_trips_and_is_not_stored_in_the_clear():
    token = crypto.encrypt("s3cret value")

    assert "s3cret" not in token
    assert crypto.decrypt(token) == "s3cret value"


def test_the_encrypted_field_stores_tokens_and_reads_plain_text():
    field = EncryptedTextField()

    stored = field.get_prep_value("kubeconfig: data")

    assert stored != "kubeconfig: data"
    assert field.from_db_value(stored, None, None) == "kubeconfig: data"


def test_a_compressed_secret_round_trips_in_a_far_shorter_token():
    text = json.dumps({f"task-{n}": {"phase": "Succeeded", "message": ""} for n in range(60)})

    plain, packed = crypto.encrypt(text), crypto.encrypt(text, compress=True)

    assert crypto.decrypt(packed) == text
    assert len(packed) < len(plain) / 4


def test_compressed_tokens_tell_apart_lengths_only_by_whole_blocks():
    # Texts that compress to a few bytes more or less make tokens of one length.
    lengths = {len(crypto.encrypt("a" * 200 + "b" * n, compress=True)) for n in range(40)}

    assert len(lengths) == 1


def test_a_field_now_compressed_reads_the_values_stored_before():
    before = EncryptedTextField().get_prep_value("kubeconfig: data " * 200)

    field = EncryptedTextField(compressed=True)

    assert field.from_db_value(before, None, None) == "kubeconfig: data " * 200
    assert len(field.get_prep_value("kubeconfig: data " * 200)) < len(before)


def test_a_secret_from_an_unknown_key_is_a_clear_configuration_error(settings):
    token = crypto.encrypt("x")
    settings.OPSDECK_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]

    with pytest.raises(ImproperlyConfigured, match="cannot be decrypted"):
        crypto.decrypt(token)


@pytest.mark.django_db
def test_rotation_reencrypts_mfa_secrets_so_the_old_key_can_go(settings, owner, capsys):
    old_key = settings.OPSDECK_ENCRYPTION_KEYS[0]
    secret = "JBSWY3DPEHPK3PXP"
    Authenticator.objects.create(
        user=owner, type=Authenticator.Type.TOTP, data={"secret": crypto.encrypt(secret)}
    )
    new_key = Fernet.generate_key().decode()
    settings.OPSDECK_ENCRYPTION_KEYS = [new_key, old_key]

    call_command("rotate_encryption_key")

    assert "mfa.Authenticator: 1 secret(s) re-encrypted" in capsys.readouterr().out
    settings.OPSDECK_ENCRYPTION_KEYS = [new_key]
    stored = Authenticator.objects.get(user=owner).data["secret"]
    assert crypto.decrypt(stored) == secret
