"""The Servers and Events tabs read a running instance's pods, volume claims and Kubernetes
events from its cell when shown, and refresh themselves (the sandbox cluster, a real worker)."""

import re
import time
import uuid

import pytest
import yaml

from accounts import services as accounts_services
from accounts.audit import Actor
from deployments import services, views
from deployments.models import Cell, Instance, Operation
from sandbox.core import Ctx
from tests.deployments import factories
from tests.deployments.conftest import wait_done
from tests.deployments.factories import BACKUPS


def test_a_running_instances_servers_claims_and_events_are_shown_to_its_members(
    worker, cell, plan, tenant, owner, client, add_member
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="live-create",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    instance_id = create.instance_id
    client.force_login(add_member("viewer@example.com", "viewer"))  # reading needs no more
    url = f"/t/{tenant.slug}/deployments/{instance_id}/"

    page = client.get(url, {"tab": "servers"}).content.decode()

    # Both servers, with the role the plan's role label gives them, ready, and their claims.
    assert f"<code>{instance_id}-1</code>" in page and f"<code>{instance_id}-2</code>" in page
    assert "Primary" in page and "Replica" in page
    assert page.count('<span class="badge badge-ok">Running</span>') == 2
    assert 'id="instance-claims"' in page and '<span class="badge badge-ok">Bound</span>' in page
    # It refreshes itself: a poll answers only the live part.
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "instance-live"}
    poll = client.get(url, {"tab": "servers"}, **htmx)
    text = poll.content.decode().strip()
    assert text.startswith('<div id="instance-live"') and "<nav" not in text
    assert 'hx-trigger="every 5s' in text and f"{instance_id}-2" in text

    events = client.get(url, {"tab": "events"}).content.decode()
    assert "ClusterPrimaryReady" in events and f"Cluster/{instance_id}" in events

    # Logs: the first server's, its plan's container; a filter keeps the lines containing it.
    logs = client.get(url, {"tab": "logs"}).content.decode()
    assert f'<option value="{instance_id}-1" selected>' in logs
    assert "database system is ready to accept connections" in logs
    replica = client.get(url, {"tab": "logs", "server": f"{instance_id}-2", "q": "STREAMING"})
    replica = replica.content.decode()
    assert f'<option value="{instance_id}-2" selected>' in replica
    assert "streaming" in replica and "ready to accept connections" not in replica
    # Follow polls the lines every 2 s, until the period ends (it never grows past one).
    following = client.get(url, {"tab": "logs", "follow": "start"}).content.decode()
    assert 'hx-trigger="every 2s' in following
    # ... and the lines: with no operation pending, the header only watches, slower.
    assert re.search(r'id="instance-head"[^>]*hx-trigger="every 15s"', following)
    poll = client.get(url, {"tab": "logs", "follow": str(10**12)}, **htmx).content.decode()
    assert poll.strip().startswith('<div id="instance-live"') and "every 2s" in poll
    assert f"follow={int(time.time()) + views.FOLLOW_FOR + 5}" not in poll
    ended = client.get(url, {"tab": "logs", "follow": str(int(time.time()) - 1)}, **htmx)
    assert "every 2s" not in ended.content.decode()
    assert "Following stopped after 5 minutes" in ended.content.decode()


@pytest.fixture
def running(worker, cell, plan, tenant, owner):
    """A running instance of two servers, `<id>-1` (the primary) and `<id>-2`."""
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="live-running",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def _log_write(sandbox_cluster, instance, server: str, *lines: str) -> None:
    """Lines the server's postgres container writes to its log."""
    core = sandbox_cluster.core
    pod = core.get(core.builtin("pods"), instance.namespace, server)
    core.logs.write(instance.namespace, server, pod["metadata"]["uid"], "postgres", *lines)


def test_the_last_lines_of_a_log_of_long_lines_end_with_the_newest(
    running, sandbox_cluster, owner_client
):
    # 2,000 lines of ~400 bytes (JSON logs, say) are more than one read keeps (LOG_BYTES).
    server = f"{running.pk}-1"
    _log_write(sandbox_cluster, running, server, *(f"old {n} {'x' * 400}" for n in range(2000)))
    _log_write(sandbox_cluster, running, server, "the newest line")
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"

    page = owner_client.get(url, {"tab": "logs", "server": server, "tail": "2000"})

    text = page.content.decode()
    assert page.status_code == 200
    assert "the newest line" in text and "old 1999 " in text
    # The oldest are dropped, whole: no line is shown without its time, cut at its start.
    assert not re.search(r'<span class="log-time">(\d+ \w+ )?</span>', text)


