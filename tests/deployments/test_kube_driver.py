"""The Kubernetes driver against an API server, through the official client."""

import uuid

import pytest
from kubernetes import client

from deployments.kube import KubeDriver, WatchExpired, api_client_from_kubeconfig
from deployments.workflow.driver import PermanentError, TransientError
from tests.servers import UNAVAILABLE

LABEL = "opsdeck.io/operation"


@pytest.fixture
def driver(kube):
    return kube  # the deployments tests' driver on the sandbox


@pytest.fixture
def namespace(driver):
    name = f"inst-{uuid.uuid4().hex[:8]}"
    driver.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def cluster(namespace, **spec):
    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "db", "namespace": namespace, "labels": {LABEL: "op-1"}},
        "spec": {"instances": 1, "storage": {"size": "1Gi"}, **spec},
    }


def test_create_is_idempotent_for_its_own_operation_only(driver, namespace):
    created = driver.create(cluster(namespace), owner_label=(LABEL, "op-1"))
    again = driver.create(cluster(namespace), owner_label=(LABEL, "op-1"))

    assert again["metadata"]["uid"] == created["metadata"]["uid"]
    clusters = driver.dynamic.resources.get(api_version="postgresql.cnpg.io/v1", kind="Cluster")
    stored = clusters.get(name="db", namespace=namespace).to_dict()  # managedFields and all
    managers = {e["manager"] for e in stored["metadata"]["managedFields"]}
    assert "opsdeck" in managers and "OpenAPI-Generator" not in managers  # not the library's
    with pytest.raises(PermanentError, match=r'Cluster "db" already exists and was made by'):
        driver.create(cluster(namespace), owner_label=(LABEL, "op-2"))


def test_apply_refuses_a_field_the_crd_lacks_and_names_it(driver, namespace):
    with pytest.raises(PermanentError, match=r'unknown field "spec\.bogus"') as refused:
        driver.apply(cluster(namespace, bogus=1))

    assert refused.value.status == 400
    assert driver.get(cluster(namespace)) is None  # nothing was created


def test_an_apply_of_a_field_a_built_in_kind_lacks_is_refused_not_retried(driver, namespace):
    """A real API server answers such an apply 500 (kubernetes issue 122480), which the driver
    took for a server error worth retrying: a spec's typo was retried until its deadline."""
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "conf", "namespace": namespace},
        "data": {"a": "b"},
        "dta": {"a": "b"},
    }

    with pytest.raises(PermanentError, match="dta: field not declared in schema") as refused:
        driver.apply(config)

    assert refused.value.status == 500
    assert driver.get(config) is None


def test_an_invalid_object_reads_as_one_line(driver, namespace):
    backup = {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Backup",
        "metadata": {"name": "b", "namespace": namespace},
        "spec": {},
    }

    with pytest.raises(PermanentError) as refused:
        driver.create(backup, owner_label=(LABEL, "op-1"))

    assert refused.value.message == 'Backup "b" is invalid: spec.cluster: Required value'
    assert refused.value.reason == "Invalid"


def test_status_patches_reach_the_status_subresource(driver, namespace):
    driver.apply(cluster(namespace))
    patch = {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "db", "namespace": namespace},
        "status": {"targetPrimary": "db-1"},
    }

    patched = driver.patch(patch, strategy="merge", subresource="status")

    assert patched["status"]["targetPrimary"] == "db-1"


def test_strategic_merge_is_refused_for_custom_resources(driver, namespace):
    driver.apply(cluster(namespace))

    with pytest.raises(PermanentError) as refused:
        driver.patch(cluster(namespace, instances=2), strategy="strategic", subresource=None)

    assert refused.value.status == 415


def test_delete_and_get_of_a_missing_object_are_quiet(driver, namespace):
    assert driver.get(cluster(namespace)) is None
    driver.delete(cluster(namespace))  # no error


def test_an_unknown_kind_says_the_operator_may_be_missing(driver, namespace):
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}

    with pytest.raises(PermanentError, match=r"does not serve Widget in example\.com/v1"):
        driver.apply({**obj, "metadata": {"name": "w", "namespace": namespace}})
    assert driver.serves("postgresql.cnpg.io/v1", "Cluster")


