"""The Metrics tab: CPU and memory of each server over a window, with the plan's limits."""

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deployments import metrics
from deployments.models import Instance, Operation, ServerSample
from tests.deployments import factories
from tests.deployments.test_metrics_sampling import postgres_with_servers

MIB = 1024 * 1024


@pytest.fixture
def instance(tenant, db):
    """A running instance of 2 cores and 4 GiB per server (factories.PARAMETERS)."""
    return Instance.objects.create(
        tenant=tenant, name="orders", plan_version=postgres_with_servers(),
        cell=factories.cell(), state=Instance.State.RUNNING, parameters=factories.PARAMETERS,
    )  # fmt: skip


def _url(instance, window=None):
    url = f"/t/{instance.tenant.slug}/deployments/{instance.pk}/metrics/"
    return f"{url}?window={window}" if window else url


def _minute(ago: timedelta):
    return (timezone.now() - ago).replace(second=0, microsecond=0)


def _sample(instance, server, ago, *, cpu, memory, role="primary", minute=None):
    ServerSample.objects.create(
        instance=instance, server=f"{instance.pk}-{server}", role=role,
        minute=minute or _minute(ago), cpu=cpu, memory=memory,
    )  # fmt: skip


def _chart(html: str, name: str) -> dict:
    found = re.search(rf'<script id="metrics-{name}-data" type="application/json">(.*?)</script>',
                      html, re.S)  # fmt: skip
    assert found, f"no {name} chart"
    return json.loads(found.group(1))


def _lines(chart: dict) -> dict[str, list]:
    return {s["label"]: s["values"] for s in chart["series"]}


def test_the_owner_sees_each_servers_cpu_and_memory_with_the_plans_limits(owner_client, instance):
    five = _minute(timedelta(minutes=5))  # once: a minute may turn while the test runs
    _sample(instance, 1, None, cpu=1500, memory=1024 * MIB, minute=five)
    _sample(instance, 2, None, cpu=250, memory=512 * MIB, role="replica", minute=five)
    four = five + timedelta(minutes=1)
    _sample(instance, 2, None, cpu=300, memory=600 * MIB, role="replica", minute=four)

    page = owner_client.get(_url(instance))

    assert page.status_code == 200
    html = page.content.decode()
    cpu, memory = _chart(html, "cpu"), _chart(html, "memory")
    assert cpu["unit"] == "cores" and memory["unit"] == "MiB"
    assert len(cpu["labels"]) == 60  # the last hour, a point a minute
    primary, replica = f"{instance.pk}-1 (primary)", f"{instance.pk}-2 (replica)"
    assert set(_lines(cpu)) == {primary, replica, "Limit per server"}
    five_ago = cpu["labels"].index(five.strftime("%H:%M"))
    assert _lines(cpu)[primary][five_ago] == 1.5
    assert _lines(cpu)[replica][five_ago : five_ago + 2] == [0.25, 0.3]
    assert _lines(cpu)[primary][five_ago + 1] is None  # no sample: a gap, not a zero
    assert _lines(memory)[primary][five_ago] == 1024.0
    # The limits drawn are the plan's for this instance's size: 2 cores and 4 GiB a server.
    assert set(_lines(cpu)["Limit per server"]) == {2.0}
    assert set(_lines(memory)["Limit per server"]) == {4096.0}
    # The same figures as a table, for screen readers and without JavaScript.
    assert "Figures (cores)" in html and "Figures (MiB)" in html
    assert "No samples yet" not in html