def test_the_log_says_its_times_are_utc_and_the_day_of_its_first_line(
    running, sandbox_cluster, owner_client
):
    """Each line began with a bare "05:03:07": no zone, and no day, though a quiet server's
    last lines may span days."""
    from django.utils import timezone

    server = f"{running.pk}-1"
    written = timezone.now()
    _log_write(sandbox_cluster, running, server, "first", "second")
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"

    text = owner_client.get(url, {"tab": "logs", "server": server}).content.decode()

    assert "Times are UTC." in text
    days = re.findall(r'<span class="log-time">(\d+ \w+ )?\d\d:\d\d:\d\d</span>', text)
    # The day once, on the first line, and again only where it changes.
    assert days[0] in {f"{when:%-d %b} " for when in (written, timezone.now())}, days
    assert not any(days[1:]), days


def test_lines_written_as_json_are_shown_as_their_level_and_message(
    running, sandbox_cluster, owner_client
):
    """The plan says where its JSON lines hold their level and message
    (`x-opsdeck.servers.logs`): each was shown as the object written, a few words of
    message inside hundreds of characters of fields."""
    import json

    server = f"{running.pk}-1"
    record = {"error_severity": "FATAL", "message": 'password authentication failed for user "app"'}
    written = [
        json.dumps({"level": "info", "logger": "postgres", "msg": "record", "record": record}),
        json.dumps({"level": "info", "logger": "setup", "msg": "Starting the instance manager"}),
        json.dumps({"level": "debug", "logger": "x"}),  # no message where the plan looks
        "not an object at all",
    ]
    _log_write(sandbox_cluster, running, server, *written)
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"

    shown = owner_client.get(url, {"tab": "logs", "server": server}).content.decode()
    found = owner_client.get(url, {"tab": "logs", "server": server, "q": "fatal"}).content.decode()
    as_written = {"tab": "logs", "server": server, "format": "raw"}
    raw = owner_client.get(url, as_written).content.decode()
    following = owner_client.get(url, {**as_written, "follow": "start"}).content.decode()

    lines = re.sub(r'<span class="log-time">[^<]*</span> ', "", shown)
    assert (
        '<span class="log-level">FATAL</span> password authentication failed for user '
        "&quot;app&quot;"
    ) in lines
    assert '<span class="log-level">info</span> Starting the instance manager' in lines
    assert "{&quot;level&quot;: &quot;debug&quot;, &quot;logger&quot;: &quot;x&quot;}" in lines
    assert "not an object at all" in lines
    assert "&quot;error_severity&quot;" not in lines  # the object is not shown
    assert 'name="format" value="raw"' in shown  # "As written" is offered
    # The filter looks in what is shown: the level too.
    assert "password authentication failed" in found and "Starting the" not in found
    # As written: each line as the container wrote it, and the follow keeps it so.
    assert "&quot;error_severity&quot;: &quot;FATAL&quot;" in raw
    assert 'class="log-level"' not in raw
    assert "&amp;format=raw&amp;follow=" in following


