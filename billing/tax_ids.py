"""The tax ID types a billing profile may hold: a short list of Stripe's customer tax ID types
(`type` on Stripe's tax ID object), each with the shape its value takes. Only the shape is
checked here; whether the number exists is for the tax authority (Stripe verifies some).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.core.exceptions import ValidationError


@dataclass(frozen=True)
class TaxIdType:
    code: str  # Stripe's enum value
    label: str
    example: str
    shape: str  # a regular expression the whole value, spaces removed and upper-cased, matches

    def fits(self, compact: str) -> bool:
        return re.fullmatch(self.shape, compact) is not None


# EU VAT numbers start with the member state's prefix (Greece's is EL; XI is Northern Ireland).
_EU = "(AT|BE|BG|CY|CZ|DE|DK|EE|EL|ES|FI|FR|HR|HU|IE|IT|LT|LU|LV|MT|NL|PL|PT|RO|SE|SI|SK|XI)"

TAX_ID_TYPES: dict[str, TaxIdType] = {
    t.code: t
    for t in [
        TaxIdType("eu_vat", "EU VAT number", "DE123456789", _EU + r"[0-9A-Z+*]{2,13}"),
        TaxIdType("gb_vat", "UK VAT number", "GB123456789", r"GB([0-9]{9}|[0-9]{12})"),
        TaxIdType(
            "ch_vat",
            "Swiss VAT number",
            "CHE-123.456.789 MWST",
            r"CHE-?[0-9]{3}\.?[0-9]{3}\.?[0-9]{3}(MWST|TVA|IVA)?",
        ),
        TaxIdType("no_vat", "Norwegian VAT number", "123456789MVA", r"[0-9]{9}MVA"),
        TaxIdType(
            "us_ein", "US Employer Identification Number", "12-3456789", r"[0-9]{2}-?[0-9]{7}"
        ),
        TaxIdType("ca_bn", "Canadian Business Number", "123456789", r"[0-9]{9}"),
        TaxIdType("au_abn", "Australian Business Number", "12345678912", r"[0-9]{11}"),
        TaxIdType("nz_gst", "New Zealand GST number", "123456789", r"[0-9]{8,9}"),
        TaxIdType("in_gst", "Indian GST number", "12ABCDE3456FGZH", r"[0-9]{2}[0-9A-Z]{13}"),
        TaxIdType("jp_cn", "Japanese Corporate Number", "1234567891234", r"[0-9]{13}"),
        TaxIdType("sg_uen", "Singaporean UEN", "123456789F", r"[0-9A-Z]{9,10}"),
        TaxIdType("za_vat", "South African VAT number", "4123456789", r"4[0-9]{9}"),
    ]
}

TAX_ID_CHOICES: list[tuple[str, str]] = [(t.code, t.label) for t in TAX_ID_TYPES.values()]


def tax_id_clean(type_code: str, value: str) -> str:
    """The value as stored and sent to Stripe (upper-cased, without spaces; a Swiss number
    written as Stripe writes it), or a ValidationError keyed by the field to correct."""
    if not type_code and not value.strip():
        return ""
    if not type_code:
        raise ValidationError({"tax_id_type": "Choose the kind of tax ID, or clear the number."})
    kind = TAX_ID_TYPES.get(type_code)
    if kind is None:
        raise ValidationError({"tax_id_type": "Choose a kind of tax ID from the list."})
    compact = re.sub(r"\s+", "", value).upper()
    if not compact:
        raise ValidationError({"tax_id_value": f"Enter the {kind.label}, or choose no tax ID."})
    if not kind.fits(compact):
        raise ValidationError(
            {"tax_id_value": f"This is not written as {kind.label}s are, e.g. {kind.example}."}
        )
    if kind.code == "ch_vat":
        digits = re.sub(r"[^0-9]", "", compact)
        suffix = re.search(r"(MWST|TVA|IVA)$", compact)
        return (
            f"CHE-{digits[:3]}.{digits[3:6]}.{digits[6:]} {suffix.group(1) if suffix else 'MWST'}"
        )
    return compact
