"""`python -m billing.bench_meter_events [--count 10000]` (in `make bench`): how fast the outbox
flushes meter events to the Stripe emulator, next to a bare loop calling the SDK.

Run it through the launcher (`python -m portal.launch --dev -- …`), which finds PostgreSQL.
Before Django starts, it creates a database of its own, `opsdeck_bench_meter_<random>`, on that
server and points DATABASE_URL at it; it drops it at the end, even on failure: the development
database is never touched. It starts an emulator in this process, syncs a one-plan catalog,
records `--count` usage records (instances by hours, one dimension) for a tenant with a Stripe
customer, enqueues them, then times `meter_events.flush()` sending them all. The baseline sends
the same events (value, customer, timestamp, identifier) through `client.v1.billing.meter_events
.create` in a plain loop, to a fresh emulator. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

import environ

INSTANCES = 100  # rows per hour; hours = count / INSTANCES


def _maintenance_connection(url: str):
    import psycopg

    db = environ.Env.db_url_config(url)
    params = {
        "host": db.get("HOST") or (db.get("OPTIONS") or {}).get("host") or None,
        "port": db.get("PORT") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
    }
    return psycopg.connect(
        dbname="postgres",
        autocommit=True,
        connect_timeout=10,
        **{k: v for k, v in params.items() if v},
    )


def _database_url(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="meter events (default 10000)")
    count = parser.parse_args(argv).count
    if count < INSTANCES or count % INSTANCES:
        parser.error(f"--count must be a positive multiple of {INSTANCES}")
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        parser.error("DATABASE_URL is not set: run it through `python -m portal.launch --dev --`")

    from psycopg import sql

    name = f"opsdeck_bench_meter_{secrets.token_hex(4)}"
    with _maintenance_connection(url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        return _run(_database_url(url, name), count)
    finally:
        with _maintenance_connection(url) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _run(database_url: str, count: int) -> int:
    from stripe_emulator import StripeEmulator

    with StripeEmulator() as emulator:
        os.environ.update(
            DATABASE_URL=database_url,
            STRIPE_API_KEY="sk_test_opsdeck_bench",
            STRIPE_API_BASE=emulator.url,
            CACHE_KEY_PREFIX=f"opsdeck-bench-meter-{secrets.token_hex(4)}",
            LOG_LEVEL="WARNING",
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        enqueue_rate, flush_rate, events = _opsdeck(count)
    with StripeEmulator() as emulator:
        base_rate = _baseline(emulator, events)

    from django.db import connections

    connections.close_all()
    print(f"{count} meter events to the Stripe emulator (in-process), one flusher")
    print(f"{'Opsdeck enqueue':28} {enqueue_rate:9.0f} rows/s")
    print(f"{'Opsdeck flush':28} {flush_rate:9.0f} events/s")
    print(f"{'baseline (bare SDK loop)':28} {base_rate:9.0f} events/s")
    print(f"{'Opsdeck vs baseline':28} {base_rate / flush_rate:9.2f}x  (time per event)")
    return 0


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
    # As the checkout webhook leaves it: usage goes to Stripe only where a subscription bills it.
    Subscription.objects.create(
        tenant=tenant, plan=plan, status=Subscription.Status.ACTIVE,
        stripe_customer_id=customer.customer_id, stripe_subscription_id="sub_bench",
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
        raise SystemExit(f"expected {count} events, enqueued {added}, sent {flushed.sent}")
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
        "sk_test_opsdeck_bench",
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
    sys.exit(main())
