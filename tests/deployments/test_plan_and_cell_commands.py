"""load_specs, add_cell and spec_test --cell as an operator runs them."""

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal
from io import StringIO
from urllib.parse import urlsplit

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from accounts.audit import Actor
from accounts.models import Tenant
from billing.models import PastPrice, Plan, Price
from deployments import runner, selectors, services
from deployments.context import BACKUP_CREDENTIALS_NAME
from deployments.models import Cell, Instance, Operation, PlanVersion
from tests.concurrency import beside_a_held_write, beside_a_lock, race
from tests.deployments import factories
from tests.deployments.conftest import (
    ROOT,
    SPEC,
    database_url_for_tests,
    instance_object,
    wait_for,
)
from tests.servers import UNAVAILABLE, UNAVAILABLE_SAID


def test_load_specs_creates_then_keeps_then_versions_a_plan(transactional_db, tmp_path, capsys):
    spec = tmp_path / "pg.yaml"
    spec.write_text(SPEC.read_text())

    call_command("load_specs", str(tmp_path))
    call_command("load_specs", str(spec))
    spec.write_text(SPEC.read_text().replace("name: PostgreSQL\n", "name: PostgreSQL 2\n", 1))
    call_command("load_specs", str(spec))

    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{spec}: plan postgres-cnpg created",
        f"{spec}: plan postgres-cnpg unchanged (version 1)",
        f"{spec}: plan postgres-cnpg updated to version 2",
    ]
    assert Plan.objects.get(key="postgres-cnpg").name == "PostgreSQL 2"
    assert list(PlanVersion.objects.values_list("number", flat=True).order_by("number")) == [1, 2]


def test_load_specs_going_back_to_an_earlier_text_releases_it_again(
    transactional_db, tmp_path, capsys
):
    spec = tmp_path / "pg.yaml"
    first = SPEC.read_text()
    spec.write_text(first)
    call_command("load_specs", str(spec))
    spec.write_text(first.replace("name: PostgreSQL\n", "name: PostgreSQL 2\n", 1))
    call_command("load_specs", str(spec))

    spec.write_text(first)  # the change is taken back
    call_command("load_specs", str(spec))
    call_command("load_specs", str(spec))

    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [
        f"{spec}: plan postgres-cnpg updated to version 3 (the text of version 1)",
        f"{spec}: plan postgres-cnpg unchanged (version 3)",
    ]
    plan = Plan.objects.get(key="postgres-cnpg")
    assert plan.name == "PostgreSQL"
    latest = selectors.plan_version_latest(plan)
    assert (latest.number, latest.spec_text) == (3, first)  # what new instances get
    # An instance on version 1 runs that text already: no upgrade is offered to it.
    tenant = Tenant.objects.create(name="Acme", slug="acme")
    cell = Cell.objects.create(name="eu-1", kubeconfig="apiVersion: v1\nkind: Config")
    on_first = Instance.objects.create(
        tenant=tenant, name="a", plan_version=plan.versions.get(number=1), cell=cell
    )
    assert selectors.upgrade_preview(on_first) is None


def test_two_loads_of_a_new_plan_at_once_make_one_plan_and_one_version(transactional_db):
    # Two deploys starting together each load the specs: neither fails on the other's plan.
    results = race(lambda: services.plan_load(text=SPEC.read_text()), times=2)

    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(r.version_created for r in results) == [False, True]
    assert Plan.objects.filter(key="postgres-cnpg").count() == 1
    assert list(PlanVersion.objects.values_list("number", flat=True)) == [1]


def test_load_specs_warns_of_a_platform_secret_the_spec_reads_that_is_not_set(
    transactional_db, tmp_path, capsys
):
    from deployments.models import PlatformSecret

    line = "                    password: {{ $var.password }}\n"
    spec = tmp_path / "pg.yaml"
    spec.write_text(
        SPEC.read_text().replace(
            line,
            line + line.replace("password: {{ $var.password }}", "token: {{ $secret.TOKEN }}"),
            1,
        )
    )

    call_command("load_specs", str(spec))
    PlatformSecret.objects.create(name="TOKEN", value="t")
    call_command("load_specs", str(spec))

    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{spec}: plan postgres-cnpg created",
        "  warning: $secret.TOKEN is read, but no platform secret is called TOKEN yet: add it in "
        "the admin before an instance of this plan runs, or its runs fail.",
        f"{spec}: plan postgres-cnpg unchanged (version 1)",  # set now: no warning
    ]


