"""A customer's address and tax IDs through the real SDK, in Stripe's shapes."""

from __future__ import annotations

import pytest
import stripe

ADDRESS = {
    "line1": "Unter den Linden 1",
    "line2": "",
    "city": "Berlin",
    "postal_code": "10117",
    "state": "",
    "country": "DE",
}


def test_an_address_is_set_replaced_whole_and_cleared(client, emulator):
    customer = client.v1.customers.create({"name": "Acme"})
    assert customer.address is None

    updated = client.v1.customers.update(customer.id, {"address": ADDRESS, "email": "ap@acme.de"})

    assert updated.address.to_dict() == {
        "line1": "Unter den Linden 1",
        "line2": None,
        "city": "Berlin",
        "postal_code": "10117",
        "state": None,
        "country": "DE",
    }
    assert updated.email == "ap@acme.de"
    event = emulator.events("customer.updated")[-1]
    assert event["data"]["previous_attributes"]["address"] is None
    replaced = client.v1.customers.update(customer.id, {"address": {"country": "FR"}})
    assert replaced.address.to_dict()["line1"] is None and replaced.address.country == "FR"
    cleared = client.v1.customers.update(customer.id, {"address": ""})
    assert cleared.address is None
    assert client.v1.customers.retrieve(customer.id).address is None


def test_an_address_with_an_unknown_field_is_refused_and_changes_nothing(client):
    customer = client.v1.customers.create({"name": "Acme", "address": {"country": "DE"}})

    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.update(
            customer.id,
            {"name": "Other", "address": {"country": "FR", "street": "x"}},  # type: ignore[typeddict-unknown-key]
        )

    assert (exc.value.code, exc.value.param) == ("parameter_unknown", "address[street]")
    held = client.v1.customers.retrieve(customer.id)
    assert held.name == "Acme" and held.address.country == "DE"


def test_tax_ids_are_created_listed_and_deleted_on_their_customer(client, emulator):
    customer = client.v1.customers.create({"name": "Acme"})
    other = client.v1.customers.create({"name": "Other"})

    vat = client.v1.customers.tax_ids.create(
        customer.id, {"type": "eu_vat", "value": "EL123456789"}
    )
    ein = client.v1.customers.tax_ids.create(customer.id, {"type": "us_ein", "value": "12-3456789"})

    assert vat.id.startswith("txi_") and vat.object == "tax_id"
    assert (vat.type, vat.value, vat.country, vat.customer) == (
        "eu_vat",
        "EL123456789",
        "GR",
        customer.id,
    )
    assert vat.owner.type == "customer" and vat.verification.status == "pending"
    assert ein.country == "US" and ein.verification is None
    listed = client.v1.customers.tax_ids.list(customer.id)
    assert [t.id for t in listed.data] == [ein.id, vat.id]  # newest first
    assert client.v1.customers.tax_ids.list(other.id).data == []
    assert client.v1.customers.tax_ids.retrieve(customer.id, vat.id).value == "EL123456789"

    deleted = client.v1.customers.tax_ids.delete(customer.id, vat.id)

    assert (deleted.id, deleted.object, deleted.deleted) == (vat.id, "tax_id", True)
    assert [t.id for t in client.v1.customers.tax_ids.list(customer.id).data] == [ein.id]
    assert [e["type"] for e in emulator.events("customer.tax_id.*")] == [
        "customer.tax_id.created",
        "customer.tax_id.created",
        "customer.tax_id.deleted",
    ]
    with pytest.raises(stripe.InvalidRequestError) as gone:
        client.v1.customers.tax_ids.delete(customer.id, vat.id)
    assert (gone.value.http_status, gone.value.code) == (404, "resource_missing")


def test_a_tax_id_of_another_customer_is_not_found_through_this_one(client):
    customer = client.v1.customers.create({"name": "Acme"})
    other = client.v1.customers.create({"name": "Other"})
    theirs = client.v1.customers.tax_ids.create(other.id, {"type": "ca_bn", "value": "123456789"})

    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.tax_ids.delete(customer.id, theirs.id)

    assert exc.value.http_status == 404
    assert [t.id for t in client.v1.customers.tax_ids.list(other.id).data] == [theirs.id]


@pytest.mark.parametrize(
    ("params", "code", "param"),
    [
        ({"type": "eu_vat", "value": "ZZ123456789"}, "tax_id_invalid", "value"),
        ({"type": "xx_vat", "value": "1"}, None, "type"),
        ({"type": "eu_vat"}, "parameter_missing", "value"),
    ],
)
def test_a_bad_tax_id_is_refused_and_nothing_is_added(client, params, code, param):
    customer = client.v1.customers.create({"name": "Acme"})

    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.tax_ids.create(customer.id, params)  # type: ignore[arg-type]

    assert (exc.value.http_status, exc.value.code, exc.value.param) == (400, code, param)
    assert client.v1.customers.tax_ids.list(customer.id).data == []


def test_tax_ids_of_a_missing_customer_are_a_404(client):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.tax_ids.list("cus_nope")
    assert (exc.value.http_status, exc.value.user_message) == (404, "No such customer: 'cus_nope'")
