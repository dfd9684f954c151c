"""Every minute, the CPU and memory of each running instance's servers: one LIST of PodMetrics
per cell and selector, bulk-inserted once per minute, kept a day, and each hour's averages kept
7 days."""

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.audit import Actor
from deployments import metrics, services, tasks
from deployments.cells import driver_for
from deployments.models import Instance, Operation, ServerHour, ServerSample
from deployments.servers import ServersRule, servers_rule
from deployments.workflow.driver import TransientError
from tests.deployments import factories
from tests.deployments.conftest import SPEC, wait_done

# How a plan describes its servers (x-opsdeck.servers); added to the shipped spec when the
# checkout's copy does not carry it yet.
SERVERS = """\
  servers:
    selector: cnpg.io/podRole=instance
    role: cnpg.io/instanceRole
    container: postgres
    limits:
      cpu: "double(var.cpu)"
      memory: "double(var.memoryGi) * 1073741824.0"
"""
SELECTOR = "cnpg.io/podRole=instance"
MINUTE = datetime(2026, 11, 30, 12, 5, tzinfo=UTC)


def spec_with_servers() -> str:
    text = SPEC.read_text()
    if "\n  servers:\n" in text:
        return text
    return text.replace("\nx-opsdeck:\n", "\nx-opsdeck:\n" + SERVERS, 1)


def postgres_with_servers():
    return services.plan_load(text=spec_with_servers()).version


def pod_metrics(namespace: str, name: str, role: str = "replica", **usage) -> dict:
    """A PodMetrics as metrics-server serves it (labels copied from the pod)."""
    containers = usage.pop("containers", None) or [
        {"name": "postgres", "usage": {"cpu": "250m", "memory": "512Mi"}}
    ]
    return {
        "apiVersion": "metrics.k8s.io/v1beta1",
        "kind": "PodMetrics",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"cnpg.io/podRole": "instance", "cnpg.io/instanceRole": role},
        },
        "timestamp": "2026-11-30T12:04:50Z",
        "window": "15s",
        "containers": containers,
    }


class FakeMetricsDriver:
    """The part of the kube driver sampling uses, serving PodMetrics and counting LISTs."""

    def __init__(self, items: list[dict], error: Exception | None = None):
        self.items = items
        self.error = error
        self.lists: list[tuple[str, str, str]] = []

    def list_objects(self, api_version, kind, *, label_selector, page=500):
        self.lists.append((api_version, kind, label_selector))
        if self.error is not None:
            raise self.error
        yield from self.items


@pytest.fixture
def version(db):
    return postgres_with_servers()


@pytest.fixture
def local_cell(db):
    return factories.cell()


def _running(tenant, version, cell, name="db", state="running"):
    return Instance.objects.create(
        tenant=tenant, name=name, plan_version=version, cell=cell, state=state,
        parameters=factories.PARAMETERS,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("cpu", "memory", "millicores", "bytes_"),
    [
        ("12m", "1234Ki", 12, 1234 * 1024),
        ("12345678n", "12Mi", 12, 12 * 1024 * 1024),
        ("1", "1Gi", 1000, 1024**3),
        ("0.5", "1000000", 500, 1_000_000),
    ],
)
def test_kubernetes_quantities_are_read_as_millicores_and_bytes(cpu, memory, millicores, bytes_):
    pod = pod_metrics(
        "ns", "p", containers=[{"name": "c", "usage": {"cpu": cpu, "memory": memory}}]
    )

    assert metrics.usage_of(pod) == (millicores, bytes_)


def test_a_pods_usage_is_the_sum_of_its_containers():
    pod = pod_metrics("ns", "p", containers=[
        {"name": "postgres", "usage": {"cpu": "250m", "memory": "512Mi"}},
        {"name": "bootstrap", "usage": {"cpu": "5000000n", "memory": "16Mi"}},
    ])  # fmt: skip

    assert metrics.usage_of(pod) == (255, 528 * 1024 * 1024)


