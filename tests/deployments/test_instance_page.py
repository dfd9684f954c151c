"""The instance page: its tabs, its actions, and who may see and do what."""

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import selectors, services
from deployments.models import (
    Cell,
    Instance,
    InstanceStateChange,
    Operation,
    PlatformSecret,
    Snapshot,
    TaskRun,
)
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS

SECRET = "s3cret-Pa55word-xyz"


@pytest.fixture
def plan(db):
    return services.plan_load(text=SPEC.read_text()).plan


@pytest.fixture
def local_cell(db):
    return Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)


def _create(user, tenant, plan, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=user), tenant=tenant, plan=plan, name=name,
        parameters=parameters, request_id=uuid.uuid4().hex,
    )  # fmt: skip


@pytest.fixture
def instance(owner, tenant, plan, local_cell):
    """A running instance whose create succeeded (with task runs), with a completed backup."""
    create = _create(owner, tenant, plan, password=SECRET, instances="2")
    now = timezone.now()
    Operation.objects.filter(pk=create.pk).update(
        state=Operation.State.SUCCEEDED,
        started_at=now - timedelta(seconds=95),
        finished_at=now - timedelta(seconds=5),
    )
    TaskRun.objects.create(
        operation=create, node="main.cluster", attempt=1, state="Failed",
        message="Cluster not ready: waiting for the primary",
        started_at=now - timedelta(seconds=90), finished_at=now - timedelta(seconds=60),
    )  # fmt: skip
    TaskRun.objects.create(
        operation=create, node="main.cluster", attempt=2, state="Succeeded",
        message="Cluster in healthy state", started_at=now - timedelta(seconds=50),
        finished_at=now - timedelta(seconds=5),
    )  # fmt: skip
    instance = create.instance
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING, outputs={"primary": f"{instance.pk}-1"}
    )
    Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-20261130080000",
        status=Snapshot.Status.COMPLETED, parameters=instance.parameters,
        expires_at=now + timedelta(days=30),
    )  # fmt: skip
    instance.refresh_from_db()
    return instance


def _url(instance, suffix=""):
    return f"/t/{instance.tenant.slug}/deployments/{instance.pk}/{suffix}"


@pytest.mark.parametrize("tab", ["overview", "operations", "backups", "activity"])
def test_each_tab_renders_and_never_shows_a_password(owner_client, instance, tab):
    page = owner_client.get(_url(instance), {"tab": tab})

    assert page.status_code == 200
    html = page.content.decode()
    assert SECRET not in html
    assert instance.name in html and instance.pk in html
    assert "set, hidden" in html or tab != "overview"


def test_the_overview_shows_parameters_outputs_and_that_nothing_was_observed_yet(
    owner_client, instance
):
    html = owner_client.get(_url(instance)).content.decode()

    assert "Not observed yet." in html
    assert "Owner password" in html and "set, hidden" in html
    assert "<code>2</code>" in html  # two servers
    assert f"{instance.pk}-1" in html  # the primary output
    # ... as the last operation left them, which the live status beside them may contradict.
    assert 'id="outputs-when">As the last operation that finished left them' in html
    assert "eu-local" in html and "PostgreSQL" in html and "v1" in html
    assert "owner@example.com" in html


def test_the_overview_shows_the_operators_observed_status(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(
        observed={
            "phase": "Cluster in healthy state",
            "ready": 1,
            "total": 2,
            "primary": f"{instance.pk}-1",
            "conditions": [
                {"type": "Ready", "status": "False", "message": "A replica is catching up"}
            ],
        },
        observed_at=datetime(2026, 11, 30, 7, 0, tzinfo=UTC),
    )

    html = owner_client.get(_url(instance)).content.decode()

    assert "Not observed yet." not in html
    assert "Cluster in healthy state" in html
    assert "1 of 2" in html
    assert "A replica is catching up" in html
    assert 'datetime="2026-11-30T07:00:00+00:00"' in html


def test_a_status_asking_for_no_server_says_so(owner_client, instance):
    # A stopped instance: its status object says 0 servers and no ready count (omitted empty).
    Instance.objects.filter(pk=instance.pk).update(
        observed={"phase": "Cluster in healthy state", "total": 0}, observed_at=timezone.now()
    )

    html = owner_client.get(_url(instance)).content.decode()

    assert '<dd id="ready-servers">None: it asks for no server</dd>' in html


def test_ready_servers_without_a_total_say_no_question_mark(owner_client, instance):
    # A create that failed before the operator counted its servers.
    Instance.objects.filter(pk=instance.pk).update(
        observed={"phase": "Setting up primary"}, observed_at=timezone.now()
    )

    html = owner_client.get(_url(instance)).content.decode()

    assert '<dd id="ready-servers">0</dd>' in html and "of ?" not in html


def test_a_stopped_instance_says_what_the_operators_healthy_status_means(owner_client, instance):
    # As CloudNativePG reports a hibernated cluster: its healthy phase, Ready, no server.
    ready = {"type": "Ready", "status": "True", "message": "Cluster is Ready"}
    observed = {"phase": "Cluster in healthy state", "total": 0, "conditions": [ready]}
    Instance.objects.filter(pk=instance.pk).update(observed=observed, observed_at=timezone.now())
    running = owner_client.get(_url(instance)).content.decode()
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)

    html = owner_client.get(_url(instance)).content.decode()

    note = "None of its servers runs while the instance is stopped."
    assert note in html and note not in running
    assert "Cluster in healthy state" in html  # what the operator says, explained, not hidden


def test_a_deleted_instance_shows_no_status_from_before_it_was_deleted(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.DELETED,
        observed={"phase": "Cluster in healthy state", "ready": 5, "total": 5,
                  "conditions": [{"type": "Ready", "status": "True", "message": "Ready"}]},
        observed_at=timezone.now(),
    )  # fmt: skip

    html = owner_client.get(_url(instance)).content.decode()

    assert "None: its objects are deleted." in html
    assert "Cluster in healthy state" not in html and "5 of 5" not in html


def test_a_deleted_instance_offers_no_action_and_shows_no_outputs_from_before(
    owner_client, instance
):
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.DELETED, outputs={"host": f"{instance.pk}-rw"}
    )

    html = owner_client.get(_url(instance)).content.decode()

    assert 'id="instance-deleted">Deleted: none of its servers runs' in html
    assert 'id="instance-actions"' not in html and "Why some actions are unavailable" not in html
    assert f"{instance.pk}-rw" not in html
    assert "None: what it reported went with its objects." in html
    assert "The values it ran with before it was deleted." in html


def test_the_overview_shows_only_what_the_plans_status_object_reports(
    owner, owner_client, tenant, local_cell
):
    """Valkey's StatefulSet reports ready and total servers, no phase, no primary."""
    valkey = services.plan_load(text=(SPEC.parent / "valkey.yaml").read_text()).plan
    instance = Instance.objects.get(pk=_create(owner, tenant, valkey, name="cache").instance_id)
    Instance.objects.filter(pk=instance.pk).update(
        observed={"ready": 2, "total": 2}, observed_at=timezone.now()
    )

    html = owner_client.get(_url(instance)).content.decode()

    assert "2 of 2" in html
    assert "<dt>Phase</dt>" not in html and "<dt>Primary</dt>" not in html
    # Stopped, its StatefulSet asks for no server.
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.STOPPED, observed={"ready": 0, "total": 0}
    )
    stopped = owner_client.get(_url(instance)).content.decode()
    assert '<dd id="ready-servers">None: it asks for no server</dd>' in stopped
    assert "The cluster may still report the phase and conditions they had before." in stopped


def test_the_backups_tab_of_a_plan_without_backups_says_so_and_offers_no_schedule(
    owner, owner_client, tenant, local_cell
):
    """Valkey's plan has no backup verb: a schedule saved there was always refused."""
    valkey = services.plan_load(text=(SPEC.parent / "valkey.yaml").read_text()).plan
    instance = Instance.objects.get(pk=_create(owner, tenant, valkey, name="cache").instance_id)

    html = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    assert f"The {valkey.name} plan takes no backups of its instances." in html
    assert 'id="backup-schedule"' not in html and "Back up now" not in html
    assert "Each one can be restored" not in html


def test_the_instance_page_is_not_kept_by_the_browsers_back_forward_cache(owner_client, instance):
    # A page restored from that cache after a delete would show the instance running.
    page = owner_client.get(_url(instance))

    assert "no-store" in page["Cache-Control"]


def test_a_queued_operation_says_it_starts_in_a_moment(owner, owner_client, instance):
    services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="restart", request_id="r-1"
    )

    html = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()

    assert "Queued: it starts in a moment, once any operation queued before it has run." in html


def test_the_operations_tab_lists_task_runs_with_their_messages_and_attempts(
    owner_client, instance
):
    html = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()

    assert "Create" in html and "Succeeded" in html
    assert "Cluster not ready: waiting for the primary" in html
    assert "Attempt </span>2</td>" in html  # the second attempt
    assert "took 1\xa0min 30\xa0s" in html  # each number held to its unit on a narrow line
    assert 'hx-trigger="every 2s' not in html  # nothing pending: no polling


def test_a_task_runs_start_says_its_day_and_zone_as_the_pages_other_times_do(
    owner_client, instance
):
    # A bare "05:03:07" said neither the day (the run was two days ago) nor the zone (read in
    # New York as 05:03 there).
    started = timezone.now().replace(microsecond=0) - timedelta(days=2)
    TaskRun.objects.filter(operation__instance=instance).update(
        started_at=started, finished_at=started + timedelta(minutes=2)
    )

    html = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()

    cell = html.split('<span class="stack-label">Started </span>', 1)[1].split("</td>", 1)[0]
    assert f'title="{started:%-d %b %Y %H:%M:%S} UTC">2\xa0days ago</time>' in cell, cell


def test_a_failed_operation_says_what_went_wrong(owner_client, instance):
    Operation.objects.filter(instance=instance).update(
        state=Operation.State.FAILED, error='Cluster "x" is invalid: spec.instances must be >= 1'
    )

    html = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()

    assert "What went wrong:" in html
    assert "spec.instances must be &gt;= 1" in html


