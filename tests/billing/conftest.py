"""Stripe fixtures for billing: an emulator on a free port, settings pointing at it, a plan
with prices, and usage recorded for a tenant."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest

from stripe_emulator import StripeEmulator
from tests.servers import Relay

API_KEY = "sk_test_opsdeck_billing"
WEBHOOK_SECRET = "whsec_test_opsdeck_billing"


@pytest.fixture
def emulator() -> Iterator[StripeEmulator]:
    with StripeEmulator() as em:
        yield em


@pytest.fixture
def stripe_settings(settings, emulator):
    """Billing talks to the emulator, as it would to Stripe."""
    settings.STRIPE_API_KEY = API_KEY
    settings.STRIPE_API_BASE = emulator.url
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    return settings


@pytest.fixture
def stripe_relay(emulator, stripe_settings) -> Iterator[Relay]:
    """Billing talks to the emulator through a relay that can hold one of its answers back."""
    with Relay(emulator.url) as relay:
        stripe_settings.STRIPE_API_BASE = relay.url
        yield relay


@pytest.fixture
def gw(stripe_settings):
    from billing.stripe_gateway import gateway

    return gateway()


@pytest.fixture
def priced_plan(db):
    """A plan pricing cpu at $0.05 an hour and storage at $0.10 a GiB-month."""
    from billing.models import Plan, Price

    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))
    Price.objects.create(
        plan=plan, dimension="storage", unit="GiB", time_unit="month", unit_price=Decimal("0.10")
    )
    return plan


@pytest.fixture
def customer(gw, tenant):
    """The tenant's Stripe customer, there for 40 days (usage from then on goes to Stripe)."""
    from django.utils import timezone

    from billing import stripe_sync

    stored = stripe_sync.customer_ensure(gw, tenant)
    stored.created_at = timezone.now() - timedelta(days=40)
    stored.save(update_fields=["created_at"])
    return stored


@pytest.fixture
def record_usage(tenant, priced_plan):
    """Record one hour of usage: `record_usage(hour, ("inst-a", "cpu", "2.5"), ...)`."""
    from billing import usage
    from billing.usage import UsageRow

    def record(hour, *quantities: tuple[str, str, str]):
        return usage.record(
            hour,
            [
                UsageRow(
                    tenant_id=tenant.pk,
                    plan_id=priced_plan.pk,
                    instance_id=instance_id,
                    instance_name=instance_id,
                    dimension=dimension,
                    unit="",
                    quantity=Decimal(quantity),
                )
                for instance_id, dimension, quantity in quantities
            ],
        )

    return record