def test_server_errors_are_transient(driver, namespace, sandbox_cluster):
    sandbox_cluster.set_faults(error_503=1.0)
    try:
        with pytest.raises(TransientError):
            driver.get(cluster(namespace))
    finally:
        sandbox_cluster.set_faults(error_503=0.0)


def test_a_watch_from_a_compacted_version_expires_and_a_new_list_resumes_it(
    driver, namespace, sandbox_cluster
):
    _, listed_at = driver.list_for_watch("v1", "ConfigMap")
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": namespace}}
    driver.apply({**config, "metadata": {**config["metadata"], "name": "before"}})
    sandbox_cluster.compact()

    with pytest.raises(WatchExpired, match="too old resource version"):
        list(driver.watch_objects("v1", "ConfigMap", resource_version=listed_at, timeout=2))

    items, relisted_at = driver.list_for_watch("v1", "ConfigMap")
    assert "before" in {o["metadata"]["name"] for o in items}
    driver.apply({**config, "metadata": {**config["metadata"], "name": "after"}})
    events = driver.watch_objects("v1", "ConfigMap", resource_version=relisted_at, timeout=2)
    assert ("ADDED", "after") in {(kind, o["metadata"]["name"]) for kind, o in events}


def test_a_watch_on_a_connection_gone_silent_ends_soon_after_its_timeout(driver, monkeypatch):
    """A connection dropped without a word (an API server or load balancer failover) held the
    watch, and with it the cell watcher's thread for that kind, for good: its events stopped
    while its lease went on being renewed."""
    import threading

    from deployments import kube
    from sandbox import server as sandbox_server

    release = threading.Event()

    def silent_watch(self, rt, ns, query):
        self.send_response(200)  # the answer's head, then nothing more
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.sent = True
        release.wait(60)
        self.close_connection = True
        return 200

    _, version = driver.list_for_watch("v1", "ConfigMap")
    monkeypatch.setattr(sandbox_server.Handler, "_watch", silent_watch)
    monkeypatch.setattr(kube, "WATCH_GRACE", 1)
    ended = []

    def watch():
        try:
            list(driver.watch_objects("v1", "ConfigMap", resource_version=version, timeout=1))
        except TransientError as exc:
            ended.append(exc)

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    reader.join(10)
    release.set()

    assert not reader.is_alive() and ended


def test_listed_objects_of_a_built_in_kind_are_named_by_their_kind(driver, namespace):
    # The API server leaves a built-in kind out of its list items; what reads them (the cell
    # watcher's listing) keys an object by its kind and name.
    driver.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": namespace}}
    )

    items, _ = driver.list_for_watch("v1", "Secret")
    listed = list(driver.list_objects("v1", "Secret", namespace=namespace))

    ours = [o for o in items if o["metadata"]["namespace"] == namespace]
    assert [(o["apiVersion"], o["kind"]) for o in ours + listed] == [("v1", "Secret")] * 2


def test_a_long_list_whose_snapshot_was_compacted_between_pages_goes_on(
    driver, namespace, sandbox_cluster
):
    """A status sweep of a large cell lists it 500 objects a page; a compaction between two
    pages (etcd's, every few minutes) answered the next page 410 Expired, and the sweep failed
    for the whole cell. The cluster's answer offers a token that goes on from the same place."""

    def config(name: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace}}  # fmt: skip

    for name in ("a", "b", "c"):
        driver.apply(config(name))
    listed = driver.list_objects("v1", "ConfigMap", namespace=namespace, page=1)
    first = next(listed)
    driver.apply(config("d"))  # the cluster changes, then compacts what the first page saw
    sandbox_cluster.compact()

    rest = list(listed)

    assert [o["metadata"]["name"] for o in [first, *rest]] == ["a", "b", "c", "d"]