def test_load_specs_reports_every_error_and_loads_nothing(transactional_db, tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text(SPEC.read_text().replace("      delete:\n", "      gone:\n", 1))

    with pytest.raises(CommandError, match="some specs were not loaded"):
        call_command("load_specs", str(broken))

    assert "delete" in capsys.readouterr().err
    assert not Plan.objects.exists()


@pytest.fixture
def cell_files(sandbox_kubeconfig, tmp_path):
    """The sandbox's kubeconfig and an object store's keys, as files `add_cell` reads."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(sandbox_kubeconfig)
    credentials = tmp_path / "keys.json"
    credentials.write_text(json.dumps({"ACCESS_KEY_ID": "k", "ACCESS_SECRET_KEY": "s3cret"}))
    return kubeconfig, credentials


def test_add_cell_checks_the_cluster_and_stores_the_kubeconfig_encrypted(
    transactional_db, sandbox_kubeconfig, cell_files, capsys
):
    kubeconfig, credentials = cell_files

    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig), "--region", "eu-west-1",
        "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
    )  # fmt: skip

    assert "Cell eu-1 registered (default)." in capsys.readouterr().out
    cell = Cell.objects.get(name="eu-1")
    assert cell.kubeconfig == sandbox_kubeconfig
    assert cell.operator_namespace == ""  # the plans' own
    with connection.cursor() as cursor:
        cursor.execute("SELECT kubeconfig, backup_credentials FROM deployments_cell")
        stored = "".join(cursor.fetchone())
    assert "server:" not in stored and "s3cret" not in stored


def test_add_cell_again_changes_only_the_options_given(
    transactional_db, sandbox_kubeconfig, cell_files, tmp_path, capsys
):
    kubeconfig, credentials = cell_files
    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig), "--region", "eu-west-1",
        "--cloud", "aws", "--backup-destination", "s3://b/p",
        "--backup-credentials", str(credentials),
    )  # fmt: skip
    call_command("add_cell", "--name", "us-1", "--kubeconfig", str(kubeconfig))
    rotated = tmp_path / "rotated"
    rotated.write_text(sandbox_kubeconfig + "# rotated\n")
    capsys.readouterr()

    call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(rotated))  # new credentials
    call_command("add_cell", "--name", "us-1", "--kubeconfig", str(kubeconfig), "--default")

    out = capsys.readouterr().out
    assert "Cell eu-1 updated: only the options given changed (default)." in out
    assert "Cell us-1 updated: only the options given changed (default)." in out
    eu = Cell.objects.get(name="eu-1")
    assert eu.kubeconfig.endswith("# rotated\n")
    assert (eu.region, eu.cloud, eu.backup_destination) == ("eu-west-1", "aws", "s3://b/p")
    assert json.loads(eu.backup_credentials)["ACCESS_SECRET_KEY"] == "s3cret"
    assert not eu.is_default and Cell.objects.get(name="us-1").is_default


def test_cells_registered_at_once_as_the_default_leave_one_default_and_no_error(
    transactional_db, sandbox_kubeconfig
):
    def register(name):
        return services.cell_register(name=name, kubeconfig=sandbox_kubeconfig, make_default=True)

    names = iter(["eu-1", "eu-2", "eu-3", "eu-4"])
    apart = race(lambda: register(next(names)))  # four cells, each made the default
    again = race(lambda: register("us-1"))  # one cell, registered four times at once

    assert [r for r in apart + again if isinstance(r, Exception)] == []
    assert Cell.objects.count() == 5
    assert list(Cell.objects.filter(is_default=True).values_list("name", flat=True)) == ["us-1"]


def _slow_door(kubeconfig: str, delay: float) -> tuple[str, socket.socket]:
    """`kubeconfig` reaching its cluster through a local port that holds each new connection
    `delay` seconds before passing it on: a cluster slow to answer. The listening socket is
    returned for the caller to close."""
    import yaml

    config = yaml.safe_load(kubeconfig)
    target = urlsplit(config["clusters"][0]["cluster"]["server"])
    door = socket.create_server(("127.0.0.1", 0))

    def pipe(src, dst):
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def hold(client):
        time.sleep(delay)
        with contextlib.suppress(OSError):
            upstream = socket.create_connection((target.hostname, target.port))
            threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
            pipe(upstream, client)

    def serve():
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=hold, args=(door.accept()[0],), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    port = door.getsockname()[1]
    config["clusters"][0]["cluster"]["server"] = f"{target.scheme}://127.0.0.1:{port}"
    return yaml.safe_dump(config), door


def test_a_registration_asks_a_slow_cluster_holding_no_transaction_nor_the_registration_lock(
    transactional_db, sandbox_kubeconfig
):
    """A cluster call may take its whole timeout: a registration waiting on one must leave
    its connection out of any transaction, and other registrations free to go on."""
    slow, door = _slow_door(sandbox_kubeconfig, delay=3.0)
    done = {}

    def register():
        try:
            done["cell"] = services.cell_register(name="slow-1", kubeconfig=slow)
        finally:
            connection.close()

    thread = threading.Thread(target=register)
    try:
        thread.start()
        time.sleep(1.0)  # the check waits on the cluster's first answer
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
            )
            idle_in_transaction = cursor.fetchone()[0]
            cursor.execute("SELECT pg_try_advisory_lock(hashtext('opsdeck.cell_register'))")
            lock_free = cursor.fetchone()[0]
            if lock_free:
                cursor.execute("SELECT pg_advisory_unlock(hashtext('opsdeck.cell_register'))")
        assert "cell" not in done, "the check ended before it was looked at"
        assert (idle_in_transaction, lock_free) == (0, True)
    finally:
        thread.join(60)
        door.close()
    assert done["cell"].name == "slow-1" and Cell.objects.filter(name="slow-1").exists()


@pytest.mark.parametrize("plans", [[], ["postgres"]])
def test_add_cell_refuses_a_cluster_that_refuses_its_credentials_saying_so(
    transactional_db, tmp_path, plans
):
    import yaml

    from sandbox.api import Sandbox

    if plans:
        call_command("load_specs", str(SPEC), stdout=StringIO())
    with Sandbox(token="right-token") as guarded:
        config = guarded.kubeconfig()
        config["users"][0]["user"]["token"] = "wrong-token"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        with pytest.raises(CommandError) as refused:
            call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig))

    assert str(refused.value).startswith("The cluster refuses the kubeconfig's credentials: ")
    assert "does not serve" not in str(refused.value)
    assert not Cell.objects.exists()


def widget_plan(*, cells: list[str] | None = None) -> str:
    """The shipped spec with its operator's kinds moved to a group the sandbox does not serve."""
    text = (
        SPEC.read_text()
        .replace("postgresql.cnpg.io/v1", "widgets.example.io/v1")
        .replace("install CloudNativePG first", "install the Widget operator first")
        .replace("plan: postgres-cnpg", "plan: widgets")
    )
    if cells:
        text = text.replace("  entitlements:\n", f"  entitlements:\n    cells: {cells}\n", 1)
    return text


def test_add_cell_refuses_a_cluster_lacking_what_a_plan_writes_with_the_spec_hint(
    transactional_db, cell_files
):
    kubeconfig, credentials = cell_files
    services.plan_load(text=SPEC.read_text())  # the sandbox serves what this one writes
    services.plan_load(text=widget_plan())

    with pytest.raises(CommandError) as refused:
        call_command(
            "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
            "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
        )  # fmt: skip

    assert str(refused.value) == (
        "The cluster does not serve Cluster, Backup: install the Widget operator first."
    )
    assert not Cell.objects.exists()


def test_add_cell_checks_only_the_plans_that_may_run_on_the_cell(
    transactional_db, sandbox_kubeconfig, tmp_path, capsys
):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(sandbox_kubeconfig)
    services.plan_load(text=widget_plan(cells=["widget-cell"]))

    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
        "--operator-namespace", "postgres-operator",
    )  # fmt: skip

    assert "Cell eu-1 registered (default)." in capsys.readouterr().out
    assert Cell.objects.get(name="eu-1").operator_namespace == "postgres-operator"
    with pytest.raises(CommandError, match="install the Widget operator first"):
        call_command("add_cell", "--name", "widget-cell", "--kubeconfig", str(kubeconfig))


