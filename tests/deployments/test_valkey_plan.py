"""The Valkey plan (specs/valkey.yaml): a cache on a plain StatefulSet, no operator. It loads
clean, every verb passes spec_test, and a real worker runs an instance through its life."""

import base64
import re
import uuid
from html import unescape
from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from accounts.audit import Actor
from deployments import context, selectors, services
from deployments.models import Instance, Operation
from deployments.spec import load_spec
from deployments.status import cell_observe
from tests.deployments.conftest import instance_object, wait_done, wait_for
from tests.deployments.test_spec_test import rows

VALKEY = Path(__file__).resolve().parents[2] / "specs" / "valkey.yaml"
POLICIES = [
    "allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-lfu",
    "allkeys-random", "volatile-random", "volatile-ttl", "noeviction",
]  # fmt: skip


@pytest.fixture
def valkey_plan(transactional_db):
    return services.plan_load(text=VALKEY.read_text()).plan


# --- the spec -----------------------------------------------------------------------------


def test_the_spec_loads_without_errors_or_warnings():
    spec = load_spec(VALKEY.read_text())  # raises SpecError on any error

    assert spec.warnings == []
    assert set(spec.main.verbs) == {
        "create", "modify", "delete", "stop", "start", "restart", "setEvictionPolicy",
    }  # fmt: skip
    policy = spec.main.verbs["setEvictionPolicy"].parameters
    assert [str(o) for o in policy[0].options] == POLICIES


def test_validate_spec_says_ok_with_no_warning():
    out = StringIO()

    call_command("validate_spec", str(VALKEY), stdout=out)

    assert out.getvalue().splitlines() == [f"{VALKEY}: ok"]


def test_plan_load_makes_the_valkey_plan_in_its_own_service(transactional_db):
    load = services.plan_load(text=VALKEY.read_text())

    assert load.warnings == []
    assert (load.plan.key, load.plan.service, load.plan.name) == ("valkey", "valkey", "Valkey")


def test_every_verb_passes_spec_test_against_the_sandbox():
    out = StringIO()

    call_command("spec_test", str(VALKEY), "--speed", "200", "--timeout", "30", stdout=out)

    table = rows(out.getvalue())
    for verb in ("create", "modify", "setEvictionPolicy", "stop", "start", "restart", "delete"):
        assert table[verb] == "passed", out.getvalue()
    assert out.getvalue().splitlines()[-1] == "7 passed, 0 failed, 7 skipped"


def test_without_an_operator_only_the_pods_and_customers_on_6379_get_in():
    spec = load_spec(VALKEY.read_text())

    objects = context.namespace_objects(
        namespace="inst-a1b2c3d4", instance_id="inst-a1b2c3d4", tenant_slug="acme",
        extensions=spec.extensions, endpoint=spec.main.primary_endpoint(),
        customer_sources=["203.0.113.0/24"], backup_credentials=None,
    )  # fmt: skip

    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}]},
        {"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 6379}]},
    ]


# --- the catalog ----------------------------------------------------------------------------


def test_the_catalog_lists_valkey_beside_postgresql(owner_client, tenant, plan, valkey_plan):
    response = owner_client.get(f"/t/{tenant.slug}/deployments/new/")

    page = unescape(re.sub(r"\s+", " ", response.content.decode()))
    assert response.status_code == 200
    assert '<h2 id="service-postgresql">PostgreSQL</h2>' in page
    assert '<h2 id="service-valkey">Valkey</h2>' in page
    # 0.5 core x 0.035 + 1 GiB x 0.005 + 2 GiB x 0.00014 = 0.02278 an hour, 16.63 a month
    assert "<strong>0.0228 USD</strong> per hour" in page
    assert "<strong>16.63 USD</strong> per month" in page
    assert f'href="/t/{tenant.slug}/deployments/new/valkey/"' in page


# --- with a worker and the sandbox cluster --------------------------------------------------


def _statefulset(kube, instance):
    return instance_object(kube, instance, "apps/v1", "StatefulSet", instance.pk)


def _pods(kube, instance) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in kube.list_objects("v1", "Pod", label_selector=f"opsdeck.io/instance={instance.pk}")
        if p["metadata"]["namespace"] == instance.namespace
    )


def _claims(kube, instance) -> dict[str, str]:
    """Claim name → its capacity."""
    return {
        c["metadata"]["name"]: (c.get("status") or {}).get("capacity", {}).get("storage", "")
        for c in kube.list_objects("v1", "PersistentVolumeClaim", label_selector="")
        if c["metadata"]["namespace"] == instance.namespace
    }