def test_objects_are_read_as_kubectl_shows_them_without_managed_fields(driver, namespace):
    # The API server keeps every field manager's bookkeeping on the object; kubectl get (and
    # so an Argo resource template) leaves it out, and so does every read through the driver:
    # what the engine keeps of each object it reads back is smaller by as much.
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": namespace}}
    _, listed_at = driver.list_for_watch("v1", "ConfigMap")
    applied = driver.apply({**config, "metadata": {**config["metadata"], "name": "c"}})
    stored = client.CoreV1Api(driver.api_client).read_namespaced_config_map("c", namespace)
    assert [m.manager for m in stored.metadata.managed_fields] == ["opsdeck"]

    events = driver.watch_objects("v1", "ConfigMap", resource_version=listed_at, timeout=1)
    read = [
        applied,
        driver.get(applied),
        *driver.list_objects("v1", "ConfigMap", namespace=namespace),
        *[o for kind, o in events if kind == "ADDED"],
    ]
    assert len(read) == 4
    assert all(o["metadata"]["name"] == "c" for o in read)
    assert not any("managedFields" in o["metadata"] for o in read)


def test_an_unreachable_cluster_is_transient(tmp_path):
    kubeconfig = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
    driver = KubeDriver(api_client_from_kubeconfig(kubeconfig), cache_file=str(tmp_path / "d"))

    with pytest.raises(TransientError) as raised:
        driver.get({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})

    assert raised.value.message == "The cluster could not be reached (connection refused)"
    assert not raised.value.sent  # no connection, so nothing of a write reached it


def test_a_broken_kubeconfig_is_a_clear_error():
    with pytest.raises(PermanentError, match="not valid YAML"):
        api_client_from_kubeconfig("{: nope")


def test_a_server_error_during_discovery_is_transient(
    sandbox_kubeconfig, tmp_path, sandbox_cluster
):
    fresh = KubeDriver(
        api_client_from_kubeconfig(sandbox_kubeconfig), cache_file=str(tmp_path / "new.json")
    )
    assert fresh.dynamic is not None  # the group list is read; a group's kinds come lazily
    sandbox_cluster.set_faults(error_503=1.0)
    try:
        with pytest.raises(TransientError):
            fresh.get({"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
                       "metadata": {"name": "x", "namespace": "default"}})  # fmt: skip
    finally:
        sandbox_cluster.set_faults(error_503=0.0)
        fresh.close()


def test_a_json_patch_applies_the_list_under_the_patch_key(driver, namespace):
    driver.apply(cluster(namespace))
    patch = {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "db", "namespace": namespace},
        "patch": [{"op": "replace", "path": "/spec/instances", "value": 3}],
    }

    patched = driver.patch(patch, strategy="json", subresource=None)

    assert patched["spec"]["instances"] == 3


@pytest.mark.parametrize(
    "argument, expected",
    [
        ("cluster", ("postgresql.cnpg.io/v1", "Cluster")),
        ("clusters", ("postgresql.cnpg.io/v1", "Cluster")),
        ("Cluster", ("postgresql.cnpg.io/v1", "Cluster")),
        ("clusters.postgresql.cnpg.io", ("postgresql.cnpg.io/v1", "Cluster")),
        ("cm", ("v1", "ConfigMap")),
        ("secret", ("v1", "Secret")),
    ],
)
def test_resolve_reads_a_kubectl_resource_argument_as_kubectl_does(driver, argument, expected):
    assert driver.resolve(argument) == expected


def test_resolve_refuses_a_type_the_cluster_does_not_serve(driver):
    with pytest.raises(PermanentError, match='serves no resource type "widgets"'):
        driver.resolve("widgets")
    with pytest.raises(PermanentError, match="serves no resource type"):
        driver.resolve("clusters.example.com")  # the right name in the wrong group


def crd(group: str, kind: str) -> dict:
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object",
                           "x-kubernetes-preserve-unknown-fields": True}},
            }],
        },
    }  # fmt: skip


def test_resolve_prefers_the_core_type_and_asks_for_a_group_between_two_others(driver):
    definitions = [crd("metrics.example.com", "Secret"), crd("a.example.com", "Widget"),
                   crd("b.example.com", "Widget")]  # fmt: skip
    for definition in definitions:
        driver.apply(definition)
    try:
        # a type another group also serves: the core one, as kubectl picks it
        assert driver.resolve("secret") == ("v1", "Secret")
        assert driver.resolve("secrets.metrics.example.com") == (
            "metrics.example.com/v1", "Secret"
        )  # fmt: skip
        with pytest.raises(PermanentError, match=r'"widget" could mean Widget.a.example.com or '):
            driver.resolve("widget")
        assert driver.resolve("widgets.b.example.com") == ("b.example.com/v1", "Widget")
    finally:
        for definition in definitions:
            driver.delete(definition)