def test_the_limit_drawn_at_each_minute_is_the_one_in_effect_then(owner_client, instance):
    def ran(verb, ago, state=Operation.State.SUCCEEDED, **changed):
        Operation.objects.create(
            instance=instance, verb=verb, request_id=verb + str(ago), state=state,
            plan_version=instance.plan_version, parameters={**factories.PARAMETERS, **changed},
            finished_at=timezone.now() - timedelta(minutes=ago),
        )  # fmt: skip

    ran("create", 90, memoryGi=1, cpu=1)  # before the hour: its limits hold from its start
    ran("modify", 40, memoryGi=2, cpu=1)
    ran("modify", 30, state=Operation.State.FAILED, memoryGi=8, cpu=4)  # never ran at that size
    ran("modify", 20, memoryGi=4, cpu=2)
    _sample(instance, 1, timedelta(minutes=5), cpu=100, memory=MIB)

    html = owner_client.get(_url(instance)).content.decode()

    memory = _lines(_chart(html, "memory"))["Limit per server"]
    cpu = _lines(_chart(html, "cpu"))["Limit per server"]
    labels = _chart(html, "memory")["labels"]
    at = {
        ago: labels.index(_minute(timedelta(minutes=ago)).strftime("%H:%M"))
        for ago in (45, 35, 25, 10)
    }
    assert [memory[at[ago]] for ago in (45, 35, 25, 10)] == [1024.0, 2048.0, 2048.0, 4096.0]
    assert [cpu[at[ago]] for ago in (45, 35, 25, 10)] == [1.0, 1.0, 1.0, 2.0]
    assert memory[-1] == 4096.0


def test_no_limit_is_drawn_before_the_instance_first_ran(owner_client, instance):
    Operation.objects.create(
        instance=instance, verb="create", request_id="c", state=Operation.State.SUCCEEDED,
        plan_version=instance.plan_version, parameters=factories.PARAMETERS,
        finished_at=timezone.now() - timedelta(minutes=30),
    )  # fmt: skip
    _sample(instance, 1, timedelta(minutes=5), cpu=100, memory=MIB)

    memory = _chart(owner_client.get(_url(instance)).content.decode(), "memory")

    limit = _lines(memory)["Limit per server"]
    started = memory["labels"].index(_minute(timedelta(minutes=30)).strftime("%H:%M"))
    assert set(limit[: started - 1]) == {None} and set(limit[started + 1 :]) == {4096.0}


def test_the_seven_day_window_averages_each_hour(owner_client, instance):
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    for minute, cpu in ((1, 100), (20, 200), (59, 600)):
        ServerSample.objects.create(
            instance=instance, server="s-1", minute=hour + timedelta(minutes=minute),
            cpu=cpu, memory=MIB * cpu,
        )  # fmt: skip

    html = owner_client.get(_url(instance, "7d")).content.decode()

    cpu = _chart(html, "cpu")
    assert len(cpu["labels"]) == 7 * 24
    values = [v for v in _lines(cpu)["s-1"] if v is not None]
    assert values == [0.3]  # one bucket: (100 + 200 + 600) / 3 millicores
    assert [v for v in _lines(_chart(html, "memory"))["s-1"] if v is not None] == [300.0]
    assert "Averaged over each hour" in html