def test_add_cell_refuses_an_operator_namespace_that_is_not_a_namespace_name(
    transactional_db, cell_files
):
    kubeconfig, _ = cell_files

    with pytest.raises(CommandError) as refused:
        call_command(
            "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
            "--operator-namespace", "Postgres_Operator",
        )  # fmt: skip

    assert str(refused.value) == (
        "The operator namespace “Postgres_Operator” is not a namespace name: use at most 63 "
        "lowercase letters, digits and '-', starting and ending with a letter or digit."
    )
    assert not Cell.objects.exists()


def _create(owner, tenant, plan, name: str) -> Operation:
    return services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip


def _customers_admitted(kube, instance) -> dict:
    """The rule of the instance's network policy (its last) that admits customers."""
    policy = instance_object(
        kube, instance, "networking.k8s.io/v1", "NetworkPolicy", "opsdeck-isolation"
    )
    return policy["spec"]["ingress"][-1]


def test_add_cell_takes_the_customer_sources_a_new_instances_network_policy_admits(
    cell_files, owner, tenant, kube
):
    kubeconfig, credentials = cell_files
    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
        "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
        "--customer-sources", " 203.0.113.0/24,2001:DB8::/32,203.0.113.0/24,198.51.100.7",
    )  # fmt: skip
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = _create(owner, tenant, plan, "orders")

    runner._step(str(create.pk))  # the namespace and its guard rails come first

    # Each range once, as the network policy's ipBlock takes it (one address: a /32).
    admitted = ["203.0.113.0/24", "2001:db8::/32", "198.51.100.7/32"]
    assert Cell.objects.get(name="eu-1").customer_sources == admitted
    assert _customers_admitted(kube, create.instance) == {
        "from": [{"ipBlock": {"cidr": cidr}} for cidr in admitted],
        "ports": [{"port": 5432}],
    }


def test_add_cell_applies_changed_customer_sources_and_keys_to_the_instances_it_runs(
    transactional_db, cell_files, owner, tenant, kube, tmp_path, capsys
):
    kubeconfig, credentials = cell_files
    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
        "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
        "--customer-sources", "203.0.113.0/24",
    )  # fmt: skip
    plan = services.plan_load(text=SPEC.read_text()).plan
    made = [_create(owner, tenant, plan, name) for name in ("orders", "billing")]
    runner._step(str(made[0].pk))  # its namespace is made; the other's create has not begun
    rotated = tmp_path / "rotated.json"
    rotated.write_text(json.dumps({"ACCESS_KEY_ID": "k2", "ACCESS_SECRET_KEY": "n3w"}))
    capsys.readouterr()

    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
        "--backup-credentials", str(rotated), "--customer-sources", "198.51.100.0/24",
    )  # fmt: skip

    assert capsys.readouterr().out == (
        "Cell eu-1 updated: only the options given changed (default).\n"
        "Guard rails applied again in the namespaces of 1 instance of the cell (1 left to their "
        "create or delete).\n"
    )
    instance = made[0].instance
    newer = [{"ipBlock": {"cidr": "198.51.100.0/24"}}]
    assert _customers_admitted(kube, instance)["from"] == newer
    secret = instance_object(kube, instance, "v1", "Secret", BACKUP_CREDENTIALS_NAME)
    assert base64.b64decode(secret["data"]["ACCESS_SECRET_KEY"]) == b"n3w"
    # The other's create applies what the cell says now when it makes its namespace.
    runner._step(str(made[1].pk))
    assert _customers_admitted(kube, made[1].instance)["from"] == newer

    # Nothing changed, nothing applied, unless asked.
    call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig))
    assert "Guard rails" not in capsys.readouterr().out
    call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
                 "--apply-namespaces")  # fmt: skip
    assert "in the namespaces of 2 instances of the cell.\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("held", "passed"),
    [
        # add_cell looks for the namespace before the create's reaches the cluster, and
        # leaves it to the create, which rendered its guard rails before the change.
        (r"^/api/v1/namespaces/[^/?]+(\?|$)", (0, 1)),
        # add_cell applies the new guard rails, then the create's older ones reach the cluster.
        (r"/networkpolicies/opsdeck-isolation\b", (1, 0)),
    ],
    ids=["namespace", "network-policy"],
)
def test_a_create_under_way_as_add_cell_changes_the_customer_sources_ends_admitting_the_new(
    held, passed, relayed_cell, owner, tenant, kube
):
    """The create rendered its guard rails before add_cell's change committed, and its write
    of them reaches the cluster after add_cell passed the namespace by, or applied the new
    ones: the instance admits the customer sources the cell has now."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = _create(owner, tenant, plan, "orders")
    relay.hold(held, before=True, method="PATCH")

    _, done = beside_a_held_write(
        relay,
        lambda: runner._step(str(create.pk)),
        lambda: services.cell_namespaces_apply(register(customer_sources=["198.51.100.0/24"])),
    )

    assert (done.applied, done.left) == passed
    assert _customers_admitted(kube, create.instance)["from"] == [
        {"ipBlock": {"cidr": "198.51.100.0/24"}}
    ]


def test_a_create_going_on_after_a_cluster_error_applies_again_what_add_cell_changed_meanwhile(
    relayed_cell, owner, tenant, kube
):
    """add_cell found no namespace and left it to the create, whose write of the object store's
    keys, after its network policy, was answered with an error: the create's next move
    renders the guard rails with the cell's new settings, and does not take the policy it
    applied with the old ones for done."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = _create(owner, tenant, plan, "orders")
    relay.hold(r"^/api/v1/namespaces/[^/?]+(\?|$)", before=True, method="PATCH")
    relay.garble(rf"/secrets/{BACKUP_CREDENTIALS_NAME}\b", UNAVAILABLE, status=503)
    _, done = beside_a_held_write(
        relay,
        lambda: runner._step(str(create.pk)),
        lambda: services.cell_namespaces_apply(register(customer_sources=["198.51.100.0/24"])),
    )
    create.refresh_from_db()
    assert (done.left, create.error) == (1, f"{runner.RETRYING}{UNAVAILABLE_SAID}")

    time.sleep(0.5)  # its back-off after the error
    runner._step(str(create.pk))

    assert _customers_admitted(kube, create.instance)["from"] == [
        {"ipBlock": {"cidr": "198.51.100.0/24"}}
    ]