def test_a_kind_whose_operator_is_installed_after_discovery_is_served(driver, namespace):
    gadget = {"apiVersion": "gadgets.example.com/v1", "kind": "Gadget",
              "metadata": {"name": "g", "namespace": namespace}}  # fmt: skip
    assert not driver.serves("gadgets.example.com/v1", "Gadget")  # discovered without it

    driver.apply(crd("gadgets.example.com", "Gadget"))
    try:
        assert driver.apply(gadget)["metadata"]["name"] == "g"
    finally:
        driver.delete(crd("gadgets.example.com", "Gadget"))


def test_threads_sharing_a_driver_look_up_kinds_while_one_finds_a_kind_unserved(
    sandbox_kubeconfig, tmp_path, namespace
):
    """A cell's watches share their driver; one of a kind the cluster does not serve makes the
    client discover again at each try, which must not break the others' lookups."""
    import threading

    shared = KubeDriver(api_client_from_kubeconfig(sandbox_kubeconfig),
                        cache_file=str(tmp_path / "cell.json"))  # fmt: skip
    stop, failures, listed = threading.Event(), [], []

    def unserved() -> None:
        while not stop.is_set():
            assert not shared.serves("example.com/v1", "Missing")

    def served() -> None:
        while not stop.is_set() and len(listed) < 200:
            try:
                listed.append(shared.list_for_watch("postgresql.cnpg.io/v1", "Cluster"))
            except Exception as exc:  # what the watch would have failed with
                failures.append(exc)

    threads = [threading.Thread(target=unserved), threading.Thread(target=served)]
    for thread in threads:
        thread.start()
    threads[1].join(60)
    stop.set()
    threads[0].join(30)
    shared.close()

    assert failures == []
    assert len(listed) == 200


@pytest.fixture
def healthy_cluster(driver, namespace):
    """A two-server Cluster in the namespace, once the simulated operator made it healthy."""
    from tests.deployments.conftest import wait_for

    driver.apply(cluster(namespace, instances=2))

    def ready():
        found = driver.get(cluster(namespace))
        return found and (found.get("status") or {}).get("readyInstances") == 2

    wait_for(ready, timeout=30, what="a healthy cluster")
    return namespace


def test_a_namespaces_pods_events_and_a_pods_log_are_read(driver, healthy_cluster):
    pods = list(
        driver.list_objects(
            "v1", "Pod", namespace=healthy_cluster, label_selector="cnpg.io/podRole"
        )
    )
    assert sorted(p["metadata"]["name"] for p in pods) == ["db-1", "db-2"]
    events = list(driver.list_objects("v1", "Event", namespace=healthy_cluster))
    assert {e["involvedObject"]["name"] for e in events} >= {"db"}

    log = driver.pod_log(healthy_cluster, "db-1", container="postgres", tail_lines=3)

    lines = log.splitlines()
    assert 0 < len(lines) <= 3
    stamp, _, text = lines[-1].partition(" ")  # each line starts with its time
    assert stamp.endswith("Z") and text
    with pytest.raises(PermanentError, match="not found"):
        driver.pod_log(healthy_cluster, "db-9")


def test_pod_metrics_of_every_namespace_come_in_one_labelled_list(driver, healthy_cluster):
    listed = driver.list_objects(
        "metrics.k8s.io/v1beta1", "PodMetrics", label_selector="cnpg.io/podRole=instance"
    )
    mine = [m for m in listed if m["metadata"]["namespace"] == healthy_cluster]

    assert sorted(m["metadata"]["name"] for m in mine) == ["db-1", "db-2"]
    assert all(m["containers"][0]["usage"]["cpu"] for m in mine)


def test_the_discovery_cache_is_never_read_half_written(sandbox_kubeconfig, tmp_path):
    """Every process keeps the cell's discovery cache in one file: a reader (another process
    starting) never finds it half written while a driver discovers again."""
    import json
    import threading

    path = tmp_path / "cell.json"
    writer = KubeDriver(api_client_from_kubeconfig(sandbox_kubeconfig), cache_file=str(path))
    discovery = writer.dynamic.resources  # discovered, and the cache written
    stop, broken = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_text())
            except ValueError as exc:
                broken.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(20):
            discovery.invalidate_cache()  # discovers again and writes the cache
    finally:
        stop.set()
        reader.join(10)
        writer.close()

    assert broken == []
    assert [p.name for p in tmp_path.iterdir()] == ["cell.json"]


