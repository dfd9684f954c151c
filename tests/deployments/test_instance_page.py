"""The instance page: its tabs, its actions, and who may see and do what."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.audit import Actor
from deployments import services
from deployments.models import Cell, Instance, Operation, Snapshot, TaskRun
from tests.deployments.conftest import SPEC

SECRET = "s3cret-Pa55word-xyz"


@pytest.fixture
def plan(db):
    return services.plan_load(text=SPEC.read_text()).plan


@pytest.fixture
def local_cell(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True)


def _create(user, tenant, plan, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=user), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


@pytest.fixture
def instance(owner, tenant, plan, local_cell):
    """A running instance whose create succeeded (with task runs), with a completed backup."""
    create = _create(owner, tenant, plan, password=SECRET, instances="2")
    now = timezone.now()
    Operation.objects.filter(pk=create.pk).update(
        state=Operation.State.SUCCEEDED,
        started_at=now - timedelta(seconds=95),
        finished_at=now - timedelta(seconds=5),
    )
    TaskRun.objects.create(
        operation=create, node="main.cluster", attempt=1, state="Failed",
        message="Cluster not ready: waiting for the primary",
        started_at=now - timedelta(seconds=90), finished_at=now - timedelta(seconds=60),
    )  # fmt: skip
    TaskRun.objects.create(
        operation=create, node="main.cluster", attempt=2, state="Succeeded",
        message="Cluster in healthy state", started_at=now - timedelta(seconds=50),
        finished_at=now - timedelta(seconds=5),
    )  # fmt: skip
    instance = create.instance
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING, outputs={"primary": f"{instance.pk}-1"}
    )
    Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-20261130080000",
        status=Snapshot.Status.COMPLETED, parameters=instance.parameters,
        expires_at=now + timedelta(days=30),
    )  # fmt: skip
    instance.refresh_from_db()
    return instance


def _url(instance, suffix=""):
    return f"/t/{instance.tenant.slug}/deployments/{instance.pk}/{suffix}"


@pytest.mark.parametrize("tab", ["overview", "operations", "backups", "activity"])
def test_each_tab_renders_and_never_shows_a_password(owner_client, instance, tab):
    page = owner_client.get(_url(instance), {"tab": tab})

    assert page.status_code == 200
    html = page.content.decode()
    assert SECRET not in html
    assert instance.name in html and instance.pk in html