def test_two_add_cells_at_once_leave_the_instances_admitting_the_sources_of_the_last(
    relayed_cell, owner, tenant, kube
):
    """The first's write of its network policy reaches the cluster after the second applied
    its own; the second's pass ended first, and the cell's guard rails stay current."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = _create(owner, tenant, plan, "orders")
    runner._step(str(create.pk))  # its namespace is made
    relay.hold(r"/networkpolicies/opsdeck-isolation\b", before=True, method="PATCH")

    first, second = beside_a_held_write(
        relay,
        lambda: services.cell_namespaces_apply(register(customer_sources=["198.51.100.0/24"])),
        lambda: services.cell_namespaces_apply(register(customer_sources=["192.0.2.0/24"])),
    )

    assert (first.applied, second.applied) == (1, 1)
    assert _customers_admitted(kube, create.instance)["from"] == [
        {"ipBlock": {"cidr": "192.0.2.0/24"}}
    ]
    assert not Cell.objects.get(name="eu-1").guard_rails_behind


def _made(owner, tenant, names: tuple[str, ...]) -> list[Instance]:
    """Instances of the plan, each with its namespace and guard rails made."""
    plan = services.plan_load(text=SPEC.read_text()).plan
    made = [_create(owner, tenant, plan, name) for name in names]
    for create in made:
        runner._step(str(create.pk))
    return [create.instance for create in made]


def _policy_write_held(relay, instance: Instance) -> None:
    """The relay holds the write of the instance's network policy before the cluster sees it."""
    relay.hold(
        rf"/namespaces/{instance.pk}/networkpolicies/opsdeck-isolation\b",
        before=True,
        method="PATCH",
    )


def _admitting(kube, instance) -> list[str]:
    return [rule["ipBlock"]["cidr"] for rule in _customers_admitted(kube, instance)["from"]]


def test_a_cell_changed_during_a_pass_stays_behind_until_the_next_one(
    relayed_cell, owner, tenant, kube
):
    """The pass applied the first instance's guard rails before the change, and the second's
    after it: the first keeps the settings before it, and the cell says so, until the next
    pass."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    first, second = _made(owner, tenant, ("orders", "billing"))
    _policy_write_held(relay, second)

    done, _ = beside_a_held_write(
        relay,
        lambda: services.cell_namespaces_apply(
            register(customer_sources=["198.51.100.0/24"]), at_once=1
        ),
        lambda: register(customer_sources=["192.0.2.0/24"]),
    )

    assert done.applied == 2
    assert (_admitting(kube, first), _admitting(kube, second)) == (
        ["198.51.100.0/24"],
        ["192.0.2.0/24"],
    )
    cell = Cell.objects.get(name="eu-1")
    assert cell.guard_rails_behind
    services.cell_namespaces_apply(cell)
    assert _admitting(kube, first) == ["192.0.2.0/24"]
    assert not Cell.objects.get(name="eu-1").guard_rails_behind


def test_an_instance_the_cluster_is_slow_to_answer_for_does_not_hold_the_others_back(
    relayed_cell, owner, tenant, kube
):
    """The first instance's network policy write is held: the second's guard rails are
    applied meanwhile, and the pass ends with both."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    first, second = _made(owner, tenant, ("orders", "billing"))
    _policy_write_held(relay, first)

    done, _ = beside_a_held_write(
        relay,
        lambda: services.cell_namespaces_apply(register(customer_sources=["198.51.100.0/24"])),
        lambda: wait_for(
            lambda: _admitting(kube, second) == ["198.51.100.0/24"],
            timeout=30,
            what="the second instance's guard rails while the first's are held",
        ),
    )

    assert done.applied == 2
    assert _admitting(kube, first) == ["198.51.100.0/24"]
    assert not Cell.objects.get(name="eu-1").guard_rails_behind


def test_a_pass_stopped_half_way_leaves_the_cells_guard_rails_behind(relayed_cell, owner, tenant):
    _, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    _made(owner, tenant, ("orders", "billing"))
    cell = register(customer_sources=["198.51.100.0/24"])

    def stopped(done: services.NamespacesApplied) -> None:
        raise KeyboardInterrupt  # add_cell's operator pressed Ctrl-C after the first instance

    with pytest.raises(KeyboardInterrupt):
        services.cell_namespaces_apply(cell, each=stopped)

    cell = Cell.objects.get(name="eu-1")
    assert cell.guard_rails_behind
    assert cell.guard_rails_pass_until is None  # let go: the watcher's catch-up may run