def _run(owner, instance, verb, **parameters) -> Operation:
    operation = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb=verb,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    assert wait_done(operation, timeout=90).state == Operation.State.SUCCEEDED, operation.error
    instance.refresh_from_db()
    return operation


def test_a_valkey_instance_lives_through_every_verb_with_a_worker(
    worker, cell, valkey_plan, tenant, owner, kube, owner_client
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=valkey_plan, name="sessions",
        parameters={"servers": "2"}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    assert wait_done(create, timeout=90).state == Operation.State.SUCCEEDED, create.error
    instance = Instance.objects.get(pk=create.instance_id)
    assert instance.state == Instance.State.RUNNING
    cell_observe(cell, kube)
    instance.refresh_from_db()
    assert instance.observed == {"ready": 2, "total": 2, "healthy": True, "healthReason": ""}
    secret = instance_object(kube, instance, "v1", "Secret", instance.pk)
    password = services.instance_parameters(instance)["password"]
    assert base64.b64decode(secret["data"]["password"]).decode() == password
    conf = instance_object(kube, instance, "v1", "ConfigMap", instance.pk)["data"]["valkey.conf"]
    assert "maxmemory 1gb\n" in conf and "maxmemory-policy allkeys-lru\n" in conf
    client = instance_object(kube, instance, "v1", "Service", instance.pk)["spec"]
    assert client["ports"][0]["port"] == 6379
    assert client["selector"]["statefulset.kubernetes.io/pod-name"] == f"{instance.pk}-0"
    headless = instance_object(kube, instance, "v1", "Service", f"{instance.pk}-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert _pods(kube, instance) == [f"{instance.pk}-0", f"{instance.pk}-1"]
    connection = selectors.instance_connection(instance)
    assert connection.has_password
    host = f"{instance.pk}.{instance.namespace}"  # the client Service, from any namespace
    assert connection.uri() == f"redis://:{selectors.MASKED}@{host}:6379"
    assert connection.uri("p@ss") == f"redis://:p%40ss@{host}:6379"
    # Its servers carry no role label: the Servers tab lists them without a Role column.
    servers = owner_client.get(
        f"/t/{tenant.slug}/deployments/{instance.pk}/", {"tab": "servers"}
    ).content.decode()
    assert f"<code>{instance.pk}-1</code>" in servers and "<th>Role</th>" not in servers

    # Scale out, and grow every claim (the claim template itself cannot change).
    _run(owner, instance, "modify", servers="3", storageGi="5")
    assert _pods(kube, instance) == [f"{instance.pk}-{i}" for i in range(3)]
    assert _claims(kube, instance) == {f"data-{instance.pk}-{i}": "5Gi" for i in range(3)}
    assert instance.parameters["servers"] == 3 and instance.parameters["storageGi"] == 5

    # A claim cannot shrink (the API server refuses it): the spec marks the size grow-only, so
    # the request is refused before anything is queued, and the instance keeps running.
    with pytest.raises(ValidationError, match="Can grow, not shrink: it is 5 now"):
        services.instance_action(
            actor=Actor(user=owner), instance=instance, verb="modify",
            parameters={"servers": "2", "storageGi": "3"}, request_id=uuid.uuid4().hex,
        )  # fmt: skip
    assert not instance.operations.filter(state=Operation.State.QUEUED).exists()
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.parameters["servers"] == 3 and instance.parameters["storageGi"] == 5
    assert _statefulset(kube, instance)["spec"]["replicas"] == 3

    before = _statefulset(kube, instance)["status"]["currentRevision"]
    _run(owner, instance, "setEvictionPolicy", policy="allkeys-lfu")
    conf = instance_object(kube, instance, "v1", "ConfigMap", instance.pk)["data"]["valkey.conf"]
    assert "maxmemory-policy allkeys-lfu\n" in conf
    status = _statefulset(kube, instance)["status"]
    assert status["updateRevision"] == status["currentRevision"] != before
    assert status["readyReplicas"] == 3
    assert instance.parameters["evictionPolicy"] == "allkeys-lfu"

    _run(owner, instance, "stop")
    assert instance.state == Instance.State.STOPPED
    assert _pods(kube, instance) == []
    assert set(_claims(kube, instance)) == {f"data-{instance.pk}-{i}" for i in range(3)}
    assert instance.outputs["readyReplicas"] == "0"  # not the 3 that ran before the stop

    _run(owner, instance, "start")
    assert instance.state == Instance.State.RUNNING
    assert _statefulset(kube, instance)["status"]["readyReplicas"] == 3
    assert instance.outputs["readyReplicas"] == "3"

    before = _statefulset(kube, instance)["status"]["currentRevision"]
    restart = _run(owner, instance, "restart")
    status = _statefulset(kube, instance)["status"]
    assert status["updateRevision"] == status["currentRevision"] != before
    assert status["readyReplicas"] == 3
    pod = instance_object(kube, instance, "v1", "Pod", f"{instance.pk}-0")
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] == (
        restart.started_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    assert instance.outputs["revision"] == status["currentRevision"]  # not the one before

    # Scaled in, a server's claim goes with it: kept, it would be storage no one is billed for;
    # and one an earlier scale-in left (a version before this rule) goes with the next change.
    kube.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"data-{instance.pk}-4", "namespace": instance.namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
    })  # fmt: skip
    _run(owner, instance, "modify", servers="2")
    assert _pods(kube, instance) == [f"{instance.pk}-0", f"{instance.pk}-1"]
    assert _claims(kube, instance) == {f"data-{instance.pk}-{i}": "5Gi" for i in range(2)}

    delete = services.instance_delete(
        actor=Actor(user=owner), instance=instance, request_id=uuid.uuid4().hex
    )
    assert wait_done(delete, timeout=90).state == Operation.State.SUCCEEDED, delete.error
    instance.refresh_from_db()
    assert instance.state == Instance.State.DELETED
    assert _statefulset(kube, instance) is None
    assert instance_object(kube, instance, "v1", "Namespace", instance.namespace) is None


