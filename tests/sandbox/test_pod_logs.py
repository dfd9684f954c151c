"""Pod logs (`pods/{name}/log`) of the simulated pods, through the official client and kubectl."""

from __future__ import annotations

import http.client
import itertools
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from sandbox.logs import PodLogs
from tests.sandbox.conftest import cache_statefulset

KUBECTL = Path(sys.executable).parent / "kubectl"

G, V = "postgresql.cnpg.io", "v1"
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z ")


def read_log(core_v1, ns: str, pod: str, **options) -> str:
    # kubernetes 36 returns the repr of the bytes for a preloaded log (kubernetes-client/python
    # issue 2596): read the raw response instead.
    return core_v1.read_namespaced_pod_log(pod, ns, _preload_content=False, **options).data.decode()


def messages(text: str) -> list[str]:
    """The PostgreSQL messages (or instance manager messages) of CNPG's JSON log lines."""
    out = []
    for line in text.splitlines():
        entry = json.loads(line)
        out.append(entry["record"]["message"] if "record" in entry else entry["msg"])
    return out


def test_primary_and_replica_logs_tell_their_start(core_v1, namespace, pg_cluster):
    pg_cluster(instances=2)
    primary = messages(read_log(core_v1, namespace, "pg-1"))
    replica = messages(read_log(core_v1, namespace, "pg-2"))
    assert primary[0] == "Starting CloudNativePG Instance Manager"
    assert "database system is ready to accept connections" in primary
    assert any(m.startswith("replication connection authorized") for m in primary)
    assert "database system is ready to accept read-only connections" in replica
    assert any(m.startswith("started streaming WAL from primary") for m in replica)
    assert "replication connected" in replica


def test_a_servers_start_line_names_the_version_its_image_runs(core_v1, namespace, pg_cluster):
    pg_cluster(instances=1, imageName="ghcr.io/cloudnative-pg/postgresql:16")
    log = messages(read_log(core_v1, namespace, "pg-1"))

    assert any(m.startswith("starting PostgreSQL 16.") for m in log), log


def test_lines_are_cnpg_json_records(core_v1, namespace, pg_cluster):
    pg_cluster(instances=1)
    text = read_log(core_v1, namespace, "pg-1")
    for raw_line in text.splitlines():
        # zap's compact encoding, level and time first.
        parsed = json.loads(raw_line)
        assert json.dumps(parsed, separators=(",", ":")) == raw_line
        assert list(parsed)[:5] == ["level", "ts", "logger", "msg", "logging_pod"]
    line = next(
        json.loads(line)
        for line in read_log(core_v1, namespace, "pg-1").splitlines()
        if "ready to accept connections" in line
    )
    assert line["logger"] == "postgres" and line["msg"] == "record"
    assert line["logging_pod"] == "pg-1"
    assert line["record"]["error_severity"] == "LOG"
    assert line["record"]["backend_type"] == "postmaster"
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$", line["record"]["log_time"])


def test_tail_lines_returns_the_last_lines(core_v1, namespace, pg_cluster):
    pg_cluster(instances=1)
    full = read_log(core_v1, namespace, "pg-1").splitlines()
    tail = read_log(core_v1, namespace, "pg-1", tail_lines=3).splitlines()
    assert len(full) > 3
    assert tail == full[len(full) - len(tail) :] and len(tail) == 3
    assert read_log(core_v1, namespace, "pg-1", tail_lines=0) == ""


def test_timestamps_prefix_every_line_in_order(core_v1, namespace, pg_cluster):
    pg_cluster(instances=1)
    lines = read_log(core_v1, namespace, "pg-1", timestamps=True).splitlines()
    assert all(STAMP.match(line) for line in lines)
    stamps = [_nanos(line.split(" ", 1)[0]) for line in lines]
    assert stamps == sorted(stamps)
    # Without timestamps the same lines come bare.
    bare = read_log(core_v1, namespace, "pg-1").splitlines()
    assert [line.split(" ", 1)[1] for line in lines][: len(bare)] == bare[: len(lines)]


def _nanos(stamp: str) -> tuple[str, int]:
    """An RFC 3339 stamp with trimmed nanoseconds as a sortable (seconds, nanoseconds) pair."""
    seconds, _, fraction = stamp.rstrip("Z").partition(".")
    return seconds, int(fraction.ljust(9, "0"))