def test_a_pending_operation_makes_the_timeline_poll_until_it_ends(owner_client, instance):
    url = _url(instance)
    owner_client.post(f"{url}actions/restart/", {"request_id": "poll-1"})

    html = owner_client.get(url, {"tab": "operations"}).content.decode()
    assert 'hx-trigger="every 2s' in html

    polled = owner_client.get(
        url, {"tab": "operations"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-operations"
    ).content.decode()
    assert polled.lstrip().startswith('<div id="instance-operations" hx-get=')
    assert "<html" not in polled and 'id="instance-head"' not in polled  # it follows itself

    Operation.objects.filter(verb="restart").update(state=Operation.State.SUCCEEDED)
    done = owner_client.get(
        url, {"tab": "operations"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-operations"
    ).content.decode()
    assert 'hx-trigger="every 2s' not in done


def test_the_timeline_poll_gets_nothing_to_swap_while_nothing_it_shows_changed(
    owner_client, instance
):
    """Each poll of the timeline replaced it, though nothing it showed had changed: the
    keyboard focus on a Cancel button went with it."""
    url = _url(instance)
    owner_client.post(f"{url}actions/restart/", {"request_id": "poll-2"})
    html = owner_client.get(url, {"tab": "operations"}).content.decode()
    again = re.search(r'<div id="instance-operations" hx-get="([^"]+)"', html).group(1)

    def poll():
        return owner_client.get(
            again.replace("&amp;", "&"),
            HTTP_HX_REQUEST="true",
            HTTP_HX_TARGET="instance-operations",
        )

    unchanged = poll()
    assert unchanged.status_code == 204 and not unchanged.content
    started = timezone.now() - timedelta(seconds=75)
    Operation.objects.filter(verb="restart").update(
        state=Operation.State.RUNNING, started_at=started
    )
    changed = poll().content.decode()
    assert "running for 1\N{NO-BREAK SPACE}min" in changed  # to the minute, so not at each poll


def test_the_header_follows_a_pending_operation_and_its_end_refreshes_the_page(
    owner_client, instance
):
    url = _url(instance)
    owner_client.post(f"{url}actions/stop/", {"request_id": "follow-1"})
    head = re.compile(r'<header[^>]*id="instance-head"[^>]*>')

    page = owner_client.get(url).content.decode()  # the overview, which does not poll itself
    assert 'hx-trigger="every 2s' in head.search(page).group(0)

    def poll(shown: str):
        return owner_client.get(
            url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head",
            HTTP_HX_CURRENT_URL=f"http://testserver{url}{shown}",
        )  # fmt: skip

    pending = poll("?tab=backups")
    html = pending.content.decode()
    assert html.lstrip().startswith("<header") and "every 2s" in head.search(html).group(0)
    assert 'id="instance-state">Running<' in html  # queued: it has not started yet
    assert 'id="instance-tab"' not in html and "HX-Retarget" not in pending
    # Polled again with what it shows unchanged: nothing to swap (what is open in it stays).
    again = head.search(html).group(0).split('hx-get="', 1)[1].split('"', 1)[0]
    unchanged = owner_client.get(
        again.replace("&amp;", "&"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head"
    )
    assert unchanged.status_code == 204 and not unchanged.content
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.UPDATING)
    changed = owner_client.get(
        again.replace("&amp;", "&"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head"
    )
    assert 'id="instance-state">Updating<' in changed.content.decode()

    Operation.objects.filter(verb="stop").update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)
    ended = poll("?tab=backups")
    html = ended.content.decode()
    # The whole page of the tab on screen: the header stops polling, the actions change.
    assert (ended["HX-Retarget"], ended["HX-Reswap"]) == ("#instance-page", "outerHTML")
    assert html.lstrip().startswith(
        '<title>Backups · orders · Opsdeck</title>\n<div id="instance-page">'
    )
    assert 'id="instance-state">Stopped<' in html
    assert 'hx-trigger="every 15s"' in head.search(html).group(0)  # it watches, slower
    assert f"{instance.pk}-20261130080000" in html  # the Backups tab, as it was shown


def test_an_open_page_of_a_running_instance_shows_it_degraded_without_a_reload(
    owner_client, instance
):
    """With no operation pending, the header did not poll: a page left open said Running and
    healthy while the cluster had taken its servers down, until someone reloaded it."""
    url = _url(instance)
    head = re.compile(r'<header[^>]*id="instance-head"[^>]*>')
    page = owner_client.get(url, {"tab": "servers"}).content.decode()
    watch = head.search(page).group(0)
    assert 'hx-trigger="every 15s"' in watch
    again = watch.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&")

    def poll():
        return owner_client.get(
            again, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head",
            HTTP_HX_CURRENT_URL=f"http://testserver{url}?tab=servers",
        )  # fmt: skip

    assert poll().status_code == 204  # nothing changed: nothing swapped
    Instance.objects.filter(pk=instance.pk).update(
        health=Instance.Health.DEGRADED, health_reason="0 of 3 servers ready"
    )
    changed = poll()

    html = changed.content.decode()
    assert (changed["HX-Retarget"], changed["HX-Reswap"]) == ("#instance-page", "outerHTML")
    assert 'id="instance-health"' in html and ">Degraded<" in html
    assert 'id="instance-live"' in html  # the Servers tab, as it was shown


def test_an_operations_end_is_said_in_the_live_region_the_page_keeps(owner_client, instance):
    """The header's poll swapped in the whole page when an operation ended, every live region
    with it: a screen reader said nothing of the end."""
    url = _url(instance)
    page = owner_client.get(url).content.decode()
    assert page.count('id="instance-news"') == 1  # empty, outside the part the swaps replace
    assert page.index('id="instance-news"') < page.index('<div id="instance-page">')
    owner_client.post(f"{url}actions/restart/", {"request_id": "news-1"})
    Operation.objects.filter(verb="restart").update(
        state=Operation.State.SUCCEEDED, finished_at=timezone.now()
    )

    ended = owner_client.get(
        url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head",
        HTTP_HX_CURRENT_URL=f"http://testserver{url}",
    )  # fmt: skip

    news = re.search(
        r'<div id="instance-news" hx-swap-oob="innerHTML">(.*?)</div>', ended.content.decode()
    ).group(1)
    assert re.sub(r"<[^>]+>", "", news) == f"Restart succeeded; {instance.name} is Running."


def test_the_refresh_when_an_operation_ends_keeps_the_tabs_choices(owner_client, instance):
    url = _url(instance)
    ended = owner_client.get(
        url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head",
        HTTP_HX_CURRENT_URL=f"http://testserver{url}?tab=metrics&window=7d",
    )  # fmt: skip

    html = ended.content.decode()
    assert html.lstrip().startswith(
        '<title>Metrics · orders · Opsdeck</title>\n<div id="instance-page">'
    )
    assert f'hx-get="{url}metrics/?window=7d"' in html  # the charts load for the window shown


def test_a_page_shows_an_operations_end_that_came_after_it_read_the_instance(
    instance, django_assert_num_queries
):
    read = Instance.objects.get(pk=instance.pk)  # the page's read, as the operation ends:
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.STOPPED, updated_at=timezone.now()
    )

    now, pending = selectors.instance_now(read)

    # Neither stale nor followed (nothing pending), it would have stayed Running.
    assert (now.state, pending) == (Instance.State.STOPPED, False)
    with django_assert_num_queries(1):  # unchanged since: one query, the same instance
        assert selectors.instance_now(now) == (now, False)


def test_a_poll_from_an_address_that_is_not_one_gets_the_overview(owner_client, instance):
    url = _url(instance)
    ended = owner_client.get(
        url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head",
        HTTP_HX_CURRENT_URL="http://[::1/?tab=backups",
    )  # fmt: skip

    assert ended.status_code == 200 and 'id="instance-parameters"' in ended.content.decode()


def test_htmx_tab_requests_get_only_the_tab(owner_client, instance):
    response = owner_client.get(
        _url(instance), {"tab": "backups"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-tab"
    )

    html = response.content.decode()
    # htmx sets the window's title from the part's (each tab has its own address).
    assert html.lstrip().startswith(
        '<title>Backups · orders · Opsdeck</title>\n<div id="instance-tab">'
    )
    assert "<html" not in html and 'id="instance-head"' not in html
    assert f"{instance.pk}-20261130080000" in html
    assert "HX-Request" in response["Vary"]


def test_the_operations_tab_reads_in_a_constant_number_of_queries(owner_client, instance):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    url = _url(instance)
    owner_client.get(url, {"tab": "operations"})  # the session's first request reads more
    with CaptureQueriesContext(connection) as few:
        owner_client.get(url, {"tab": "operations"})
    for n in range(5):
        op = Operation.objects.create(
            instance=instance, verb="restart", request_id=f"more-{n}",
            plan_version=instance.plan_version, state=Operation.State.SUCCEEDED,
        )  # fmt: skip
        TaskRun.objects.create(operation=op, node="restart", state="Succeeded")
    with CaptureQueriesContext(connection) as many:
        owner_client.get(url, {"tab": "operations"})

    assert len(many) == len(few)


def test_the_operations_tab_lists_fifty_operations_a_page_newest_first(owner_client, instance):
    # A year of hourly backups is some 17,000 operations: the tab, polled every 2 s while one
    # is pending, lists a page of them.
    Operation.objects.bulk_create(
        Operation(
            instance=instance, verb="backup", request_id=f"slot-{n}",
            plan_version=instance.plan_version, state=Operation.State.SUCCEEDED,
            created_at=timezone.now() + timedelta(minutes=n),
        )
        for n in range(60)
    )  # fmt: skip
    newest = Operation.objects.get(request_id="slot-59")
    url = _url(instance)

    first = owner_client.get(url, {"tab": "operations"}).content.decode()
    second = owner_client.get(url, {"tab": "operations", "page": "2"}).content.decode()
    unreadable = owner_client.get(url, {"tab": "operations", "page": "x"}).content.decode()

    assert first.count('class="timeline-item"') == 50
    assert re.search(r'id="operation-([^"]+)"', first).group(1) == str(newest.pk)
    assert "Page 1 of 2 · 61 operations" in first and "page=2" in first and "Newer" not in first
    assert second.count('class="timeline-item"') == 11 and "Newer" in second
    assert f'id="operation-{instance.operations.get(verb="create").pk}"' in second  # the oldest
    assert unreadable.count('class="timeline-item"') == 50
    # An operation still pending on an older page (the create, queued here) keeps it polled,
    # for that page: the poll does not bring the first page back over it.
    Operation.objects.filter(verb="create").update(state=Operation.State.QUEUED)
    second = owner_client.get(url, {"tab": "operations", "page": "2"}).content.decode()
    assert f'hx-get="{url}?tab=operations&amp;page=2&amp;shown=' in second


def test_the_page_reads_no_run_state_spec_text_or_cell_secret_however_many_operations_wait(
    owner_client, instance, monkeypatch
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from accounts import crypto

    decrypted = []
    real = crypto.decrypt
    monkeypatch.setattr(crypto, "decrypt", lambda token: decrypted.append(token) or real(token))
    url = _url(instance)

    def read() -> tuple[int, str]:
        decrypted.clear()
        with CaptureQueriesContext(connection) as queries:
            assert owner_client.get(url).status_code == 200  # with its modify dialog, prefilled
        return len(decrypted), " ".join(q["sql"] for q in queries.captured_queries)

    def queue(count: int) -> None:
        for _ in range(count):
            Operation.objects.create(
                instance=instance, verb="restart", request_id=uuid.uuid4().hex,
                plan_version=instance.plan_version, state=Operation.State.QUEUED,
                engine_state=json.dumps({"nodes": {"n": "x" * 20_000}}),
            )  # fmt: skip

    queue(1)
    one, sql = read()
    queue(19)
    twenty, _ = read()

    assert twenty == one  # the instance's own secret values, whatever waits
    for column in ["engine_state", "spec_text", "parsed", "kubeconfig", "backup_credentials"]:
        assert f'"{column}"' not in sql, column
    # Its Activity tab shows who acted as recorded, without reading their accounts.
    with CaptureQueriesContext(connection) as queries:
        assert owner_client.get(url, {"tab": "activity"}).status_code == 200
    read = [q["sql"] for q in queries.captured_queries if "accounts_auditevent" in q["sql"]]
    assert read and not [sql for sql in read if '"accounts_user"' in sql]


def test_the_operations_tab_reads_of_who_asked_their_address_and_nothing_it_does_not_show(
    owner_client, owner, instance
):
    Operation.objects.filter(instance=instance).update(
        parameters={"instances": 3, "big": "x" * 2000}, outputs={"endpoint": "y" * 2000}
    )

    with CaptureQueriesContext(connection) as queries:
        page = owner_client.get(_url(instance), {"tab": "operations"}).content.decode()

    assert f"by {owner.email}" in page
    heads = [q["sql"].split(" FROM ")[0] for q in queries.captured_queries]
    listed = [head for head in heads if '"deployments_operation"."verb"' in head]
    listed = [head for head in listed if '"accounts_user"' in head]  # with who asked
    assert listed
    for select in listed:
        # Who asked is shown by their address: their account (its password hash too) stays in
        # the database, as do the values each operation ran with, asked for and left.
        assert '"accounts_user"."password"' not in select
        for column in ["parameters", "requested", "outputs", "arguments", "waiting_on"]:
            assert f'"deployments_operation"."{column}"' not in select, column


def test_the_overview_reads_of_operations_only_what_it_says_of_them(owner_client, instance):
    """The Overview asks whether a run setting values stopped part-way: it read that run's
    whole row, with the values it ran with and left and its encrypted run state. (The modify
    dialog's values read what queued operations asked for: it shows them.)"""
    with CaptureQueriesContext(connection) as queries:
        assert owner_client.get(_url(instance)).status_code == 200

    heads = [q["sql"].split(" FROM ")[0] for q in queries.captured_queries]
    read = [head for head in heads if '"deployments_operation"."' in head]
    assert read
    for select in read:
        for column in ["parameters", "outputs", "waiting_on", "engine_state", "error"]:
            assert f'"deployments_operation"."{column}"' not in select, (column, select)


ACTIONS = [
    ("stop", {}),
    ("restart", {}),
    ("failover", {}),
    ("backup", {}),
    ("reloadConfiguration", {}),
    ("rotateCredentials", {"p-newPassword": "another-long-password-1"}),
]


@pytest.mark.parametrize(("verb", "fields"), ACTIONS)
def test_each_action_queues_its_operation_and_says_so(owner_client, instance, verb, fields):
    response = owner_client.post(
        _url(instance, f"actions/{verb}/"), {"request_id": f"r-{verb}", **fields}, follow=True
    )

    operation = Operation.objects.get(instance=instance, verb=verb)
    assert operation.state == Operation.State.QUEUED
    assert operation.request_id == f"r-{verb}"
    html = response.content.decode()
    assert f"/operations/{operation.pk}/" in html  # the message links to it
    assert "is <a href=" in html and "queued</a>." in html
    assert "another-long-password-1" not in html


def test_start_queues_on_a_stopped_instance(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)

    owner_client.post(_url(instance, "actions/start/"), {"request_id": "s-1"})

    assert Operation.objects.get(instance=instance, verb="start").state == "queued"


def test_a_repeated_post_with_the_same_request_id_queues_one_operation(owner_client, instance):
    for _ in range(3):
        response = owner_client.post(_url(instance, "actions/stop/"), {"request_id": "same-id"})
        assert response.status_code == 302

    assert Operation.objects.filter(instance=instance, verb="stop").count() == 1


def test_an_htmx_action_gets_the_refreshed_page_part_and_the_operations_address(
    owner_client, instance
):
    response = owner_client.post(
        _url(instance, "actions/restart/"), {"request_id": "hx-1"}, HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="instance-page",
    )  # fmt: skip

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(
        '<title>Operations · orders · Opsdeck</title>\n<div id="instance-page">'
    )
    assert '<div id="messages" hx-swap-oob="innerHTML">' in html
    assert "Restart of orders is" in html
    assert response["HX-Push-Url"] == _url(instance) + "?tab=operations"


def test_a_custom_action_with_a_bad_value_reopens_its_dialog_with_the_error(owner_client, instance):
    response = owner_client.post(
        _url(instance, "actions/rotateCredentials/"),
        {"request_id": "bad-1", "p-newPassword": "short"},
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert (
        'id="dialog-rotateCredentials" aria-labelledby="dialog-rotateCredentials-title" open'
        in html
    )
    # The builder's field, with the dialog's own ids, and the message beside it.
    assert (
        '<small class="field-error" id="dialog-rotateCredentials-p-newPassword_error">'
        "Must be between 12 and 100 characters long.</small>"
    ) in html
    field = r'<input type="password" name="p-newPassword"[^>]*id="dialog-rotateCredentials-p-'
    assert re.search(field, html)
    assert 'value="short"' not in html  # a password is never sent back
    assert not Operation.objects.filter(verb="rotateCredentials").exists()


def test_a_custom_action_queues_its_verb_with_the_values_of_its_form(owner_client, instance):
    page = owner_client.get(_url(instance)).content.decode()
    assert 'id="dialog-rotateCredentials-p-newPassword"' in page
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # the Modify dialog's and this one's never clash

    response = owner_client.post(
        _url(instance, "actions/rotateCredentials/"),
        {"request_id": "rot-1", "p-newPassword": "another-long-password-2"},
    )

    assert response.status_code == 302
    operation = Operation.objects.get(verb="rotateCredentials")
    assert operation.request_id == "rot-1"
    secret = json.loads(operation.requested_secret)
    assert secret["verb_parameters"]["newPassword"] == "another-long-password-2"


def test_a_custom_action_left_empty_gets_a_generated_password(owner_client, instance):
    owner_client.post(_url(instance, "actions/rotateCredentials/"), {"request_id": "rot-2"})

    secret = json.loads(Operation.objects.get(verb="rotateCredentials").requested_secret)
    assert len(secret["verb_parameters"]["newPassword"]) >= 12


def test_a_state_forbidden_action_is_disabled_with_its_reason(owner_client, instance):
    html = owner_client.get(_url(instance)).content.decode()

    assert 'disabled aria-describedby="why-start">Start</button>' in html
    assert "The instance is running; start needs it to be stopped." in html
    assert 'aria-describedby="why-stop"' not in html


def test_refusals_name_the_actions_as_the_page_does(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)
    html = owner_client.get(_url(instance)).content.decode()

    assert "The instance is stopped; switchover needs it to be running." in html
    assert "The instance is stopped; rotate owner password needs it to be running." in html
    assert "failover needs" not in html and "rotateCredentials needs" not in html
    refused = owner_client.post(
        _url(instance, "actions/rotateCredentials/"), {"request_id": "rc-1"}, follow=True
    )
    assert "rotate owner password needs it to be running" in refused.content.decode()

    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)
    refused = owner_client.post(
        _url(instance, "actions/restart/"), {"request_id": "r-1"}, follow=True
    )
    assert "The instance is deleted." in refused.content.decode()


def test_a_state_forbidden_post_queues_nothing_and_says_why(owner_client, instance):
    response = owner_client.post(
        _url(instance, "actions/start/"), {"request_id": "st-1"}, follow=True
    )

    assert "The instance is running; start needs it to be stopped." in response.content.decode()
    assert not Operation.objects.filter(verb="start").exists()


def test_retry_is_offered_only_after_a_failed_create_and_queues_it_again(owner_client, instance):
    assert ">Retry</button>" not in owner_client.get(_url(instance)).content.decode()
    Operation.objects.filter(instance=instance).update(state=Operation.State.FAILED)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.FAILED)

    assert ">Retry</button>" in owner_client.get(_url(instance)).content.decode()
    owner_client.post(_url(instance, "actions/create/"), {"request_id": "retry-1"})

    assert instance.operations.filter(verb="create", state="queued").count() == 1


def _failed_by(instance, verb: str, state: str) -> Operation:
    """The instance failed by an operation of `verb` that ran and ended in `state`, with the
    state change the runner records."""
    now = timezone.now()
    ended = Operation.objects.create(
        instance=instance, verb=verb, request_id=f"{verb}-ended", state=state,
        plan_version=instance.plan_version, started_at=now, finished_at=now,
    )  # fmt: skip
    InstanceStateChange.objects.create(
        instance=instance, from_state="updating", to_state="failed", operation=ended
    )
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.FAILED)
    return ended


def test_a_cancelled_restart_that_failed_the_instance_can_be_retried_and_nothing_else(
    owner_client, instance
):
    _failed_by(instance, "restart", Operation.State.CANCELLED)

    html = owner_client.get(_url(instance)).content.decode()

    assert ">Retry</button>" in html  # in the form that posts the restart again
    form = html[: html.index(">Retry</button>")].rsplit('action="', 1)[1]
    assert form.split('"', 1)[0].endswith("/actions/restart/")
    assert "The instance has failed; start needs it to be stopped." in html
    refused = owner_client.post(_url(instance, "actions/start/"), {"request_id": "s-1"})
    assert refused.status_code == 302 and not instance.operations.filter(verb="start").exists()
    owner_client.post(_url(instance, "actions/restart/"), {"request_id": "retry-1"})
    assert instance.operations.filter(verb="restart", state="queued").count() == 1


def test_a_failed_instance_says_which_operation_failed_it_and_how(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(outputs={})
    cancelled = _failed_by(instance, "create", Operation.State.CANCELLED)

    html = re.sub(r"\s+", " ", owner_client.get(_url(instance)).content.decode())

    said = html.split('id="instance-failed">', 1)[1].split("</p>", 1)[0]
    assert said.startswith("Failed: the create of ")
    assert "so its servers may run some of it, or all of it. <a href" in said
    assert f"/operations/{cancelled.pk}/" in said
    assert "None: the create was cancelled before it read them." in html


def test_a_failed_change_marks_the_outputs_it_may_have_changed(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(outputs={"readyInstances": 1})
    failed = _failed_by(instance, "modify", Operation.State.FAILED)
    Operation.objects.filter(pk=failed.pk).update(error="The Cluster never became healthy.")

    html = re.sub(r"\s+", " ", owner_client.get(_url(instance)).content.decode())

    said = html.split('id="instance-failed">', 1)[1].split("</p>", 1)[0]
    # One full stop: the error's own ("… healthy.. What it did" before).
    assert "failed: The Cluster never became healthy. <a href" in said
    assert (
        "As the last change that finished left them: the modify that failed may have changed "
        "what they say." in html
    )
    assert "readyInstances" in html


def test_a_backup_forgotten_since_does_not_hide_the_retry(owner_client, instance):
    _failed_by(instance, "stop", Operation.State.FAILED)
    later = timezone.now() + timedelta(minutes=1)
    Operation.objects.create(
        instance=instance, verb="deleteBackup", request_id="forget", state="succeeded",
        plan_version=instance.plan_version, created_at=later, started_at=later, finished_at=later,
    )  # fmt: skip

    assert ">Retry</button>" in owner_client.get(_url(instance)).content.decode()
    owner_client.post(_url(instance, "actions/stop/"), {"request_id": "retry-3"})
    assert instance.operations.filter(verb="stop", state="queued").count() == 1


def test_a_failed_backup_offers_no_retry(owner_client, instance):
    _failed_by(instance, "backup", Operation.State.FAILED)

    assert ">Retry</button>" not in owner_client.get(_url(instance)).content.decode()
    owner_client.post(_url(instance, "actions/restart/"), {"request_id": "retry-2"})
    assert not instance.operations.filter(verb="restart").exists()


def test_a_viewer_sees_no_action_and_a_forged_post_is_refused_and_audited(
    client, instance, add_member
):
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)

    html = client.get(_url(instance)).content.decode()
    for label in ["Stop", "Restart", "Switchover", "Back up now", "Delete", "Reload configuration"]:
        assert f">{label}</button>" not in html
    assert "data-dialog" not in client.get(_url(instance), {"tab": "backups"}).content.decode()

    forged = client.post(_url(instance, "actions/stop/"), {"request_id": "forged"})

    assert forged.status_code == 403
    assert "Your role (Viewer) does not allow" in forged.content.decode()
    assert not Operation.objects.filter(verb="stop").exists()
    denied = AuditEvent.objects.get(action="instance.stop", result="denied")
    assert denied.actor == viewer and denied.target_id == instance.pk


def test_a_viewers_forged_delete_is_refused_for_the_role_whatever_name_it_typed(
    client, instance, add_member
):
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)

    for n, typed in enumerate(["wrong", "orders"]):
        forged = client.post(
            _url(instance, "delete/"), {"request_id": f"forged-{n}", "confirm_name": typed}
        )

        assert forged.status_code == 403
        assert "Your role (Viewer) does not allow" in forged.content.decode()
    assert not Operation.objects.filter(verb="delete").exists()
    assert AuditEvent.objects.filter(action="instance.delete", result="denied").count() == 2
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING


@pytest.mark.parametrize(
    ("stored", "typed"),
    [
        ("D\u017ex", "\u01c5x"),  # typed as the one letter
        ("orders-db", "orders\u2010db"),  # the name as first typed, with a Unicode hyphen
    ],
)
def test_the_delete_confirmation_reads_the_name_as_names_are_stored(
    owner_client, instance, stored, typed
):
    Instance.objects.filter(pk=instance.pk).update(name=stored)

    response = owner_client.post(
        _url(instance, "delete/"), {"request_id": "del-n", "confirm_name": typed}
    )

    assert response.status_code == 302
    assert Operation.objects.filter(verb="delete").exists()


def test_a_backup_that_did_not_complete_shows_when_it_was_asked_for_not_taken(
    owner_client, instance
):
    failed = Snapshot.objects.create(
        tenant=instance.tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-failed",
        status=Snapshot.Status.FAILED, parameters=instance.parameters,
    )  # fmt: skip
    completed = instance.snapshots.get(status=Snapshot.Status.COMPLETED)

    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    def row(snapshot):
        start = page.index(f'<tr id="backup-{snapshot.pk}">')
        return page[start : page.index("</tr>", start)]

    assert "— asked <time" in row(failed)
    assert "asked" not in row(completed)
    assert "was never completed: it holds nothing to restore." in page  # its delete dialog
    assert f"The backup taken {completed.created_at:%-d %b %Y %H:%M} UTC can no longer" in page


def test_a_failed_backup_says_why_and_links_its_operation(owner_client, owner, instance):
    backup = services.instance_action(
        actor=Actor(user=owner), instance=instance, verb="backup", request_id="b-1"
    )
    Operation.objects.filter(pk=backup.pk).update(
        state=Operation.State.FAILED, error="Backup failed: the object store refused the upload."
    )
    failed = Snapshot.objects.get(operation=backup)
    Snapshot.objects.filter(pk=failed.pk).update(status=Snapshot.Status.FAILED)

    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    start = page.index(f'<tr id="backup-{failed.pk}">')
    row = page[start : page.index("</tr>", start)]
    assert "Backup failed: the object store refused the upload." in row
    assert f'href="{_url(instance)}operations/{backup.pk}/">See the backup' in row


def test_the_delete_dialog_counts_only_the_backups_a_restore_can_start_from(owner_client, instance):
    Snapshot.objects.create(
        tenant=instance.tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name=f"{instance.pk}-failed",
        status=Snapshot.Status.FAILED, parameters=instance.parameters,
    )  # fmt: skip

    page = owner_client.get(_url(instance)).content.decode()
    assert "Its 1 backup stays until deleted or expired" in page  # the completed one alone

    Snapshot.objects.filter(status=Snapshot.Status.COMPLETED).update(status=Snapshot.Status.FAILED)
    page = owner_client.get(_url(instance)).content.decode()
    assert "It has no backup: its data cannot be recovered." in page


def test_delete_with_a_wrong_name_deletes_nothing(owner_client, instance):
    response = owner_client.post(
        _url(instance, "delete/"), {"request_id": "del-1", "confirm_name": "order"}
    )

    assert response.status_code == 400
    html = response.content.decode()
    assert "Type the instance&#x27;s name, orders, to delete it." in html
    assert 'id="dialog-delete" aria-labelledby="dialog-delete-title" open' in html
    assert not Operation.objects.filter(verb="delete").exists()
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING


def test_delete_with_the_name_queues_the_deletion(owner_client, instance):
    response = owner_client.post(
        _url(instance, "delete/"), {"request_id": "del-2", "confirm_name": "orders"}
    )

    assert response.status_code == 302
    assert Operation.objects.get(verb="delete").instance == instance


def test_deleting_again_from_a_new_form_says_it_is_deleted_already(owner_client, instance):
    owner_client.post(
        _url(instance, "delete/"), {"request_id": "del-1", "confirm_name": "orders"}, follow=True
    )
    Operation.objects.filter(verb="delete").update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)

    again = owner_client.post(
        _url(instance, "delete/"), {"request_id": "del-2", "confirm_name": "orders"}, follow=True
    )  # another tab's form

    page = again.content.decode()
    assert "Deletion of orders <a href=" in page and ">succeeded</a> already." in page
    assert "This form was sent before" not in page
    assert Operation.objects.filter(verb="delete").count() == 1


