"""The dashboard's deployment figures: instances by state, what runs now, what failed lately."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services as account_services
from accounts.audit import Actor
from tests.deployments import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def version():
    return factories.postgres_version()


@pytest.fixture
def cell():
    return factories.cell()


@pytest.fixture
def other_tenant(make_user):
    stranger = make_user("other@example.com")
    return account_services.tenant_create(actor=Actor(user=stranger), name="Other")


def section(page: str, heading_id: str) -> str:
    """The HTML of the dashboard section whose heading has `heading_id`."""
    start = page.index(f'id="{heading_id}"')
    return page[start : page.index("</section>", start)]


def test_instances_are_counted_by_state_with_their_badges(
    owner_client, tenant, version, cell, other_tenant
):
    factories.make_instances(tenant, version, cell, 3, state="running")
    factories.make_instances(tenant, version, cell, 1, state="failed", name="broken")
    factories.make_instances(tenant, version, cell, 2, state="deleted", name="gone")
    factories.make_instances(other_tenant, version, cell, 5, state="stopped", name="theirs")

    page = owner_client.get(f"/t/{tenant.slug}/").content.decode()

    counts = re.findall(
        r'badge-state-(\w+)">[^<]+</span> <strong class="state-count">(\d+)</strong>',
        section(page, "by-state"),
    )
    assert counts == [("running", "3"), ("failed", "1")]
    assert f'href="/t/{tenant.slug}/deployments/?state=failed"' in page
    assert '<span class="figure">4</span>' in page  # deployments, deleted ones left out


def test_operations_running_now_link_to_their_deployment(
    owner_client, tenant, version, cell, other_tenant
):
    (orders,) = factories.make_instances(tenant, version, cell, 1, name="orders")
    (done,) = factories.make_instances(tenant, version, cell, 1, name="done")
    (theirs,) = factories.make_instances(other_tenant, version, cell, 1, name="theirs")
    backup = factories.make_operation(
        orders, verb="backup", state="running", ago=timedelta(minutes=5)
    )
    factories.make_operation(done, verb="create", state="succeeded")
    factories.make_operation(theirs, verb="restart", state="running")

    running = section(owner_client.get(f"/t/{tenant.slug}/").content.decode(), "running-now")

    assert "(1)" in running
    operation_url = f"/t/{tenant.slug}/deployments/{orders.pk}/operations/{backup.pk}/"
    assert f'<a href="{operation_url}">Backup</a>' in running  # as the instance page names it
    assert '<span class="badge badge-op-running">Running</span>' in running
    link = f'<a href="/t/{tenant.slug}/deployments/{orders.pk}/?tab=operations">orders-0</a>'
    assert link in running
    assert "5\xa0minutes ago</time>" in running
    assert "theirs" not in running
    assert "done" not in running


def test_the_dashboard_says_a_time_as_the_instance_page_says_it(
    owner_client, tenant, version, cell
):
    """The dashboard floored times (Django's naturaltime) where the instance page rounds them:
    a backup begun 2 min 50 s ago read "2 minutes ago" here and "3 minutes ago" there."""
    (orders,) = factories.make_instances(tenant, version, cell, 1, name="orders")
    factories.make_operation(
        orders, verb="backup", state="running", ago=timedelta(minutes=2, seconds=50)
    )

    running = section(owner_client.get(f"/t/{tenant.slug}/").content.decode(), "running-now")

    assert "3\xa0minutes ago</time>" in running


def test_operations_failed_in_the_last_7_days_link_to_their_deployment(
    owner_client, tenant, version, cell, other_tenant
):
    (orders,) = factories.make_instances(tenant, version, cell, 1, name="orders")
    (old,) = factories.make_instances(tenant, version, cell, 1, name="old")
    (theirs,) = factories.make_instances(other_tenant, version, cell, 1, name="theirs")
    modify = factories.make_operation(
        orders, verb="modify", state="failed", ago=timedelta(days=2), error="The disk is full."
    )
    factories.make_operation(old, verb="modify", state="failed", ago=timedelta(days=8))
    factories.make_operation(orders, verb="backup", state="succeeded")
    factories.make_operation(theirs, verb="create", state="failed")

    failed = section(owner_client.get(f"/t/{tenant.slug}/").content.decode(), "failed-recently")

    assert "(1)" in failed
    link = f'<a href="/t/{tenant.slug}/deployments/{orders.pk}/?tab=operations">orders-0</a>'
    assert link in failed
    operation_url = f"/t/{tenant.slug}/deployments/{orders.pk}/operations/{modify.pk}/"
    assert f'<a href="{operation_url}">Modify</a>' in failed
    assert '<span class="badge badge-op-failed">Failed</span>' in failed
    assert "The disk is full." in failed
    assert "2\xa0days ago</time>" in failed
    assert "old-0" not in failed
    assert "theirs" not in failed


def test_operations_are_named_as_their_plan_names_its_verbs(owner_client, tenant, version, cell):
    (orders,) = factories.make_instances(tenant, version, cell, 1, name="orders")
    factories.make_operation(orders, verb="rotateCredentials", state="failed")
    factories.make_operation(orders, verb="failover", state="running")

    page = owner_client.get(f"/t/{tenant.slug}/").content.decode()

    assert ">Rotate owner password</a>" in section(page, "failed-recently")  # its displayName
    assert ">Switchover</a>" in section(page, "running-now")
    assert "rotateCredentials" not in page and ">failover<" not in page


def test_nothing_running_or_failed_says_so(owner_client, tenant):
    page = owner_client.get(f"/t/{tenant.slug}/").content.decode()

    assert "No deployments yet." in page
    # ... and leads to making one, as the empty Deployments page does.
    assert f'<a role="button" href="/t/{tenant.slug}/deployments/new/">New deployment</a>' in page
    assert "Nothing is running." in page
    assert "No operation failed in the last 7 days." in page


def test_a_viewer_is_not_offered_a_new_deployment(client, tenant, add_member):
    client.force_login(add_member("vic@example.com", "viewer"))

    page = client.get(f"/t/{tenant.slug}/").content.decode()

    assert "No deployments yet." in page and "New deployment" not in page


def _dashboard_queries(client, url) -> int:
    client.get(url)  # the first visit also saves the organization in the session
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries.captured_queries)


def test_the_dashboard_makes_as_many_queries_for_many_deployments_as_for_few(
    owner_client, tenant, version, cell, monkeypatch
):
    url = f"/t/{tenant.slug}/"

    def add(count: int, name: str) -> None:
        for n, instance in enumerate(
            factories.make_instances(tenant, version, cell, count, name=name)
        ):
            factories.make_operation(instance, verb="create", state="running")
            factories.make_operation(instance, verb="backup", state="failed", ago=timedelta(n))

    add(2, "few")
    few = _dashboard_queries(owner_client, url)
    add(30, "many")

    def refuse(token):
        raise AssertionError("the dashboard decrypted a stored secret")

    monkeypatch.setattr("accounts.crypto.decrypt", refuse)
    assert _dashboard_queries(owner_client, url) == few
    page = owner_client.get(url).content.decode()
    assert "(32)" in section(page, "running-now")
    assert "The 10 started last of 32." in page


def test_degraded_instances_come_first_with_why_and_only_running_ones(
    owner_client, tenant, version, cell, other_tenant
):
    from django.utils import timezone

    from deployments.models import Instance

    mine = factories.make_instances(tenant, version, cell, 3, name="db")
    theirs = factories.make_instances(other_tenant, version, cell, 1, name="theirs")
    since = timezone.now() - timedelta(minutes=5)
    Instance.objects.filter(pk__in=[mine[0].pk, theirs[0].pk]).update(
        health="degraded", health_reason="Failing over", unhealthy_since=since
    )
    # A stopped instance is not degraded, whatever it was before it stopped.
    Instance.objects.filter(pk=mine[1].pk).update(health="degraded", state="stopped")

    page = owner_client.get(f"/t/{tenant.slug}/").content.decode()

    degraded = section(page, "degraded-now")
    assert page.index('id="degraded-now"') < page.index('id="by-state"')  # first
    assert "db-0" in degraded and "Failing over" in degraded
    assert "</time>: Failing over" in degraded  # "since 5 minutes ago: …", no space before ":"
    assert "db-1" not in degraded and "theirs" not in degraded


def test_more_degraded_instances_than_listed_are_counted(owner_client, tenant, version, cell):
    from django.utils import timezone

    from deployments.models import Instance

    url = f"/t/{tenant.slug}/"

    def degrade(count: int, name: str) -> None:
        instances = factories.make_instances(tenant, version, cell, count, name=name)
        Instance.objects.filter(pk__in=[i.pk for i in instances]).update(
            health="degraded", health_reason="Failing over",
            unhealthy_since=timezone.now() - timedelta(minutes=5),
        )  # fmt: skip

    degrade(2, "few")
    few = _dashboard_queries(owner_client, url)
    assert "degraded longest of" not in owner_client.get(url).content.decode()
    degrade(10, "many")

    assert _dashboard_queries(owner_client, url) == few
    degraded = section(owner_client.get(url).content.decode(), "degraded-now")
    assert degraded.count("badge-state-degraded") == 10
    assert "(12)" in degraded and "The 10 degraded longest of 12." in degraded


def test_no_degraded_section_while_every_instance_serves(owner_client, tenant, version, cell):
    factories.make_instances(tenant, version, cell, 2, name="db")

    assert 'id="degraded-now"' not in owner_client.get(f"/t/{tenant.slug}/").content.decode()


def _poll(page: str) -> str | None:
    """Where the dashboard's poll asks, or None when it does not poll."""
    found = re.search(r'<div id="dashboard" hx-get="([^"]+)"', page)
    return found.group(1) if found else None


def test_the_dashboard_follows_an_operation_until_it_ends(owner_client, tenant, version, cell):
    (instance,) = factories.make_instances(tenant, version, cell, 1, state="creating")
    operation = factories.make_operation(instance, verb="create", state="running")
    url = f"/t/{tenant.slug}/"
    poll = _poll(owner_client.get(url).content.decode())
    assert poll is not None and poll.startswith(f"{url}?shown=")

    assert owner_client.get(poll, headers={"HX-Request": "true"}).status_code == 204

    operation.state = "succeeded"
    operation.save(update_fields=["state"])
    instance.state = "running"
    instance.save(update_fields=["state"])
    answer = owner_client.get(poll, headers={"HX-Request": "true"})

    assert answer.status_code == 200
    page = answer.content.decode().strip()
    assert page.startswith('<div id="dashboard"')  # the dashboard's content alone, to swap
    assert "Nothing is running." in section(page, "running-now")
    assert re.search(r'badge-state-running">Running</span> <strong class="state-count">1<', page)
    assert _poll(page) is None  # nothing runs any more: it stops polling


def test_the_dashboard_follows_an_operation_still_queued(owner_client, tenant, version, cell):
    (instance,) = factories.make_instances(tenant, version, cell, 1)
    operation = factories.make_operation(instance, verb="restart", state="queued")
    url = f"/t/{tenant.slug}/"
    poll = _poll(owner_client.get(url).content.decode())
    assert poll is not None

    operation.state = "running"  # a worker took it
    operation.save(update_fields=["state"])
    answer = owner_client.get(poll, headers={"HX-Request": "true"})

    assert answer.status_code == 200
    assert instance.name in section(answer.content.decode(), "running-now")


def test_the_dashboard_says_a_role_changed_while_it_follows_an_operation(
    client, owner, add_member, tenant, version, cell
):
    # Member to viewer: the same sections (neither sees the audit log), only the role differs.
    member = add_member("member@example.com", "member")
    client.force_login(member)
    (instance,) = factories.make_instances(tenant, version, cell, 1)
    factories.make_operation(instance, verb="restart", state="running")
    poll = _poll(client.get(f"/t/{tenant.slug}/").content.decode())

    membership = tenant.memberships.get(user=member)
    account_services.membership_change_role(
        actor=Actor(user=owner), membership=membership, role="viewer"
    )
    answer = client.get(poll, headers={"HX-Request": "true"})

    assert answer.status_code == 200
    assert "Your role: Viewer" in answer.content.decode()


def test_the_dashboard_does_not_poll_while_nothing_runs(owner_client, tenant, version, cell):
    (instance,) = factories.make_instances(tenant, version, cell, 1)
    factories.make_operation(instance, verb="backup", state="failed")

    assert _poll(owner_client.get(f"/t/{tenant.slug}/").content.decode()) is None


def test_the_dashboards_poll_costs_as_many_queries_for_many_operations_as_for_few(
    owner_client, tenant, version, cell
):
    url = f"/t/{tenant.slug}/"

    def poll_queries() -> int:
        poll = _poll(owner_client.get(url).content.decode())
        with CaptureQueriesContext(connection) as queries:
            assert owner_client.get(poll, headers={"HX-Request": "true"}).status_code == 204
        return len(queries.captured_queries)

    for instance in factories.make_instances(tenant, version, cell, 2):
        factories.make_operation(instance, verb="restart", state="running")
    few = poll_queries()
    for instance in factories.make_instances(tenant, version, cell, 40, name="more"):
        factories.make_operation(instance, verb="restart", state="running")

    assert poll_queries() == few


def test_the_team_link_says_manage_only_to_a_role_that_can(client, owner, add_member, tenant):
    client.force_login(add_member("member@example.com", "member"))
    theirs = client.get(f"/t/{tenant.slug}/").content.decode()
    client.force_login(owner)
    ours = client.get(f"/t/{tenant.slug}/").content.decode()

    assert f'href="/t/{tenant.slug}/team/">View team</a>' in theirs and "Manage team" not in theirs
    assert f'href="/t/{tenant.slug}/team/">Manage team</a>' in ours


def test_the_dashboard_makes_as_many_queries_for_many_plans_as_for_few(
    owner_client, tenant, version, cell
):
    """Each plan with its subscription, a running instance, one degraded, and an operation
    running and one failed on them."""
    from django.utils import timezone

    from deployments import services
    from deployments.models import Instance

    url = f"/t/{tenant.slug}/"

    def add(keys) -> None:
        for key in keys:
            plan_version = services.plan_load(
                text=factories.SPEC.read_text()
                .replace("name: PostgreSQL\n", f"name: PG {key}\n", 1)
                .replace("plan: postgres-cnpg", f"plan: {key}")
            ).version
            running, degraded = factories.make_instances(tenant, plan_version, cell, 2, name=key)
            Instance.objects.filter(pk=degraded.pk).update(
                health="degraded", health_reason="A server is down.", unhealthy_since=timezone.now()
            )
            factories.make_operation(running, verb="failover", state="running")
            factories.make_operation(degraded, verb="rotateCredentials", state="failed")

    add(["pg-0", "pg-1"])
    # The visit before each count also reads the new plan versions' specs (once per process).
    few = _dashboard_queries(owner_client, url)
    add(["pg-2", "pg-3", "pg-4"])

    assert _dashboard_queries(owner_client, url) == few
    page = owner_client.get(url).content.decode()
    assert page.count(">Switchover</a>") == 5 and page.count(">Rotate owner password</a>") == 5
    assert page.count("A server is down.") == 5


def test_the_dashboard_reads_only_what_it_shows_of_the_log_and_counts_pending_invitations(
    owner_client, owner, tenant, settings
):
    from django.utils import timezone

    from accounts.audit import audit_record
    from accounts.models import Invitation

    audit_record(
        actor=Actor(user=owner), action="tenant.rename", tenant=tenant, payload={"x": "y" * 5000}
    )
    for email in ("a@example.com", "b@example.com", "old@example.com"):
        account_services.invitation_create(
            actor=Actor(user=owner), tenant=tenant, email=email, role="viewer"
        )
    Invitation.objects.filter(email="old@example.com").update(  # expired
        created_at=timezone.now() - timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE + 1)
    )

    with CaptureQueriesContext(connection) as captured:
        page = owner_client.get(f"/t/{tenant.slug}/").content.decode()

    assert "tenant.rename" in page
    assert re.search(r'Pending invitations</span>\s*<span class="figure">2</span>', page)
    log_reads = [q["sql"] for q in captured if 'FROM "accounts_auditevent"' in q["sql"]]
    assert log_reads and not [sql for sql in log_reads if '"payload"' in sql]
    counted = [q["sql"] for q in captured if 'FROM "accounts_invitation"' in q["sql"]]
    assert [sql for sql in counted if sql.startswith("SELECT COUNT(*)")]  # not every row read