class _PodLogs:
    """A pod's log as the API serves it (`read_namespaced_pod_log`): its last `tail_lines`,
    then at most `limit_bytes` of them from the first, counting the bytes it sent."""

    def __init__(self, lines: list[bytes]):
        self.lines, self.sent, self.reads = lines, 0, 0

    def read(self, pod, namespace, *, tail_lines=None, limit_bytes=None, **_):
        self.reads += 1
        data = b"".join(self.lines[-tail_lines:] if tail_lines else self.lines)[:limit_bytes]
        self.sent += len(data)
        return type("Answer", (), {"data": data})()


def _log_line(n: int, size: int) -> bytes:
    head = f"2026-12-06T03:00:00.{n:06d}Z line {n} "
    return (head + "x" * (size - len(head) - 1) + "\n").encode()


@pytest.mark.parametrize(
    ("lines", "size", "limit", "kept"),
    [
        (2000, 64 * 1024, 512 * 1024, range(1992, 2000)),  # long lines: the newest that fit
        (8, 1024, 4096, range(4, 8)),  # the window starts at a line: each whole line kept
        (3, 100, 4096, range(3)),  # all fit: one read
    ],
)
def test_a_pods_log_is_its_newest_whole_lines_in_bounded_reads(
    monkeypatch, lines, size, limit, kept
):
    """The API's limitBytes keeps the first bytes of the lines asked for: "Last 2000" of
    long lines showed the oldest and never the newest; read whole instead, 125 MiB came
    through the portal for 512 KiB shown, at every poll."""
    logs = _PodLogs([_log_line(n, size) for n in range(lines)])
    monkeypatch.setattr(client.CoreV1Api, "read_namespaced_pod_log", logs.read)

    text = KubeDriver(client.ApiClient()).pod_log("ns", "db-1", tail_lines=lines, limit_bytes=limit)

    assert [int(line.split()[2]) for line in text.splitlines()] == list(kept)
    assert logs.reads <= 3 and logs.sent <= 3 * limit


def test_a_namespace_deleted_again_while_it_empties_is_taken_as_going(driver, namespace):
    """A cluster answers a second delete of a namespace still removing its content with 409
    Conflict: an instance's delete whose first answer was lost (or whose move was done again)
    retried it as a cluster error until the namespace was gone, for ever if a finalizer held."""
    from deployments.context import namespace_delete

    meta = {"name": "held", "namespace": namespace, "finalizers": ["x.io/hold"]}
    held = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    driver.apply(held)
    namespace_delete(driver, namespace)

    namespace_delete(driver, namespace)  # the same, again: no error

    ns = driver.get({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    assert ns["metadata"]["deletionTimestamp"]
    driver.patch(
        {**held, "metadata": {**meta, "finalizers": None}}, strategy="merge", subresource=None
    )


def test_a_cluster_refusing_the_credentials_says_whose_they_are_and_is_tried_again(tmp_path):
    """Expired or revoked cell credentials failed every operation at once with "Unauthorized",
    which read as the customer's own fault: nothing of the request was applied, and it goes on
    once the platform team renews them."""
    import yaml

    from deployments.kube import UNAUTHORIZED
    from sandbox.api import Sandbox

    with Sandbox(token="right-token") as guarded:
        config = guarded.kubeconfig()
        config["users"][0]["user"]["token"] = "expired-token"
        api = api_client_from_kubeconfig(yaml.safe_dump(config))
        driver = KubeDriver(api, cache_file=str(tmp_path / "d"))
        with pytest.raises(TransientError) as raised:
            driver.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}})

    assert raised.value.message == UNAUTHORIZED
    assert raised.value.message.startswith("The cluster refused the credentials Opsdeck holds")
    assert raised.value.status == 401 and not raised.value.sent  # nothing was applied