def _cache_running(owner, tenant) -> Instance:
    """A Valkey instance "cache" on the allkeys-lru policy, its create done (no worker)."""
    from tests.deployments import factories

    cell = factories.cell()
    plan = services.plan_load(text=VALKEY.read_text()).plan
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="cache", cell=cell,
        parameters={"evictionPolicy": "allkeys-lru"}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=create.instance_id)


def test_the_eviction_policy_dialog_starts_from_the_policy_the_instance_will_hold(
    db, owner_client, owner, tenant
):
    instance = _cache_running(owner, tenant)
    page = f"/t/{tenant.slug}/deployments/{instance.pk}/"

    def selected() -> list[str]:
        html = owner_client.get(page).content.decode()
        dialog = html[html.index('id="dialog-setEvictionPolicy"') :]
        select = dialog[: dialog.index("</select>")]
        return re.findall(r'<option value="([^"]+)" selected', select)

    assert selected() == ["allkeys-lru"]  # not the verb's default, allkeys-lfu
    services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="setEvictionPolicy",
        parameters={"policy": "volatile-ttl"}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    assert selected() == ["volatile-ttl"]  # as the queued change leaves it


def test_setting_the_eviction_policy_the_instance_holds_is_refused_as_a_modify_is(
    db, owner_client, owner, tenant
):
    instance = _cache_running(owner, tenant)
    url = f"/t/{tenant.slug}/deployments/{instance.pk}/actions/setEvictionPolicy/"

    same = owner_client.post(url, {"request_id": "same", "p-policy": "allkeys-lru"})
    other = owner_client.post(url, {"request_id": "other", "p-policy": "volatile-ttl"})

    assert "The instance already has these values: change one to set eviction policy." in (
        same.content.decode()
    )
    verbs = Operation.objects.filter(instance=instance, verb="setEvictionPolicy")
    assert other.status_code == 302 and verbs.count() == 1


def eviction_change_cancelled(owner, instance, faults) -> Operation:
    """A change of the instance's eviction policy to volatile-ttl, cancelled while it waited on
    its servers' rollout (which never ends while it is frozen), ended."""
    faults(frozen=["statefulsets"])
    change = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="setEvictionPolicy",
        parameters={"policy": "volatile-ttl"}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    wait_for(
        lambda: change.task_runs.filter(node__endswith="statefulset", state="Running").exists(),
        what="the change to wait on its rollout",
    )
    services.operation_cancel(
        actor=Actor(user=owner), operation=change, request_id=uuid.uuid4().hex
    )
    wait_done(change, timeout=30)
    faults(frozen=[])
    return change


