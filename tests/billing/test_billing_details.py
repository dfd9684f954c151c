"""Billing details: whom a tenant's invoices are made out to, set on its Billing page by the
roles that manage billing, validated field by field and audited."""

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services as accounts_services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from billing import services, tax_ids
from billing.models import BillingProfile

DETAILS = {
    "legal_name": "Acme GmbH",
    "email": "ap@acme.example",
    "line1": "Unter den Linden 1",
    "line2": "3. OG",
    "city": "Berlin",
    "postal_code": "10117",
    "state": "",
    "country": "DE",
    "tax_id_type": "eu_vat",
    "tax_id_value": "de 123 456 789",
}
EMPTY = dict.fromkeys(DETAILS, "")


def _url(tenant, suffix=""):
    return f"/t/{tenant.slug}/billing/{suffix}"


def _update(tenant, user, **changes):
    return services.billing_details_update(
        actor=Actor(user=user), tenant=tenant, details={**DETAILS, **changes}
    )


# --- the service and its validation ------------------------------------------------------------


def test_details_are_saved_normalized_and_audited_with_what_changed(tenant, owner):
    profile, changed = _update(tenant, owner)

    profile.refresh_from_db()
    assert (profile.legal_name, profile.country, profile.tax_id_value) == (
        "Acme GmbH",
        "DE",
        "DE123456789",
    )
    assert changed == [name for name in BillingProfile.DETAILS if name != "state"]
    assert (profile.version, profile.stripe_version, profile.updated_by) == (1, 0, owner)
    event = AuditEvent.objects.get(action="billing.details_update")
    assert event.result == "ok" and event.actor == owner and event.tenant == tenant
    assert event.payload["changed"]["tax_id_value"] == "DE123456789"

    _, again = _update(tenant, owner, city="Potsdam", postal_code="14467")

    assert again == ["city", "postal_code"]
    assert BillingProfile.objects.get(tenant=tenant).version == 2
    latest = AuditEvent.objects.filter(action="billing.details_update").order_by("-pk").first()
    assert latest.payload == {"changed": {"city": "Potsdam", "postal_code": "14467"}}


def test_sending_the_same_details_again_writes_and_audits_nothing(tenant, owner):
    _update(tenant, owner)

    _, changed = _update(tenant, owner)

    assert changed == []
    assert BillingProfile.objects.get(tenant=tenant).version == 1
    assert AuditEvent.objects.filter(action="billing.details_update").count() == 1


def test_the_organization_name_alone_makes_no_profile(tenant, owner):
    _, changed = _update(tenant, owner, **{**EMPTY, "legal_name": tenant.name})

    assert changed == []
    assert not BillingProfile.objects.filter(tenant=tenant).exists()


@pytest.mark.parametrize(
    ("changes", "field", "said"),
    [
        ({"tax_id_value": "123456789"}, "tax_id_value", "not written as EU VAT numbers are"),
        ({"tax_id_type": "gb_vat", "tax_id_value": ""}, "tax_id_value", "Enter the UK VAT"),
        ({"tax_id_type": ""}, "tax_id_type", "Choose the kind of tax ID"),
        ({"tax_id_type": "xx_vat"}, "tax_id_type", "Value 'xx_vat' is not a valid choice"),
        ({"city": ""}, "city", "Enter the city, or clear the address."),
        ({"line1": ""}, "line1", "Enter the first line of the address"),
        ({"country": ""}, "country", "Choose the country, or clear the address."),
        ({"country": "QQ"}, "country", "Value 'QQ' is not a valid choice"),
        ({"legal_name": ""}, "legal_name", "This field cannot be blank."),
        ({"email": "not-an-address"}, "email", "Enter a valid email address."),
        ({"email": "billing@localhost"}, "email", "Enter an address at an internet domain"),
        # Shown reversed, blank, or breaking the printed address (and sent to Stripe as typed).
        ({"legal_name": "Acme \u202eHbmG"}, "legal_name", "Use letters, digits, spaces and"),
        ({"legal_name": "\u3164"}, "legal_name", "Enter the legal name, as registered."),
        ({"line1": "Hauptstr. 1\r\nEvil\x1b[31m"}, "line1", "Use letters, digits, spaces and"),
        ({"city": "Ber\u200blin"}, "city", "Use letters, digits, spaces and punctuation only."),
    ],
)
def test_bad_details_are_refused_by_field_and_change_nothing(tenant, owner, changes, field, said):
    _update(tenant, owner)

    with pytest.raises(ValidationError) as refused:
        _update(tenant, owner, **{"legal_name": "Renamed", **changes})

    assert said in " ".join(refused.value.message_dict[field])
    profile = BillingProfile.objects.get(tenant=tenant)
    assert (profile.legal_name, profile.version) == ("Acme GmbH", 1)