def test_since_seconds_keeps_only_recent_lines(core_v1, custom, namespace, pg_cluster, sandbox):
    pg_cluster(instances=1)
    time.sleep(3.2)  # the start's lines are older than the window below, whatever the load
    custom.patch_namespaced_custom_object(
        G, V, namespace, "clusters", "pg", {"spec": {"postgresql": {"parameters": {"a": "1"}}}}
    )
    sandbox.run_until_idle()
    recent = messages(read_log(core_v1, namespace, "pg-1", since_seconds=3))
    assert "received SIGHUP, reloading configuration files" in recent
    assert "database system is ready to accept connections" not in recent


def test_limit_bytes_cuts_the_output(core_v1, namespace, pg_cluster):
    pg_cluster(instances=1)
    full = read_log(core_v1, namespace, "pg-1")
    assert read_log(core_v1, namespace, "pg-1", limit_bytes=100) == full[:100]


def test_since_time_keeps_lines_written_from_then_on(raw, namespace, pg_cluster):
    pg_cluster(instances=1)
    path = f"/api/v1/namespaces/{namespace}/pods/pg-1/log"
    _, _, everything = raw.request("GET", f"{path}?sinceTime=2020-01-01T00:00:00Z")
    assert "ready to accept connections" in everything
    _, _, nothing = raw.request("GET", f"{path}?sinceTime=2999-01-01T00:00:00Z")
    assert nothing == ""
    status, _, body = raw.request("GET", f"{path}?sinceTime=2020-01-01T00:00:00Z&sinceSeconds=5")
    assert (status, body["reason"]) == (422, "Invalid")


def test_backups_are_logged_on_the_primary(core_v1, custom, namespace, pg_cluster, sandbox):
    pg_cluster(instances=1, backup={"barmanObjectStore": {"destinationPath": "s3://logs/"}})
    body = {"apiVersion": f"{G}/{V}", "kind": "Backup", "metadata": {"name": "b1"}}
    body["spec"] = {"cluster": {"name": "pg"}}
    custom.create_namespaced_custom_object(G, V, namespace, "backups", body)
    sandbox.run_until_idle()
    said = messages(read_log(core_v1, namespace, "pg-1"))
    assert said.index("Starting barman-cloud-backup") < said.index("Backup completed")


def test_follow_streams_new_lines_and_ends_when_the_pod_goes(
    core_v1, custom, namespace, pg_cluster, sandbox
):
    pg_cluster(instances=1)
    response = core_v1.read_namespaced_pod_log(
        "pg-1", namespace, follow=True, tail_lines=0, _preload_content=False
    )
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.extend(response.stream(4096)))
    reader.start()
    custom.patch_namespaced_custom_object(
        G,
        V,
        namespace,
        "clusters",
        "pg",
        {"metadata": {"annotations": {"cnpg.io/hibernation": "on"}}},
    )
    reader.join(timeout=15)
    assert not reader.is_alive(), "the stream did not end when the pod was deleted"
    said = messages(b"".join(received).decode())
    assert "received fast shutdown request" in said
    assert said[-1] == "database system is shut down"
    assert "database system is ready to accept connections" not in said  # tailLines=0


def _handler_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_follow_ends_when_the_client_goes_away(namespace, pg_cluster, sandbox, until):
    pg_cluster(instances=1)
    before = _handler_threads()
    conn = http.client.HTTPConnection(sandbox.host, sandbox.port, timeout=5)
    conn.request("GET", f"/api/v1/namespaces/{namespace}/pods/pg-1/log?follow=true")
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Transfer-Encoding") == "chunked"
    conn.close()
    until(lambda: _handler_threads() <= before, timeout=5)


def test_statefulset_pods_log_their_start(core_v1, namespace, sandbox, api_client):
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_stateful_set(
        namespace,
        cache_statefulset(1),
    )
    sandbox.run_until_idle()
    text = read_log(core_v1, namespace, "cache-0")
    assert re.search(
        r"^1:M \d\d \w{3} \d{4} [\d:.]+ \* Ready to accept connections tcp$", text, re.M
    )


# ---- errors, as kube-apiserver answers them ---------------------------------------------------


def test_unknown_pod_is_404_with_a_status(core_v1, namespace):
    with pytest.raises(client.ApiException) as err:
        core_v1.read_namespaced_pod_log("nope", namespace)
    assert err.value.status == 404
    body = json.loads(err.value.body)
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'pods "nope" not found'