def test_restore_makes_a_new_instance_from_the_backup(owner_client, instance):
    snapshot = instance.snapshots.get()

    response = owner_client.post(
        _url(instance, f"backups/{snapshot.pk}/restore/"),
        {"request_id": "rs-1", "name": "orders-copy"},
    )

    copy = Instance.objects.get(name="orders-copy")
    assert response.status_code == 302
    assert response["Location"] == _url(copy)
    assert copy.operations.get().verb == "restore"
    assert copy.parameters["instances"] == 2
    # Its overview says where it came from, linking the instance the backup was taken of.
    overview = owner_client.get(_url(copy)).content.decode()
    assert (
        f'the backup <code>{snapshot.name}</code> of <a href="{_url(instance)}">{instance.name}</a>'
    ) in overview
    assert "Restored from" not in owner_client.get(_url(instance)).content.decode()


def test_restore_posted_without_any_field_shows_the_form_with_what_to_give(owner_client, instance):
    snapshot = instance.snapshots.get()

    response = owner_client.post(_url(instance, f"backups/{snapshot.pk}/restore/"))

    assert response.status_code == 200
    assert "Give the instance a name." in response.content.decode()
    assert Instance.objects.count() == 1


def test_restore_without_a_name_shows_the_form_again(owner_client, instance):
    snapshot = instance.snapshots.get()

    response = owner_client.post(
        _url(instance, f"backups/{snapshot.pk}/restore/"), {"request_id": "rs-2", "name": " "}
    )

    assert response.status_code == 200
    html = response.content.decode()
    assert '<small class="field-error" id="id_name_error">Give the instance a name.</small>' in html
    assert 'id="restore-form"' in html
    assert Instance.objects.count() == 1