GONE = {
    "apiVersion": "v1", "kind": "Config", "current-context": "gone",
    "clusters": [{"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}],
    "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
}  # fmt: skip


# A cell that does not answer; then configurations that cannot be used: invalid YAML, not a
# mapping, or empty (in-cluster, but Opsdeck does not run in a cluster).
@pytest.mark.parametrize("kubeconfig", [yaml.safe_dump(GONE), "not: [valid", "- a list", ""])
def test_a_cell_that_cannot_be_read_is_said_not_raised(db, tenant, owner_client, kubeconfig):
    cell = Cell.objects.create(name="gone", region="nowhere", kubeconfig=kubeconfig, **BACKUPS)
    version = factories.postgres_version()
    [instance] = factories.make_instances(tenant, version, cell, 1, name="orders")
    url = f"/t/{tenant.slug}/deployments/{instance.pk}/"

    for tab in ("servers", "events", "logs"):
        response = owner_client.get(url, {"tab": tab})
        assert response.status_code == 200, tab
        assert "The cluster could not be read" in response.content.decode(), tab


def test_a_deleted_instances_live_tabs_neither_read_its_cell_nor_poll(db, tenant, owner_client):
    # Its cell out of reach: any read would say "The cluster could not be read".
    cell = Cell.objects.create(
        name="gone", region="nowhere", kubeconfig=yaml.safe_dump(GONE), **BACKUPS
    )
    version = factories.postgres_version()
    [instance] = factories.make_instances(tenant, version, cell, 1, name="orders", state="deleted")
    url = f"/t/{tenant.slug}/deployments/{instance.pk}/"
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "instance-live"}

    pages = {tab: owner_client.get(url, {"tab": tab}).content.decode() for tab in views.LIVE_TABS}
    follow = {"tab": "logs", "server": f"{instance.pk}-1", "follow": str(int(time.time()) + 60)}
    poll = owner_client.get(url, follow, **htmx).content.decode()

    for tab, page in [*pages.items(), ("logs poll", poll)]:
        assert "The cluster could not be read" not in page, tab
        assert "every 5s" not in page and "every 2s" not in page, tab
    assert "No servers run now: the instance is deleted." in pages["servers"]
    assert "No events: they went with the instance's objects." in pages["events"]
    assert "there is no log to read: the instance is deleted." in pages["logs"]
    assert f"{instance.pk}-1 no longer runs." in poll


def test_another_tenants_instance_tabs_are_a_404(db, tenant, owner_client, make_user):
    stranger = make_user("stranger@example.com")
    other = accounts_services.tenant_create(actor=Actor(user=stranger), name="Globex")
    version = factories.postgres_version()
    [theirs] = factories.make_instances(other, version, factories.cell(), 1, name="their-db")

    for tab in ("servers", "events", "logs"):
        response = owner_client.get(
            f"/t/{tenant.slug}/deployments/{theirs.pk}/", {"tab": tab, "server": uuid.uuid4().hex}
        )
        assert response.status_code == 404, tab


def test_following_a_log_goes_on_after_a_poll_the_cluster_fails(running, owner_client, faults):
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "instance-live"}
    follow = {"tab": "logs", "server": f"{running.pk}-2", "tail": "500", "follow": "start"}
    first = owner_client.get(url, follow, **htmx).content.decode()
    until = re.search(r"follow=(\d+)", first).group(1)

    faults(error_503=1.0)  # a blip: the cluster answers one poll 503
    try:
        poll = owner_client.get(url, {**follow, "follow": until}, **htmx).content.decode()
    finally:
        faults(error_503=0)

    # The pane says so and still follows the same server's 500 lines, showing none it did not read.
    assert "The cluster could not be read" in poll
    assert 'hx-trigger="every 2s' in poll and f"Following {running.pk}-2:" in poll
    assert f"server={running.pk}-2&amp;" in poll and "tail=500&amp;" in poll
    assert f"follow={until}" in poll and "No log lines" not in poll
    again = owner_client.get(url, {**follow, "follow": until}, **htmx).content.decode()
    assert "The cluster could not be read" not in again and "streaming" in again


def test_events_of_one_second_are_listed_newest_first_too(running, sandbox_cluster, owner_client):
    # The cluster stamps events to the second: a switchover's three, written in this order.
    core, namespace = sandbox_cluster.core, running.namespace
    second = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    for n, reason in enumerate(["SwitchoverStarted", "Promoted", "SwitchoverDone"]):
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{running.pk}.switchover-{n}", "namespace": namespace},
            "involvedObject": {"kind": "Cluster", "name": running.pk, "namespace": namespace},
            "reason": reason, "message": reason, "type": "Normal", "count": 1,
            "firstTimestamp": second, "lastTimestamp": second,
        }  # fmt: skip
        core.create(core.builtin("events"), namespace, event, Ctx())
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"

    page = owner_client.get(url, {"tab": "events"}).content.decode()

    shown = re.findall(r'<span class="stack-label">Reason </span>([^<]*)</td>', page)
    assert shown[:3] == ["SwitchoverDone", "Promoted", "SwitchoverStarted"]


def test_a_chosen_server_that_is_gone_is_said_not_replaced_by_another(running, owner_client):
    # Followed, the replica goes (scaled down, say): the poll names a server no longer running.
    gone, primary = f"{running.pk}-9", f"{running.pk}-1"
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "instance-live"}

    poll = owner_client.get(url, {"tab": "logs", "server": gone, "follow": "start"}, **htmx)
    page = owner_client.get(url, {"tab": "logs", "server": gone}).content.decode()

    poll = poll.content.decode()
    assert f"{gone} no longer runs: its lines appear here if it starts again." in poll
    assert 'hx-trigger="every 2s' in poll and f"server={gone}&amp;" in poll
    assert "ready to accept connections" not in poll and f"Following {primary}" not in poll
    assert f'<option value="{gone}" selected>{gone} (gone)</option>' in page
    assert f"{gone} no longer runs: choose another server." in page
    assert "ready to accept connections" not in page
