"""Customers, products and prices."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .errors import invalid, missing
from .forms import Params, merge_metadata
from .state import State, changed, new_id, page

_ADDRESS = ("city", "country", "line1", "line2", "postal_code", "state")


def _address(params: Params) -> dict[str, str | None] | None:
    """`address[...]`: the six fields Stripe keeps, each null when not given or empty; an empty
    `address` clears it (null)."""
    if params.data.get("address") == "":
        return None
    address = params.hash("address", required=True) or Params({}, "address")
    address.only(*_ADDRESS)
    return {key: address.text(key, max_length=200) or None for key in _ADDRESS}


def customer_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/customers."""
    params.only("email", "name", "description", "phone", "metadata", "address")
    customer = {
        "id": new_id("cus_", 14),
        "object": "customer",
        "address": _address(params) if params.has("address") else None,
        "created": state.now(),
        "email": params.text("email", max_length=512),
        "name": params.text("name", max_length=256),
        "description": params.text("description"),
        "phone": params.text("phone", max_length=20),
        "metadata": merge_metadata({}, params.metadata()),
        "balance": 0,
        "currency": None,
        "default_source": None,
        "delinquent": False,
        "invoice_prefix": new_id("", 8).upper(),
        "invoice_settings": {"default_payment_method": None, "footer": None},
        "livemode": False,
        "preferred_locales": [],
        "tax_exempt": "none",
        "test_clock": None,
    }
    return state.add("customer", customer)


def customer_retrieve(state: State, params: Params, customer_id: str) -> dict[str, Any]:
    """GET /v1/customers/{id}."""
    params.only()
    return state.get("customer", customer_id)


def customer_update(state: State, params: Params, customer_id: str) -> dict[str, Any]:
    """POST /v1/customers/{id}: emits `customer.updated` when something changed. An address
    sent replaces the one held whole (a field left out becomes null)."""
    params.only("email", "name", "description", "phone", "metadata", "address")
    customer = state.get("customer", customer_id)
    # Read every value before writing any: a refused update changes nothing.
    lengths = {"email": 512, "name": 256, "description": 5000, "phone": 20}
    values = {k: params.text(k, max_length=n) or None for k, n in lengths.items() if params.has(k)}
    if params.has("address"):
        values["address"] = _address(params)
    metadata = params.metadata()
    before = dict(customer)
    customer.update(values)
    customer["metadata"] = merge_metadata(customer["metadata"], metadata)
    previous = changed(before, customer)
    if previous:
        state.emit("customer.updated", customer, previous)
    return customer


