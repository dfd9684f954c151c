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
