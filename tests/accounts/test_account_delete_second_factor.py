"""A deletion refused after the second factor was checked used up the recovery code
typed (the form says one is used up only by a form that deletes)."""

import pytest
from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret

from accounts import services
from accounts.audit import Actor
from tests.accounts.test_account_delete import URL, _client, _form, _gone
from tests.concurrency import beside_a_lock
from tests.conftest import PASSWORD


@pytest.mark.django_db
def test_a_stale_page_refused_does_not_use_up_the_recovery_code_typed(owner, tenant, add_member):
    olga = add_member("olga@example.com", "owner")
    TOTP.activate(owner, generate_totp_secret())
    codes = RecoveryCodes.activate(owner).get_unused_codes()
    client = _client(owner)
    form = _form(client)  # Acme is left: Olga owns it too
    services.membership_leave(actor=Actor(user=olga), tenant=tenant)

    stale = client.post(
        URL, {**form, "password": PASSWORD, "confirm_email": owner.email, "code": codes[0]}
    )

    assert stale.status_code == 400 and "would now delete Acme too" in stale.content.decode()
    assert not _gone(owner)
    # Nothing was deleted: the code typed is still theirs to use.
    unused = RecoveryCodes(owner.authenticator_set.get(type="recovery_codes")).get_unused_codes()
    assert codes[0] in unused


@pytest.mark.django_db(transaction=True)
def test_a_refusal_arising_while_the_form_is_checked_does_not_use_up_the_code(
    owner, tenant, add_member
):
    """The page said Acme is left (Olga owns it too); Olga leaves at the moment the form is
    sent. Her leaving went in between the form's check and the deletion's own, under its locks:
    the deletion was refused, and the recovery code, checked in between, was used up. The form
    waits for her, then is refused before the code is checked."""
    olga = add_member("olga@example.com", "owner")
    TOTP.activate(owner, generate_totp_secret())
    codes = RecoveryCodes.activate(owner).get_unused_codes()
    client = _client(owner)
    form = {**_form(client), "password": PASSWORD, "confirm_email": owner.email, "code": codes[0]}

    left, sent = beside_a_lock(
        lock=lambda: services.tenant_lock(tenant.pk),  # Olga's leaving, under way
        write=lambda: services.membership_leave(actor=Actor(user=olga), tenant=tenant),
        act=lambda: client.post(URL, form),
    )

    assert left == "committed"
    assert sent.status_code == 400 and "would now delete Acme too" in sent.content.decode()
    assert not _gone(owner)
    unused = RecoveryCodes(owner.authenticator_set.get(type="recovery_codes")).get_unused_codes()
    assert codes[0] in unused