def customer_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/customers, optionally by exact `email` (case-sensitive, as Stripe's)."""
    params.only("email", "limit", "starting_after", "ending_before")
    email = params.text("email")
    customers = [c for c in state.all("customer") if email is None or c["email"] == email]
    return page(customers, params, "/v1/customers")


def product_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/products (`id` may be chosen, as Stripe allows)."""
    params.only("id", "name", "description", "active", "metadata")
    product_id = params.text("id") or new_id("prod_", 14)
    if state.find("product", product_id):
        raise invalid(f"Product already exists with ID {product_id}", param="id")
    return state.add("product", _product(state, product_id, params))


def _product(state: State, product_id: str, params: Params) -> dict[str, Any]:
    now = state.now()
    active = params.flag("active")
    return {
        "id": product_id,
        "object": "product",
        "active": True if active is None else active,
        "created": now,
        "default_price": None,
        "description": params.text("description"),
        "images": [],
        "livemode": False,
        "marketing_features": [],
        "metadata": merge_metadata({}, params.metadata()),
        "name": params.text("name", required=True),
        "tax_code": None,
        "type": "service",
        "unit_label": None,
        "updated": now,
        "url": None,
    }


def product_retrieve(state: State, params: Params, product_id: str) -> dict[str, Any]:
    """GET /v1/products/{id}."""
    params.only()
    return state.get("product", product_id)


def product_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/products (`active` filter)."""
    params.only("active", "limit", "starting_after", "ending_before")
    active = params.flag("active")
    products = [p for p in state.all("product") if active is None or p["active"] == active]
    return page(products, params, "/v1/products")


def price_create(state: State, params: Params) -> dict[str, Any]:
    """POST /v1/prices: one-off or recurring, licensed or metered (a metered price names its
    meter, as Stripe requires since 2025-03-31.basil)."""
    params.only(
        "currency",
        "unit_amount",
        "unit_amount_decimal",
        "product",
        "product_data",
        "recurring",
        "lookup_key",
        "transfer_lookup_key",
        "nickname",
        "metadata",
        "active",
        "billing_scheme",
        "tax_behavior",
    )
    # Everything is read and checked before anything is written: a refused price leaves no
    # product behind and no lookup key moved.
    currency = (params.text("currency", required=True) or "").lower()
    params.choice("billing_scheme", ("per_unit",))  # tiered prices are not emulated
    unit_amount_decimal = _unit_amount(params)
    product = _price_product(state, params)
    recurring = _recurring(state, params.hash("recurring"))
    lookup_key = params.text("lookup_key", max_length=200)
    holder = _lookup_key_holder(state, lookup_key, bool(params.flag("transfer_lookup_key")))
    active = params.flag("active")
    whole = unit_amount_decimal == unit_amount_decimal.to_integral_value()
    price = {
        "id": new_id("price_"),
        "object": "price",
        "active": True if active is None else active,
        "billing_scheme": "per_unit",
        "created": state.now(),
        "currency": currency,
        "custom_unit_amount": None,
        "livemode": False,
        "lookup_key": lookup_key,
        "metadata": merge_metadata({}, params.metadata()),
        "nickname": params.text("nickname"),
        "product": product["id"],
        "recurring": recurring,
        "tax_behavior": params.choice("tax_behavior", ("exclusive", "inclusive", "unspecified"))
        or "unspecified",
        "tiers_mode": None,
        "transform_quantity": None,
        "type": "recurring" if recurring else "one_time",
        "unit_amount": int(unit_amount_decimal) if whole else None,
        "unit_amount_decimal": _decimal_text(unit_amount_decimal),
    }
    if holder is not None:
        holder["lookup_key"] = None
    if state.find("product", product["id"]) is None:
        state.add("product", product)
    return state.add("price", price)


def _unit_amount(params: Params) -> Decimal:
    if params.has("unit_amount") and params.has("unit_amount_decimal"):
        raise invalid(
            "You may only specify one of these parameters: unit_amount, unit_amount_decimal.",
            param="unit_amount",
        )
    if params.has("unit_amount"):
        return Decimal(params.integer("unit_amount", minimum=0) or 0)
    amount = params.decimal("unit_amount_decimal")
    if amount is None:
        raise missing("unit_amount")
    if amount < 0:
        raise invalid("Invalid unit_amount_decimal: must be non-negative", param="unit_amount")
    return amount


def _decimal_text(value: Decimal) -> str:
    # Stripe prints "2500" and "0.5", never "2500.000" or "5E-1".
    return format(value.normalize(), "f")


def _price_product(state: State, params: Params) -> dict[str, Any]:
    """The price's product: an existing one, or a new one (not yet stored) from product_data."""
    product_id = params.text("product")
    product_data = params.hash("product_data")
    if product_id is not None and product_data is not None:
        raise invalid(
            "You may only specify one of these parameters: product, product_data.",
            param="product",
        )
    if product_data is not None:
        product_data.only("name", "metadata", "active")
        return _product(state, new_id("prod_", 14), product_data)
    if product_id is None:
        raise missing("product")
    return state.get("product", product_id, param="product")


def _recurring(state: State, recurring: Params | None) -> dict[str, Any] | None:
    if recurring is None:
        return None
    recurring.only("interval", "interval_count", "usage_type", "meter", "trial_period_days")
    interval = recurring.choice("interval", ("day", "week", "month", "year"), required=True)
    usage_type = recurring.choice("usage_type", ("licensed", "metered")) or "licensed"
    meter = recurring.text("meter")
    if usage_type == "metered" and meter is None:
        raise invalid(
            "Metered prices must be backed by a meter: set recurring[meter].",
            param="recurring[meter]",
        )
    if meter is not None:
        if usage_type != "metered":
            raise invalid(
                "recurring[meter] can only be set when recurring[usage_type] is metered.",
                param="recurring[meter]",
            )
        state.get("billing.meter", meter, label="billing meter", param="recurring[meter]")
    return {
        "interval": interval,
        "interval_count": recurring.integer("interval_count", minimum=1) or 1,
        "meter": meter,
        "trial_period_days": recurring.integer("trial_period_days"),
        "usage_type": usage_type,
    }


def _lookup_key_holder(
    state: State, lookup_key: str | None, transfer: bool
) -> dict[str, Any] | None:
    """The price holding lookup_key, which gives it up only with transfer_lookup_key."""
    if lookup_key is None:
        return None
    for price in state.all("price"):
        if price["lookup_key"] == lookup_key:
            if not transfer:
                raise invalid(
                    f"A price (`{price['id']}`) already uses the lookup key `{lookup_key}`.",
                    param="lookup_key",
                )
            return price
    return None


def price_retrieve(state: State, params: Params, price_id: str) -> dict[str, Any]:
    """GET /v1/prices/{id}."""
    params.only()
    return state.get("price", price_id)


def price_list(state: State, params: Params) -> dict[str, Any]:
    """GET /v1/prices, filtered by `lookup_keys` (up to 10), `product`, `active`, `type`."""
    params.only(
        "lookup_keys", "product", "active", "type", "limit", "starting_after", "ending_before"
    )
    lookup_keys = params.strings("lookup_keys")
    if len(lookup_keys) > 10:
        raise invalid("You can specify up to 10 lookup_keys.", param="lookup_keys")
    product, active = params.text("product"), params.flag("active")
    price_type = params.choice("type", ("one_time", "recurring"))
    prices = [
        p
        for p in state.all("price")
        if (not lookup_keys or p["lookup_key"] in lookup_keys)
        and (product is None or p["product"] == product)
        and (active is None or p["active"] == active)
        and (price_type is None or p["type"] == price_type)
    ]
    return page(prices, params, "/v1/prices")