def test_the_next_add_cell_applies_the_guard_rails_a_run_could_not_apply_everywhere(
    relayed_cell, owner, tenant, kube, tmp_path, capsys
):
    """The cluster refused one instance's network policy: add_cell names it as it goes and
    fails, and the next add_cell for the cell, changing nothing, applies them again."""
    relay, register = relayed_cell
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(register.keywords["kubeconfig"])  # the sandbox through the relay
    register(customer_sources=["203.0.113.0/24"])
    first, second = _made(owner, tenant, ("orders", "billing"))
    relay.garble(rf"/namespaces/{second.pk}/networkpolicies/", UNAVAILABLE, status=503, before=True)
    add_cell = ["add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig)]

    with pytest.raises(CommandError) as refused:
        call_command(*add_cell, "--customer-sources", "198.51.100.0/24")

    assert str(refused.value) == (
        "1 instance could not be updated: run add_cell for the cell again once the cluster "
        "takes them (it applies them again until every instance has them)."
    )
    out, err = capsys.readouterr()
    assert err == f"{second.pk}: {UNAVAILABLE_SAID}\n"
    assert "Guard rails applied again in the namespaces of 1 instance of the cell.\n" in out
    assert (_admitting(kube, first), _admitting(kube, second)) == (
        ["198.51.100.0/24"],
        ["203.0.113.0/24"],
    )
    assert Cell.objects.get(name="eu-1").guard_rails_behind

    call_command(*add_cell)

    assert capsys.readouterr().out == (
        "Cell eu-1 updated: only the options given changed (default).\n"
        "The guard rails of the cell's instances were not all applied again since its settings "
        "last changed (a run stopped, or the cluster refused some): applying them now.\n"
        "Guard rails applied again in the namespaces of 2 instances of the cell.\n"
    )
    assert _admitting(kube, second) == ["198.51.100.0/24"]
    assert not Cell.objects.get(name="eu-1").guard_rails_behind
    call_command(*add_cell)
    assert "Guard rails" not in capsys.readouterr().out  # all applied: nothing to do


def _interrupted_once_held(relay, kubeconfig, *options: str) -> tuple[int, str, str]:
    """`add_cell` changing the cell's customer sources, in a process of its own, sent SIGINT
    (Ctrl-C) once the relay holds the request it was told to (`relay.hold`): its exit code,
    output and errors."""
    add_cell = subprocess.Popen(  # noqa: S603 - our own manage.py
        [sys.executable, "manage.py", "add_cell", "--name", "eu-1", "--kubeconfig",
         str(kubeconfig), "--customer-sources", "198.51.100.0/24", *options],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url_for_tests()},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Heard as a terminal's Ctrl-C is, even where this run ignores SIGINT (a shell's
        # background job does, and a process inherits it).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert relay.holding.wait(60), "add_cell did not make the request held"
        add_cell.send_signal(signal.SIGINT)
        out, err = add_cell.communicate(timeout=60)
    finally:
        relay.release()
        if add_cell.poll() is None:
            add_cell.kill()
    return add_cell.returncode, out, err


def test_add_cell_stopped_with_ctrl_c_says_how_far_it_went_and_that_the_cell_is_behind(
    relayed_cell, owner, tenant, tmp_path
):
    """add_cell, in a process of its own, gets SIGINT while its write of the second instance's
    network policy is on its way."""
    relay, register = relayed_cell
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(register.keywords["kubeconfig"])  # the sandbox through the relay
    register(customer_sources=["203.0.113.0/24"])
    _, second = _made(owner, tenant, ("orders", "billing"))
    _policy_write_held(relay, second)

    returncode, out, err = _interrupted_once_held(relay, kubeconfig, "--at-once", "1")

    assert returncode == 130
    assert out == "Cell eu-1 updated: only the options given changed (default).\n"
    assert err.strip() == (
        "CommandError: Stopped after 1 instance of the cell: its guard rails are behind until a "
        "run applies them in every instance's namespace; run add_cell for the cell again."
    )
    assert Cell.objects.get(name="eu-1").guard_rails_behind


def test_add_cell_stopped_with_ctrl_c_while_it_checks_the_cluster_says_nothing_changed(
    relayed_cell, tmp_path
):
    """add_cell, in a process of its own, gets SIGINT while its first request to the cluster
    is on its way (a cluster slow to answer)."""
    relay, register = relayed_cell
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(register.keywords["kubeconfig"])  # the sandbox through the relay
    register(customer_sources=["203.0.113.0/24"])
    relay.hold(r"^/api", before=True)

    returncode, out, err = _interrupted_once_held(relay, kubeconfig)

    assert returncode == 130
    assert (out, err.strip()) == (
        "",
        "CommandError: Stopped while the cluster was checked, before the cell was saved: "
        "nothing changed.",
    )
    cell = Cell.objects.get(name="eu-1")
    assert (cell.customer_sources, cell.guard_rails_behind) == (["203.0.113.0/24"], False)


def test_of_passes_started_together_unless_another_holds_the_cell_one_runs(
    relayed_cell, owner, tenant, kube
):
    """The one that holds the cell has its write held on its way until the others ended."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    (instance,) = _made(owner, tenant, ("orders",))
    cell = register(customer_sources=["198.51.100.0/24"])
    _policy_write_held(relay, instance)
    ended = []

    def one_pass() -> services.NamespacesApplied | None:
        ended.append(services.cell_namespaces_apply(cell, unless_held=True))
        return ended[-1]

    passes, _ = beside_a_held_write(
        relay,
        lambda: race(one_pass),
        lambda: wait_for(lambda: len(ended) == 3, timeout=30, what="the other passes"),
    )

    assert passes.count(None) == 3, passes
    assert [p.applied for p in passes if p is not None] == [1]
    assert _admitting(kube, instance) == ["198.51.100.0/24"]
    cell.refresh_from_db()
    assert (cell.guard_rails_behind, cell.guard_rails_pass_until) == (False, None)


def test_add_cells_pass_runs_beside_a_pass_that_holds_the_cell(relayed_cell, owner, tenant, kube):
    """add_cell's operator asked for it: it does not wait for the cell watcher's pass."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    first, second = _made(owner, tenant, ("orders", "billing"))
    _policy_write_held(relay, first)

    held, beside = beside_a_held_write(
        relay,
        lambda: services.cell_namespaces_apply(
            register(customer_sources=["198.51.100.0/24"]), at_once=1, unless_held=True
        ),
        lambda: services.cell_namespaces_apply(Cell.objects.get(name="eu-1"), at_once=1),
    )

    assert (held.applied, beside.applied) == (2, 2)
    assert _admitting(kube, second) == ["198.51.100.0/24"]
    assert Cell.objects.get(name="eu-1").guard_rails_pass_until is None


@pytest.fixture
def catching_up(settings, monkeypatch):
    """`watch_cells` started on a cell, as it runs, looking at its cells every 0.2 s rather
    than 3 s, and catching up guard rails behind for half a second rather than a minute."""
    from deployments import watcher
    from tests.deployments.test_watcher import watcher_started

    settings.OPSDECK_WATCH_TIMEOUT = 2  # a stopping watch returns within this
    monkeypatch.setattr(watcher, "RENEW_EVERY", 0.2)
    monkeypatch.setattr(watcher, "CATCH_UP_AFTER", 0.5)
    started = []

    def start(cell: Cell):
        started.append(watcher_started(cell))
        return started[-1][0]

    yield start
    for running, thread in started:
        running.stopping.set()
        thread.join(30)


def _current() -> bool:
    return not Cell.objects.get(name="eu-1").guard_rails_behind


def _logged(caplog, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


def test_the_cell_watcher_applies_the_guard_rails_an_add_cell_left_behind(
    relayed_cell, owner, tenant, kube, catching_up, caplog
):
    """add_cell changed the customer sources and stopped before its pass (its operator's
    session dropped)."""
    _, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    first, second = _made(owner, tenant, ("orders", "billing"))
    cell = register(customer_sources=["198.51.100.0/24"])

    catching_up(cell)

    wait_for(_current, timeout=30, what="the cell's guard rails caught up")
    assert (_admitting(kube, first), _admitting(kube, second)) == (
        ["198.51.100.0/24"],
        ["198.51.100.0/24"],
    )
    said = "applied the guard rails of cell eu-1 again in the namespaces of 2 instance(s)"
    wait_for(lambda: _logged(caplog, said), timeout=10, what="the watcher's log line")


def test_the_cell_watcher_tries_again_after_the_cluster_refused_an_instances_guard_rails(
    relayed_cell, owner, tenant, kube, catching_up, caplog
):
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    _, second = _made(owner, tenant, ("orders", "billing"))
    cell = register(customer_sources=["198.51.100.0/24"])
    relay.garble(rf"/namespaces/{second.pk}/networkpolicies/", UNAVAILABLE, status=503, before=True)

    catching_up(cell)

    wait_for(lambda: relay.garbled is None, timeout=30, what="the refused write")
    wait_for(_current, timeout=30, what="the cell's guard rails caught up on a second pass")
    assert _admitting(kube, second) == ["198.51.100.0/24"]
    said = f"the cluster refused the guard rails of 1 instance(s) of cell eu-1 ({second.pk}: "
    assert _logged(caplog, said)


class _Stopped(Exception):
    """add_cell's pass stopped (its operator's session dropped)."""


def test_the_cell_watcher_does_not_run_beside_a_pass_that_holds_the_cell(
    relayed_cell, owner, tenant, kube, catching_up
):
    """add_cell's pass holds the cell with its first instance's write on its way: the
    watcher leaves the cell to it, and catches up once it stopped."""
    relay, register = relayed_cell
    register(customer_sources=["203.0.113.0/24"])
    first, second = _made(owner, tenant, ("orders", "billing"))
    _policy_write_held(relay, first)
    meanwhile = []

    def stopped_after_the_first(done: services.NamespacesApplied) -> None:
        raise _Stopped

    def watched_meanwhile() -> None:
        catching_up(Cell.objects.get(name="eu-1"))
        time.sleep(2)  # four times the watcher's wait before it catches up, ten of its rounds
        meanwhile.append(_admitting(kube, second))

    with pytest.raises(_Stopped):
        beside_a_held_write(
            relay,
            lambda: services.cell_namespaces_apply(
                register(customer_sources=["198.51.100.0/24"]),
                at_once=1,
                each=stopped_after_the_first,
            ),
            watched_meanwhile,
        )

    assert meanwhile == [["203.0.113.0/24"]]  # the watcher left the cell to add_cell's pass
    wait_for(_current, timeout=30, what="the cell's guard rails caught up")
    assert _admitting(kube, second) == ["198.51.100.0/24"]


def test_a_pass_marking_the_guard_rails_while_add_cell_saves_the_cell_is_not_saved_over(
    cell, sandbox_kubeconfig
):
    """The pass's mark is written, not committed yet, when a registration changing only the
    cell's region reads the cell: the registration saves the mark, not what it read before."""
    Cell.objects.filter(pk=cell.pk).update(settings_generation=1)  # a change no pass followed

    marked, _ = beside_a_lock(
        lambda: Cell.objects.filter(pk=cell.pk).update(guard_rails_generation=1),
        lambda: None,
        lambda: services.cell_register(
            name="sandbox", kubeconfig=sandbox_kubeconfig, region="eu-west-1"
        ),
    )

    assert marked == "committed"
    cell.refresh_from_db()
    assert (cell.region, cell.guard_rails_behind) == ("eu-west-1", False)


def test_add_cell_says_how_far_a_pass_through_many_instances_has_gone(
    transactional_db, cell_files, owner, tenant, monkeypatch, capsys
):
    from deployments.management.commands import add_cell

    kubeconfig, credentials = cell_files
    call_command(
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
        "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
    )  # fmt: skip
    plan = services.plan_load(text=SPEC.read_text()).plan
    for name in ("orders", "billing", "ledger", "search", "events"):
        _create(owner, tenant, plan, name)  # no namespace yet: left to their create
    monkeypatch.setattr(add_cell, "PROGRESS_EVERY", 2)
    capsys.readouterr()

    call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
                 "--apply-namespaces")  # fmt: skip

    assert capsys.readouterr().out == (
        "Cell eu-1 updated: only the options given changed (default).\n"
        "… 2 of 5 instances\n"
        "… 4 of 5 instances\n"
        "Guard rails applied again in the namespaces of 0 instances of the cell (5 left to "
        "their create or delete).\n"
    )


def test_guard_rails_the_cluster_does_not_take_are_said_per_instance_and_the_rest_go_on(
    cell, plan, owner, tenant, faults
):
    made = [_create(owner, tenant, plan, name) for name in ("orders", "billing")]
    for create in made:
        runner._step(str(create.pk))
    faults(error_500=1.0)

    done = services.cell_namespaces_apply(cell)

    assert (done.applied, done.left) == (0, 0)
    assert sorted(instance_id for instance_id, _ in done.failed) == sorted(
        c.instance_id for c in made
    )
    assert {why for _, why in done.failed} == {"Internal error occurred: sandbox fault injection"}
    faults(error_500=0)
    assert services.cell_namespaces_apply(cell).applied == 2


def _unanswered(
    relay, owner, tenant, count: int, *, refused=None, said=UNAVAILABLE, status=503
) -> list[str]:
    """`count` instances, created, with no namespace yet; the cluster answers the read of
    the namespace of each (or of those `refused` picks out of them) with `status` and `said`
    (a body, or a body for a path), by default a 503 as an API server short of capacity
    does."""
    plan = services.plan_load(text=SPEC.read_text()).plan
    names = ("orders", "billing", "ledger", "search", "events")[:count]
    made = [str(_create(owner, tenant, plan, name).instance_id) for name in names]
    picked = made if refused is None else refused(made)
    relay.garble(
        rf"/api/v1/namespaces/({'|'.join(picked)})$", said, status=status,
        times=len(picked), before=True,
    )  # fmt: skip
    return made


def _forbidden(path: str) -> bytes:
    """What an API server answers a read of the namespace at `path` that the cell's
    credentials may no longer make (their role was taken away): words of its own for each."""
    namespace = path.rsplit("/", 1)[-1]
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
        "reason": "Forbidden", "details": {"name": namespace, "kind": "namespaces"},
        "message": f'namespaces "{namespace}" is forbidden: User "system:serviceaccount:'
        f'opsdeck:opsdeck" cannot get resource "namespaces" in API group "" in the namespace '
        f'"{namespace}"',
    }).encode()  # fmt: skip