def test_the_seven_day_window_reads_the_hours_rolled_up_and_the_minutes_of_the_others(
    owner_client, instance
):
    now = timezone.now()
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=30)
    # Each hour's minutes cost as many millicores as the hours since `first`, times 10.
    ServerSample.objects.bulk_create(
        ServerSample(
            instance=instance, server="s-1", minute=first + timedelta(minutes=m),
            cpu=10 * (m // 60), memory=MIB,
        )
        for m in range(int((now - first).total_seconds() // 60) + 1)  # to this minute
    )  # fmt: skip
    metrics.samples_take(now)  # beat's minute: the ended hours rolled up, old minutes forgotten
    assert ServerSample.objects.filter(minute__lt=first + timedelta(hours=4)).count() == 0

    html = owner_client.get(_url(instance, "7d")).content.decode()

    values = [v for v in _lines(_chart(html, "cpu"))["s-1"] if v is not None]
    assert values == [round(10 * h / 1000, 3) for h in range(31)]  # every hour once, to now
    assert set(_lines(_chart(html, "memory"))["s-1"]) - {None} == {1.0}


def test_the_day_window_has_ten_minute_points(owner_client, instance):
    _sample(instance, 1, timedelta(hours=23), cpu=100, memory=MIB)

    cpu = _chart(owner_client.get(_url(instance, "24h")).content.decode(), "cpu")

    assert len(cpu["labels"]) == 144
    assert [v for v in _lines(cpu)[f"{instance.pk}-1 (primary)"] if v is not None] == [0.1]


@pytest.mark.parametrize("window", ["2y", "", "1H", "<script>"])
def test_an_unknown_window_is_the_last_hour(owner_client, instance, window):
    _sample(instance, 1, timedelta(minutes=1), cpu=100, memory=MIB)

    page = owner_client.get(_url(instance), {"window": window})

    assert page.status_code == 200
    assert len(_chart(page.content.decode(), "cpu")["labels"]) == 60
    assert re.search(r'aria-current="page">Last hour<', page.content.decode())


def test_window_links_load_the_tab_in_place_and_keep_the_address(owner_client, instance):
    html = owner_client.get(_url(instance, "24h")).content.decode()

    page = f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab=metrics&amp;window=7d"
    assert f'href="{page}"' in html and f'hx-push-url="{page}"' in html
    assert f'hx-get="{_url(instance, "7d")}"' in html
    assert re.search(r'aria-current="page">Last 24 hours<', html)
    assert "every 60s" not in html  # only the last hour refreshes


def test_without_samples_the_tab_says_when_they_come(owner_client, instance):
    _sample(instance, 1, timedelta(days=2), cpu=100, memory=MIB)  # outside the last hour

    html = owner_client.get(_url(instance)).content.decode()

    assert "No samples yet: they are taken every minute while the instance runs." in html
    assert "data-chart" not in html
    assert "Last 7 days" in html  # the older ones are one click away


@pytest.mark.parametrize("role", ["viewer", "billing", "member"])
def test_every_role_that_sees_deployments_sees_their_metrics(client, add_member, instance, role):
    _sample(instance, 1, timedelta(minutes=1), cpu=100, memory=MIB)
    client.force_login(add_member(f"{role}@example.com", role))

    page = client.get(_url(instance))

    assert page.status_code == 200
    assert _chart(page.content.decode(), "cpu")


def test_another_organizations_instance_is_not_found(client, make_user, instance):
    from accounts import services
    from accounts.audit import Actor

    stranger = make_user("stranger@example.com")
    services.tenant_create(actor=Actor(user=stranger), name="Other")
    _sample(instance, 1, timedelta(minutes=1), cpu=100, memory=MIB)
    client.force_login(stranger)

    # Under its own organization's address, and under the instance's organization's.
    other = client.get(f"/t/other/deployments/{instance.pk}/metrics/")
    theirs = client.get(_url(instance))

    assert other.status_code == 404 and theirs.status_code == 404


def test_signed_out_visitors_are_sent_to_log_in(client, instance):
    page = client.get(_url(instance))

    assert page.status_code == 302 and "/accounts/login/" in page["Location"]


def test_the_page_reads_the_same_few_queries_for_any_number_of_samples(
    owner_client, instance, django_assert_num_queries
):
    _sample(instance, 1, timedelta(minutes=1), cpu=100, memory=MIB)
    owner_client.get(_url(instance))  # the first request of a session also writes the session
    # The session, the user, the membership, the instance (with its plan and cell), the hours
    # rolled up, the minutes of the others, the operations that set the limits.
    with django_assert_num_queries(7), CaptureQueriesContext(connection) as few:
        owner_client.get(_url(instance, "7d"))
    ServerSample.objects.bulk_create(
        ServerSample(
            instance=instance, server=f"{instance.pk}-{n}", minute=_minute(timedelta(minutes=m)),
            cpu=n * 100 + m, memory=MIB * m,
        )
        for n in range(1, 6)
        for m in range(0, 7 * 24 * 60, 7)
    )  # fmt: skip
    with CaptureQueriesContext(connection) as many:
        page = owner_client.get(_url(instance, "7d"))

    assert len(_lines(_chart(page.content.decode(), "cpu"))) == 6  # 5 servers and the limit
    assert len(many.captured_queries) == len(few.captured_queries)
    samples = [q for q in many.captured_queries if "deployments_serversample" in q["sql"]]
    assert len(samples) == 1
