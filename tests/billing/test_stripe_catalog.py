"""`manage.py stripe_sync_catalog`: meters, products and metered prices made once in Stripe,
their ids stored, found again on every later run."""

from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing.models import Price, StripeMeter, StripePrice


def _sync() -> str:
    out = StringIO()
    call_command("stripe_sync_catalog", stdout=out)
    return out.getvalue()


def _posts(emulator) -> list[str]:
    return [r["path"] for r in emulator.requests() if r["method"] == "POST"]


def test_the_catalog_is_created_once_and_found_after(stripe_settings, emulator, priced_plan):
    first = _sync()

    assert "created meter opsdeck_pg_cpu" in first and "created meter opsdeck_pg_storage" in first
    assert "created product pg: opsdeck-plan-pg" in first
    assert "created price opsdeck-pg-cpu" in first and "5 created, 0 found." in first
    meters = emulator.requests()
    assert sorted(_posts(emulator)) == sorted(
        ["/v1/billing/meters"] * 2 + ["/v1/products"] + ["/v1/prices"] * 2
    )

    second = _sync()

    assert "0 created, 5 found." in second
    assert _posts(emulator) == [r["path"] for r in meters if r["method"] == "POST"]
    assert dict(StripeMeter.objects.values_list("dimension", "event_name")) == {
        "cpu": "opsdeck_pg_cpu", "storage": "opsdeck_pg_storage",
    }  # fmt: skip
    assert StripePrice.objects.count() == 2


def test_a_metered_price_charges_cents_per_millionth_of_a_unit_hour(
    stripe_settings, emulator, gw, priced_plan
):
    _sync()

    cpu = StripePrice.objects.get(price__dimension="cpu")
    storage = StripePrice.objects.get(price__dimension="storage")
    stripe_cpu = gw.client.v1.prices.retrieve(cpu.stripe_price_id)
    stripe_storage = gw.client.v1.prices.retrieve(storage.stripe_price_id)
    # $0.05 an hour: 5 cents per unit-hour, 0.000005 cents per millionth.
    assert Decimal(stripe_cpu.unit_amount_decimal) == Decimal("0.000005")
    # $0.10 a month (730 h): 0.0136986301… cents per unit-hour, to Stripe's 12 places.
    assert Decimal(stripe_storage.unit_amount_decimal) == Decimal("0.000000013699")
    assert (stripe_cpu.lookup_key, stripe_cpu.recurring.usage_type) == ("opsdeck-pg-cpu", "metered")
    meter = StripeMeter.objects.get(dimension="cpu")
    assert stripe_cpu.recurring.meter == meter.meter_id
    assert stripe_cpu.product == cpu.stripe_product_id == "opsdeck-plan-pg"


def test_a_price_in_a_three_decimal_currency_is_sent_to_stripe_in_thousandths(
    stripe_settings, emulator, gw, priced_plan
):
    """Stripe counts a Kuwaiti dinar's amounts in fils (1.500 KWD is 1500): sent in hundredths,
    a plan priced at 1 KWD a core-hour charged 0.1."""
    Price.objects.filter(plan=priced_plan).update(currency="kwd")
    _sync()

    cpu = StripePrice.objects.get(price__dimension="cpu")
    # 0.05 KWD an hour: 50 fils per unit-hour, 0.00005 fils per millionth.
    assert Decimal(gw.client.v1.prices.retrieve(cpu.stripe_price_id).unit_amount_decimal) == (
        Decimal("0.00005")
    )


def test_a_changed_price_replaces_the_stripe_price_and_keeps_its_lookup_key(
    stripe_settings, emulator, gw, priced_plan
):
    _sync()
    old = StripePrice.objects.get(price__dimension="cpu").stripe_price_id
    Price.objects.filter(dimension="cpu").update(unit_price=Decimal("0.06"))

    out = _sync()

    assert "created price opsdeck-pg-cpu" in out and "1 created, 4 found." in out
    new = StripePrice.objects.get(price__dimension="cpu").stripe_price_id
    assert new != old
    assert gw.price_by_lookup_key("opsdeck-pg-cpu").id == new


def test_without_stripe_there_is_no_catalog_to_sync(settings, priced_plan):
    settings.STRIPE_API_KEY = ""

    with pytest.raises(CommandError, match="STRIPE_API_KEY is not set"):
        _sync()