def test_a_pass_the_cluster_refuses_alike_instance_after_instance_stops_there(
    relayed_cell, owner, tenant, monkeypatch
):
    """A cluster that refuses instance after instance for the same reason (one that does not
    answer, refuses the credentials, or whose admission webhook is down) would refuse the rest:
    the pass stops rather than wait out each one's timeout (5,000 instances at 5 s each, 8 at a
    time: 50 minutes), and the cell stays behind for the next."""
    monkeypatch.setattr(services, "SAME_REFUSAL_STOPS", 3)
    relay, register = relayed_cell
    register()
    _unanswered(relay, owner, tenant, 5)
    cell = register(customer_sources=["198.51.100.0/24"])

    done = services.cell_namespaces_apply(cell, at_once=1)

    assert (done.total, done.passed, len(done.failed)) == (5, 3, 3)
    assert done.gave_up == UNAVAILABLE_SAID
    cell = Cell.objects.get(name="eu-1")
    assert cell.guard_rails_behind and cell.guard_rails_pass_until is None


def test_a_pass_stops_on_refusals_for_the_same_reason_in_words_of_their_own(
    relayed_cell, owner, tenant, monkeypatch
):
    """The cell's credentials lost their role: each refusal names its own namespace."""
    monkeypatch.setattr(services, "SAME_REFUSAL_STOPS", 3)
    relay, register = relayed_cell
    register()
    made = _unanswered(relay, owner, tenant, 5, said=_forbidden, status=403)
    cell = register(customer_sources=["198.51.100.0/24"])

    done = services.cell_namespaces_apply(cell, at_once=1)

    assert (done.passed, len({why for _, why in done.failed})) == (3, 3)
    assert done.gave_up == done.failed[-1][1]
    assert f'cannot get resource "namespaces" in API group "" in the namespace "{made[2]}"' in (
        done.gave_up
    )