def test_restoring_a_backup_a_teammate_deleted_meanwhile_says_so_and_makes_nothing(
    owner_client, instance
):
    snapshot = instance.snapshots.get()
    form = owner_client.get(_restore_url(instance, snapshot))
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.DELETED)  # another tab

    sent = owner_client.post(
        _url(instance, f"backups/{snapshot.pk}/restore/"),
        {"request_id": "rs-3", "name": "orders-copy"}, follow=True,
    )  # fmt: skip

    assert form.status_code == 200
    assert sent.redirect_chain[-1][0] == _url(instance) + "?tab=backups"
    assert f"The backup {snapshot.name} was deleted: it can no longer be restored." in (
        sent.content.decode()
    )
    assert Instance.objects.count() == 1


def _restore_url(instance, snapshot, request_id="a" * 32):
    return _url(instance, f"backups/{snapshot.pk}/restore/?request={request_id}")


def test_the_backups_tab_links_each_completed_backup_to_its_restore_form(owner_client, instance):
    snapshot = instance.snapshots.get()

    html = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    assert f'href="{_url(instance, f"backups/{snapshot.pk}/restore/")}">Restore</a>' in html


def test_the_restore_form_keeps_its_request_id_in_the_address(owner_client, instance):
    snapshot = instance.snapshots.get()

    response = owner_client.get(_url(instance, f"backups/{snapshot.pk}/restore/"))

    assert response.status_code == 302
    assert re.fullmatch(
        rf"{_url(instance, f'backups/{snapshot.pk}/restore/')}\?request=[0-9a-f]{{32}}",
        response["Location"],
    )


def test_the_restore_form_is_prefilled_from_the_backup_never_with_a_password(
    owner_client, instance
):
    snapshot = instance.snapshots.get()
    taken = timezone.now() - timedelta(seconds=5, microseconds=300_000)  # within a second
    Snapshot.objects.filter(pk=snapshot.pk).update(
        parameters={**snapshot.parameters, "database": "ledger", "instances": 3},
        created_at=taken,
    )

    response = owner_client.get(_restore_url(instance, snapshot))

    assert response.status_code == 200
    html = response.content.decode()
    assert 'value="orders-restored"' in html
    # Fixed by the backup: shown read-only with the backup's value.
    assert re.search(r'<input type="text" name="p-database" value="ledger"[^>]* readonly', html)
    assert re.search(r'name="p-instances" value="3"', html)
    assert not re.search(r'name="p-instances"[^>]* readonly', html)
    assert re.search(r'<input type="password" name="p-password"[^>]*>', html)
    assert 'name="p-password" value' not in html
    assert "Leave empty to keep the backed-up instance&#x27;s password." in html
    assert "Leave empty to have one generated." not in html  # a restore keeps it instead
    assert SECRET not in html
    # The shipped spec's restore reads $sys.restore.targetTime: a point in time, in UTC.
    field = re.search(r'<input type="datetime-local" name="target_time"[^>]*>', html).group()
    # From the first whole second the backup covers, which the restore takes.
    first = taken.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
    assert f'min="{first:%Y-%m-%dT%H:%M:%S}"' in field and 'max="' in field
    assert "Point in time (UTC)" in html


def test_the_restore_form_prices_the_backups_values_and_then_the_changes_typed(
    owner_client, instance
):
    snapshot = instance.snapshots.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(
        parameters={
            **snapshot.parameters,
            "instances": 3,
            "cpu": 2,
            "memoryGi": 4,
            "storageGi": 100,
        }
    )
    estimate = _url(instance, f"backups/{snapshot.pk}/restore/estimate/")

    page = owner_client.get(_restore_url(instance, snapshot)).content.decode()
    fewer = owner_client.post(estimate, {"name": "copy", "p-instances": "1"}).content.decode()
    wrong = owner_client.post(estimate, {"name": "copy", "p-instances": "many"}).content.decode()
    # Fixed by the backup: a restore cannot change it, so there is nothing to price.
    fixed = owner_client.post(estimate, {"name": "", "p-database": "other"}).content.decode()

    # As the create form prices the same values: 3 x (2 x 0.035 + 4 x 0.005 + 100 x 0.00014).
    assert 'id="estimate-hour">0.3120<' in page and 'id="estimate-month">227.76<' in page
    assert 'hx-post="' + estimate + '"' in page
    assert "<html" not in fewer
    assert 'id="estimate-hour">0.1040<' in fewer and 'id="estimate-month">75.92<' in fewer
    assert "Enter valid values to see the price." in wrong
    assert "Enter valid values to see the price." in fixed


def test_another_tenants_backup_has_no_restore_estimate(client, instance, add_member, theirs):
    client.force_login(add_member("member@example.com", "member"))
    their_instance, _, their_snapshot = theirs

    for owner_id in (their_instance.pk, instance.pk):
        url = f"/t/{instance.tenant.slug}/deployments/{owner_id}/backups/{their_snapshot.pk}/"
        assert client.post(f"{url}restore/estimate/", {"p-instances": "1"}).status_code == 404


def test_a_valid_restore_keeps_the_backups_fixed_values(owner_client, instance):
    snapshot = instance.snapshots.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(
        parameters={**snapshot.parameters, "database": "ledger"}
    )
    form = owner_client.get(_restore_url(instance, snapshot))
    assert form.status_code == 200

    response = owner_client.post(
        _restore_url(instance, snapshot),
        {"name": "ledger-copy", "p-database": "ledger", "p-instances": "3", "p-password": ""},
    )

    copy = Instance.objects.get(name="ledger-copy")
    assert response.status_code == 302 and response["Location"] == _url(copy)
    assert copy.parameters["database"] == "ledger" and copy.parameters["instances"] == 3
    assert services.instance_parameters(copy)["password"] == SECRET  # left empty: kept
    restore = copy.operations.get()
    assert restore.verb == "restore" and restore.arguments["sys"]["restore"]["targetTime"] == ""
    page = owner_client.get(response["Location"]).content.decode()
    assert f"Restore of {snapshot.name} into ledger-copy is" in page


def test_the_restore_form_again_after_back_links_the_instance_it_made(owner_client, instance):
    snapshot = instance.snapshots.get()
    url = _restore_url(instance, snapshot)
    owner_client.post(url, {"name": "ledger-copy", "p-instances": "3", "p-password": ""})
    copy = Instance.objects.get(name="ledger-copy")

    html = owner_client.get(url).content.decode()  # Back fetches the form again, same id

    assert f'made <a href="{_url(copy)}">ledger-copy</a>' in html
    assert "Start a new form</a>" in html
    # The form, which comes back filled in, is not offered again: no click makes a second copy.
    assert 'id="restore-form"' not in html
    other = owner_client.get(_restore_url(instance, snapshot, "b" * 32)).content.decode()
    assert 'id="form-made"' not in other and 'id="restore-form"' in other


