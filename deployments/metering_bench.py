"""`manage.py bench_metering [--count 10000]`: metering one hour, next to a hand-written
`INSERT … SELECT` of the same rows.

`run()` (the command) creates a fresh PostgreSQL database `opsdeck_bench_<random>` on the
configured server, runs `measure()` in a child process (`bench_metering --inner`) whose
settings point at that database, and drops it at the end, even on failure: the development
database is never used (as `bench_operations`, whose helpers it shares).

`measure()` loads the CloudNativePG plan and bulk-creates `--count` instances of twelve sizes,
created two hours before the metered hour, each with its state history (creating, running) and
its succeeded create; one in ten is stopped since before the hour (storage only). Then, in
turns, `metering.meter_hour()` (state history, operations, usage rules, `billing.usage.record`)
and one `INSERT … SELECT` that computes the same rows in SQL from the instances' current
state and parameters (it knows these usage rules and that no state changed in the hour, which
metering cannot assume); the rows are deleted between turns, and the two results compared.
Figures are printed, never asserted. Never imported by the request path.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import product

from deployments.bench import (
    ROOT,
    BenchError,
    _database_create,
    _database_drop,
    _database_url,
    _fernet_key,
)

HOUR = datetime(2026, 11, 2, 13, tzinfo=UTC)
ROUNDS = 3
AIM_RATIO = 2.0
SIZES = [
    {"instances": n, "cpu": cpu, "memoryGi": 2 * cpu, "storageGi": storage}
    for n, cpu, storage in product((1, 2, 3), (1, 2), (10, 50))
]

# The CloudNativePG plan's usage rules, written by hand for the baseline.
BASELINE = """
INSERT INTO billing_usagerecord
    (tenant_id, plan_id, instance_id, instance_name, dimension, unit, hour, quantity, period,
     adjustment, recorded_at)
SELECT i.tenant_id, pv.plan_id, i.id, i.name, d.dimension, d.unit, %(hour)s, d.quantity,
       %(period)s, false, now()
FROM deployments_instance i
JOIN deployments_planversion pv ON pv.id = i.plan_version_id
CROSS JOIN LATERAL (VALUES
    ('cpu', 'core', (i.parameters->>'cpu')::numeric * (i.parameters->>'instances')::numeric),
    ('memory', 'GiB',
     (i.parameters->>'memoryGi')::numeric * (i.parameters->>'instances')::numeric),
    ('storage', 'GiB',
     (i.parameters->>'storageGi')::numeric * (i.parameters->>'instances')::numeric),
    ('replica', '', (i.parameters->>'instances')::numeric),
    ('base', '', 1::numeric)
) AS d(dimension, unit, quantity)
WHERE i.created_at < %(hour)s
  AND (i.state IN ('creating', 'running', 'updating')
       OR (i.state IN ('stopped', 'failed') AND d.dimension = 'storage'))
