"""`python -m bench.metering SPEC [--count 10000]`: metering one hour, next to a hand-made
`INSERT … SELECT` of the same rows.

The outer process creates a throwaway database and runs the measuring one on it
(`support.run_measuring`). That one loads the plan and bulk-creates `--count` instances of
several sizes (the plan's defaults, and twice each numeric parameter its usage rules read, where
valid), created two hours before the metered hour, each with its state history (creating,
running) and its succeeded create; one in ten is stopped since before the hour (storage only).
Then, in turns, `metering.meter_hour()` (state history, operations, usage rules,
`billing.usage.record`) and one `INSERT … SELECT` that computes the same rows in SQL from the
instances' current state and parameters; the rows are deleted between turns, and the two
results compared.

The baseline is written from the spec: each usage rule must be a product of numeric parameters
(`double(var.cpu) * double(var.instances)`), which it turns into SQL; it knows that no state
changed in the hour, which metering cannot assume. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime, timedelta
from itertools import product
from pathlib import Path

from .support import BenchError, figures_record, measure_or_run

HOUR = datetime(2026, 11, 2, 13, tzinfo=UTC)
ROUNDS = 3
AIM_RATIO = 2.0
FACTOR = re.compile(r"\s*double\(var\.([A-Za-z_][A-Za-z0-9_]*)\)\s*")

BASELINE = """
INSERT INTO billing_usagerecord
    (tenant_id, plan_id, instance_id, instance_name, dimension, unit, hour, quantity, period,
     adjustment, recorded_at)
SELECT i.tenant_id, pv.plan_id, i.id, i.name, d.dimension, d.unit, %(hour)s, d.quantity,
       %(period)s, false, now()
FROM deployments_instance i
JOIN deployments_planversion pv ON pv.id = i.plan_version_id
CROSS JOIN LATERAL (VALUES {dimensions}) AS d(dimension, unit, quantity)
WHERE i.created_at < %(hour)s
  AND (i.state IN ({all_states}) OR (i.state IN ({persistent_states}) AND d.dimension IN
       ({persistent_dimensions})))
ON CONFLICT DO NOTHING
"""


def baseline_sql(spec) -> tuple[str, list[str]]:
    """The `INSERT … SELECT` for the plan's usage rules, and the parameters they read."""
    from deployments import metering

    units = {item["dimension"]: item.get("unit", "") for item in spec.pricing}
    dimensions, read = [], []
    for dimension, rule in spec.usage_rules.items():
        factors = [FACTOR.fullmatch(factor) for factor in rule.split("*")]
        if not all(factors):
            raise BenchError(
                f"the usage rule of {dimension} ({rule}) is not a product of numeric parameters,"
                " which is all the hand-made baseline computes"
            )
        keys = [factor.group(1) for factor in factors]
        read += [k for k in keys if k not in read]
        quantity = " * ".join(f"(i.parameters->>'{k}')::numeric" for k in keys)
        dimensions.append(f"('{dimension}', '{units.get(dimension, '')}', {quantity})")
    if "base" not in spec.usage_rules:
        dimensions.append(f"('base', '{units.get('base', '')}', 1::numeric)")

    def listed(values) -> str:
        return ", ".join(f"'{v}'" for v in sorted(values))

    sql = BASELINE.format(
        dimensions=", ".join(dimensions),
        all_states=listed(metering.ALL_DIMENSIONS_STATES),
        persistent_states=listed(metering.PERSISTENT_STATES),
        persistent_dimensions=listed(metering.PERSISTENT_DIMENSIONS),
    )
    return sql, read


def sizes(spec, keys: list[str]) -> list[dict]:
    """Valid parameter values: each of `keys` at its default or twice it, in every combination
    the plan accepts."""
    from deployments.spec import validate_parameters
    from deployments.spec.params import ParameterErrors

    defaults = validate_parameters(spec.main.parameters, {})
    secret = {p.key for p in spec.main.parameters if p.type == "Password"}
    found = []
    for choice in product(*[(defaults[k], defaults[k] * 2) for k in keys]):
        try:
            values = validate_parameters(spec.main.parameters, dict(zip(keys, choice, strict=True)))
        except ParameterErrors:
            continue
        found.append({k: v for k, v in values.items() if k not in secret})
    return found


