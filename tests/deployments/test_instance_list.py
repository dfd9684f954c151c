"""The deployments list: what it shows, how it searches, filters and pages, and what it costs."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services as account_services
from accounts.audit import Actor
from deployments.models import Instance, PlanVersion
from tests.deployments import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def version():
    return factories.postgres_version()


@pytest.fixture
def cell():
    return factories.cell()


@pytest.fixture
def url(tenant):
    return f"/t/{tenant.slug}/deployments/"


def names(response) -> list[str]:
    """The names of the deployments listed, top to bottom."""
    return re.findall(r'<td><a href="[^"]+">([^<]+)</a>', response.content.decode())


def _list_queries(client, url) -> list[str]:
    client.get(url)  # the first visit also saves the organization in the session
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return [q["sql"] for q in queries.captured_queries]


def test_the_list_makes_as_many_queries_for_500_deployments_as_for_10(
    owner_client, tenant, version, cell, url
):
    redis = factories.other_service_version()
    factories.make_instances(tenant, version, cell, 5)
    factories.make_instances(tenant, redis, factories.cell("us-1", "us-east"), 5, name="cache")
    few = _list_queries(owner_client, url)

    factories.make_instances(tenant, version, cell, 490, name="more")
    many = _list_queries(owner_client, url)

    assert len(many) == len(few)
    assert len(names(owner_client.get(url))) == 25


def test_the_list_reads_no_spec_text_and_decrypts_no_kubeconfig(
    owner_client, tenant, version, cell, url, monkeypatch
):
    factories.make_instances(tenant, version, cell, 3)

    def refuse(token):
        raise AssertionError("the list decrypted a stored secret")

    monkeypatch.setattr("accounts.crypto.decrypt", refuse)
    sql = " ".join(_list_queries(owner_client, url))

    for column in ["spec_text", "parsed", "kubeconfig", "backup_credentials", "secret_parameters"]:
        assert f'"{column}"' not in sql
    assert names(owner_client.get(url)) == ["db-2", "db-1", "db-0"]


def test_each_row_shows_name_service_plan_state_region_and_created(
    owner_client, tenant, version, cell, url
):
    (instance,) = factories.make_instances(tenant, version, cell, 1, name="orders")

    page = owner_client.get(url).content.decode()

    assert f'<a href="/t/{tenant.slug}/deployments/{instance.pk}/">orders-0</a>' in page
    assert f'<code class="instance-id">{instance.pk}</code>' in page
    assert "Service </span>PostgreSQL</td>" in page  # as its spec names the service
    assert f'{version.plan.name} <small class="muted">v{version.number}</small>' in page
    assert '<span class="badge badge-state-running">Running</span>' in page
    assert "Region </span>eu-west</td>" in page
    created = re.escape(instance.created_at.isoformat())
    assert re.search(rf'<time datetime="{created}" title="[^"]+ UTC">1\xa0hour ago</time>', page)


def test_search_finds_a_name_in_any_case_and_part(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 1, name="Orders-EU")
    factories.make_instances(tenant, version, cell, 1, name="billing")

    assert names(owner_client.get(url, {"q": "orders"})) == ["Orders-EU-0"]
    assert names(owner_client.get(url, {"q": "rs-e"})) == ["Orders-EU-0"]
    # Typed as it was first typed: a Unicode hyphen, fullwidth letters (stored plain).
    assert names(owner_client.get(url, {"q": "orders\u2010eu"})) == ["Orders-EU-0"]
    assert names(owner_client.get(url, {"q": "\uff4f\uff52\uff44\uff45\uff52\uff53"})) == [
        "Orders-EU-0"
    ]


def test_search_finds_an_id_from_its_start(owner_client, tenant, version, cell, url):
    first, second = factories.make_instances(tenant, version, cell, 2)
    Instance.objects.filter(pk=first.pk).update(id="inst-abcd1234")
    Instance.objects.filter(pk=second.pk).update(id="inst-abzz9999")

    assert names(owner_client.get(url, {"q": "inst-abcd1234"})) == ["db-0"]
    assert names(owner_client.get(url, {"q": "INST-abc"})) == ["db-0"]
    assert names(owner_client.get(url, {"q": "abzz"})) == ["db-1"]  # without the prefix
    assert names(owner_client.get(url, {"q": "bcd1"})) == []  # the middle of an id is no match
    assert names(owner_client.get(url, {"q": "i"})) == []  # nor the "i" every id starts with


def test_filters_by_state_and_by_service(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 2, state="running", name="up")
    factories.make_instances(tenant, version, cell, 1, state="failed", name="broken")
    redis = factories.other_service_version()
    factories.make_instances(tenant, redis, cell, 1, state="running", name="cache")

    assert names(owner_client.get(url, {"state": "failed"})) == ["broken-0"]
    assert names(owner_client.get(url, {"service": "redis"})) == ["cache-0"]
    assert names(owner_client.get(url, {"service": "postgresql", "state": "running"})) == [
        "up-1",
        "up-0",
    ]
    page = owner_client.get(url).content.decode()
    assert '<option value="redis">redis</option>' in page  # its plan names no service: its key
    assert '<option value="postgresql">PostgreSQL</option>' in page


def test_an_unknown_filter_value_is_ignored(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 2)

    response = owner_client.get(url, {"state": "exploded", "service": "nope"})

    assert names(response) == ["db-1", "db-0"]


def test_deleted_deployments_are_listed_only_when_asked_for(
    owner_client, tenant, version, cell, url
):
    factories.make_instances(tenant, version, cell, 1, name="live")
    factories.make_instances(tenant, version, cell, 1, state="deleted", name="gone")

    assert names(owner_client.get(url)) == ["live-0"]
    assert names(owner_client.get(url, {"q": "gone"})) == []
    assert names(owner_client.get(url, {"state": "deleted"})) == ["gone-0"]


def test_only_deleted_deployments_say_where_they_are(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 1, state="deleted", name="gone")

    page = owner_client.get(url).content.decode()

    assert "No active deployments" in page
    assert "No deployments yet" not in page


def test_25_a_page_and_the_page_links_keep_the_filters(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 26, name="db")
    factories.make_instances(tenant, version, cell, 3, state="stopped", name="idle")

    first = owner_client.get(url, {"state": "running", "q": "db"})
    second = owner_client.get(url, {"state": "running", "q": "db", "page": "2"})

    assert names(first) == [f"db-{n}" for n in range(25, 0, -1)]
    assert names(second) == ["db-0"]
    assert "Page 1 of 2" in first.content.decode()
    assert f'href="{url}?state=running&amp;q=db&amp;page=2"' in first.content.decode()
    assert f'href="{url}?state=running&amp;q=db&amp;page=1"' in second.content.decode()


def test_a_page_past_the_end_shows_the_last(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 26)

    assert names(owner_client.get(url, {"page": "9"})) == ["db-0"]
    assert len(names(owner_client.get(url, {"page": "first"}))) == 25


def test_another_tenants_deployments_are_never_listed(
    client, owner, tenant, version, cell, url, make_user
):
    stranger = make_user("other@example.com")
    other = account_services.tenant_create(actor=Actor(user=stranger), name="Other")
    theirs = factories.make_instances(other, version, cell, 2, name="secret-db")
    factories.make_instances(other, version, cell, 1, state="deleted", name="secret-gone")
    factories.make_instances(tenant, version, cell, 1, name="mine")
    client.force_login(owner)

    for query in [{"q": "secret"}, {"q": theirs[0].pk}, {"state": "deleted"}]:
        assert names(client.get(url, query)) == []
    assert names(client.get(url)) == ["mine-0"]
    assert b"secret" not in client.get(url).content
    assert client.get(f"/t/{tenant.slug}/deployments/{theirs[0].pk}/").status_code == 404


def test_an_empty_list_offers_a_member_a_new_deployment(client, tenant, add_member, url):
    client.force_login(add_member("mia@example.com", "member"))

    page = client.get(url).content.decode()

    assert "No deployments yet" in page
    assert f'<a role="button" href="{url}new/">New deployment</a>' in page
    assert 'name="q"' not in page  # nothing to search yet


def test_a_viewer_is_not_offered_a_new_deployment(client, tenant, add_member, url):
    client.force_login(add_member("vic@example.com", "viewer"))

    page = client.get(url).content.decode()

    assert "No deployments yet" in page
    assert "New deployment" not in page


def test_a_member_sees_new_deployment_above_a_list(client, tenant, add_member, version, cell, url):
    factories.make_instances(tenant, version, cell, 1)
    client.force_login(add_member("mia@example.com", "member"))

    page = client.get(url).content.decode()

    assert page.count(">New deployment</a>") == 1


def test_htmx_gets_only_the_table_and_a_plain_request_the_page(
    owner_client, tenant, version, cell, url
):
    factories.make_instances(tenant, version, cell, 2, name="orders")

    swap = owner_client.get(url, {"q": "orders-1"}, headers={"HX-Request": "true"})
    page = owner_client.get(url, {"q": "orders-1"})

    assert swap.content.decode().lstrip().startswith('<div id="deployment-table">')
    assert "<html" not in swap.content.decode()
    assert names(swap) == ["orders-1"]
    assert "<html" in page.content.decode()
    assert 'value="orders-1"' in page.content.decode()
    assert "HX-Request" in swap["Vary"]


def test_a_missing_filter_match_offers_to_clear(owner_client, tenant, version, cell, url):
    factories.make_instances(tenant, version, cell, 1)

    page = owner_client.get(url, {"q": "nothing-like-it"}).content.decode()

    assert "No deployments match." in page
    assert f'<a href="{url}">Clear the search and filters</a>' in page


def test_the_name_opens_the_deployment(owner_client, tenant, version, cell):
    (instance,) = factories.make_instances(tenant, version, cell, 1, name="orders")

    page = owner_client.get(f"/t/{tenant.slug}/deployments/{instance.pk}/")

    assert page.status_code == 200
    assert "orders-0" in page.content.decode()


def _poll(page: str) -> str | None:
    """Where the table's poll asks (its hx-get, unescaped), or None when the table does not
    poll."""
    table = re.search(r'<div id="deployment-table"([^>]*)>', page).group(1)
    found = re.search(r'hx-get="([^"]+)"', table)
    return found.group(1).replace("&amp;", "&") if found else None


def _creating(tenant, version, cell, count: int = 1, name: str = "shop") -> list[Instance]:
    """Instances being created: each with its create running."""
    made = factories.make_instances(tenant, version, cell, count, state="creating", name=name)
    for instance in made:
        factories.make_operation(instance, verb="create", state="running")
    return made


def test_a_list_showing_an_operation_under_way_follows_it_until_it_ends(
    owner_client, tenant, version, cell, url
):
    factories.make_instances(tenant, version, cell, 2, name="up")
    (shop,) = _creating(tenant, version, cell)
    poll = _poll(owner_client.get(url).content.decode())
    assert poll is not None and poll.startswith(f"{url}?page=1&shown=")

    # Nothing changed: nothing to swap.
    assert owner_client.get(poll, headers={"HX-Request": "true"}).status_code == 204

    shop.operations.update(state="succeeded")  # as the worker ends it
    Instance.objects.filter(pk=shop.pk).update(state="running")
    answer = owner_client.get(poll, headers={"HX-Request": "true"})

    assert answer.status_code == 200
    table = answer.content.decode().strip()
    assert table.startswith('<div id="deployment-table"')  # the table alone, to swap
    assert re.search(r'shop-0</a>.*?badge-state-running">Running', table, re.DOTALL)
    assert _poll(table) is None  # nothing under way any more: it stops polling


def test_a_queued_operation_is_followed_before_it_changes_the_state(
    owner_client, tenant, version, cell, url
):
    """Workers busy elsewhere: a restart waits its turn while the row still reads Running, and
    the list follows it from the start (it would miss it if it looked at the state alone)."""
    (instance,) = factories.make_instances(tenant, version, cell, 1)
    factories.make_operation(instance, verb="restart", state="queued")
    poll = _poll(owner_client.get(url).content.decode())
    assert poll is not None

    Instance.objects.filter(pk=instance.pk).update(state="updating")  # it started

    assert owner_client.get(poll, headers={"HX-Request": "true"}).status_code == 200


def test_a_list_with_nothing_pending_does_not_poll(owner_client, tenant, version, cell, url):
    for state in ["running", "stopped", "failed"]:
        (instance,) = factories.make_instances(tenant, version, cell, 1, state=state, name=state)
        factories.make_operation(
            instance, verb="create", state=state.replace("running", "succeeded")
        )

    assert _poll(owner_client.get(url).content.decode()) is None


def test_a_change_of_plan_version_under_the_same_state_is_swapped_in(
    owner_client, tenant, version, cell, url
):
    """An upgrade ends and the next operation starts between two polls: the row reads Updating
    before and after, and its new version still shows."""
    (instance,) = _creating(tenant, version, cell)
    poll = _poll(owner_client.get(url).content.decode())
    newer = PlanVersion.objects.create(
        plan=version.plan, number=version.number + 1, spec_text=version.spec_text,
        parsed=version.parsed, digest="0" * 64,
    )  # fmt: skip
    Instance.objects.filter(pk=instance.pk).update(plan_version=newer)

    answer = owner_client.get(poll, headers={"HX-Request": "true"})

    assert answer.status_code == 200
    assert f"v{newer.number}</small>" in answer.content.decode()


def test_the_poll_asks_for_the_page_and_filters_shown(owner_client, tenant, version, cell, url):
    _creating(tenant, version, cell, 27, name="db")

    page = owner_client.get(url, {"q": "db", "state": "creating", "page": "2"}).content.decode()
    poll = _poll(page)

    assert poll.startswith(f"{url}?q=db&state=creating&page=2&shown=")
    answer = owner_client.get(poll.replace("shown=", "shown=x"), headers={"HX-Request": "true"})
    assert names(answer) == ["db-1", "db-0"]
    # The page links the answer carries keep the filters, not the digest.
    assert f'href="{url}?q=db&amp;state=creating&amp;page=1"' in answer.content.decode()


def test_the_poll_costs_as_many_queries_for_many_deployments_as_for_few(
    owner_client, tenant, version, cell, url
):
    def poll_queries() -> tuple[int, int]:
        """Queries of a poll answered with nothing, and of one answered with the table."""
        poll = _poll(owner_client.get(url).content.decode())
        counts = []
        for sent in (poll, poll.replace("shown=", "shown=x")):
            with CaptureQueriesContext(connection) as queries:
                owner_client.get(sent, headers={"HX-Request": "true"})
            counts.append(len(queries.captured_queries))
        return tuple(counts)

    _creating(tenant, version, cell, 3)
    few = poll_queries()
    _creating(tenant, version, cell, 200, name="more")

    assert poll_queries() == few


def test_a_search_holding_a_nul_finds_what_the_rest_of_it_names(
    owner_client, tenant, version, cell, url
):
    factories.make_instances(tenant, version, cell, 1, name="orders")
    factories.make_instances(tenant, version, cell, 1, name="billing")

    response = owner_client.get(url, {"q": "ord\x00ers"})

    assert response.status_code == 200 and names(response) == ["orders-0"]
