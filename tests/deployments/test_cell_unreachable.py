"""What a customer sees and can do while an instance's cell refuses connections (its API
server unreachable for a while). Opsdeck runs for real (a Celery worker, the sandbox
cluster); the only thing put between them is a gate that can refuse connections."""

import re

import pytest
import yaml

from deployments import services
from deployments.models import Instance, Operation
from deployments.runner import RETRYING
from tests.deployments.conftest import instance_object, wait_done, wait_for
from tests.deployments.test_operation_cancel import _act, _cancel, _create
from tests.servers import Gate

# A Python exception's class name (ProtocolError, MaxRetryError, NewConnectionError...).
PYTHON_EXCEPTION = re.compile(r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b")


@pytest.fixture
def gate(sandbox_cluster):
    server = sandbox_cluster.kubeconfig()["clusters"][0]["cluster"]["server"]
    gate = Gate(int(server.rsplit(":", 1)[1]))
    yield gate
    if gate.closed:
        gate.open()


@pytest.fixture
def gated_cell(transactional_db, sandbox_cluster, gate):
    """The sandbox registered as the cell, reached through the gate."""
    kubeconfig = sandbox_cluster.kubeconfig()
    kubeconfig["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{gate.port}"
    return services.cell_register(
        name="sandbox", kubeconfig=yaml.safe_dump(kubeconfig), region="local", cloud="sandbox",
        backup_destination="s3://sandbox-backups/opsdeck",
        backup_credentials={"ACCESS_KEY_ID": "sandbox", "ACCESS_SECRET_KEY": "sandbox-secret"},
    )  # fmt: skip


@pytest.fixture
def running(worker, gated_cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def _retrying(operation):
    return wait_for(
        lambda: Operation.objects.get(pk=operation.pk).error.startswith(RETRYING),
        what=f"the {operation.verb} to retry",
    )


def _url(instance):
    return f"/t/{instance.tenant.slug}/deployments/{instance.pk}/"


def test_an_unreachable_cell_is_described_in_words_not_python_exception_names(
    running, owner, owner_client, gate
):
    """The cell refuses connections while a modify waits to reach it. The Operations tab said
    "Retrying after a cluster error: The cluster did not answer: MaxRetryError", and the
    Servers, Logs and Events tabs "The cluster could not be read: The cluster did not answer:
    MaxRetryError": the name of a Python exception of urllib3, which tells a customer
    nothing."""
    gate.close()
    modify = _act(owner, running, "modify", cpu="2")
    _retrying(modify)

    said = "The cluster could not be reached (connection refused)"
    shown = {}
    for tab in ("operations", "servers", "logs", "events"):
        html = owner_client.get(_url(running), {"tab": tab}).content.decode()
        shown[tab] = (sorted(set(PYTHON_EXCEPTION.findall(html))), said in html)
    modify.refresh_from_db()
    gate.open()

    assert shown == {tab: ([], True) for tab in ("operations", "servers", "logs", "events")}
    assert modify.error == f"{RETRYING}{said}"


def _cancelled_unreached(owner, running, gate, kube, verb: str, **parameters):
    """`verb` asked while the cell refuses every connection, seen retrying, and cancelled;
    the operation once ended, and the instance's Cluster as the cell holds it once reachable
    again (`running` read again)."""
    gate.close()
    operation = _act(owner, running, verb, **parameters)
    _retrying(operation)
    _cancel(owner, operation)
    wait_done(operation, timeout=60)
    gate.open()
    running.refresh_from_db()
    cluster = instance_object(kube, running, "postgresql.cnpg.io/v1", "Cluster", running.pk)
    return operation, cluster


@pytest.mark.parametrize(("verb", "parameters"), [("stop", {}), ("modify", {"cpu": "2"})])
def test_a_verb_cancelled_while_the_cell_refused_every_connection_leaves_the_instance_as_it_was(
    running, owner, gate, kube, verb, parameters
):
    """The cell refuses connections (nothing Opsdeck sends reaches it); the customer clicks
    Stop (or modifies the CPU), sees "Retrying after a cluster error", and cancels. The
    cluster never took any of it, so the instance is running as before (DESIGN: "a verb that
    fails before the cluster accepted any change leaves the instance in its previous
    state"). A cancelled Stop left it "Stopped" (its page offering Start, its servers metered
    as stopped) while the database never stopped; a cancelled modify left it "Failed", as if
    its servers might run part of a change they never received."""
    operation, cluster = _cancelled_unreached(owner, running, gate, kube, verb, **parameters)

    assert operation.state == Operation.State.CANCELLED
    # The cluster never received it: no hibernation, still one core.
    assert "cnpg.io/hibernation" not in (cluster["metadata"].get("annotations") or {})
    assert cluster["spec"]["resources"]["requests"]["cpu"] in ("1", 1)
    assert running.state == Instance.State.RUNNING


def test_a_start_cancelled_while_the_cell_refused_every_connection_leaves_the_instance_stopped(
    running, owner, gate, kube
):
    """A stopped instance; the cell becomes unreachable; the customer clicks Start, sees it
    retry, and cancels. Nothing reached the cluster: the database is still hibernated. The
    instance showed "Running" (and was metered as running, every dimension) while its servers
    stayed stopped."""
    stop = _act(owner, running, "stop")
    assert wait_done(stop, timeout=60).state == Operation.State.SUCCEEDED, stop.error
    start, cluster = _cancelled_unreached(owner, running, gate, kube, "start")

    assert start.state == Operation.State.CANCELLED
    assert (cluster["metadata"].get("annotations") or {}).get("cnpg.io/hibernation") == "on"
    assert running.state == Instance.State.STOPPED
