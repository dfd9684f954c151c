# ruff: noqa: F811 (the fixtures imported from the instance page tests are parameters here)
"""The Connection tab: host, port, database, user and a masked URI; the password only by an
audited reveal after a recent reauthentication."""

from urllib.parse import urlsplit

import pytest

from accounts.models import AuditEvent
from deployments.spec import SpecError, load_spec
from tests.conftest import PASSWORD
from tests.deployments.conftest import SPEC
from tests.deployments.test_instance_page import (  # noqa: F401 (fixtures)
    SECRET,
    _url,
    instance,
    local_cell,
    plan,
)


def test_the_tab_shows_how_to_connect_with_the_password_masked(owner_client, instance):
    html = owner_client.get(_url(instance), {"tab": "connection"}).content.decode()
    # The Service's name qualified with the instance's namespace: customers' applications run
    # in namespaces of their own, where the bare name does not resolve.
    host = f"{instance.pk}-rw.{instance.namespace}"

    assert f'id="connection-host">{host}</code>' in html
    assert 'id="connection-port">5432</code>' in html
    assert 'id="connection-database">app</code>' in html
    assert 'id="connection-user">app</code>' in html
    assert f"postgresql://app:••••••@{host}:5432/app" in html
    assert ">Reveal password</button>" in html
    assert SECRET not in html
    # Its Copy gives the URI without a password, for the client to ask: a mask is no use pasted.
    assert f'data-copy="postgresql://app@{host}:5432/app"' in html


def test_a_deleted_instance_has_nothing_to_connect_to_nor_a_password_to_reveal(
    owner_client, instance
):
    from deployments.models import Instance

    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)

    html = owner_client.get(_url(instance), {"tab": "connection"}).content.decode()
    asked = _reveal(owner_client, instance)  # sent anyway, from a page open before the delete
    shown = owner_client.post(asked["Location"], {"password": PASSWORD}, follow=True)

    assert "The instance is deleted: nothing runs to connect to." in html
    assert "Reveal password" not in html and f"{instance.pk}-rw" not in html
    assert SECRET not in shown.content.decode()
    assert "The instance is deleted: nothing runs to connect to." in shown.content.decode()
    assert not AuditEvent.objects.filter(action="instance.reveal_credentials", result="ok")


def _reveal(client, instance):
    return client.post(_url(instance, "connection/reveal/"))


def test_a_reveal_without_a_recent_reauthentication_asks_for_it(owner_client, instance):
    response = _reveal(owner_client, instance)

    assert response.status_code == 302
    assert urlsplit(response["Location"]).path == "/accounts/reauthenticate/"
    assert SECRET not in response.content.decode()
    assert not AuditEvent.objects.filter(action="instance.reveal_credentials").exists()


def test_after_reauthenticating_the_password_is_shown_once_and_audited(owner_client, instance):
    asked = _reveal(owner_client, instance)

    shown = owner_client.post(asked["Location"], {"password": PASSWORD})

    html = shown.content.decode()
    assert shown.status_code == 200
    assert f'id="connection-password">{SECRET}</code>' in html
    assert f"postgresql://app:{SECRET}@{instance.pk}-rw.{instance.namespace}:5432/app" in html
    assert "postgresql://app:••••••@" not in html  # one URI: the one to copy
    assert "no-store" in shown["Cache-Control"].split(", ")
    assert 'hx-history="false"' in html
    event = AuditEvent.objects.get(action="instance.reveal_credentials", result="ok")
    assert event.target_id == instance.pk
    assert SECRET not in str(event.payload)
    # Shown once: the tab itself masks it again.
    again = owner_client.get(_url(instance), {"tab": "connection"}).content.decode()
    assert SECRET not in again


def test_a_recently_reauthenticated_member_sees_it_at_once(client, instance, add_member):
    member = add_member("member@example.com", "member")
    client.post("/accounts/login/", {"login": member.email, "password": PASSWORD})
    client.post(_reveal(client, instance)["Location"], {"password": PASSWORD})

    again = _reveal(client, instance)

    assert again.status_code == 200 and SECRET in again.content.decode()
    assert AuditEvent.objects.filter(action="instance.reveal_credentials", result="ok").count() == 2


@pytest.mark.parametrize("role", ["viewer", "billing"])
def test_a_role_without_reveal_cannot_and_is_audited(client, instance, add_member, role):
    user = add_member(f"{role}@example.com", role)
    client.force_login(user)

    tab = client.get(_url(instance), {"tab": "connection"}).content.decode()
    response = _reveal(client, instance)

    assert "Reveal password" not in tab and "connection-host" in tab
    assert response.status_code == 403
    assert SECRET not in response.content.decode()
    denied = AuditEvent.objects.get(action="instance.reveal_credentials", actor=user)
    assert denied.result == "denied"
    assert (denied.target_type, denied.target_id) == ("instance", instance.pk)


@pytest.mark.parametrize(
    "mapping, message",
    [
        ("{user: nobody}", 'x-opsdeck.connection.user: unknown parameter "nobody"'),
        ("{password: owner}", 'parameter "owner" must be a Password parameter'),
        ("{user: password}", 'parameter "password" must be not a Password parameter'),
        ("{scheme: 'Postgres SQL'}", "x-opsdeck.connection.scheme: must be a URI scheme"),
        ("{host: x}", 'unknown key "host"'),
    ],
)
def test_a_wrong_connection_mapping_fails_at_load(mapping, message):
    text = SPEC.read_text()
    shipped = (
        "  connection: {user: owner, database: database, password: password, scheme: postgresql}"
    )
    assert shipped in text
    with pytest.raises(SpecError) as error:
        load_spec(text.replace(shipped, f"  connection: {mapping}"))
    assert message in str(error.value)


def test_another_tenants_instance_is_a_404_even_before_reauthentication(
    client, instance, make_user
):
    from accounts import services as account_services
    from accounts.audit import Actor

    stranger = make_user("stranger@example.com")
    theirs = account_services.tenant_create(actor=Actor(user=stranger), name="Other")
    client.force_login(stranger)

    response = client.post(f"/t/{theirs.slug}/deployments/{instance.pk}/connection/reveal/")

    assert response.status_code == 404
    assert not AuditEvent.objects.filter(action="instance.reveal_credentials").exists()


def test_a_reload_of_the_reveal_address_is_the_tab_with_the_password_masked(owner_client, instance):
    response = owner_client.get(_url(instance, "connection/reveal/"))

    assert response.status_code == 302
    assert response["Location"] == _url(instance) + "?tab=connection"
    assert not AuditEvent.objects.filter(action="instance.reveal_credentials").exists()
