"""`python -m bench.admin_lists SPEC [--scale 1]`: the staff's admin lists at a fleet's size.

The outer process creates a throwaway database and runs the measuring one on it
(`support.run_measuring`). That one loads the plan and fills the tables that grow with the
fleet — at `--scale` 1, 10,000 instances in 1,000 organizations, 100,000 operations, 1,000,000
audit events, 2,000,000 usage records, 200,000 Stripe meter events and 300,000 snapshots (a
month of daily backups) — by copying one row made through the models with `INSERT … SELECT`
over `generate_series`, then vacuums and analyzes them as autovacuum keeps a database in
service.

Then it requests every list of the admin through Django's test client as a superuser, `--rounds`
times each, and prints the median time, and the rows and index entries the page's statements
read of the list's table (PostgreSQL's own counters, in the request's transaction), beside the
rows the table holds. A list that reads about a page of its table costs the same at any size;
one that reads its whole table (a count, a DISTINCT, a sort without an index) grows with it.
Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import NamedTuple

from .support import figures_record, measure_or_run, rows_read

ROUNDS = 5  # requests of each list, their median printed (`--rounds`)
# The tables' rows at --scale 1: a fleet of 10,000 instances after some months.
SIZES = {
    "tenants": 1_000,
    "instances": 10_000,
    "operations": 100_000,
    "audit_events": 1_000_000,
    "usage_records": 2_000_000,
    "meter_events": 200_000,
    "snapshots": 300_000,  # a month of daily backups
}


def measure(*, spec_path: Path, scale: float, rounds: int = ROUNDS) -> None:
    from django.core.management import call_command
    from django.test.utils import override_settings

    call_command("migrate", verbosity=0, interactive=False)
    call_command("collectstatic", verbosity=0, interactive=False)  # as a deployment serves it
    sizes = {name: max(1, round(rows * scale)) for name, rows in SIZES.items()}
    started = time.perf_counter()
    _fill(spec_path, sizes)
    print(
        f"the admin's lists with {sizes['instances']:,} instances, "
        f"{sizes['operations']:,} operations, {sizes['audit_events']:,} audit events, "
        f"{sizes['usage_records']:,} usage records, {sizes['meter_events']:,} meter events "
        f"and {sizes['snapshots']:,} snapshots "
        f"(made in {time.perf_counter() - started:.0f} s); median of {rounds} requests each:"
    )
    print(f"  {'list':40} {'rows':>11} {'read':>9} {'statements':>10} {'ms':>8}")
    # Production settings (DEBUG off): the test client's host admitted, its requests over HTTPS.
    with override_settings(ALLOWED_HOSTS=["testserver"]):
        client = _staff_client()
        found = [_list(model, client, rounds) for model, _ in _lists()]
    for f in sorted(found, key=lambda f: -f.seconds):
        print(f"  {f.name:40} {f.rows:11,} {f.read:9,} {f.statements:10} {f.seconds * 1000:8.1f}")
    slowest = max(found, key=lambda f: f.seconds)
    most = max(found, key=lambda f: f.read)
    print(
        f"  slowest: {slowest.name}, {slowest.seconds * 1000:.1f} ms; most rows read by a page: "
        f"{most.name}, {most.read:,} of {most.rows:,}"
    )
    figures_record(
        {
            "admin_list_slowest_ms": round(slowest.seconds * 1000, 1),
            "admin_list_most_rows_read": most.read,
        }
    )


class Listed(NamedTuple):
    """What one list of the admin cost: its table's rows, what one request of it read of the
    table, its statements, and its median time."""

    name: str
    rows: int
    read: int
    statements: int
    seconds: float


def _lists():
    from django.contrib import admin

    return sorted(
        admin.site._registry.items(),
        key=lambda item: (item[0]._meta.app_label, item[0]._meta.model_name),
    )


def _list(model, client, rounds: int) -> Listed:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {model._meta.db_table}")  # noqa: S608
        (rows,) = cursor.fetchone()
    times, reads = [], []
    for _ in range(rounds + 1):  # the first warms the session and the caches
        # In one transaction: PostgreSQL's counters of it are not yet flushed to its statistics.
        with transaction.atomic(), CaptureQueriesContext(connection) as statements:
            before = rows_read(model)
            started = time.perf_counter()
            response = client.get(url, secure=True)
            times.append(time.perf_counter() - started)
            reads.append(rows_read(model) - before)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}")
    return Listed(
        name=f"{model._meta.app_label} / {model._meta.verbose_name_plural}",
        rows=rows,
        read=int(statistics.median(reads[1:])),
        statements=len(statements) - 2,  # the last request's, but for the two of rows_read
        seconds=statistics.median(times[1:]),
    )


def _staff_client():
    """A test client signed in as a superuser."""
    from django.test import Client

    from accounts.models import User

    client = Client()
    client.force_login(User.objects.create_superuser(email="staff@bench.example", password=None))
    return client


# --- the fleet's rows --------------------------------------------------------------------------


def _fill(spec_path: Path, sizes: dict[str, int]) -> None:
    """One row of each table made through the models, copied in SQL to `sizes`."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from django.db import connection
    from django.utils import timezone

    from accounts.audit import Actor
    from accounts.models import AuditEvent, Tenant, User
    from accounts.services import tenant_create
    from billing.models import MeteredHour, MeterEvent, UsageRecord
    from deployments import services
    from deployments.models import Cell, Instance, Operation, Snapshot

    version = services.plan_load(text=spec_path.read_text()).version
    user = User.objects.create_user(email="owner@bench.example", password=None)
    tenant = tenant_create(actor=Actor(user=user), name="Org 0")
    cell = Cell.objects.create(name="cell-1", region="eu-west", kubeconfig="apiVersion: v1")
    instance = Instance.objects.create(
        id="i000000000000", tenant=tenant, name="db-0", plan_version=version, cell=cell,
        state=Instance.State.RUNNING, parameters={"instances": 3},
        secret_parameters=json.dumps({"superuserPassword": "p" * 24}), created_by=user,
    )  # fmt: skip
    operation = Operation.objects.create(
        instance=instance, verb="create", requested_by=user, request_id="r0", plan_version=version,
        state=Operation.State.SUCCEEDED, finished_at=timezone.now(),
        engine_state=json.dumps({"nodes": {f"n{n}": {"phase": "Succeeded"} for n in range(20)}}),
    )  # fmt: skip
    event = AuditEvent.objects.create(
        tenant=tenant, actor=user, actor_email=user.email, actor_kind="user",
        action="instance.create", target_type="instance", target_id=instance.pk,
    )  # fmt: skip
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk, plan_version=version,
        name="db-0-20261101", status=Snapshot.Status.COMPLETED, operation=operation,
        metadata={"backupName": "db-0-20261101", "size": "1Gi"}, parameters={"instances": 3},
    )  # fmt: skip
    hour = datetime(2026, 11, 1, tzinfo=UTC)
    record = UsageRecord.objects.create(
        tenant=tenant, plan=version.plan, instance_id=instance.pk, instance_name="db-0",
        dimension="cpu", unit="core", hour=hour, quantity=Decimal(1), period="2026-11",
    )  # fmt: skip
    MeteredHour.objects.create(hour=hour)
    meter_event = MeterEvent.objects.create(
        usage_record=record, identifier="e0", customer_id="cus_0", event_name="opsdeck_cpu",
        value="1000000", timestamp=hour,
    )  # fmt: skip
    t = sizes["tenants"]
    i = sizes["instances"]
    actions = (
        "array['instance.create','instance.stop','instance.start','member.invite','user.login']"
    )
    of_a_tenant = f"(SELECT min(id) FROM accounts_tenant) + g % {t}"  # noqa: S608 - our SQL
    copies = [
        (Tenant, tenant.pk, t - 1, {"name": "'Org ' || g", "slug": "'org-' || g",
                                    "request_id": "'t' || g"}),
        (Instance, instance.pk, i - 1, {
            "id": "'i' || lpad(g::text, 12, '0')", "name": "'db-' || g",
            "tenant_id": of_a_tenant, "created_at": "now() - g * interval '1 hour'"}),
        (Operation, str(operation.pk), sizes["operations"] - 1, {
            "id": "gen_random_uuid()", "request_id": "'r' || g",
            "instance_id": f"'i' || lpad((g % {i})::text, 12, '0')",
            "created_at": "now() - g * interval '1 minute'"}),
        (AuditEvent, event.pk, sizes["audit_events"] - 1, {
            "tenant_id": of_a_tenant, "action": f"({actions})[1 + g % 5]",
            "created_at": "now() - g * interval '10 second'"}),
        (UsageRecord, record.pk, sizes["usage_records"] - 1, {
            "instance_id": f"'i' || lpad((g % {i})::text, 12, '0')",
            "dimension": f"(array['cpu','memory','storage'])[1 + (g / {i}) % 3]",
            "hour": f"timestamptz '2026-11-01' - (g / (3 * {i})) * interval '1 hour'",
            "period": f"to_char(timestamptz '2026-11-01' - (g / (3 * {i})) * interval '1 hour', "
                      "'YYYY-MM')"}),
        (Snapshot, snapshot.pk, sizes["snapshots"] - 1, {
            "name": "'db-' || g", "instance_id": f"'i' || lpad((g % {i})::text, 12, '0')",
            "source_instance_id": f"'i' || lpad((g % {i})::text, 12, '0')",
            "tenant_id": of_a_tenant, "created_at": "now() - g * interval '9 second'"}),
        (MeterEvent, meter_event.pk, sizes["meter_events"] - 1, {
            "identifier": "'e' || g",
            "usage_record_id": "(SELECT min(id) FROM billing_usagerecord) + g",
            "timestamp": "timestamptz '2026-11-01' - g * interval '1 second'"}),
    ]  # fmt: skip
    with connection.cursor() as cursor:
        for model, source, count, changed in copies:
            if count > 0:
                cursor.execute(*_copy(model, source, count, changed))
        cursor.execute(
            "INSERT INTO billing_meteredhour (hour, instances, recorded_at) "
            "SELECT DISTINCT hour, 0, now() FROM billing_usagerecord ON CONFLICT DO NOTHING"
        )
        cursor.execute("VACUUM ANALYZE")