def test_changing_a_value_the_backup_fixes_is_refused_beside_the_field(owner_client, instance):
    snapshot = instance.snapshots.get()

    response = owner_client.post(
        _restore_url(instance, snapshot), {"name": "copy", "p-database": "other"}
    )

    assert response.status_code == 200
    html = response.content.decode()
    assert (
        '<small class="field-error" id="id_p-database_error">'
        "Fixed by the backup, which holds app.</small>"
    ) in html
    assert Instance.objects.count() == 1


def test_a_restore_proposes_a_name_no_instance_has_and_refuses_a_taken_one(owner_client, instance):
    snapshot = instance.snapshots.get()
    for name in ["orders-restored", "Orders-Restored-2"]:
        Instance.objects.create(
            tenant=instance.tenant, name=name, plan_version=instance.plan_version,
            cell=instance.cell,
        )  # fmt: skip

    form = owner_client.get(_restore_url(instance, snapshot)).content.decode()
    response = owner_client.post(_restore_url(instance, snapshot), {"name": "orders-restored"})

    assert 'name="name" value="orders-restored-3"' in form
    assert response.status_code == 200
    assert (
        '<small class="field-error" id="id_name_error">Another instance of your organization is '
        "called “orders-restored”: choose another name.</small>"
    ) in response.content.decode()
    assert Instance.objects.count() == 3


def test_a_restore_refuses_a_name_shaped_like_an_instance_id_beside_its_field(
    owner_client, instance
):
    snapshot = instance.snapshots.get()

    response = owner_client.post(_restore_url(instance, snapshot), {"name": "Inst-Abcd1234"})

    assert (
        '<small class="field-error" id="id_name_error">Names of the form inst- and 8 letters or '
        "digits are kept for instance ids: choose another name.</small>"
    ) in response.content.decode()
    assert Instance.objects.count() == 1


def test_the_restore_forms_queries_do_not_grow_with_the_names_taken(owner_client, instance):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    snapshot = instance.snapshots.get()

    def taken(names):
        for name in names:
            Instance.objects.create(
                tenant=instance.tenant, name=name, plan_version=instance.plan_version,
                cell=instance.cell,
            )  # fmt: skip
        with CaptureQueriesContext(connection) as queries:
            form = owner_client.get(_restore_url(instance, snapshot)).content.decode()
        return len(queries.captured_queries), form

    owner_client.get(_restore_url(instance, snapshot))  # what a first request reads once
    few, _ = taken(["orders-restored"])
    many, form = taken([f"orders-restored-{n}" for n in range(2, 12)])

    assert many == few
    assert 'name="name" value="orders-restored-12"' in form


def test_a_custom_actions_dialog_never_starts_from_a_password(owner_client, instance):
    response = owner_client.get(_url(instance))

    rotate = response.context["verb_forms"]["rotateCredentials"]
    assert rotate.initial == {}  # the owner's password is what the verb sets: never read back
    assert SECRET not in response.content.decode()


def test_a_point_in_time_before_the_backup_is_refused_beside_the_field(owner_client, instance):
    snapshot = instance.snapshots.get()
    before = (snapshot.created_at - timedelta(hours=1)).astimezone(UTC)

    response = owner_client.post(
        _restore_url(instance, snapshot),
        {"name": "copy", "target_time": before.strftime("%Y-%m-%dT%H:%M:%S")},
    )

    assert response.status_code == 200
    assert (
        '<small class="field-error" id="id_target_time_error">'
        "The point in time is before the backup was taken.</small>"
    ) in response.content.decode()
    assert Instance.objects.count() == 1


def test_the_first_point_in_time_the_form_offers_is_taken(owner_client, instance):
    snapshot = instance.snapshots.get()
    taken = (timezone.now() - timedelta(hours=3)).replace(microsecond=250_000)
    Snapshot.objects.filter(pk=snapshot.pk).update(created_at=taken)

    html = owner_client.get(_restore_url(instance, snapshot)).content.decode()
    first = re.search(r'name="target_time"[^>]*min="([^"]+)"', html).group(1)
    response = owner_client.post(
        _restore_url(instance, snapshot), {"name": "copy", "target_time": first}
    )

    assert first == f"{taken.astimezone(UTC) + timedelta(seconds=1):%Y-%m-%dT%H:%M:%S}"
    assert response.status_code == 302, re.findall(
        r'field-error"[^>]*>([^<]+)', response.content.decode()
    )
    assert Instance.objects.filter(name="copy").exists()


def test_the_point_in_time_is_bounded_by_what_the_operator_can_recover(owner_client, instance):
    snapshot = instance.snapshots.get()
    taken = (timezone.now() - timedelta(hours=3)).replace(microsecond=0)
    Snapshot.objects.filter(pk=snapshot.pk).update(created_at=taken)
    # The operator reports older WAL gone: recovery starts an hour after the backup, and (a
    # plan mapping it) ends an hour ago.
    oldest, newest = taken + timedelta(hours=1), taken + timedelta(hours=2)
    Instance.objects.filter(pk=instance.pk).update(
        observed={
            "phase": "Cluster in healthy state",
            "recoverableFrom": oldest.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "recoverableUntil": newest.astimezone(UTC).isoformat(),
        }
    )

    html = owner_client.get(_restore_url(instance, snapshot)).content.decode()
    field = re.search(r'<input type="datetime-local" name="target_time"[^>]*>', html).group()
    assert f'min="{oldest.astimezone(UTC):%Y-%m-%dT%H:%M:%S}"' in field
    assert f'max="{newest.astimezone(UTC):%Y-%m-%dT%H:%M:%S}"' in field
    assert f"from {oldest.astimezone(UTC):%Y-%m-%d %H:%M:%S} to" in html

    for outside in (oldest - timedelta(minutes=5), newest + timedelta(minutes=5)):
        response = owner_client.post(
            _restore_url(instance, snapshot),
            {"name": "copy", "target_time": outside.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")},
        )
        assert response.status_code == 200
        assert (
            f"The point in time must be between {oldest.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC "
            f"and {newest.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        ) in response.content.decode()
    assert Instance.objects.count() == 1


def test_the_point_in_time_ends_when_the_source_stopped_archiving(owner_client, instance):
    snapshot = instance.snapshots.get()
    taken = (timezone.now() - timedelta(hours=3)).replace(microsecond=0)
    Snapshot.objects.filter(pk=snapshot.pk).update(created_at=taken)
    stopped = taken + timedelta(hours=1)
    # Stopped an hour after the backup (its stop ran from "updating"), deleted later on.
    for from_state, to_state, at in (
        ("running", "updating", stopped - timedelta(seconds=20)),
        ("updating", "stopped", stopped),
        ("stopped", "deleting", stopped + timedelta(hours=1)),
        ("deleting", "deleted", stopped + timedelta(hours=1, seconds=30)),
    ):
        InstanceStateChange.objects.create(
            instance=instance, from_state=from_state, to_state=to_state, at=at
        )
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)

    after = stopped + timedelta(minutes=10)
    response = owner_client.post(
        _restore_url(instance, snapshot),
        {"name": "copy", "target_time": after.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")},
    )

    assert response.status_code == 200
    assert f"and {stopped.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" in response.content.decode()
    assert not Instance.objects.filter(name="copy").exists()
    html = owner_client.get(_restore_url(instance, snapshot)).content.decode()
    assert f'max="{stopped.astimezone(UTC):%Y-%m-%dT%H:%M:%S}"' in html


def test_a_point_in_time_without_a_zone_is_read_as_utc(owner_client, instance):
    snapshot = instance.snapshots.get()
    taken = timezone.now() - timedelta(hours=2)
    Snapshot.objects.filter(pk=snapshot.pk).update(created_at=taken)
    moment = (taken + timedelta(minutes=30)).astimezone(UTC).replace(microsecond=0)

    response = owner_client.post(
        _restore_url(instance, snapshot),
        {"name": "copy", "target_time": moment.strftime("%Y-%m-%dT%H:%M:%S")},
    )

    assert response.status_code == 302
    restore = Instance.objects.get(name="copy").operations.get()
    assert restore.arguments["sys"]["restore"]["targetTime"] == moment.strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def test_a_restore_sent_twice_makes_one_instance(owner_client, instance):
    snapshot = instance.snapshots.get()
    url = _restore_url(instance, snapshot, "b" * 32)

    first = owner_client.post(url, {"name": "copy"})
    second = owner_client.post(url, {"name": "copy"})

    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"]
    assert Instance.objects.filter(name="copy").count() == 1


def test_a_viewer_sees_no_restore_and_a_forged_one_is_refused_and_audited(
    client, instance, add_member
):
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)
    snapshot = instance.snapshots.get()

    tab = client.get(_url(instance), {"tab": "backups"}).content.decode()
    form = client.get(_restore_url(instance, snapshot))
    forged = client.post(_restore_url(instance, snapshot), {"name": "copy"})

    assert ">Restore</a>" not in tab
    assert form.status_code == 403
    assert forged.status_code == 403
    assert AuditEvent.objects.filter(
        action="instance.restore", result="denied", actor=viewer
    ).exists()
    assert Instance.objects.count() == 1


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_viewer_asking_to_restore_a_deleted_backup_is_refused_for_the_role(
    client, instance, add_member, method
):
    """Told the backup was deleted, its role never checked nor the refusal audited."""
    snapshot = instance.snapshots.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.DELETED)
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)

    response = getattr(client, method)(_restore_url(instance, snapshot), {"name": "copy"})

    assert response.status_code == 403
    assert AuditEvent.objects.filter(result="denied", actor=viewer).exists()


def test_another_tenants_backup_has_no_restore_form(client, instance, add_member, theirs):
    member = add_member("member@example.com", "member")
    client.force_login(member)
    their_instance, _, their_snapshot = theirs

    for owner_id in (their_instance.pk, instance.pk):
        url = f"/t/{instance.tenant.slug}/deployments/{owner_id}/backups/{their_snapshot.pk}/"
        assert client.get(f"{url}restore/?request={'c' * 32}").status_code == 404


def test_delete_backup_runs_the_plans_delete_backup(owner_client, instance):
    snapshot = instance.snapshots.get()

    owner_client.post(_url(instance, f"backups/{snapshot.pk}/delete/"), {"request_id": "db-1"})

    forget = Operation.objects.get(verb="deleteBackup")
    assert forget.arguments["forget_snapshot"] == snapshot.pk

    # Asked for again from another tab while it is pending: that one, not a second.
    again = owner_client.post(
        _url(instance, f"backups/{snapshot.pk}/delete/"), {"request_id": "db-2"}, follow=True
    )
    assert Operation.objects.filter(verb="deleteBackup").count() == 1
    assert ">queued</a>." in again.content.decode()


def test_a_delete_backup_form_sent_again_once_the_deletion_finished_says_it_is_done(
    owner_client, instance
):
    snapshot = instance.snapshots.get()
    url = _url(instance, f"backups/{snapshot.pk}/delete/")
    owner_client.post(url, {"request_id": "db-1"})
    # The deletion ran: its operation succeeded and the backup is gone.
    Operation.objects.filter(verb="deleteBackup").update(state=Operation.State.SUCCEEDED)
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.DELETED)

    resent = owner_client.post(url, {"request_id": "db-1"}, follow=True)  # a reload
    other_tab = owner_client.post(url, {"request_id": "db-2"}, follow=True)

    assert resent.status_code == other_tab.status_code == 200
    assert "This form was sent before" in resent.content.decode()
    assert f"Backup {snapshot.name} was deleted already." in other_tab.content.decode()
    assert Operation.objects.filter(verb="deleteBackup").count() == 1


def test_the_activity_tab_shows_the_instances_events_only(owner_client, instance, plan):
    other = _create(instance.created_by, instance.tenant, plan, name="elsewhere")
    owner_client.post(_url(instance, "actions/stop/"), {"request_id": "act-1"})

    html = owner_client.get(_url(instance), {"tab": "activity"}).content.decode()

    assert "instance.stop" in html and "instance.create" in html
    assert html.count("instance.create") == 1  # not elsewhere's
    assert other.instance.name not in html