ON CONFLICT DO NOTHING
"""


def run(*, count: int) -> None:
    """Create the bench database, measure in a child process on it, drop it (always)."""
    from django.conf import settings

    name = f"opsdeck_bench_{secrets.token_hex(4)}"
    db = settings.DATABASES["default"]
    _database_create(db, name)
    try:
        with tempfile.TemporaryDirectory(prefix="opsdeck-bench-") as var_dir:
            env = {
                **os.environ,
                "DATABASE_URL": _database_url(db, name),
                "DEBUG": "0",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "OPSDECK_ENCRYPTION_KEYS": _fernet_key(),
                "OPSDECK_VAR_DIR": var_dir,
                "LOG_LEVEL": "WARNING",
            }
            command = [sys.executable, str(ROOT / "manage.py"), "bench_metering", "--inner",
                       "--count", str(count)]  # fmt: skip
            code = subprocess.call(command, cwd=ROOT, env=env)  # noqa: S603
            if code != 0:
                raise BenchError(f"the benchmark failed (exit status {code}); see above")
    finally:
        _database_drop(db, name)


def measure(*, count: int, out: Callable[[str], None]) -> tuple[float, float]:
    """Seconds to meter one hour of `count` instances, and for the baseline (best of ROUNDS)."""
    from django.core.management import call_command
    from django.db import connection

    from billing.models import MeteredHour, UsageRecord
    from deployments import metering

    call_command("migrate", verbosity=0, interactive=False)
    _instances(count)
    metering.meter_hour(HOUR - timedelta(hours=1))  # warm up: the spec parsed, caches filled
    ours, baseline, rows = [], [], {}
    for _ in range(ROUNDS):
        UsageRecord.objects.all().delete()
        MeteredHour.objects.all().delete()
        started = time.perf_counter()
        recorded = metering.meter_hour(HOUR)
        ours.append(time.perf_counter() - started)
        rows["metering"] = _stored()
        UsageRecord.objects.all().delete()
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(BASELINE, {"hour": HOUR, "period": HOUR.strftime("%Y-%m")})
        baseline.append(time.perf_counter() - started)
        rows["baseline"] = _stored()
    if rows["metering"] != rows["baseline"]:
        raise BenchError("metering and the baseline did not record the same rows")
    best, base = min(ours), min(baseline)
    out(f"metering one hour of {count} instances ({recorded.inserted} usage records)")
    out(f"{'Opsdeck meter_hour':28} {best:9.3f} s")
    out(f"{'baseline (INSERT … SELECT)':28} {base:9.3f} s")
    out(f"{'Opsdeck vs baseline':28} {best / base:9.2f}x  (aim: at most {AIM_RATIO:g}x)")
    return best, base


def _stored() -> set[tuple]:
    from billing.models import UsageRecord

    return set(
        UsageRecord.objects.values_list("instance_id", "dimension", "unit", "quantity", "period")
    )


def _instances(count: int) -> None:
    from accounts.models import Tenant
    from deployments import selectors, services
    from deployments.models import Cell, Instance, InstanceStateChange, Operation
    from deployments.spec import validate_parameters

    version = services.plan_load(text=(ROOT / "specs" / "postgres-cnpg.yaml").read_text()).version
    spec = selectors.plan_spec(version)
    cell = Cell.objects.create(name="bench")
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"Bench {n}", slug=f"bench-{n}") for n in range(max(1, count // 100))
    )
    created = HOUR - timedelta(hours=2)
    running = created + timedelta(minutes=1)
    values = [
        {k: v for k, v in validate_parameters(spec.main.parameters, size).items()
         if k != "password"}
        for size in SIZES
    ]  # fmt: skip
    instances = Instance.objects.bulk_create(
        (
            Instance(
                tenant=tenants[n % len(tenants)],
                name=f"db-{n}",
                plan_version=version,
                cell=cell,
                parameters=values[n % len(values)],
                state=Instance.State.STOPPED if n % 10 == 9 else Instance.State.RUNNING,
                created_at=created,
            )
            for n in range(count)
        ),
        batch_size=2000,
    )
    changes = []
    for instance in instances:
        changes.append(InstanceStateChange(instance=instance, to_state="creating", at=created))
        changes.append(
            InstanceStateChange(
                instance=instance, from_state="creating", to_state="running", at=running
            )
        )
        if instance.state == Instance.State.STOPPED:
            changes.append(
                InstanceStateChange(
                    instance=instance, from_state="running", to_state="stopped",
                    at=running + timedelta(minutes=30),
                )
            )  # fmt: skip
    InstanceStateChange.objects.bulk_create(changes, batch_size=5000)
    Operation.objects.bulk_create(
        (
            Operation(
                instance=instance, verb="create", request_id=f"create-{instance.pk}",
                plan_version=version, requested=instance.parameters,
                parameters=instance.parameters, state=Operation.State.SUCCEEDED,
                created_at=created, started_at=created, finished_at=running,
            )
            for instance in instances
        ),
        batch_size=2000,
    )  # fmt: skip