def _copy(model, source, count: int, changed: dict[str, str]) -> tuple[str, list]:
    """`INSERT … SELECT` of `count` copies of the model's row `source`, each column as it is
    unless `changed` gives it an SQL expression of the copy's number `g` (1 to `count`)."""
    from django.db import connection

    table = model._meta.db_table
    key = model._meta.pk.column
    columns = [
        field.column
        for field in model._meta.concrete_fields
        if field.column in changed or not (field.primary_key and key not in changed)
    ]
    quoted = ", ".join(connection.ops.quote_name(column) for column in columns)
    values = ", ".join(
        changed[column].replace("%", "%%") if column in changed else f"s.{column}"
        for column in columns
    )
    return (
        f"INSERT INTO {table} ({quoted}) SELECT {values} "  # noqa: S608 - our tables, our SQL
        f"FROM {table} s, generate_series(1, {count}) g WHERE s.{key} = %s",
        [source],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.admin_lists",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", type=Path, help="the plan spec the instances run")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="the tables' size, times the default (1)"
    )
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"requests of each list (default {ROUNDS})"
    )
    # The measuring child process, run on the throwaway database.
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scale <= 0:
        parser.error("--scale must be positive")
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    measure_or_run(
        "bench.admin_lists",
        inner=args.inner,
        argv=argv,
        measure=lambda: measure(
            spec_path=args.spec.resolve(), scale=args.scale, rounds=args.rounds
        ),
    )


if __name__ == "__main__":
    main()