def test_the_activity_tab_lists_a_hundred_events_a_page_and_pages_to_the_rest(
    owner_client, owner, instance
):
    from accounts.audit import audit_record

    for n in range(104):  # and the create's
        audit_record(
            actor=Actor(user=owner), action="instance.reveal_credentials",
            tenant=instance.tenant, target=instance, payload={"name": f"reveal-{n}"},
        )  # fmt: skip
    url = _url(instance)

    first = owner_client.get(url, {"tab": "activity"}).content.decode()
    second = owner_client.get(url, {"tab": "activity", "page": "2"}).content.decode()

    assert first.count("instance.reveal_credentials") == 100 and "reveal-103" in first
    assert "Page 1 of 2 · 105 events" in first and "tab=activity&amp;page=2" in first
    assert second.count("instance.reveal_credentials") == 4 and "instance.create" in second


def test_the_activity_tab_shows_who_cancelled_the_instances_operations(
    owner_client, instance, plan
):
    other = _create(instance.created_by, instance.tenant, plan, name="elsewhere")
    mine = _stop(owner_client, instance, "act-2")
    theirs = _stop(owner_client, other.instance, "act-3")
    for op in (mine, theirs):
        cancel = _url(op.instance, f"operations/{op.pk}/cancel/")
        assert owner_client.post(cancel, {"request_id": f"c-{op.pk}"}).status_code in {200, 302}

    html = owner_client.get(_url(instance), {"tab": "activity"}).content.decode()

    assert html.count("operation.cancel") == 1  # not elsewhere's
    row = html.split("operation.cancel", 1)[1].split("</tr>", 1)[0]
    assert "the stop" in row and '<span class="badge badge-ok">' in row  # what it stopped


def test_the_activity_tab_shows_its_backups_events_and_the_restores_from_them(
    owner_client, owner, instance, plan
):
    snapshot = instance.snapshots.get()
    other = _create(owner, instance.tenant, plan, name="elsewhere").instance
    restore = _url(instance, f"backups/{snapshot.pk}/restore/")
    owner_client.post(restore, {"request_id": "rs-1", "name": "orders-copy"})
    Operation.objects.filter(verb="restore").update(state=Operation.State.SUCCEEDED)
    services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="forget")
    Snapshot.objects.create(
        tenant=other.tenant, instance=other, source_instance_id=other.pk, name="their-backup",
        plan_version=other.plan_version, status=Snapshot.Status.COMPLETED,
    )  # fmt: skip
    services.snapshot_delete(
        actor=Actor(user=owner), snapshot=other.snapshots.get(), request_id="forget-theirs"
    )

    html = owner_client.get(_url(instance), {"tab": "activity"}).content.decode()

    assert "instance.create" in html and html.count("instance.create") == 1  # not elsewhere's
    assert "<code>backup.delete</code>" in html and html.count("backup.delete") == 1
    assert "<code>instance.restore</code>" in html and "orders-copy" in html  # made from it


def test_an_instances_activity_tab_reads_its_own_events_not_the_whole_organizations_log(
    owner_client, instance, plan
):
    from bench.support import rows_read

    # The organization's log: another instance's 3,000 events, a minute apart.
    busy = _create(instance.created_by, instance.tenant, plan, name="busy").instance
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(tenant=instance.tenant, actor_kind="user", action="instance.restart",
                   target_type="instance", target_id=busy.pk, target_name=busy.name,
                   created_at=now - timedelta(minutes=n))
        for n in range(3000)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE accounts_auditevent")
    url = _url(instance)
    owner_client.get(url, {"tab": "activity"})  # the session's first request reads more

    before = rows_read(AuditEvent)
    html = owner_client.get(url, {"tab": "activity"}).content.decode()
    read = rows_read(AuditEvent) - before

    assert "instance.create" in html and "instance.restart" not in html
    # Its own few events, counted and listed: not the organization's 3,000 (twice: once to
    # count the tab's events, once more to find its page of them).
    assert read < 100, read


def _stop(client, instance, request_id) -> Operation:
    client.post(_url(instance, "actions/stop/"), {"request_id": request_id})
    return Operation.objects.filter(instance=instance, verb="stop").get()


@pytest.fixture
def theirs(make_user, plan, local_cell):
    """Another tenant's instance with an operation and a completed snapshot."""
    from accounts import services as accounts_services

    stranger = make_user("stranger@example.com")
    tenant = accounts_services.tenant_create(actor=Actor(user=stranger), name="Globex")
    create = _create(stranger, tenant, plan, name="their-db")
    instance = create.instance
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING)
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=instance, source_instance_id=instance.pk,
        plan_version=instance.plan_version, name="their-backup",
        status=Snapshot.Status.COMPLETED,
    )  # fmt: skip
    return instance, create, snapshot


def test_a_member_requesting_another_tenants_real_ids_gets_404_everywhere(
    client, instance, add_member, theirs
):
    member = add_member("member@example.com", "member")  # of the instance's tenant
    client.force_login(member)
    their_instance, their_operation, their_snapshot = theirs
    verbs = selectors.plan_spec(their_instance.plan_version).main.verbs
    mine = f"/t/{instance.tenant.slug}/deployments/"
    gets = [
        f"{mine}{their_instance.pk}/",
        f"{mine}{their_instance.pk}/?tab=backups",
        f"{mine}{their_instance.pk}/operations/{their_operation.pk}/",
        f"{mine}{instance.pk}/operations/{their_operation.pk}/",
    ]
    posts = [
        *(f"{mine}{their_instance.pk}/actions/{verb}/" for verb in verbs if verb != "delete"),
        f"{mine}{their_instance.pk}/delete/",
        f"{mine}{their_instance.pk}/backups/{their_snapshot.pk}/restore/",
        f"{mine}{their_instance.pk}/backups/{their_snapshot.pk}/delete/",
        f"{mine}{instance.pk}/backups/{their_snapshot.pk}/restore/",
        f"{mine}{instance.pk}/backups/{their_snapshot.pk}/delete/",
    ]
    their_slug = f"/t/{their_instance.tenant.slug}/deployments/{their_instance.pk}/"

    for url in [*gets, their_slug]:
        assert client.get(url).status_code == 404, url
    for url in posts:
        data = {"request_id": uuid.uuid4().hex, "name": "x", "confirm_name": "their-db"}
        assert client.post(url, data).status_code == 404, url

    assert Operation.objects.filter(instance=their_instance).count() == 1
    assert not Instance.objects.filter(name="x").exists()


def test_an_address_whose_instance_id_no_instance_could_have_is_a_404(owner_client, instance):
    mine = f"/t/{instance.tenant.slug}/deployments/"

    for odd in ("%00", "inst%00abc", "..%2F..", "%E2%80%AEinst", "inst-" + "9" * 400):
        assert owner_client.get(f"{mine}{odd}/").status_code == 404, odd
        assert owner_client.get(f"{mine}{odd}/?tab=backups").status_code == 404, odd
        assert owner_client.post(f"{mine}{odd}/actions/restart/").status_code == 404, odd


def test_an_operations_address_opens_the_timeline_at_it(owner_client, instance):
    operation = instance.operations.get()

    response = owner_client.get(_url(instance, f"operations/{operation.pk}/"), follow=True)

    url, _ = response.redirect_chain[-1]
    assert (
        url == f"{_url(instance)}?tab=operations&operation={operation.pk}#operation-{operation.pk}"
    )
    assert f'<li id="operation-{operation.pk}" class="timeline-item">\n    <details open>' in (
        response.content.decode()
    )


def test_a_form_sent_again_says_where_its_first_sending_stands(owner_client, instance):
    first = owner_client.post(_url(instance, "actions/restart/"), {"request_id": "r1"}, follow=True)
    assert f"Restart of {instance.name} is" in first.content.decode()
    assert ">queued</a>." in first.content.decode()
    Operation.objects.filter(verb="restart").update(state=Operation.State.SUCCEEDED)

    # Back to the page as it was, and Restart again: the same form, the same request id.
    again = owner_client.post(_url(instance, "actions/restart/"), {"request_id": "r1"}, follow=True)

    page = again.content.decode()
    assert f"This form was sent before: Restart of {instance.name} <a href=" in page
    assert ">succeeded</a>." in page and "queued</a>" not in page
    assert Operation.objects.filter(verb="restart").count() == 1


def test_a_request_id_reused_for_another_action_is_said_in_a_message(owner_client, instance):
    owner_client.post(_url(instance, "actions/restart/"), {"request_id": "reused"})

    response = owner_client.post(
        _url(instance, "actions/stop/"), {"request_id": "reused"}, follow=True
    )

    assert "This form was already sent with different values." in response.content.decode()
    assert not Operation.objects.filter(verb="stop").exists()


def test_restoring_a_backup_that_is_not_complete_says_why(owner_client, instance):
    snapshot = instance.snapshots.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.PENDING)

    response = owner_client.post(
        _url(instance, f"backups/{snapshot.pk}/restore/"),
        {"request_id": "rs-3", "name": "copy"},
        follow=True,
    )

    assert "Only a completed backup can be restored." in response.content.decode()
    assert Instance.objects.count() == 1


def test_a_failed_backup_shows_no_expiry(owner_client, instance):
    snapshot = instance.snapshots.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(
        status=Snapshot.Status.FAILED, expires_at=timezone.now() + timedelta(days=28)
    )

    html = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    row = html[html.index(f'id="backup-{snapshot.pk}"') :]
    row = row[: row.index("</tr>")]
    assert '<span class="stack-label">Expires </span><span class="muted"' in row
    assert "in 28\xa0days" not in row


@pytest.mark.parametrize(("retention", "said"), [(7, "in 7\xa0days"), (365, "in 1\xa0year")])
def test_a_backup_just_taken_expires_in_its_retention_not_a_unit_less(
    owner_client, instance, retention, said
):
    # Read a second after it was asked for, the time left is a hair under the retention: it
    # read "in 6 days" for 7 days' retention and "in 11 months" for 365 days'.
    snapshot = instance.snapshots.get()
    asked = timezone.now() - timedelta(seconds=1)
    Snapshot.objects.filter(pk=snapshot.pk).update(
        created_at=asked, taken_at=asked, expires_at=asked + timedelta(days=retention)
    )

    html = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    row = html.split(f'id="backup-{snapshot.pk}"', 1)[1].split("</tr>", 1)[0]
    expires = row.split('<span class="stack-label">Expires </span>', 1)[1].split("</td>", 1)[0]
    assert f">{said}</time>" in expires, expires


@pytest.mark.parametrize(
    ("offset", "said"),
    [
        (timedelta(days=7, seconds=-1), "in 7\xa0days"),
        (timedelta(days=365, seconds=-1), "in 1\xa0year"),
        (timedelta(days=28), "in 28\xa0days"),  # as retentions are set, never "4 weeks"
        (timedelta(hours=23, minutes=50), "in 1\xa0day"),  # not "24 hours"
        (timedelta(days=44), "in 1\xa0month"),
        (timedelta(days=46), "in 2\xa0months"),
        (timedelta(seconds=30), "in under a minute"),  # it read "just now", not yet come
        (timedelta(seconds=-30), "just now"),
        (timedelta(minutes=-3, seconds=-10), "3\xa0minutes ago"),
        (timedelta(minutes=-1, seconds=-5), "1\xa0minute ago"),
        (timedelta(minutes=-59, seconds=-50), "1\xa0hour ago"),
        (timedelta(days=-2, hours=-3), "2\xa0days ago"),
        (timedelta(days=-400), "1\xa0year ago"),
    ],
)
def test_a_relative_time_says_the_nearest_whole_unit_before_or_after_now(offset, said):
    from accounts.templatetags.times import relative

    assert relative(timezone.now() + offset) == said


