"""Rows for page tests, made straight in the database (no cluster, no worker)."""

from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from billing.models import Plan
from deployments.models import Cell, Instance, Operation, PlanVersion

SPEC = Path(__file__).resolve().parents[2] / "specs" / "postgres-cnpg.yaml"


def postgres_version() -> PlanVersion:
    from deployments import services

    return services.plan_load(text=SPEC.read_text()).version


def other_service_version(service: str = "redis") -> PlanVersion:
    plan = Plan.objects.create(
        key=f"{service}-dev", name=f"{service.title()} — Dev", service=service
    )
    return PlanVersion.objects.create(
        plan=plan, number=3, spec_text="name: big spec\n" * 1000, parsed={"x": 1}, digest="d"
    )


def cell(name: str = "eu-1", region: str = "eu-west") -> Cell:
    # A kubeconfig is stored encrypted: a list that reads it decrypts it.
    return Cell.objects.create(name=name, region=region, kubeconfig="apiVersion: v1\nkind: Config")


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