@pytest.mark.parametrize(
    ("query", "code", "message"),
    [
        ("tailLines=abc", 400, 'strconv.ParseInt: parsing "abc": invalid syntax'),
        (
            "tailLines=-1",
            422,
            'PodLogOptions "pg-1" is invalid: tailLines: Invalid value: -1: '
            "must be greater than or equal to 0",
        ),
        (
            "sinceSeconds=0",
            422,
            'PodLogOptions "pg-1" is invalid: sinceSeconds: Invalid value: 0: '
            "must be greater than 0",
        ),
        ("container=nope", 400, "container nope is not valid for pod pg-1"),
        ("previous=true", 400, 'previous terminated container "postgres" in pod "pg-1" not found'),
    ],
)
def test_bad_options_are_refused(raw, namespace, pg_cluster, query, code, message):
    pg_cluster(instances=1)
    status, _, body = raw.request("GET", f"/api/v1/namespaces/{namespace}/pods/pg-1/log?{query}")
    assert status == code
    assert body["kind"] == "Status" and body["code"] == code
    assert body["message"] == message


def test_a_multi_container_pod_needs_a_container_name(core_v1, raw, namespace):
    core_v1.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "two"},
            "spec": {
                "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]
            },
        },
    )
    status, _, body = raw.request("GET", f"/api/v1/namespaces/{namespace}/pods/two/log")
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"] == "a container name must be specified for pod two, choose one of: [a b]"
    # A named container of a pod that never started is still being created.
    status, _, body = raw.request("GET", f"/api/v1/namespaces/{namespace}/pods/two/log?container=a")
    assert status == 400
    assert body["message"] == 'container "a" in pod "two" is waiting to start: ContainerCreating'


# ---- kubectl ---------------------------------------------------------------------------------


def test_kubectl_logs_tail_with_timestamps(kubectl, namespace, pg_cluster):
    pg_cluster(instances=1)
    out = kubectl("logs", "-n", namespace, "pg-1", "--tail=5", "--timestamps").stdout
    lines = out.splitlines()
    assert len(lines) == 5
    assert all(STAMP.match(line) for line in lines)


def test_kubectl_logs_follow_prints_new_lines(kubeconfig, custom, namespace, pg_cluster, tmp_path):
    pg_cluster(instances=1)
    proc = subprocess.Popen(  # noqa: S603 - our own kubectl
        [
            str(KUBECTL),
            "--kubeconfig",
            str(kubeconfig),
            "--cache-dir",
            str(tmp_path),
            "logs",
            "-f",
            "-n",
            namespace,
            "pg-1",
            "--tail=1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert json.loads(first)["logging_pod"] == "pg-1"
        custom.patch_namespaced_custom_object(
            G, V, namespace, "clusters", "pg", {"spec": {"postgresql": {"parameters": {"b": "2"}}}}
        )
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "reloading configuration" not in "".join(seen):
            seen.append(proc.stdout.readline())
        assert any("received SIGHUP, reloading configuration files" in line for line in seen)
    finally:
        proc.terminate()
        proc.wait(timeout=5)


# ---- the buffer ------------------------------------------------------------------------------


def test_each_container_keeps_only_its_last_lines():
    logs = PodLogs(limit=5)
    logs.write("ns", "p", "uid", "c", *[f"line {i}" for i in range(12)])
    assert [line.text for line in logs.read("ns", "p", "c")] == [f"line {i}" for i in range(7, 12)]
    logs.drop("ns", "p")
    assert logs.read("ns", "p", "c") == []


def test_periodic_lines_appear_when_read():
    logs = PodLogs(limit=100)
    began = time.time()
    logs.every("ns", "p", "uid", "c", 0.05, lambda when: [f"tick at {when:.2f}"])
    time.sleep(0.28)
    ticks = logs.read("ns", "p", "c")
    read_at = time.time()
    # One line per period that passed before the read (however late the read came), each at
    # its own time.
    assert 4 <= len(ticks) <= (read_at - began) / 0.05 + 1
    gaps = [b.time_ns - a.time_ns for a, b in itertools.pairwise(ticks)]
    assert all(abs(gap - 50_000_000) < 1_000_000 for gap in gaps)


def test_logs_go_with_their_pod(core_v1, sandbox, namespace, pg_cluster):
    pg_cluster(instances=1)
    assert sandbox.core.logs.read(namespace, "pg-1", "postgres")
    # With the operator frozen, nothing writes a new pod-1 meanwhile.
    sandbox.set_faults(frozen=["cnpg"])
    try:
        core_v1.delete_namespaced_pod("pg-1", namespace)
        assert sandbox.core.logs.read(namespace, "pg-1", "postgres") == []
    finally:
        sandbox.set_faults(frozen=[])
