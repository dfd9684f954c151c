"""`python -m bench.meter_events [--count 10000]`: how fast the outbox flushes meter events to
the Stripe emulator, next to a bare loop calling the SDK.

It runs on a throwaway database, as the other benchmarks do (`support.run_measuring`): the
development database is never touched. The measuring process starts an emulator of its own,
syncs a one-plan catalog, records `--count` usage records (instances by hours, one dimension)
for a tenant with a Stripe customer, enqueues them, then times `meter_events.flush()` sending
them all. The baseline sends the same events (value, customer, timestamp, identifier) through
`client.v1.billing.meter_events.create` in a plain loop, to a fresh emulator. Figures, not
pass/fail; `meter_events_ratio` in `var/bench.json` is the baseline's rate over the flush's.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from decimal import Decimal

from .support import BenchError, figures_record, measure_or_run

INSTANCES = 100  # rows per hour; hours = count / INSTANCES
API_KEY = "sk_test_opsdeck_bench"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.meter_events", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--count", type=int, default=10_000, help="meter events (default 10000)")
    # The measuring child process, run on the throwaway database.
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count < INSTANCES or args.count % INSTANCES:
        parser.error(f"--count must be a positive multiple of {INSTANCES}")
    if not args.inner:
        measure_or_run("bench.meter_events", inner=False, argv=argv, measure=lambda: None)
        return
    from stripe_emulator import StripeEmulator

    # The gateway reads the emulator's address from the settings: it runs before Django starts.
    with StripeEmulator() as emulator:
        os.environ.update(STRIPE_API_KEY=API_KEY, STRIPE_API_BASE=emulator.url)
        measure_or_run(
            "bench.meter_events", inner=True, argv=argv, measure=lambda: _measure(args.count)
        )


def _measure(count: int) -> None:
    from stripe_emulator import StripeEmulator

    enqueue_rate, flush_rate, events = _opsdeck(count)
    with StripeEmulator() as emulator:
        base_rate = _baseline(emulator, events)
    ratio = base_rate / flush_rate
    print(f"{count} meter events to the Stripe emulator (in-process), one flusher")
    print(f"{'Opsdeck enqueue':28} {enqueue_rate:9.0f} rows/s")
    print(f"{'Opsdeck flush':28} {flush_rate:9.0f} events/s")
    print(f"{'baseline (bare SDK loop)':28} {base_rate:9.0f} events/s")
    print(f"{'Opsdeck vs baseline':28} {ratio:9.2f}x  (time per event)")
    figures_record({"meter_events_ratio": round(ratio, 3)})


def _opsdeck(count: int) -> tuple[float, float, list[dict]]:
    from django.utils import timezone

    from accounts.models import Tenant
    from billing import meter_events, stripe_sync, usage
    from billing.models import MeterEvent, Plan, Price, Subscription
    from billing.stripe_gateway import gateway

    gw = gateway()
    assert gw is not None  # noqa: S101 - the environment above configures it
    plan = Plan.objects.create(key="bench", name="Bench", service="bench")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.05"))
    stripe_sync.catalog_sync(gw)
    tenant = Tenant.objects.create(name="Bench", slug="bench")
    customer = stripe_sync.customer_ensure(gw, tenant)
    customer.created_at = timezone.now() - timedelta(days=30)
    customer.save(update_fields=["created_at"])
    # As the checkout webhook leaves it, made with the customer: usage goes to Stripe only for
    # the hours a subscription has billed since it was made.
    Subscription.objects.create(
        tenant=tenant, plan=plan, status=Subscription.Status.ACTIVE,
        stripe_customer_id=customer.customer_id, stripe_subscription_id="sub_bench",
        created_at=customer.created_at,
    )  # fmt: skip
    last = usage.hour_start(timezone.now()) - timedelta(hours=1)
    for back in range(count // INSTANCES):
        usage.record(
            last - timedelta(hours=back),
            [
                usage.UsageRow(tenant.pk, plan.pk, f"inst-{i:08}", f"bench-{i}", "cpu", "core",
                               Decimal("1.5"))
                for i in range(INSTANCES)
            ],
        )  # fmt: skip

    started = time.perf_counter()
    added = meter_events.enqueue()
    enqueue_rate = added / (time.perf_counter() - started)
    started = time.perf_counter()
    flushed = meter_events.flush()
    flush_rate = flushed.sent / (time.perf_counter() - started)
    if flushed.sent != count or added != count:
        raise BenchError(f"expected {count} events, enqueued {added}, sent {flushed.sent}")
    events = [
        {"event_name": e.event_name, "identifier": e.identifier, "timestamp": e.timestamp,
         "payload": {"stripe_customer_id": e.customer_id, "value": e.value}}
        for e in MeterEvent.objects.order_by("id")
    ]  # fmt: skip
    return enqueue_rate, flush_rate, events


def _baseline(emulator, events: list[dict]) -> float:
    """The same events through the SDK in a plain loop: no database, no bookkeeping."""
    import stripe
    from django.conf import settings

    client = stripe.StripeClient(
        API_KEY,
        stripe_version=settings.STRIPE_API_VERSION,
        base_addresses=emulator.base_addresses,  # type: ignore[arg-type]
        max_network_retries=0,
    )
    client.v1.billing.meters.create(
        {
            "display_name": "cpu",
            "event_name": events[0]["event_name"],
            "default_aggregation": {"formula": "sum"},
            "customer_mapping": {"type": "by_id", "event_payload_key": "stripe_customer_id"},
            "value_settings": {"event_payload_key": "value"},
        }
    )
    params = [{**e, "timestamp": int(e["timestamp"].timestamp())} for e in events]
    started = time.perf_counter()
    for event in params:
        client.v1.billing.meter_events.create(event)
    return len(params) / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