def test_one_list_per_cell_samples_every_running_instances_servers_once_a_minute(
    tenant, version, local_cell
):
    orders, billing = (
        _running(tenant, version, local_cell, "orders"),
        _running(tenant, version, local_cell),
    )
    stopped = _running(tenant, version, local_cell, "old", state="stopped")
    driver = FakeMetricsDriver([
        pod_metrics(orders.namespace, f"{orders.pk}-1", "primary"),
        pod_metrics(orders.namespace, f"{orders.pk}-2", "replica"),
        pod_metrics(billing.namespace, f"{billing.pk}-1", "primary"),
        pod_metrics(stopped.namespace, f"{stopped.pk}-1", "primary"),  # still winding down
        pod_metrics("inst-notours", "inst-notours-1", "primary"),  # no instance of this cell
    ])  # fmt: skip

    with CaptureQueriesContext(connection) as queries:
        offered = metrics.cell_sample(local_cell, driver, MINUTE)

    assert driver.lists == [("metrics.k8s.io/v1beta1", "PodMetrics", SELECTOR)]
    assert offered == 3
    samples = {(s.instance_id, s.server, s.role, s.cpu, s.memory, s.minute)
               for s in ServerSample.objects.all()}  # fmt: skip
    assert samples == {
        (orders.pk, f"{orders.pk}-1", "primary", 250, 512 * 1024**2, MINUTE),
        (orders.pk, f"{orders.pk}-2", "replica", 250, 512 * 1024**2, MINUTE),
        (billing.pk, f"{billing.pk}-1", "primary", 250, 512 * 1024**2, MINUTE),
    }
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1  # in bulk

    # The same minute again (beat ran twice, or a retry): nothing more, nothing changed.
    metrics.cell_sample(local_cell, driver, MINUTE + timedelta(seconds=30))
    assert ServerSample.objects.count() == 3


def test_a_spec_without_a_server_selector_describes_no_servers():
    assert servers_rule({}) is None
    assert servers_rule({"servers": {"role": "x"}}) is None
    assert servers_rule({"servers": {"selector": "app=db"}}) == ServersRule(selector="app=db")


def test_a_pod_whose_usage_cannot_be_read_is_skipped_and_the_others_kept(
    tenant, version, local_cell
):
    instance = _running(tenant, version, local_cell)
    bad = [{"name": "postgres", "usage": {"cpu": "lots", "memory": "1Mi"}}]
    driver = FakeMetricsDriver([
        pod_metrics(instance.namespace, f"{instance.pk}-1", containers=bad),
        pod_metrics(instance.namespace, f"{instance.pk}-2"),
    ])  # fmt: skip

    assert metrics.cell_sample(local_cell, driver, MINUTE) == 1
    assert list(ServerSample.objects.values_list("server", flat=True)) == [f"{instance.pk}-2"]


def test_a_cell_that_cannot_be_read_is_skipped_and_the_others_sampled(
    tenant, version, local_cell, monkeypatch, caplog
):
    other = factories.cell("us-1", "us-east")
    down, up = _running(tenant, version, local_cell), _running(tenant, version, other, "up")
    drivers = {
        local_cell.pk: FakeMetricsDriver([], error=TransientError("The cluster did not answer")),
        other.pk: FakeMetricsDriver([pod_metrics(up.namespace, f"{up.pk}-1")]),
    }
    monkeypatch.setattr(metrics, "driver_for", lambda c: drivers[c.pk])
    ServerSample.objects.create(
        instance=up, server="gone", minute=MINUTE - timedelta(days=8), cpu=1, memory=1
    )

    # (Another module's logging set-up in the same test process may have turned it off.)
    monkeypatch.setattr(logging.getLogger(metrics.__name__), "disabled", False)
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        assert metrics.samples_take(MINUTE + timedelta(seconds=42)) == 1

    assert list(ServerSample.objects.values_list("instance_id", "minute")) == [(up.pk, MINUTE)]
    assert not ServerSample.objects.filter(instance=down).exists()
    assert "metrics not read: The cluster did not answer" in caplog.text
    assert not ServerSample.objects.filter(server="gone").exists()  # pruned on the way