def test_the_restore_form_of_a_failed_backup_is_not_offered(owner_client, instance):
    snapshot = instance.snapshots.get()
    Snapshot.objects.filter(pk=snapshot.pk).update(status=Snapshot.Status.FAILED)

    response = owner_client.get(_restore_url(instance, snapshot), follow=True)

    assert response.redirect_chain[-1][0] == _url(instance, "?tab=backups")
    assert "Only a completed backup can be restored." in response.content.decode()
    assert 'name="name"' not in response.content.decode()  # the restore form's


def test_a_backup_being_deleted_is_neither_counted_nor_offered_for_restore(
    owner_client, owner, instance
):
    snapshot = instance.snapshots.get()
    services.snapshot_delete(actor=Actor(user=owner), snapshot=snapshot, request_id="forget")

    page = owner_client.get(_url(instance)).content.decode()
    response = owner_client.get(_restore_url(instance, snapshot), follow=True)

    assert "It has no backup: its data cannot be recovered." in page  # the delete dialog
    assert response.redirect_chain[-1][0] == _url(instance, "?tab=backups")
    assert services.RESTORE_FORGETTING in response.content.decode()
    assert 'name="name"' not in response.content.decode()  # the restore form's


@pytest.mark.parametrize("role", ["viewer", "billing"])
def test_roles_without_deployment_rights_are_refused_every_action(
    client, instance, add_member, role
):
    user = add_member(f"{role}@example.com", role)
    client.force_login(user)
    snapshot = instance.snapshots.get()
    posts = {
        "instance.restart": _url(instance, "actions/restart/"),
        "instance.backup": _url(instance, "actions/backup/"),
        "instance.rotateCredentials": _url(instance, "actions/rotateCredentials/"),
        "instance.delete": _url(instance, "delete/"),
        "instance.restore": _url(instance, f"backups/{snapshot.pk}/restore/"),
        "backup.delete": _url(instance, f"backups/{snapshot.pk}/delete/"),
    }

    for action, url in posts.items():
        data = {"request_id": uuid.uuid4().hex, "confirm_name": "orders", "name": "copy"}
        response = client.post(url, data)
        assert response.status_code == 403, url
        assert "does not allow" in response.content.decode()
        assert AuditEvent.objects.filter(action=action, result="denied", actor=user).exists()

    assert instance.operations.count() == 1  # only its create
    assert Instance.objects.count() == 1


def test_parameters_the_spec_does_not_export_stay_off_the_page(owner, tenant, local_cell, client):
    text = SPEC.read_text().replace("plan: postgres-cnpg", "plan: postgres-quiet", 1)
    exported = '        defaultValue: "app"\n        required: false\n        modifiable: false\n'
    assert text.count(exported) == 2  # database, then owner
    text = text.replace(exported, exported + "        export: false\n", 1)
    plan = services.plan_load(text=text).plan
    create = _create(owner, tenant, plan, database="internal_ledger")
    client.force_login(owner)

    html = client.get(_url(create.instance)).content.decode()

    assert "internal_ledger" not in html
    assert "Owner password" in html and "Servers" in html


def test_switchover_on_one_server_is_disabled_with_the_specs_reason_and_refused(
    owner_client, owner, tenant, plan, local_cell
):
    """The spec's `x-opsdeck.requires` for failover: a one-server instance has no replica to
    promote, so the button says why, and a forged request queues nothing."""
    single = _create(owner, tenant, plan, name="single", instances="1").instance
    Instance.objects.filter(pk=single.pk).update(state=Instance.State.RUNNING)
    reason = "Switchover promotes a replica, and this instance runs one server"

    html = owner_client.get(_url(single)).content.decode()
    refused = owner_client.post(
        _url(single, "actions/failover/"), {"request_id": "sw-1"}, follow=True
    )

    assert 'disabled aria-describedby="why-failover">Switchover</button>' in html
    assert reason in html
    assert reason in refused.content.decode()
    assert not single.operations.filter(verb="failover").exists()


def test_a_plan_words_what_its_buttons_ask_or_asks_nothing(owner_client, owner, tenant, local_cell):
    document = yaml.safe_load(SPEC.read_text())
    document["plan"] = "worded"
    service = document["services"][0]
    service["systemWorkflows"]["restart"]["x-opsdeck"] = {"confirm": "Restart every server?"}
    service["systemWorkflows"]["stop"]["x-opsdeck"] = {"confirm": ""}
    service["systemWorkflows"]["backup"]["x-opsdeck"] = {"confirm": "Back up now?"}
    custom = next(v for v in service["customWorkflows"] if v.get("apiParameters"))
    custom.setdefault("x-opsdeck", {})["confirm"] = "Its servers restart."
    plan = services.plan_load(text=yaml.safe_dump(document)).plan
    worded = _create(owner, tenant, plan, name="worded", instances="2").instance
    Instance.objects.filter(pk=worded.pk).update(state=Instance.State.RUNNING)

    html = owner_client.get(_url(worded)).content.decode()

    def asked(verb):
        form = html[html.index(f'action="{_url(worded, f"actions/{verb}/")}"') :]
        form = form[: form.index(">")]
        found = re.search(
            r'hx-confirm="([^"]*)" data-confirm-yes="[^"]*" data-confirm-no="([^"]*)"', form
        )
        return found.groups() if found else None

    assert asked("restart") == ("Restart every server?", "Keep it running")
    assert asked("stop") is None  # the plan asks nothing
    assert asked("failover")[0].startswith("Switch this instance&#x27;s primary")  # Opsdeck's own
    assert asked("failover")[1] == "Not now"  # it runs on either way
    assert asked("backup") == ("Back up now?", "Not now")
    dialog = f'id="dialog-{custom["verb"]}-warns">Its servers restart.</p>'
    assert dialog in html


def test_switchover_on_two_servers_is_offered(owner_client, instance):
    html = owner_client.get(_url(instance)).content.decode()

    assert 'aria-describedby="why-failover"' not in html and ">Switchover</button>" in html


def test_a_forged_delete_backup_naming_no_backup_queues_nothing(owner_client, instance):
    refused = owner_client.post(
        _url(instance, "actions/deleteBackup/"), {"request_id": "db-1"}, follow=True
    )

    assert "Deleting a backup is done from the Backups tab." in refused.content.decode()
    assert not instance.operations.filter(verb="deleteBackup").exists()


def test_switchover_is_judged_on_the_servers_the_instance_will_have_when_it_runs(
    owner_client, instance
):
    """Two servers now, a modify to one queued before it: the switchover would run on one."""
    owner_client.post(_url(instance, "modify/"), {"request_id": "to-one", "p-instances": "1"})
    assert instance.operations.filter(verb="modify").exists()

    refused = owner_client.post(_url(instance, "actions/failover/"), {"request_id": "sw-q"},
                                follow=True)  # fmt: skip

    assert "Switchover promotes a replica" in refused.content.decode()
    assert not instance.operations.filter(verb="failover").exists()


def test_back_up_now_says_a_backup_is_already_under_way_and_a_second_click_queues_none(
    owner_client, instance
):
    owner_client.post(_url(instance, "actions/backup/"), {"request_id": "tab-1"})
    queued = instance.operations.get(verb="backup", state=Operation.State.QUEUED)

    html = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    why = selectors.BACKUP_PENDING
    assert why.startswith("A backup of this instance is already queued or running;")
    assert re.search(r'<button type="submit" disabled aria-describedby="why-backup-tab">', html)
    assert why in html
    # The other tab still shows the button live: its click is refused with the same words.
    response = owner_client.post(
        _url(instance, "actions/backup/"), {"request_id": "tab-2"}, follow=True
    )
    assert why in response.content.decode()
    assert list(instance.operations.filter(verb="backup")) == [queued]


def test_the_admin_instance_page_reads_its_state_changes_in_a_constant_number_of_queries(
    client, make_user, instance
):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    url = f"/admin/deployments/instance/{instance.pk}/change/"

    def queries() -> int:
        with CaptureQueriesContext(connection) as read:
            assert client.get(url).status_code == 200
        return len(read.captured_queries)

    queries()  # what the first read caches (content types, the session)
    few = queries()
    for i in range(10):
        restart = Operation.objects.create(
            instance=instance, verb="restart", request_id=f"r-{i}",
            plan_version=instance.plan_version, state=Operation.State.SUCCEEDED,
        )  # fmt: skip
        InstanceStateChange.objects.create(
            instance=instance, from_state="running", to_state="updating", operation=restart
        )

    assert queries() == few


def _selects_of(client, url: str, table: str) -> list[str]:
    """The select lists (up to FROM) of the statements `url` reads `table`'s rows with."""
    client.get(url)  # what the first read caches (content types, the session)
    with CaptureQueriesContext(connection) as read:
        assert client.get(url).status_code == 200
    heads = [q["sql"].split(" FROM ")[0] for q in read.captured_queries]
    return [head for head in heads if head.startswith("SELECT") and f'"{table}".' in head]


def test_the_admin_instance_page_names_its_state_changes_operations_without_their_secrets(
    client, make_user, instance
):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    restart = Operation.objects.create(
        instance=instance, verb="restart", request_id="r-1", plan_version=instance.plan_version,
        state=Operation.State.SUCCEEDED, secret_parameters=json.dumps({"password": SECRET}),
    )  # fmt: skip
    InstanceStateChange.objects.create(
        instance=instance, from_state="running", to_state="updating", operation=restart
    )

    url = f"/admin/deployments/instance/{instance.pk}/change/"
    page = client.get(url).content.decode()
    changes = _selects_of(client, url, "deployments_instancestatechange")

    assert f"restart on {instance.pk} (succeeded)" in page  # each change names its operation
    assert changes
    # ... and reads of it that name alone: not its run's state, nor the secrets each row
    # would decrypt.
    for column in ["engine_state", "secret_parameters", "requested_secret", "parameters"]:
        assert not [s for s in changes if f'"deployments_operation"."{column}"' in s], column


def test_the_admin_operation_page_lists_its_task_runs_without_the_objects_they_rendered(
    client, make_user, instance
):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    create = instance.operations.get()
    TaskRun.objects.filter(operation=create).update(object=json.dumps({"spec": "z" * 5000}))

    url = f"/admin/deployments/operation/{create.pk}/change/"
    page = client.get(url).content.decode()
    runs = _selects_of(client, url, "deployments_taskrun")

    assert "Cluster not ready: waiting for the primary" in page
    # Its columns are the node, attempt, state, message and times: the object each run
    # rendered (encrypted, large) stays in the database.
    assert runs and not [s for s in runs if '"deployments_taskrun"."object"' in s]


def test_a_platform_secret_a_running_plan_version_reads_cannot_be_deleted_in_the_admin(
    client, make_user, instance
):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    read = PlatformSecret.objects.create(name="MONITORING_TOKEN", value="t")
    unread = PlatformSecret.objects.create(name="MONITORING", value="t")  # a prefix of it
    line = "                    password: {{ $var.password }}\n"
    text = SPEC.read_text().replace(
        line,
        line
        + line.replace(
            "password: {{ $var.password }}", "monitoring: {{ $secret.MONITORING_TOKEN }}"
        ),
        1,
    )
    services.plan_load(text=text)  # the plan's newest version, which creates run

    def delete(secret):
        url = f"/admin/deployments/platformsecret/{secret.pk}/delete/"
        return client.post(url, {"post": "yes"}).content.decode()

    refused = delete(read)
    delete(unread)

    assert "which reads $secret.MONITORING_TOKEN" in refused and "PostgreSQL version 2" in refused
    assert list(PlatformSecret.objects.values_list("name", flat=True)) == ["MONITORING_TOKEN"]

    # Renamed, it would be as gone for that version: refused, saying why.
    renamed = client.post(
        f"/admin/deployments/platformsecret/{read.pk}/change/",
        {"name": "MONITORING_KEY", "value": "", "description": ""},
    )
    assert renamed.status_code == 200
    assert "renamed, its next run would fail" in renamed.content.decode()
    assert list(PlatformSecret.objects.values_list("name", flat=True)) == ["MONITORING_TOKEN"]
    # One that no version reads is renamed, its value kept.
    spare = PlatformSecret.objects.create(name="SPARE", value="kept")
    client.post(
        f"/admin/deployments/platformsecret/{spare.pk}/change/",
        {"name": "SPARE_2", "value": "", "description": ""},
    )
    spare.refresh_from_db()
    assert (spare.name, spare.value) == ("SPARE_2", "kept")