def test_every_field_in_error_is_said_at_once(tenant, owner):
    with pytest.raises(ValidationError) as refused:
        _update(tenant, owner, tax_id_value="123", city="", country="")

    assert set(refused.value.message_dict) == {"tax_id_value", "city", "country"}


@pytest.mark.parametrize(
    ("type_", "written", "stored"),
    [
        ("eu_vat", "el 123456789", "EL123456789"),
        ("gb_vat", "GB 123 4567 89", "GB123456789"),
        ("ch_vat", "che123456789", "CHE-123.456.789 MWST"),
        ("ch_vat", "CHE-123.456.789 TVA", "CHE-123.456.789 TVA"),
        ("us_ein", "12-3456789", "12-3456789"),
        ("no_vat", "123456789mva", "123456789MVA"),
    ],
)
def test_tax_ids_are_stored_as_stripe_writes_them(type_, written, stored):
    assert tax_ids.tax_id_clean(type_, written) == stored


def test_a_country_alone_is_an_address_stripe_takes(tenant, owner):
    profile, _ = _update(tenant, owner, line1="", line2="", city="", postal_code="", country="FR")

    assert profile.details()["country_name"] == "France"


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_roles_that_do_not_manage_billing_are_refused_and_the_refusal_audited(
    tenant, add_member, role
):
    user = add_member(f"{role}@example.com", role)

    with pytest.raises(ActionDenied, match="does not allow managing billing"):
        _update(tenant, user)

    assert not BillingProfile.objects.filter(tenant=tenant).exists()
    assert AuditEvent.objects.get(action="billing.details_update").result == "denied"


# --- the pages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["owner", "admin", "billing"])
def test_roles_that_manage_billing_edit_the_details_from_the_billing_page(
    client, tenant, owner, add_member, role
):
    user = owner if role == "owner" else add_member(f"{role}@example.com", role)
    client.force_login(user)

    overview = client.get(_url(tenant)).content.decode()
    form = client.get(_url(tenant, "details/")).content.decode()
    sent = client.post(_url(tenant, "details/"), DETAILS)

    assert "Invoices are made out to the organization's name alone" in overview
    assert f'href="{_url(tenant, "details/")}">Add billing details</a>' in overview
    assert 'name="legal_name"' in form and 'value="Acme"' in form  # the organization's name
    assert sent.status_code == 302 and sent["Location"] == _url(tenant) + "#billing-details"
    after = client.get(_url(tenant)).content.decode()
    assert "Your billing details are saved" in after
    for shown in ("Acme GmbH", "3. OG", "10117 Berlin", "Germany", "EU VAT number: DE123456789"):
        assert shown in after
    assert "Edit billing details</a>" in after


def test_no_break_spaces_pasted_into_the_details_are_spaces(client, tenant, owner):
    """A name or tax ID copied from a web page or a PDF often holds no-break or narrow spaces:
    they were refused as "Use letters, digits, spaces and punctuation only."."""
    from billing.models import BillingProfile

    client.force_login(owner)
    pasted = {
        **DETAILS,
        "legal_name": "Acme\u00a0GmbH",
        "line1": "Unter\u202fden Linden 1",
        "tax_id_value": "DE\u00a0123\u00a0456\u00a0789",
    }

    sent = client.post(_url(tenant, "details/"), pasted)

    assert sent.status_code == 302
    profile = BillingProfile.objects.get(tenant=tenant)
    assert (profile.legal_name, profile.line1, profile.tax_id_value) == (
        "Acme GmbH",
        "Unter den Linden 1",
        "DE123456789",
    )


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_other_roles_neither_see_nor_change_the_details(client, tenant, add_member, role):
    client.force_login(add_member(f"{role}@example.com", role))

    shown = client.get(_url(tenant, "details/"))
    forged = client.post(_url(tenant, "details/"), DETAILS)

    assert shown.status_code == 403 and forged.status_code == 403
    assert not BillingProfile.objects.filter(tenant=tenant).exists()
    denied = AuditEvent.objects.filter(result="denied", tenant=tenant).values_list("action")
    assert ("billing.view",) in denied