def test_refusals_with_instances_taken_between_them_do_not_stop_a_pass(
    relayed_cell, owner, tenant, monkeypatch
):
    monkeypatch.setattr(services, "SAME_REFUSAL_STOPS", 2)
    relay, register = relayed_cell
    cell = register()
    made = _unanswered(relay, owner, tenant, 4, refused=lambda made: made[::2])

    done = services.cell_namespaces_apply(cell, at_once=1)

    assert (done.passed, done.left, done.gave_up) == (4, 2, "")
    assert [instance_id for instance_id, _ in done.failed] == made[::2]


def test_add_cell_says_it_stopped_once_the_cluster_refused_instance_after_instance_alike(
    relayed_cell, owner, tenant, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(services, "SAME_REFUSAL_STOPS", 3)
    relay, register = relayed_cell
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(register.keywords["kubeconfig"])  # the sandbox through the relay
    register()
    _unanswered(relay, owner, tenant, 5)

    with pytest.raises(CommandError) as stopped:
        call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
                     "--apply-namespaces", "--at-once", "1")  # fmt: skip

    assert str(stopped.value) == (
        "Stopped with 2 instances of the cell left: the cluster refused the last 3 alike "
        f"({UNAVAILABLE_SAID}). Run add_cell for the cell again once it takes them; the cell "
        "watcher (watch_cells) also tries again, less and less often."
    )
    assert capsys.readouterr().err.count(UNAVAILABLE_SAID) == 3  # each said as it came


def test_the_cell_watcher_says_when_its_pass_stopped_on_refusals_alike(
    relayed_cell, owner, tenant, monkeypatch, catching_up, caplog
):
    monkeypatch.setattr(services, "SAME_REFUSAL_STOPS", 3)
    relay, register = relayed_cell
    register()
    _unanswered(relay, owner, tenant, 5)
    cell = register(customer_sources=["198.51.100.0/24"])

    catching_up(cell)

    said = (
        "the cluster refused the guard rails of the last 3 instances of cell eu-1 alike "
        f"({UNAVAILABLE_SAID}), so the pass stopped with 2 left; trying again in"
    )
    wait_for(lambda: _logged(caplog, said), timeout=30, what="the watcher's log line")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("10.1.2.3/8", "has an address inside its range, not the range's first: did you mean "
                       "10.0.0.0/8?"),
        ("office-network", "is not an address range: give it in CIDR form, such as "
                           "203.0.113.0/24 or 2001:db8::/32."),
        ("10.0.0.0/33", "is not an address range: give it in CIDR form, such as "
                        "203.0.113.0/24 or 2001:db8::/32."),
    ],
)  # fmt: skip
def test_add_cell_refuses_a_customer_source_that_is_not_an_address_range_changing_nothing(
    transactional_db, cell_files, given, said
):
    kubeconfig, _ = cell_files
    call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
                 "--customer-sources", "203.0.113.0/24")  # fmt: skip

    with pytest.raises(CommandError) as refused:
        call_command(
            "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig), "--region",
            "eu-west-1", "--customer-sources", f"192.0.2.0/24,{given}",
        )  # fmt: skip

    assert str(refused.value) == f"The customer source “{given}” {said}"
    cell = Cell.objects.get(name="eu-1")
    assert (cell.customer_sources, cell.region) == (["203.0.113.0/24"], "")


def test_add_cell_refuses_no_instance_at_once_changing_nothing(transactional_db, cell_files):
    kubeconfig, _ = cell_files

    with pytest.raises(CommandError) as refused:
        call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
                     "--at-once", "0")  # fmt: skip

    assert str(refused.value) == "--at-once must be at least 1."
    assert not Cell.objects.exists()


