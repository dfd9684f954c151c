"""The spec's `pricing` and `x-opsdeck.currency` as the loader reads and checks them."""

from decimal import Decimal

from tests.engine.test_spec_validation import WORKFLOWS, check, errors


def test_the_currency_defaults_to_usd():
    assert check(lambda d: d.get("x-opsdeck", {}).pop("currency", None)).spec.currency == "usd"


def test_a_currency_is_three_lowercase_letters():
    def set_currency(value):
        return lambda d: d.setdefault("x-opsdeck", {}).update(currency=value)

    assert check(set_currency("eur")).spec.currency == "eur"
    for bad in ("EUR", "euro", "e1r", 3):
        assert errors(set_currency(bad)) == [
            f'x-opsdeck.currency: "{bad}" is not a currency code (3 lowercase letters)'
        ]


def test_a_price_is_per_hour_or_per_month_and_per_hour_by_default():
    def pricing(*items):
        return lambda d: d.update(pricing=list(items))

    spec = check(pricing({"dimension": "cpu", "price": "1"})).spec
    assert spec.pricing[0]["timeUnit"] == "hour"
    assert errors(pricing({"dimension": "cpu", "price": "1", "timeUnit": "day"})) == [
        'pricing[0].timeUnit: unknown time unit "day"; expected one of hour, month'
    ]


def test_a_dimension_is_priced_once_with_at_most_8_decimals():
    def pricing(*items):
        return lambda d: d.update(pricing=list(items))

    assert errors(
        pricing(
            {"dimension": "cpu", "price": "1"},
            {"dimension": "cpu", "price": "2"},
            {"dimension": "memory", "price": "0.000000001"},
            {"dimension": "storage", "price": "1e20"},
        )
    ) == [
        'pricing[1].dimension: "cpu" is priced twice',
        "pricing[2].price: use at most 10 digits before and 8 after the decimal point",
        "pricing[3].price: use at most 10 digits before and 8 after the decimal point",
    ]
    assert check(lambda d: None, WORKFLOWS).spec.pricing[1]["price"] == Decimal("0.0002")