def test_beat_takes_samples_every_minute(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["server-samples-take"]

    assert entry == {"task": "deployments.tasks.server_samples_take", "schedule": 60.0}
    assert tasks.server_samples_take.name == entry["task"]


def test_minutes_older_than_a_day_and_hours_older_than_a_week_are_pruned_in_one_delete_each(
    tenant, version, local_cell
):
    instance = _running(tenant, version, local_cell)
    now = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
    for age in (timedelta(hours=26), timedelta(hours=25, minutes=1), timedelta(hours=24),
                timedelta(minutes=1)):  # fmt: skip
        ServerSample.objects.create(
            instance=instance, server=f"{instance.pk}-1", minute=now - age, cpu=1, memory=1
        )
    for age in (timedelta(days=8), timedelta(days=7, hours=2), timedelta(days=7),
                timedelta(hours=2)):  # fmt: skip
        ServerHour.objects.create(
            instance=instance, server=f"{instance.pk}-1", hour=now - age, cpu=1, memory=1,
            samples=60,
        )  # fmt: skip

    with CaptureQueriesContext(connection) as queries:
        assert metrics.samples_prune(now) == 4

    # Where the hours rolled up end (the minutes after it are kept), then a DELETE each.
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["SELECT", "DELETE", "DELETE"]
    kept = sorted(now - m for m in ServerSample.objects.values_list("minute", flat=True))
    assert kept == [timedelta(minutes=1), timedelta(hours=24)]
    kept = sorted(now - h for h in ServerHour.objects.values_list("hour", flat=True))
    assert kept == [timedelta(hours=2), timedelta(days=7)]


HOUR = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _minutes(instance, server, start, count, *, cpu, role="primary"):
    ServerSample.objects.bulk_create(
        ServerSample(
            instance=instance, server=server, role=role, minute=start + timedelta(minutes=m),
            cpu=cpu(m), memory=cpu(m) * 1024,
        )
        for m in range(count)
    )  # fmt: skip


def test_each_hour_that_ended_is_rolled_up_once_into_each_servers_average(
    tenant, version, local_cell
):
    instance = _running(tenant, version, local_cell)
    primary, replica = f"{instance.pk}-1", f"{instance.pk}-2"
    # Three hours of minutes, the last one under way; the replica was sampled half the first.
    _minutes(instance, primary, HOUR, 150, cpu=lambda m: 100 + m)
    _minutes(instance, replica, HOUR + timedelta(minutes=30), 120, cpu=lambda m: 10, role="replica")

    # Three minutes after the second hour ended: its last minute may still come.
    assert metrics.hours_roll_up(HOUR + timedelta(hours=2, minutes=3)) == 2
    rows = {
        (row.server, row.hour - HOUR): (row.cpu, row.memory, row.samples, row.role)
        for row in ServerHour.objects.filter(instance=instance)
    }
    assert rows == {
        (primary, timedelta(0)): (129.5, 129.5 * 1024, 60, "primary"),  # 100 … 159
        (replica, timedelta(0)): (10.0, 10240.0, 30, "replica"),
    }
    assert metrics.hours_roll_up(HOUR + timedelta(hours=2, minutes=4)) == 0  # done once
    assert metrics.hours_roll_up(HOUR + timedelta(hours=2, minutes=6)) == 2  # the second hour
    assert ServerHour.objects.get(server=primary, hour=HOUR + timedelta(hours=1)).cpu == 189.5
    assert ServerHour.objects.filter(hour=HOUR + timedelta(hours=2)).count() == 0  # under way


def test_a_weeks_minutes_are_rolled_up_a_day_a_minute_and_none_forgotten_before(
    tenant, version, local_cell
):
    instance = _running(tenant, version, local_cell)
    server = f"{instance.pk}-1"
    start = HOUR - timedelta(days=3)
    _minutes(instance, server, start, 3 * 24 * 60, cpu=lambda m: m // 60)  # hour n costs n
    now = HOUR + timedelta(minutes=10)

    metrics.samples_take(now)  # the first day rolled up: only its minutes forgotten
    assert ServerHour.objects.count() == 24
    assert ServerSample.objects.earliest("minute").minute == start + timedelta(days=1)
    metrics.samples_take(now + timedelta(minutes=1))
    metrics.samples_take(now + timedelta(minutes=2))

    hours = list(ServerHour.objects.order_by("hour").values_list("hour", "cpu"))
    assert hours == [(start + timedelta(hours=n), float(n)) for n in range(72)]
    # The minutes the day's chart reads are kept.
    last_call = now + timedelta(minutes=2)
    assert ServerSample.objects.earliest("minute").minute == last_call - metrics.MINUTES_KEPT


def test_the_roll_up_goes_on_after_days_without_samples(tenant, version, local_cell):
    instance = _running(tenant, version, local_cell)
    server = f"{instance.pk}-1"
    _minutes(instance, server, HOUR, 60, cpu=lambda m: 100)
    metrics.hours_roll_up(HOUR + timedelta(hours=2))
    # Every instance stopped for three days, then one runs again for an hour.
    again = HOUR + timedelta(days=3)
    _minutes(instance, server, again, 60, cpu=lambda m: 300)

    assert metrics.hours_roll_up(again + timedelta(hours=1, minutes=5)) == 1
    assert ServerHour.objects.get(hour=again).cpu == 300.0


def test_beat_rolls_the_hours_up_before_it_forgets_their_minutes(tenant, version, local_cell):
    instance = _running(tenant, version, local_cell)
    server = f"{instance.pk}-1"
    _minutes(instance, server, HOUR, 120, cpu=lambda m: 200)
    # Beat stopped for two days; at its next minute the minutes are a day too old to keep.
    metrics.samples_take(HOUR + timedelta(days=2))  # (the cell, not reachable, is skipped)

    assert not ServerSample.objects.exists()
    assert sorted(ServerHour.objects.values_list("hour", "cpu", "samples")) == [
        (HOUR, 200.0, 60),
        (HOUR + timedelta(hours=1), 200.0, 60),
    ]


# --- against the sandbox cluster ---------------------------------------------------------------


@pytest.fixture
def plan(transactional_db):
    return services.plan_load(text=spec_with_servers()).plan


def _create(owner, tenant, plan, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def test_a_running_instances_servers_are_sampled_from_the_clusters_metrics_api(
    worker, cell, plan, tenant, owner, monkeypatch
):
    ops = [_create(owner, tenant, plan, instances="2", cpu="1", memoryGi="1"),
           _create(owner, tenant, plan, "billing")]  # fmt: skip
    for op in ops:
        assert wait_done(op).state == Operation.State.SUCCEEDED, op.error
    # Marked stopped while its pods still run (as while a stop winds down): not sampled.
    stopped = ops[1].instance
    Instance.objects.filter(pk=stopped.pk).update(state=Instance.State.STOPPED)
    running = ops[0].instance
    driver = driver_for(cell)
    requests = []
    call = driver._call
    monkeypatch.setattr(driver, "_call", lambda *a, **kw: requests.append(a) or call(*a, **kw))
    now = timezone.now()

    metrics.cell_sample(cell, driver, now)

    assert len(requests) == 1  # one LIST for the cell, whatever its number of instances
    samples = list(ServerSample.objects.order_by("server"))
    assert [(s.instance_id, s.server, s.role) for s in samples] == [
        (running.pk, f"{running.pk}-1", "primary"),
        (running.pk, f"{running.pk}-2", "replica"),
    ]
    for sample in samples:
        assert sample.minute == now.replace(second=0, microsecond=0)
        assert 0 < sample.cpu <= 1000  # within the plan's limits: 1 core, 1 GiB a server
        assert 0 < sample.memory <= 1024**3
    assert samples[0].cpu > samples[1].cpu  # the primary is the busier

    # Again within the same minute: nothing more.
    metrics.cell_sample(cell, driver, now.replace(second=59))
    assert ServerSample.objects.count() == 2
    assert not ServerSample.objects.filter(instance=stopped).exists()
