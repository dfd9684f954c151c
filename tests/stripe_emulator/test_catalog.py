"""Customers, products, prices and meters through the real SDK."""

from __future__ import annotations

from decimal import Decimal

import pytest
import stripe


def test_customer_create_retrieve_update_and_list_by_email(client):
    created = client.v1.customers.create({"email": "ada@example.com", "metadata": {"tenant": "7"}})
    client.v1.customers.create({"email": "bob@example.com"})

    assert created.id.startswith("cus_") and created.object == "customer"
    assert created.livemode is False and created.metadata.to_dict() == {"tenant": "7"}
    updated = client.v1.customers.update(
        created.id, {"name": "Ada Lovelace", "metadata": {"tenant": "", "plan": "pro"}}
    )
    assert updated.name == "Ada Lovelace" and updated.metadata.to_dict() == {"plan": "pro"}
    assert client.v1.customers.retrieve(created.id).name == "Ada Lovelace"
    found = client.v1.customers.list({"email": "ada@example.com"})
    assert [c.id for c in found.data] == [created.id] and found.has_more is False


def test_a_refused_update_changes_nothing(client):
    customer = client.v1.customers.create({"email": "ada@example.com"})

    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.update(customer.id, {"email": "new@example.com", "phone": "9" * 21})
    assert exc.value.param == "phone"
    assert client.v1.customers.retrieve(customer.id).email == "ada@example.com"


def test_missing_customer_is_a_404_resource_missing(client):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.retrieve("cus_nope")
    assert exc.value.http_status == 404
    assert exc.value.code == "resource_missing"
    assert exc.value.user_message == "No such customer: 'cus_nope'"


def test_unknown_parameter_is_refused_and_nothing_is_created(client, emulator):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.customers.create({"emial": "typo@example.com"})  # type: ignore[typeddict-unknown-key]
    assert (exc.value.http_status, exc.value.code, exc.value.param) == (
        400,
        "parameter_unknown",
        "emial",
    )
    assert client.v1.customers.list().data == []


def test_metered_price_on_a_meter_is_listed_by_lookup_key(client, metered):
    price, meter = metered["price"], metered["meter"]
    assert price.id.startswith("price_") and meter.id.startswith("mtr_")
    assert price.recurring.usage_type == "metered" and price.recurring.meter == meter.id
    assert price.unit_amount is None and price.unit_amount_decimal == Decimal("0.5")
    assert client.v1.products.retrieve(price.product).name == "vCPU hours"
    seat = client.v1.prices.create(
        {
            "currency": "usd",
            "unit_amount": 2500,
            "product_data": {"name": "Seat"},
            "recurring": {"interval": "month"},
            "lookup_key": "seat",
        }
    )

    listed = client.v1.prices.list({"lookup_keys": ["vcpu_hours", "seat", "unknown"]})
    assert sorted(p.id for p in listed.data) == sorted([price.id, seat.id])
    assert [p.id for p in client.v1.prices.list({"lookup_keys": ["seat"]}).data] == [seat.id]


def test_lookup_key_moves_only_with_transfer_lookup_key(client, metered):
    old = metered["price"]
    params = {
        "currency": "usd",
        "unit_amount_decimal": "0.6",
        "product": old.product,
        "recurring": {"interval": "month", "usage_type": "metered", "meter": metered["meter"].id},
        "lookup_key": "vcpu_hours",
    }
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.prices.create(params)
    assert exc.value.param == "lookup_key"

    new = client.v1.prices.create({**params, "transfer_lookup_key": True})
    assert [p.id for p in client.v1.prices.list({"lookup_keys": ["vcpu_hours"]}).data] == [new.id]
    assert client.v1.prices.retrieve(old.id).lookup_key is None


def test_metered_price_needs_a_meter(client):
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.prices.create(
            {
                "currency": "usd",
                "unit_amount": 1,
                "product_data": {"name": "Storage"},
                "recurring": {"interval": "month", "usage_type": "metered"},
            }
        )
    assert exc.value.param == "recurring[meter]"
    assert client.v1.products.list().data == []


def test_an_event_name_belongs_to_one_active_meter(client, metered):
    params = {
        "display_name": "again",
        "event_name": "vcpu_hours",
        "default_aggregation": {"formula": "sum"},
    }
    with pytest.raises(stripe.InvalidRequestError) as exc:
        client.v1.billing.meters.create(params)
    assert exc.value.param == "event_name"

    client.v1.billing.meters.deactivate(metered["meter"].id)
    again = client.v1.billing.meters.create(params)
    assert again.status == "active"
    assert [m.id for m in client.v1.billing.meters.list({"status": "active"}).data] == [again.id]
