"""A worker killed in the middle of an operation loses nothing and applies nothing twice.

The workers here are real `celery worker` processes on the test database; one is
SIGKILLed while the create waits on the operator.
"""

import os
import signal
import subprocess
import sys
import uuid

import pytest

from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import runner, services
from deployments.kube import KubeDriver, api_client_from_kubeconfig
from deployments.models import Operation, TaskRun
from tests.deployments.conftest import ROOT, database_url_for_tests, wait_for


@pytest.fixture
def start_worker_process(transactional_db, tmp_path):
    started = []

    def start() -> subprocess.Popen:
        env = {**os.environ, "DATABASE_URL": database_url_for_tests()}
        log = open(tmp_path / f"worker-{len(started)}.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "--app", "portal", "worker", "--pool", "solo",
             "--loglevel", "INFO", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append((proc, log))
        return proc

    yield start
    for proc, log in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def test_a_killed_worker_resumes_and_the_cluster_holds_no_duplicates(
    start_worker_process, cell, plan, tenant, owner, sandbox_cluster, sandbox_kubeconfig,
    settings, tmp_path,
):  # fmt: skip
    sandbox_cluster.set_faults(frozen=["clusters"])  # the create will wait on the operator
    try:
        first = start_worker_process()
        create = services.instance_create(
            actor=Actor(user=owner), tenant=tenant, plan=plan, name="db",
            parameters={"instances": "2"}, request_id=uuid.uuid4().hex,
        )  # fmt: skip
        wait_for(
            lambda: (
                TaskRun.objects.filter(operation=create, node="main.cluster").exists()
                and Operation.objects.get(pk=create.pk).idle_steps > 0
            ),
            timeout=60,
            what="the create to wait on its Cluster",
        )

        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        sandbox_cluster.set_faults(frozen=[])

    start_worker_process()
    # The killed worker's message comes back only after the broker's visibility timeout;
    # the sweeper re-enqueues the stalled operation sooner.
    settings.OPSDECK_STALLED_AFTER = 0
    wait_for(lambda: runner.operations_sweep() >= 0 and _done(create), timeout=90,
             interval=1.0, what="the create to finish")  # fmt: skip

    create.refresh_from_db()
    assert create.state == Operation.State.SUCCEEDED, create.error
    driver = KubeDriver(
        api_client_from_kubeconfig(sandbox_kubeconfig), cache_file=str(tmp_path / "d.json")
    )
    clusters = driver.dynamic.resources.get(api_version="postgresql.cnpg.io/v1", kind="Cluster")
    items = clusters.get(namespace=create.instance.namespace).to_dict()["items"]
    driver.close()
    assert [c["metadata"]["name"] for c in items] == [create.instance_id]
    assert items[0]["metadata"]["generation"] == 1  # applied once, or re-applied unchanged
    assert TaskRun.objects.filter(operation=create, node="main.cluster").count() == 1
    assert (
        AuditEvent.objects.filter(action="operation.succeeded", target_id=str(create.pk)).count()
        == 1
    )


def _done(operation) -> bool:
    operation.refresh_from_db()
    return operation.state in {Operation.State.SUCCEEDED, Operation.State.FAILED}
