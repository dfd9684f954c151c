"""Rows for page tests, made straight in the database (no cluster, no worker)."""

import hashlib
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from billing.models import Plan
from deployments.models import Cell, Instance, InstanceStateChange, Operation, PlanVersion

SPEC = Path(__file__).resolve().parents[2] / "specs" / "postgres-cnpg.yaml"
VALKEY = SPEC.with_name("valkey.yaml")


def postgres_version() -> PlanVersion:
    from deployments import services

    return services.plan_load(text=SPEC.read_text()).version


def other_service_version(service: str = "redis") -> PlanVersion:
    """Version 3 of a plan of another service, whose spec (Valkey's) is long: a list that
    read every row's spec text would be slow."""
    plan = Plan.objects.create(
        key=f"{service}-dev", name=f"{service.title()} — Dev", service=service
    )
    text = VALKEY.read_text() + "# a long spec\n" * 1000
    return PlanVersion.objects.create(
        plan=plan, number=3, spec_text=text, parsed={"x": 1},
        digest=hashlib.sha256(text.encode()).hexdigest(),
    )  # fmt: skip


# A cell's object store: a plan whose spec reads `$sys.backup.*` is not loaded while a cell it
# may run on has none.
BACKUPS = {
    "backup_destination": "s3://backups/opsdeck",
    "backup_credentials": '{"ACCESS_KEY_ID": "k", "ACCESS_SECRET_KEY": "s"}',
}


def cell(name: str = "eu-1", region: str = "eu-west") -> Cell:
    # A kubeconfig is stored encrypted: a list that reads it decrypts it.
    return Cell.objects.create(
        name=name, region=region, kubeconfig="apiVersion: v1\nkind: Config", **BACKUPS
    )


def make_instances(tenant, version, cell, count: int, *, state="running", name="db", ago=0):
    """`count` instances named `name-<n>`, the later numbers created later."""
    start = timezone.now() - timedelta(days=ago, hours=count)
    return Instance.objects.bulk_create(
        Instance(
            tenant=tenant,
            name=f"{name}-{n}",
            plan_version=version,
            cell=cell,
            state=state,
            created_at=start + timedelta(hours=n),
        )
        for n in range(count)
    )


def make_operation(instance, *, verb="create", state="running", ago=timedelta(0), error=""):
    at = timezone.now() - ago
    finished = state in {"succeeded", "failed", "cancelled"}
    return Operation.objects.create(
        instance=instance,
        verb=verb,
        request_id=f"{verb}-{Operation.objects.count()}",
        plan_version=instance.plan_version,
        state=state,
        created_at=at,
        started_at=at,
        finished_at=at if finished else None,
        error=error,
        engine_state='{"secret": "x"}',
    )


PARAMETERS = {"version": "17", "instances": 3, "cpu": 2, "memoryGi": 4, "storageGi": 20,
              "database": "app", "owner": "app"}  # fmt: skip


def ran_since(tenant, version, cell, since, *, name="orders") -> Instance:
    """An instance that has been running since `since`, with the state history and create
    operation the runner leaves (what metering reads)."""
    instance = Instance.objects.create(
        tenant=tenant, name=name, plan_version=version, cell=cell, parameters=PARAMETERS,
        state=Instance.State.RUNNING, created_at=since,
    )  # fmt: skip
    InstanceStateChange.objects.create(instance=instance, to_state="creating", at=since)
    Operation.objects.create(
        instance=instance, verb="create", request_id=f"create-{name}", plan_version=version,
        requested=PARAMETERS, parameters=PARAMETERS, state=Operation.State.SUCCEEDED,
        created_at=since, started_at=since, finished_at=since + timedelta(minutes=1),
    )  # fmt: skip
    InstanceStateChange.objects.create(
        instance=instance, from_state="creating", to_state="running",
        at=since + timedelta(minutes=1),
    )  # fmt: skip
    return instance