def test_add_cell_refuses_a_cell_without_the_backup_destination_a_plan_reads(
    transactional_db, cell_files, capsys
):
    kubeconfig, credentials = cell_files
    # Its Cluster's destinationPath is $sys.backup.destinationPath: empty on such a cell.
    services.plan_load(text=SPEC.read_text())
    register = ["add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig)]

    with pytest.raises(CommandError) as refused:
        call_command(*register, "--backup-credentials", str(credentials))
    assert str(refused.value) == (
        "The cell has no backup destination, which plan postgres-cnpg reads "
        "($sys.backup.destinationPath): give --backup-destination."
    )
    assert not Cell.objects.exists()

    call_command(
        *register, "--backup-credentials", str(credentials), "--backup-destination", "s3://b/p"
    )
    assert "Cell eu-1 registered (default)." in capsys.readouterr().out


def test_add_cell_needs_no_backup_destination_where_no_plan_reads_one(
    transactional_db, cell_files, capsys
):
    kubeconfig, _ = cell_files
    services.plan_load(text=SPEC.with_name("valkey.yaml").read_text())

    call_command("add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig))

    assert "Cell eu-1 registered (default)." in capsys.readouterr().out


def test_load_specs_refuses_a_plan_a_registered_cell_cannot_run_saying_which_lacks_what(
    cell, cell_files, tmp_path, capsys
):
    kubeconfig, _ = cell_files
    # Registered with no backup destination while no plan needed one.
    call_command("add_cell", "--name", "bare", "--kubeconfig", str(kubeconfig))
    spec = tmp_path / "widgets.yaml"
    spec.write_text(widget_plan())
    capsys.readouterr()

    with pytest.raises(CommandError, match="some specs were not loaded"):
        call_command("load_specs", str(spec))

    assert capsys.readouterr().err.splitlines() == [
        f"{spec}: Cell bare does not serve Cluster, Backup: install the Widget operator first.",
        f"{spec}: Cell bare has no backup destination, which this plan reads "
        "($sys.backup.destinationPath): give add_cell --name bare --backup-destination.",
        f"{spec}: Cell bare has no backup credentials, which this plan reads "
        "($sys.backup.credentialsSecret): give add_cell --name bare --backup-credentials.",
        f"{spec}: Cell sandbox does not serve Cluster, Backup: install the Widget operator first.",
    ]
    assert not Plan.objects.filter(key="widgets").exists()
    # Offered on cells of its own, which are not registered yet, it is loaded.
    spec.write_text(widget_plan(cells=["widget-cell"]))
    call_command("load_specs", str(spec))
    assert capsys.readouterr().out == f"{spec}: plan widgets created\n"


def test_load_specs_checks_a_new_version_against_the_cells_it_opens_to(
    transactional_db, cell_files, tmp_path, capsys
):
    kubeconfig, _ = cell_files
    spec = tmp_path / "pg.yaml"
    spec.write_text(
        SPEC.read_text().replace("  entitlements:\n", "  entitlements:\n    cells: [eu-1]\n", 1)
    )
    call_command("load_specs", str(spec))
    call_command("add_cell", "--name", "bare", "--kubeconfig", str(kubeconfig))  # not eu-1
    spec.write_text(SPEC.read_text())  # version 2 runs on every cell
    capsys.readouterr()

    with pytest.raises(CommandError, match="some specs were not loaded"):
        call_command("load_specs", str(spec))

    err = capsys.readouterr().err
    assert f"{spec}: Cell bare has no backup destination, which this plan reads " in err
    assert list(PlanVersion.objects.values_list("number", flat=True)) == [1]


def test_a_cell_an_override_offers_a_plan_on_is_checked_for_it(
    transactional_db, cell_files, tmp_path
):
    from billing.models import PlanOverride

    kubeconfig, credentials = cell_files
    register = [
        "add_cell", "--name", "eu-1", "--kubeconfig", str(kubeconfig),
        "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
    ]  # fmt: skip
    call_command(*register)
    services.plan_load(text=widget_plan(cells=["widget-cell"]))
    # Staff offer the plan on eu-1 too, to one organization.
    PlanOverride.objects.create(
        tenant=Tenant.objects.create(name="Acme", slug="acme"),
        plan=Plan.objects.get(key="widgets"),
        limits={"cells": ["widget-cell", "eu-1"]},
    )

    with pytest.raises(ValidationError) as refused:
        services.plan_load(text=widget_plan(cells=["widget-cell"]) + "# version 2\n")
    with pytest.raises(CommandError, match="install the Widget operator first"):
        call_command(*register)  # registered again, say with another kubeconfig

    assert refused.value.messages == [
        "Cell eu-1 does not serve Cluster, Backup: install the Widget operator first."
    ]


def test_a_version_leaving_out_a_cell_the_plans_instances_run_in_is_loaded_with_a_warning(
    db, tenant
):
    first = services.plan_load(text=widget_plan()).version
    factories.make_instances(tenant, first, factories.cell("eu-1"), 2)

    loaded = services.plan_load(text=widget_plan(cells=["widget-cell"]))

    assert loaded.version.number == 2
    assert (
        "instances of this plan run in cell eu-1, which it leaves out: they stay on the version "
        "they run, and cannot upgrade to this one."
    ) in loaded.warnings


def test_load_specs_loads_a_plan_a_cell_that_does_not_answer_was_not_checked_for(
    transactional_db, cell_files, tmp_path, capsys
):
    import yaml

    from sandbox.api import Sandbox

    _, credentials = cell_files
    kubeconfig = tmp_path / "down.yaml"
    with Sandbox() as cluster:  # registered while it answered
        kubeconfig.write_text(yaml.safe_dump(cluster.kubeconfig()))
        call_command(
            "add_cell", "--name", "down", "--kubeconfig", str(kubeconfig),
            "--backup-destination", "s3://b/p", "--backup-credentials", str(credentials),
        )  # fmt: skip
    capsys.readouterr()

    call_command("load_specs", str(SPEC))  # down (or not started yet) now
    call_command("load_specs", str(SPEC))  # unchanged: checked when it was released

    assert capsys.readouterr().out.splitlines() == [
        f"{SPEC}: plan postgres-cnpg created",
        "  warning: cell down was not checked (the cluster could not be reached (connection "
        "refused)): creates of this plan there fail unless it serves the kinds the plan writes.",
        f"{SPEC}: plan postgres-cnpg unchanged (version 1)",
    ]


def test_add_cell_refuses_a_cluster_that_does_not_answer(transactional_db, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )

    with pytest.raises(
        CommandError, match=r"The cluster could not be reached \(connection refused\)"
    ):
        call_command("add_cell", "--name", "nowhere", "--kubeconfig", str(kubeconfig))

    assert not Cell.objects.exists()


def test_spec_test_can_describe_a_registered_cell(cell, capsys):
    Cell.objects.filter(pk=cell.pk).update(
        region="eu-central-1", labels={"publicSubnetIDs": ["subnet-eu-" + uuid.uuid4().hex[:4]]}
    )

    call_command("spec_test", str(SPEC), "--cell", "sandbox", "--speed", "200")

    assert "14 passed, 0 failed" in capsys.readouterr().out
    with pytest.raises(CommandError, match="No cell is registered as 'nope'"):
        call_command("spec_test", str(SPEC), "--cell", "nope")


def test_new_prices_wait_for_the_next_month_once_an_instance_runs_on_the_plan(tenant):
    """Before its first hour is metered, no usage is recorded: the running instance's hour
    under way is billed at the prices it was created under, not at a price loaded meanwhile."""
    version = factories.postgres_version()
    factories.make_instances(tenant, version, factories.cell(), 1)
    changed = SPEC.read_text().replace('price: "0.035"', 'price: "0.07"')
    assert changed != SPEC.read_text()

    services.plan_load(text=changed)

    cpu = PastPrice.objects.get(plan=version.plan, dimension="cpu")
    assert cpu.unit_price == Decimal("0.035") and cpu.until > timezone.now()  # till next month
    assert Price.objects.get(plan=version.plan, dimension="cpu").unit_price == Decimal("0.07")
