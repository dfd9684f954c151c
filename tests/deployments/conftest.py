import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "postgres-cnpg.yaml"


@pytest.fixture(scope="package")
def sandbox_cluster():
    """A sandbox Kubernetes API server with the simulated CloudNativePG operator, fast-forwarded.

    Package-scoped: it stops when these tests end, before the sandbox suite checks that no
    server thread is left running.
    """
    from sandbox.api import Sandbox

    with Sandbox(speed=200) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def sandbox_kubeconfig(sandbox_cluster) -> str:
    import yaml

    return yaml.safe_dump(sandbox_cluster.kubeconfig())


@pytest.fixture
def faults(sandbox_cluster):
    """Set sandbox faults for one test; they are cleared afterwards."""
    yield sandbox_cluster.set_faults
    sandbox_cluster.set_faults(
        error_500=0, error_503=0, error_429=0, conflict=0, fail_bootstrap=[], frozen=[],
        latency_ms=0,
    )  # fmt: skip


@pytest.fixture
def cell(transactional_db, sandbox_kubeconfig):
    from deployments import services

    return services.cell_register(
        name="sandbox",
        kubeconfig=sandbox_kubeconfig,
        region="local",
        cloud="sandbox",
        backup_destination="s3://sandbox-backups/opsdeck",
        backup_credentials={"ACCESS_KEY_ID": "sandbox", "ACCESS_SECRET_KEY": "sandbox-secret"},
    )


@pytest.fixture
def plan(transactional_db):
    from deployments import services

    return services.plan_load(text=SPEC.read_text()).plan


@pytest.fixture
def created(cell, plan, owner, tenant):
    """A create of "orders" in the sandbox's cell, queued."""
    import uuid

    from accounts.audit import Actor
    from deployments import services

    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip


@pytest.fixture
def worker(transactional_db, settings):
    """A real Celery worker (threads) on this run's queue, consuming from the real broker,
    with the stalled-operation sweeper running beside it as beat runs it in production
    (faster here: a step 3 s overdue is re-enqueued)."""
    import threading

    from django.db import connection

    from deployments import runner
    from tests.celery_worker import threads_worker

    settings.OPSDECK_STALLED_AFTER = 3
    stop = threading.Event()

    def sweep():
        while not stop.wait(1.0):
            runner.operations_sweep()
        connection.close()

    sweeper = threading.Thread(target=sweep, name="test-sweeper", daemon=True)
    with threads_worker(concurrency=2):
        sweeper.start()
        yield
        # Let operations still in flight finish while the database is there for them.
        from deployments.models import Operation

        active = [Operation.State.QUEUED, Operation.State.RUNNING]
        deadline = time.monotonic() + 30
        while Operation.objects.filter(state__in=active).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        stop.set()
        sweeper.join(10)


@pytest.fixture
def relayed_cell(transactional_db, sandbox_kubeconfig):
    """The sandbox reached through a relay (`tests.servers.Relay`, to hold a request on its
    way), and `register(**settings)`: `cell_register` of the cell "eu-1" through it, with an
    object store, as add_cell registers or updates it."""
    import functools

    import yaml

    from deployments import services
    from tests.servers import Relay

    config = yaml.safe_load(sandbox_kubeconfig)
    server = config["clusters"][0]["cluster"]
    with Relay(server["server"]) as relay:
        server["server"] = relay.url
        register = functools.partial(
            services.cell_register, name="eu-1", kubeconfig=yaml.safe_dump(config),
            backup_destination="s3://b/p", backup_credentials={"ACCESS_KEY_ID": "k"},
        )  # fmt: skip
        yield relay, register


def database_url_for_tests() -> str:
    """The URL of this test process's database (not the configured one), for a process it
    starts (`DATABASE_URL`)."""
    from django.db import connection

    db = connection.settings_dict
    host = db["HOST"] or db.get("OPTIONS", {}).get("host", "")
    if host.startswith("/"):
        return f"postgres://{db['USER']}@/{db['NAME']}?host={host}"
    return f"postgres://{db['USER']}@{host}:{db['PORT'] or 5432}/{db['NAME']}"


def wait_for(predicate, *, timeout=60.0, interval=0.1, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def wait_done(operation, timeout=60.0):
    from deployments.models import Operation

    done = {Operation.State.SUCCEEDED, Operation.State.FAILED, Operation.State.CANCELLED}

    def finished():
        operation.refresh_from_db()
        return operation.state in done

    try:
        wait_for(finished, timeout=timeout, what=f"{operation.verb} to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {where_it_stands(operation)}") from None
    return operation


def where_it_stands(operation) -> str:
    """What an operation that did not finish in time was at, for the failure to say: its row
    (claimed? due when?), its tasks, and on stderr what each thread of this process, a worker's
    included, was doing."""
    import faulthandler

    from django.utils import timezone

    from deployments.workflow import engine

    state = engine.RunState.from_json(json.loads(operation.engine_state or "{}"))
    statuses = "; ".join(
        f"{name}: {json.dumps((node.observed or {}).get('status'))[:600]}"
        for name, node in state.nodes.items()
        if node.phase == engine.RUNNING and node.observed
    )
    runs = "; ".join(
        f"{run.node} #{run.attempt} {run.state}" + (f" ({run.message})" if run.message else "")
        for run in operation.task_runs.order_by("started_at", "node", "attempt")
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    due = f"{operation.next_step_at:%H:%M:%S.%f}" if operation.next_step_at else "none"
    claimed = f"{operation.claimed_until:%H:%M:%S.%f}" if operation.claimed_until else "none"
    return (
        f"at {timezone.now():%H:%M:%S.%f} it was {operation.state} after {operation.moves}"
        f" moves ({operation.idle_steps} idle in a row, {operation.transient_failures} transient"
        f" failures, {operation.fault_streak} faults in a row), its next step due at {due},"
        f" claimed until {claimed}, waiting on"
        f" {operation.waiting_on or 'nothing'}; error {operation.error!r}; tasks: {runs};"
        f" the status of what its running tasks read last: {statuses or 'none'}"
    )


def decoded(value: str) -> dict:
    return json.loads(value) if value else {}


@pytest.fixture
def kube(sandbox_kubeconfig, tmp_path):
    """The Kubernetes driver Opsdeck uses, on the sandbox cluster (to read what a run made)."""
    from deployments.kube import KubeDriver, api_client_from_kubeconfig

    driver = KubeDriver(
        api_client_from_kubeconfig(sandbox_kubeconfig), cache_file=str(tmp_path / "d.json")
    )
    yield driver
    driver.close()


def instance_object(kube, instance, api_version: str, kind: str, name: str):
    """An object in the instance's namespace as the cluster holds it (None when absent)."""
    return kube.get({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": instance.namespace},
    })  # fmt: skip
