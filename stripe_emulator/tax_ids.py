"""A customer's tax IDs: `/v1/customers/{customer}/tax_ids`."""

from __future__ import annotations

import re
from typing import Any

from .errors import invalid, no_such
from .forms import Params
from .state import State, new_id, page

# The shapes Stripe checks at once for a few types (any other known type takes any value); a
# value that does not fit is refused with Stripe's `tax_id_invalid`.
_SHAPES = {
    "eu_vat": r"(AT|BE|BG|CY|CZ|DE|DK|EE|EL|ES|FI|FR|HR|HU|IE|IT|LT|LU|LV|MT|NL|PL|PT|RO|SE|SI|SK"
    r"|XI)[0-9A-Z+*]{2,13}",
    "gb_vat": r"GB([0-9]{9}|[0-9]{12})",
    "ch_vat": r"CHE-[0-9]{3}\.[0-9]{3}\.[0-9]{3} (MWST|TVA|IVA)",
    "no_vat": r"[0-9]{9}MVA",
    "us_ein": r"[0-9]{2}-?[0-9]{7}",
    "ca_bn": r"[0-9]{9}",
    "au_abn": r"[0-9]{11}",
    "nz_gst": r"[0-9]{8,9}",
    "in_gst": r"[0-9]{2}[0-9A-Z]{13}",
    "jp_cn": r"[0-9]{13}",
    "sg_uen": r"[0-9A-Z]{9,10}",
    "za_vat": r"4[0-9]{9}",
}
# Types Stripe takes beyond those (a part of its list: enough for what clients here send).
_OTHER_TYPES = (
    "ae_trn", "au_arn", "br_cnpj", "br_cpf", "ca_gst_hst", "ca_pst_bc", "ca_pst_mb", "ca_pst_sk",
    "ca_qst", "ch_uid", "cl_tin", "es_cif", "eu_oss_vat", "hk_br", "il_vat", "is_vat", "jp_rn",
    "jp_trn", "kr_brn", "li_uid", "mx_rfc", "my_sst", "sa_vat", "sg_gst", "th_vat", "tw_vat",
    "ua_vat",
)  # fmt: skip
TYPES = (*_SHAPES, *_OTHER_TYPES)
# The types Stripe verifies with a tax authority: they start `pending`.
_VERIFIED = {"eu_vat", "gb_vat", "au_abn", "au_arn", "in_gst", "no_vat", "za_vat", "ae_trn"}
# EU VAT prefixes that are not the ISO country code.
_EU_COUNTRIES = {"EL": "GR", "XI": "GB"}


def _country(type_: str, value: str) -> str | None:
    """The country of a tax ID as Stripe gives it: an EU VAT number's from its prefix, the
    others' from the type."""
    if type_ == "eu_vat":
        return _EU_COUNTRIES.get(value[:2], value[:2])
    if type_ == "eu_oss_vat":
        return None
    return type_[:2].upper()


def _customer(state: State, customer_id: str) -> dict[str, Any]:
    return state.get("customer", customer_id)


def tax_id_create(state: State, params: Params, customer_id: str) -> dict[str, Any]:
    """POST /v1/customers/{customer}/tax_ids: `type` and `value`, checked at once for the types
    with a known shape (`tax_id_invalid`)."""
    params.only("type", "value")
    customer = _customer(state, customer_id)
    type_ = params.choice("type", TYPES, required=True) or ""
    value = params.text("value", required=True, max_length=100) or ""
    shape = _SHAPES.get(type_)
    if shape is not None and not re.fullmatch(shape, value):
        raise invalid(f"Invalid value for {type_}.", param="value", code="tax_id_invalid")
    verified = type_ in _VERIFIED
    tax_id = {
        "id": new_id("txi_", 24),
        "object": "tax_id",
        "country": _country(type_, value),
        "created": state.now(),
        "customer": customer["id"],
        "livemode": False,
        "owner": {"type": "customer", "customer": customer["id"]},
        "type": type_,
        "value": value,
        "verification": {"status": "pending", "verified_address": None, "verified_name": None}
        if verified
        else None,
    }
    state.add("tax_id", tax_id)
    state.emit("customer.tax_id.created", tax_id)
    return tax_id


def tax_id_list(state: State, params: Params, customer_id: str) -> dict[str, Any]:
    """GET /v1/customers/{customer}/tax_ids, newest first."""
    params.only("limit", "starting_after", "ending_before")
    customer = _customer(state, customer_id)
    held = [t for t in state.all("tax_id") if t["customer"] == customer["id"]]
    return page(held, params, f"/v1/customers/{customer_id}/tax_ids")


def _held(state: State, customer_id: str, tax_id: str) -> dict[str, Any]:
    found = state.find("tax_id", tax_id)
    if found is None or found["customer"] != _customer(state, customer_id)["id"]:
        raise no_such("tax_id", tax_id)
    return found


def tax_id_retrieve(state: State, params: Params, customer_id: str, tax_id: str) -> dict[str, Any]:
    """GET /v1/customers/{customer}/tax_ids/{id}."""
    params.only()
    return _held(state, customer_id, tax_id)


def tax_id_delete(state: State, params: Params, customer_id: str, tax_id: str) -> dict[str, Any]:
    """DELETE /v1/customers/{customer}/tax_ids/{id}: gone for good (a second delete is a 404)."""
    params.only()
    found = _held(state, customer_id, tax_id)
    del state.objects["tax_id"][found["id"]]
    state.emit("customer.tax_id.deleted", found)
    return {"id": found["id"], "object": "tax_id", "deleted": True}