@pytest.fixture
def relayed(sandbox_kubeconfig, tmp_path):
    """The driver, with a relay between it and the sandbox (`tests.servers.Relay`)."""
    import yaml

    from tests.servers import Relay

    config = yaml.safe_load(sandbox_kubeconfig)
    server = config["clusters"][0]["cluster"]
    with Relay(server["server"]) as relay:
        server["server"] = relay.url
        driver = KubeDriver(
            api_client_from_kubeconfig(yaml.safe_dump(config)), cache_file=str(tmp_path / "d")
        )
        yield driver, relay
        driver.close()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"", "not a Kubernetes object: it is empty."),
        (b"null", "not a Kubernetes object: it is a JSON null."),
        (b"[]", "not a Kubernetes object: it is a JSON array."),
        (b'"ok"', "not a Kubernetes object: it is a JSON string."),
        (b"{}", "not a Kubernetes object: it has no kind."),
        (b"<html>Service Unavailable</html>", "not JSON."),
    ],
)
def test_a_read_answered_with_no_kubernetes_object_is_an_error_not_an_object_gone(
    relayed, namespace, body, said
):
    """A proxy in front of the cluster that answers a read 200 with an empty body, or with JSON
    that is no object of any kind: the read fails, saying so. An empty answer read as an
    object that does not exist (a delete waiting for its object to go would have taken it for
    gone), and other JSON raised an error the worker did not expect (the operation stranded,
    its move redone every lease)."""
    driver, relay = relayed
    settings = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": namespace}, "data": {"a": "1"},
    }  # fmt: skip
    driver.apply(settings)
    relay.garble(rf"/namespaces/{namespace}/configmaps/settings$", body)

    with pytest.raises(PermanentError) as refused:
        driver.get(settings)
    assert refused.value.message == f"The cluster's answer is {said}"
    assert driver.get(settings)["data"] == {"a": "1"}  # the next answer, as the cluster gave it


def test_a_list_answered_with_no_kubernetes_object_is_an_error(relayed, namespace):
    driver, relay = relayed
    relay.garble(rf"/namespaces/{namespace}/configmaps(\?|$)", b"")

    with pytest.raises(PermanentError) as refused:
        list(driver.list_objects("v1", "ConfigMap", namespace=namespace))
    assert refused.value.message == "The cluster's answer is not a Kubernetes object: it is empty."


def test_a_kind_whose_group_the_cluster_could_not_list_is_tried_again_not_taken_for_unserved(
    relayed, namespace
):
    """The client reads a group whose list of kinds the cluster answered with a 503 as one
    that has none, and looks again once: answered so twice, a StatefulSet read failed with
    "does not serve StatefulSet; is its operator installed?", and the operation with it."""
    driver, relay = relayed
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "cache", "namespace": namespace},
    }  # fmt: skip
    relay.garble(r"^/apis/apps/v1$", UNAVAILABLE, status=503, times=2)

    with pytest.raises(TransientError) as unread:
        driver.get(statefulset)
    assert (
        unread.value.message == "The cluster's list of the kinds apps/v1 serves could not be read."
    )
    assert driver.get(statefulset) is None  # read, the next time: there is none
    # A kind the group's list does not name is one the cluster does not serve, as before.
    with pytest.raises(PermanentError, match=r"^The cluster does not serve Widget in apps/v1;"):
        driver.get({**statefulset, "kind": "Widget"})


def test_a_discovery_the_cluster_failed_midway_leaves_what_was_discovered_usable(
    relayed, namespace
):
    """A kind found nowhere makes the client discover the cluster's groups again; when the
    cluster answered that with an error, the client's cache was left without its groups, and
    every later lookup in a group it had not read yet failed with a KeyError, an error no
    operation expects (its worker's task failed, its claim held until its lease ran out)."""
    driver, relay = relayed
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "settings", "namespace": namespace}}  # fmt: skip
    driver.get({**config, "apiVersion": "apps/v1", "kind": "StatefulSet"})  # reads apps/v1 alone
    relay.garble(r"^/apis$", UNAVAILABLE, status=503)

    with pytest.raises(TransientError, match="unable to handle the request"):
        driver.get({**config, "apiVersion": "example.com/v1", "kind": "Widget"})
    assert driver.get(config) is None  # the core group, read for the first time