def test_a_cancelled_eviction_policy_change_says_what_the_servers_may_run_and_can_be_undone(
    worker, cell, valkey_plan, tenant, owner, kube, owner_client, faults
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=valkey_plan, name="cache",
        parameters={"servers": "1", "evictionPolicy": "allkeys-lru"}, request_id="cache",
    )  # fmt: skip
    assert wait_done(create, timeout=90).state == Operation.State.SUCCEEDED, create.error
    instance = Instance.objects.get(pk=create.instance_id)
    page = f"/t/{tenant.slug}/deployments/{instance.pk}/"
    change = eviction_change_cancelled(owner, instance, faults)
    assert change.state == Operation.State.CANCELLED

    # The cluster took the new policy; the instance holds the old one, and the page says so.
    conf = instance_object(kube, instance, "v1", "ConfigMap", instance.pk)["data"]["valkey.conf"]
    assert "maxmemory-policy volatile-ttl\n" in conf
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.parameters["evictionPolicy"] == "allkeys-lru"
    html = unescape(owner_client.get(page).content.decode())
    said = html[html.index('id="parameters-setting-left"') :][:700]
    assert "was cancelled after it had changed the cluster: its servers may run" in said
    assert "Eviction policy <code>volatile-ttl</code> rather than the value listed." in said

    # Either value may be set again: the one the instance holds is not refused as unchanged.
    _run(owner, instance, "setEvictionPolicy", policy="allkeys-lru")
    conf = instance_object(kube, instance, "v1", "ConfigMap", instance.pk)["data"]["valkey.conf"]
    assert "maxmemory-policy allkeys-lru\n" in conf
    after = owner_client.get(page).content.decode()
    assert 'id="parameters-setting-left"' not in after
    with pytest.raises(ValidationError, match="The instance already has these values"):
        services.instance_action(
            actor=Actor(user=owner), instance=instance, verb="setEvictionPolicy",
            parameters={"policy": "allkeys-lru"}, request_id="again",
        )  # fmt: skip


def test_the_activity_tab_says_what_a_modify_and_an_eviction_policy_change_set(
    db, owner_client, owner, tenant
):
    """Two teammates changing one instance see who set which values: the tab said only
    "instance.modify" and "instance.setEvictionPolicy", and the policy chosen was kept nowhere."""
    instance = _cache_running(owner, tenant)
    page = f"/t/{tenant.slug}/deployments/{instance.pk}/"
    owner_client.post(f"{page}modify/", {"request_id": "scale", "p-servers": "4"})
    Operation.objects.filter(verb="modify").update(state=Operation.State.SUCCEEDED)
    owner_client.post(
        f"{page}actions/setEvictionPolicy/", {"request_id": "policy", "p-policy": "volatile-ttl"}
    )
    assert Operation.objects.filter(verb="setEvictionPolicy").count() == 1

    tab = owner_client.get(page, {"tab": "activity"}).content.decode()

    rows = {
        action: " ".join(row.split())
        for row in re.findall(r"<tr>(.*?)</tr>", tab, re.S)
        for action in ("instance.modify", "instance.setEvictionPolicy")
        if f"<code>{action}</code>" in row
    }
    assert "<td>Servers: 4</td>" in rows["instance.modify"]
    assert "<td>Eviction policy: volatile-ttl</td>" in rows["instance.setEvictionPolicy"]


def test_an_action_the_header_comes_to_offer_while_an_operation_is_pending_opens_its_dialog(
    db, owner_client, owner, tenant
):
    """While a modify updates the cache, a new eviction policy is refused, so the page has no
    dialog for it; once the servers are back, before the modify ends, the header's poll offers
    it. It brought the enabled button alone, and clicking it opened nothing: its dialog now
    comes with it."""
    instance = _cache_running(owner, tenant)
    page = f"/t/{tenant.slug}/deployments/{instance.pk}/"
    owner_client.post(f"{page}modify/", {"request_id": "scale", "p-servers": "4"})
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.UPDATING)
    shown = owner_client.get(page).content.decode()
    assert 'id="dialog-setEvictionPolicy"' not in shown
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING)  # modify pending

    polled = owner_client.get(
        page, {"shown": "an older digest"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head"
    ).content.decode()

    why = re.search(r'id="why-setEvictionPolicy">(.*?)</li>', polled)
    assert why is None, why.group(1)
    assert '<div id="instance-dialogs" hx-swap-oob="true">' in polled
    assert 'id="dialog-setEvictionPolicy"' in polled
