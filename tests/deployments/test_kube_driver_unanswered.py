"""A cell whose API server takes connections and never answers (hung, or behind a network that
drops its packets): a call gives up after its timeout, once, with a TransientError the runner
retries later. Nothing of Opsdeck's is replaced: the cell's address is a real socket that
accepts and stays silent."""

import threading
import time

import pytest
import yaml
from django.utils import timezone

from deployments import services
from deployments.kube import TIMEOUT, KubeDriver, api_client_from_kubeconfig
from deployments.models import Cell
from deployments.workflow.driver import TransientError
from tests.deployments import factories
from tests.deployments.factories import BACKUPS, SPEC
from tests.servers import Blackhole, kubeconfig

ONE_CALL = sum(TIMEOUT)  # connected within 5 s, answered within 30 s
# A driver's own timeout, shorter than the cells' (kube.TIMEOUT) so that waiting for one takes
# seconds: what bounds a call is the driver's timeout, whatever it is.
SHORT = (1.0, 2.0)
# gunicorn's default --timeout, which the Procfile's web process keeps: a request still
# running then is killed, and the browser gets no page.
GUNICORN_TIMEOUT = 30
CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "y"}}


@pytest.fixture
def silent():
    with Blackhole() as hole:
        yield hole


@pytest.fixture
def silent_kubeconfig(silent) -> str:
    return yaml.safe_dump(kubeconfig(f"http://127.0.0.1:{silent.port}"))


def _timed(call, wait: float):
    """Run `call` in a thread for at most `wait` seconds: (finished, seconds, result or
    exception). A thread still waiting ends once the fixture closes the silent server."""
    out: dict = {}

    def run():
        start = time.monotonic()
        try:
            out["result"] = call()
        except Exception as exc:
            out["result"] = exc
        finally:
            from django.db import connection

            connection.close()  # this thread's, if it opened one
        out["took"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait)
    return "took" in out, out.get("took"), out.get("result")


def test_a_call_to_a_cell_that_never_answers_ends_after_its_timeout_not_four_of_them(
    silent, tmp_path, sandbox_cluster
):
    """Discovery cached (from when the cell answered), one read: it gives up after
    its timeout, not four of them (urllib3's default Retry(3)), which took two minutes:
    longer than the 90 s operation lease, which must be at least twice the longest call."""
    cache = str(tmp_path / "discovery.json")
    config = sandbox_cluster.kubeconfig()
    warm = KubeDriver(api_client_from_kubeconfig(yaml.safe_dump(config)), cache_file=cache)
    assert warm.get(CONFIG_MAP) is None  # the cache holds the cluster's kinds
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{silent.port}"
    driver = KubeDriver(
        api_client_from_kubeconfig(yaml.safe_dump(config)), cache_file=cache, timeout=SHORT
    )

    finished, took, result = _timed(lambda: driver.get(CONFIG_MAP), wait=sum(SHORT) + 10)

    assert finished, f"still waiting after {sum(SHORT) + 10} s"
    assert isinstance(result, TransientError), result
    assert took < 2 * SHORT[1] and len(silent.accepted) == 1  # asked once
    assert result.sent  # it took the request: a write so lost may have been applied


def test_a_first_call_to_a_cell_that_never_answers_ends_instead_of_waiting_for_ever(
    silent_kubeconfig, tmp_path
):
    """A driver with no discovery cache yet (a new worker or web process, a new cell, or a
    lookup that missed the cache, on which the client discovers again) first asks the cell
    for its version and API groups. The client sends those requests with no timeout: against
    a cell that never answered, the call waited for ever (a worker thread stuck, a page
    never loaded) instead of raising a TransientError after kube.TIMEOUT."""
    driver = KubeDriver(
        api_client_from_kubeconfig(silent_kubeconfig),
        cache_file=str(tmp_path / "d.json"),
        timeout=SHORT,
    )

    finished, _, result = _timed(lambda: driver.get(CONFIG_MAP), wait=sum(SHORT) + 10)

    assert finished, f"still waiting on the cell after {sum(SHORT) + 10} s"
    assert isinstance(result, TransientError), result


def test_a_plan_loaded_while_a_cell_never_answers_is_loaded_with_a_warning(
    transactional_db, silent_kubeconfig
):
    """A cell whose cluster does not answer only warns (the README): loading a plan checks
    the kinds it serves, and waited for ever on one that took the connection and never
    answered; then 35 s (a call's timeout), for each such cell."""
    Cell.objects.create(name="silent", region="eu-west", kubeconfig=silent_kubeconfig, **BACKUPS)

    finished, took, loaded = _timed(
        lambda: services.plan_load(text=SPEC.read_text()), wait=ONE_CALL + 10
    )

    assert finished, f"still loading after {ONE_CALL + 10} s"
    assert took < sum(services.CHECK_TIMEOUT) + 5, f"loaded after {took:.0f} s"
    assert loaded.version.number == 1, loaded
    assert loaded.warnings == [
        "cell silent was not checked (the cluster did not answer in time): creates of this plan "
        "there fail unless it serves the kinds the plan writes."
    ]


def test_a_tab_of_an_instance_on_a_cell_that_never_answers_says_so_before_the_web_server_gives_up(
    transactional_db, silent_kubeconfig, tenant, owner, client
):
    """The Servers tab reads the cluster in the page's request. On a cell that took the
    connection and never answered, the page did not come back within gunicorn's 30 s (the
    web worker killed, the customer given an error or nothing) instead of saying "The
    cluster could not be read"."""
    version = factories.postgres_version()  # loaded before the cell exists: no check of it
    cell = Cell.objects.create(
        name="silent", region="eu-west", kubeconfig=silent_kubeconfig, **BACKUPS
    )
    instance = factories.ran_since(tenant, version, cell, since=timezone.now())
    client.force_login(owner)
    url = f"/t/{tenant.slug}/deployments/{instance.pk}/"

    finished, took, page = _timed(lambda: client.get(url, {"tab": "servers"}), wait=45)

    assert finished and took < GUNICORN_TIMEOUT, (
        f"the page answered after {took} s" if finished else "no page after 45 s"
    )
    assert "The cluster could not be read" in page.content.decode()