def measure(*, spec_path: Path, count: int) -> tuple[float, float]:
    """Seconds to meter one hour of `count` instances, and for the baseline (best of ROUNDS)."""
    from django.core.management import call_command
    from django.db import connection

    from billing.models import MeteredHour, UsageRecord
    from deployments import metering, selectors, services

    call_command("migrate", verbosity=0, interactive=False)
    version = services.plan_load(text=spec_path.read_text()).version
    spec = selectors.plan_spec(version)
    sql, keys = baseline_sql(spec)
    _instances(version, sizes(spec, keys), count)
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
            cursor.execute(sql, {"hour": HOUR, "period": HOUR.strftime("%Y-%m")})
        baseline.append(time.perf_counter() - started)
        rows["baseline"] = _stored()
    if rows["metering"] != rows["baseline"]:
        raise BenchError("metering and the baseline did not record the same rows")
    best, base = min(ours), min(baseline)
    print(f"metering one hour of {count} instances ({recorded.inserted} usage records)")
    print(f"{'Opsdeck meter_hour':28} {best:9.3f} s")
    print(f"{'baseline (INSERT … SELECT)':28} {base:9.3f} s")
    print(f"{'Opsdeck vs baseline':28} {best / base:9.2f}x  (aim: at most {AIM_RATIO:g}x)")
    cold, warm, held = _entitlement_usage(version)
    print(
        f"a tenant's usage summed for the entitlement check of a create ({held} instances): "
        f"{cold * 1000:.1f} ms in a new process, {warm * 1000:.1f} ms after"
    )
    figures_record(
        {
            "metering_ratio": round(best / base, 3),
            "metering_hour_s": round(best, 4),
            "entitlement_usage_cold_s": round(cold, 4),
            "entitlement_usage_warm_s": round(warm, 4),
        }
    )
    return best, base


def _entitlement_usage(version) -> tuple[float, float, int]:
    """Seconds to sum one tenant's usage of the plan, as each of its creates does: with no
    instance's quantities known yet (a new process), and after (best of ROUNDS); the tenant's
    instances."""
    from accounts.models import Tenant
    from deployments import entitlement_usage, metering

    tenant = Tenant.objects.order_by("pk").first()
    metering._stored_quantities.cache_clear()  # as in a new process
    started = time.perf_counter()
    usage = entitlement_usage.usage_on_plan(tenant, version.plan, dimensions=True)
    cold = time.perf_counter() - started
    warm = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        entitlement_usage.usage_on_plan(tenant, version.plan, dimensions=True)
        warm.append(time.perf_counter() - started)
    return cold, min(warm), usage.instances


def _stored() -> set[tuple]:
    from billing.models import UsageRecord

    return set(
        UsageRecord.objects.values_list("instance_id", "dimension", "unit", "quantity", "period")
    )


def _instances(version, values: list[dict], count: int) -> None:
    from accounts.models import Tenant
    from deployments.models import Cell, Instance, InstanceStateChange, Operation

    cell = Cell.objects.create(name="bench")
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"Bench {n}", slug=f"bench-{n}") for n in range(max(1, count // 100))
    )
    created = HOUR - timedelta(hours=2)
    running = created + timedelta(minutes=1)
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
                    instance=instance,
                    from_state="running",
                    to_state="stopped",
                    at=running + timedelta(minutes=30),
                )
            )
    InstanceStateChange.objects.bulk_create(changes, batch_size=5000)
    Operation.objects.bulk_create(
        (
            Operation(
                instance=instance,
                verb="create",
                request_id=f"create-{instance.pk}",
                plan_version=version,
                requested=instance.parameters,
                parameters=instance.parameters,
                state=Operation.State.SUCCEEDED,
                created_at=created,
                started_at=created,
                finished_at=running,
            )
            for instance in instances
        ),
        batch_size=2000,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.metering",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", type=Path, help="the plan spec whose usage rules are metered")
    parser.add_argument("--count", type=int, default=10_000, help="instances (default 10000)")
    # The measuring child process, run on the throwaway database.
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be positive")
    measure_or_run(
        "bench.metering",
        inner=args.inner,
        argv=argv,
        measure=lambda: measure(spec_path=args.spec.resolve(), count=args.count),
    )


if __name__ == "__main__":
    main()