def test_another_organizations_details_are_not_found(client, tenant, make_user):
    stranger = make_user("stranger@example.com")
    accounts_services.tenant_create(actor=Actor(user=stranger), name="Elsewhere")
    client.force_login(stranger)

    assert client.get(_url(tenant, "details/")).status_code == 404
    assert client.post(_url(tenant, "details/"), DETAILS).status_code == 404
    assert not BillingProfile.objects.filter(tenant=tenant).exists()


def test_a_post_without_the_csrf_token_is_refused(tenant, owner):
    from django.test import Client

    forged = Client(enforce_csrf_checks=True)
    forged.force_login(owner)

    assert forged.post(_url(tenant, "details/"), DETAILS).status_code == 403
    assert not BillingProfile.objects.filter(tenant=tenant).exists()


def test_bad_input_is_said_beside_each_field_with_what_was_typed_kept(owner_client, tenant, owner):
    _update(tenant, owner)

    page = owner_client.post(
        _url(tenant, "details/"),
        {**DETAILS, "legal_name": "Renamed", "city": "", "tax_id_value": "123", "email": "x@"},
    )

    text = page.content.decode()
    assert page.status_code == 200
    assert "Nothing was saved. Please correct:" in text
    assert 'id="id_email_error">Enter a valid email address.</small>' in text
    assert 'aria-invalid="true" aria-describedby="id_email_helptext id_email_error"' in text
    assert 'value="Renamed"' in text and 'value="123"' in text  # what was typed, kept
    # The profile's own rules are said once the form's fields are valid.
    fixed = owner_client.post(
        _url(tenant, "details/"), {**DETAILS, "legal_name": "Renamed", "city": ""}
    ).content.decode()
    assert 'id="id_city_error">Enter the city, or clear the address.</small>' in fixed
    assert '<a href="#id_city">City: Enter the city, or clear the address.</a>' in fixed
    assert BillingProfile.objects.get(tenant=tenant).legal_name == "Acme GmbH"


def test_the_htmx_form_swaps_itself_with_errors_and_redirects_when_saved(owner_client, tenant):
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "billing-details-form"}

    refused = owner_client.post(_url(tenant, "details/"), {**DETAILS, "city": ""}, **htmx)
    saved = owner_client.post(_url(tenant, "details/"), DETAILS, **htmx)

    assert refused.content.decode().lstrip().startswith('<form id="billing-details-form"')
    assert "<html" not in refused.content.decode()
    assert saved["HX-Redirect"] == _url(tenant) + "#billing-details"
    assert BillingProfile.objects.get(tenant=tenant).city == "Berlin"


def test_saving_unchanged_details_says_nothing_changed(owner_client, tenant, owner):
    _update(tenant, owner)

    owner_client.post(_url(tenant, "details/"), DETAILS)

    assert "Nothing changed" in owner_client.get(_url(tenant)).content.decode()


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as done:
        assert client.get(url).status_code == 200
    return len(done)


def test_the_pages_read_the_details_in_a_constant_number_of_queries(owner_client, tenant, owner):
    owner_client.get(_url(tenant))  # the session learns the organization once
    before = (
        _queries(owner_client, _url(tenant)),
        _queries(owner_client, _url(tenant, "details/")),
    )
    _update(tenant, owner)
    BillingProfile.objects.filter(tenant=tenant).update(stripe_error="Stripe was away.")

    after = (_queries(owner_client, _url(tenant)), _queries(owner_client, _url(tenant, "details/")))

    assert after == before