def test_deleting_many_platform_secrets_at_once_names_each_one_read_in_as_many_queries(
    client, make_user, instance
):
    client.force_login(make_user("staff@example.com", is_staff=True, is_superuser=True))
    names = [f"TOKEN_{n}" for n in range(8)]
    line = "                    password: {{ $var.password }}\n"
    reads = "".join(
        line.replace("password: {{ $var.password }}", f"t{n}: {{{{ $secret.{name} }}}}")
        for n, name in enumerate(names)
    )
    services.plan_load(text=SPEC.read_text().replace(line, line + reads, 1))
    secrets = [PlatformSecret.objects.create(name=name, value="t") for name in names]
    spare = PlatformSecret.objects.create(name="SPARE", value="t")

    def confirm(chosen) -> tuple[str, int]:
        with CaptureQueriesContext(connection) as read:
            page = client.post(
                "/admin/deployments/platformsecret/",
                {"action": "delete_selected", "_selected_action": [s.pk for s in chosen]},
            )
        assert page.status_code == 200
        return page.content.decode(), len(read.captured_queries)

    confirm([spare])  # what the first read caches (content types, the session)
    _, few = confirm([secrets[0], spare])
    page, many = confirm([*secrets, spare])

    assert many == few
    for name in names:
        assert f"PostgreSQL version 2, which reads $secret.{name}" in page
    assert page.count("which reads $secret.") == len(names)  # SPARE, read by none, is not
    assert PlatformSecret.objects.count() == len(names) + 1


def test_a_deleted_instances_newest_backup_past_its_retention_says_it_is_kept(
    owner_client, instance
):
    past = timezone.now() - timedelta(days=60)
    Snapshot.objects.filter(instance=instance).update(created_at=past, expires_at=past)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)
    assert services.snapshots_prune() == 0  # the newest completed one stays

    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    assert "kept: the newest backup" in page
    assert '<span class="stack-label">Expires </span><time' not in page  # no "2 months ago"
    assert "and the newest completed one until it is deleted." in page


def test_a_deleted_instances_backups_say_their_data_outlives_them_in_the_object_store(
    owner_client, instance
):
    """The page said a deleted instance's backups were kept until their retention ended, as if
    they were then gone: the instance's cluster prunes its object store, and with the instance
    deleted nothing does. Deleting one here only ends its restores, which the page now says."""
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.DELETED)
    [snapshot] = Snapshot.objects.filter(instance=instance, status=Snapshot.Status.COMPLETED)[:1]

    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    said = page.split('id="backup-schedule-status"', 1)[1].split("</p>", 1)[0]
    assert "no cluster prunes the object store" in said
    assert "its data stays there until the platform team removes it" in said
    dialog = page.split(f'id="dialog-delete-backup-{snapshot.pk}"', 1)[1].split("</dialog>", 1)[0]
    assert "Its data stays in the object store until the platform team removes it" in dialog


def test_a_running_instances_backup_dialog_says_nothing_of_data_left_behind(owner_client, instance):
    page = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()

    assert 'id="dialog-delete-backup-' in page
    assert "Its data stays in the object store" not in page


def test_the_backups_tab_lists_fifty_a_page_and_a_refused_delete_reopens_on_its_page(
    owner_client, instance
):
    now = timezone.now()
    made = Snapshot.objects.bulk_create(
        Snapshot(
            tenant=instance.tenant, instance=instance, source_instance_id=instance.pk,
            plan_version=instance.plan_version, name=f"{instance.pk}-hourly-{n:03d}",
            status=Snapshot.Status.COMPLETED, parameters=instance.parameters, scheduled=True,
            created_at=now - timedelta(hours=n + 1), expires_at=now + timedelta(days=30),
        )
        for n in range(54)
    )  # fmt: skip

    first = owner_client.get(_url(instance), {"tab": "backups"}).content.decode()
    second = owner_client.get(_url(instance), {"tab": "backups", "page": "2"}).content.decode()

    assert first.count('<tr id="backup-') == 50 and second.count('<tr id="backup-') == 5
    assert "Page 1 of 2 · 55 backups" in first and "Older →" in first
    oldest = made[-1]
    assert f'id="backup-{oldest.pk}"' in second and f'id="backup-{oldest.pk}"' not in first
    delete = _url(instance, f"backups/{oldest.pk}/delete/")
    refused = owner_client.post(delete, {"request_id": " x"})  # a request id it cannot use
    assert refused.status_code == 400
    page = refused.content.decode()
    assert "Page 2 of 2 · 55 backups" in page
    assert f'<dialog id="dialog-delete-backup-{oldest.pk}"' in page
    assert f'id="dialog-delete-backup-{oldest.pk}-title"' in page
    assert re.search(rf'<dialog id="dialog-delete-backup-{oldest.pk}"[^>]* open', page)


@pytest.mark.parametrize("method", ["put", "patch", "delete", "options"])
def test_pages_with_a_form_answer_another_method_with_405_and_show_nothing(
    owner_client, instance, method
):
    snapshot = instance.snapshots.get(status=Snapshot.Status.COMPLETED)
    slug = instance.tenant.slug
    for url in [
        f"/t/{slug}/deployments/new/{instance.plan_version.plan.key}/",
        _url(instance, f"backups/{snapshot.pk}/restore/"),
        _url(instance, "connection/reveal/"),
    ]:
        response = getattr(owner_client, method)(url)

        assert response.status_code == 405, url
        assert b"<form" not in response.content


def test_a_viewer_asking_for_the_restore_form_with_head_is_refused_as_with_get(
    client, add_member, instance
):
    client.force_login(add_member("viewer@example.com", "viewer"))
    snapshot = instance.snapshots.get(status=Snapshot.Status.COMPLETED)
    url = _url(instance, f"backups/{snapshot.pk}/restore/")

    assert client.get(url).status_code == 403
    assert client.head(url).status_code == 403


@pytest.mark.parametrize(
    ("tab", "table", "unshown"),
    [
        ("backups", "deployments_snapshot", ["parameters", "metadata"]),
        ("activity", "accounts_auditevent", ["ip", "user_agent"]),
    ],
)
def test_a_tab_reads_only_the_columns_it_shows(owner_client, instance, tab, table, unshown):
    with CaptureQueriesContext(connection) as queries:
        page = owner_client.get(_url(instance), {"tab": tab})

    assert page.status_code == 200
    # The page's rows: of the table's rows read (a first one's id beside them), the widest.
    rows = [q["sql"].split(" FROM ")[0] for q in queries]
    selected = max((r for r in rows if r.startswith(f'SELECT "{table}"."id"')), key=len)
    for column in unshown:
        assert f'"{table}"."{column}"' not in selected


def test_the_activity_tab_says_a_json_value_as_it_was_typed_not_as_python_writes_it():
    # A JSON parameter's value read "{'a': 'é', 'b': True}", Python's words, not JSON's.
    from deployments.templatetags.instance_page import values_said

    said = values_said({"settings": {"b": True, "a": "é"}, "tls": False}, {"settings": "Settings"})

    assert said == 'Settings: {"a": "é", "b": true}, tls: no'


def test_an_instance_on_a_version_stored_before_a_rule_was_added_still_opens(owner_client, tenant):
    """Its password rule caps passwords below the 24 characters one generated has, which a
    spec loaded now is refused for: the stored version no longer loaded, and its instances'
    pages were server errors."""
    import hashlib

    import yaml

    from deployments.models import PlanVersion
    from tests.deployments import factories
    from tests.deployments.conftest import SPEC

    current = factories.postgres_version()
    document = yaml.safe_load(SPEC.read_text())
    password = next(p for p in document["services"][0]["apiParameters"] if p["type"] == "Password")
    password["regex"] = "^[A-Za-z0-9]{12,20}$"
    text = yaml.safe_dump(document, sort_keys=False)
    stored = PlanVersion.objects.create(
        plan=current.plan, number=current.number + 1, spec_text=text,
        digest=hashlib.sha256(text.encode()).hexdigest(),
    )  # fmt: skip
    (instance,) = factories.make_instances(tenant, stored, factories.cell("eu-2"), 1)

    page = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/")

    assert page.status_code == 200 and instance.name in page.content.decode()


def test_a_link_to_an_older_operation_opens_the_page_of_the_timeline_that_lists_it(
    owner_client, tenant
):
    """A backup failed three days ago (the failure banner and its Backups row link it), and an
    hourly schedule's backups since: its link opened the timeline's first page, the fifty
    newest, where neither it nor what went wrong was."""
    from tests.deployments.factories import cell, make_instances, make_operation, postgres_version

    (instance,) = make_instances(tenant, postgres_version(), cell("eu-9"), 1)
    failed = make_operation(
        instance, verb="backup", state="failed", ago=timedelta(days=3), error="bucket full"
    )
    now = timezone.now()
    Operation.objects.bulk_create(
        Operation(instance=instance, verb="backup", request_id=f"slot-{n}",
                  plan_version=instance.plan_version, state=Operation.State.SUCCEEDED,
                  created_at=now - timedelta(hours=n))
        for n in range(60)
    )  # fmt: skip

    for operation, listed in (
        (failed, "bucket full"),
        (Operation.objects.get(request_id="slot-0"), ""),
    ):
        url = f"/t/{tenant.slug}/deployments/{instance.pk}/operations/{operation.pk}/"
        page = owner_client.get(url, follow=True)

        html = page.content.decode()
        assert f'id="operation-{operation.pk}"' in html and listed in html


def test_a_status_the_sync_has_not_read_lately_says_it_is_the_last_one_reported(
    owner_client, instance, settings
):
    """A cell that stopped answering: its instances kept showing "Healthy" and their last
    phase, the "Observed … ago" time the only hint that nothing was read since."""
    settings.OPSDECK_STATUS_CONFIRM_AFTER = 300
    observed = {"phase": "Cluster in healthy state", "ready": 2, "total": 2, "healthy": True}
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING,
        observed=observed,
        observed_at=timezone.now() - timedelta(seconds=300 + 60),  # confirmed on time
    )
    confirmed = owner_client.get(_url(instance)).content.decode()
    Instance.objects.filter(pk=instance.pk).update(
        observed_at=timezone.now() - timedelta(minutes=12)
    )

    html = owner_client.get(_url(instance)).content.decode()

    assert 'id="status-unread"' not in confirmed and "(as last read)" not in confirmed
    note = re.search(r'<p[^>]*id="status-unread">(.*?)</p>', html, re.S)
    assert note, html
    text = re.sub(r"<[^>]+>", "", note.group(1)).replace("\xa0", " ")
    assert text.startswith("Its status was last read 12 minutes ago: since then, the cluster"), text
    assert "its health included, is what it reported then." in text
    assert "Healthy (as last read)" in re.sub(r"<[^>]+>", "", html)
    assert "Cluster in healthy state" in html  # still shown, as what was last reported


def test_the_sidebar_marks_deployments_on_a_deployments_page(owner_client, instance, tenant):
    """Deployments was highlighted on the list alone: not on a deployment's page, nor on the
    catalog or the form that make one."""
    link = re.compile(r'<a href="/t/[^"]+/deployments/"([^>]*)>Deployments</a>')

    listed = owner_client.get(f"/t/{tenant.slug}/deployments/").content.decode()
    opened = owner_client.get(_url(instance)).content.decode()
    catalog = owner_client.get(f"/t/{tenant.slug}/deployments/new/").content.decode()
    billing = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()

    assert link.search(listed).group(1) == ' aria-current="page"'
    assert link.search(opened).group(1) == link.search(catalog).group(1) == ' aria-current="true"'
    assert link.search(billing).group(1) == ""
