"""An instance's health, beside its state: the plan's health rule over the status object, kept
as a verdict in the observed status; Degraded after two minutes of failing verdicts, recorded
and emailed to the organization's owners and admins once per incident and once on recovery."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from accounts.models import AuditEvent
from deployments import health, status
from deployments.models import Instance
from tests.concurrency import race
from tests.deployments import factories

RULE = status.status_rule(
    {
        "status": {
            "apiVersion": "example.com/v1",
            "kind": "Db",
            "fields": {"phase": "status.phase", "ready": "status.ready"},
        },
        "health": {
            "condition": "cel: self.status.ready == self.spec.servers",
            "reason": "status.phase",
        },
    }
)


def db(ready: int, phase: str) -> dict:
    return {"spec": {"servers": 2}, "status": {"ready": ready, "phase": phase}}


def test_the_observed_status_keeps_the_health_rules_verdict_and_the_operators_reason():
    assert status.observed_of(db(2, "Healthy"), RULE) == {
        "phase": "Healthy", "ready": 2, "healthy": True, "healthReason": "",
    }  # fmt: skip
    assert status.observed_of(db(1, "Failing over"), RULE)["healthReason"] == "Failing over"
    assert status.observed_of(db(1, "Failing over"), RULE)["healthy"] is False
    # A field the condition reads is missing: not healthy (as a successCondition would not hold).
    assert status.observed_of({"status": {}}, RULE)["healthy"] is False


def test_a_rule_that_runs_past_its_bounds_gives_no_verdict_rather_than_a_false_alarm():
    endless = (
        "cel: self.status.items.all(a, self.status.items.all(b, self.status.items.all(c, true)))"
    )
    obj = {"status": {"items": list(range(2000))}}

    assert health.verdict(obj, endless, "") == {}


@pytest.fixture
def running(db, tenant, owner, add_member):
    add_member("admin@example.com", "admin")
    add_member("member@example.com", "member")
    add_member("viewer@example.com", "viewer")
    version = factories.postgres_version()
    [instance] = factories.make_instances(tenant, version, factories.cell(), 1, name="orders")
    return instance


@pytest.fixture
def assess(django_capture_on_commit_callbacks):
    """`health.instances_assess` as beat runs it: what it leaves for after its commits (the
    emails) runs too."""

    def run(at):
        with django_capture_on_commit_callbacks(execute=True):
            return health.instances_assess(at)

    return run


def observe(instance: Instance, healthy: bool, reason: str = "") -> None:
    instance.observed = {"phase": reason or "Cluster in healthy state", "healthy": healthy,
                         "healthReason": reason}  # fmt: skip
    instance.save(update_fields=["observed"])


@pytest.mark.usefixtures("mail_at_commit")
def test_an_instance_failing_its_rule_for_two_minutes_is_degraded_and_its_owners_told_once(
    running, assess
):
    start = timezone.now()
    observe(running, False, "Failing over")

    assert assess(start) == {"degraded": 0, "recovered": 0}
    assert assess(start + timedelta(seconds=119))["degraded"] == 0
    running.refresh_from_db()
    assert running.health == Instance.Health.HEALTHY and running.unhealthy_since == start

    assert assess(start + timedelta(seconds=121))["degraded"] == 1
    assert assess(start + timedelta(seconds=151))["degraded"] == 0  # once

    running.refresh_from_db()
    assert running.health == Instance.Health.DEGRADED
    assert running.health_reason == "Failing over"
    assert running.state == Instance.State.RUNNING  # health is not a lifecycle state
    [email] = mail.outbox
    assert email.subject == "[Opsdeck] orders-0 is degraded"
    assert sorted(email.to) == ["admin@example.com", "owner@example.com"]
    assert "Failing over" in email.body
    assert AuditEvent.objects.filter(action="instance.degraded", target_id=running.pk).count() == 1


@pytest.mark.usefixtures("mail_at_commit")
def test_a_degraded_instance_recovers_at_its_first_passing_verdict_and_says_so_once(
    running, assess
):
    start = timezone.now()
    observe(running, False, "Failing over")
    assess(start)
    assess(start + timedelta(minutes=3))
    observe(running, True)

    assert assess(start + timedelta(minutes=4))["recovered"] == 1
    assert assess(start + timedelta(minutes=5))["recovered"] == 0

    running.refresh_from_db()
    assert running.health == Instance.Health.HEALTHY and running.unhealthy_since is None
    assert [m.subject for m in mail.outbox] == [
        "[Opsdeck] orders-0 is degraded", "[Opsdeck] orders-0 is healthy again",
    ]  # fmt: skip
    assert AuditEvent.objects.filter(action="instance.healthy", target_id=running.pk).exists()


def test_a_blip_shorter_than_two_minutes_sends_nothing(running, assess):
    start = timezone.now()
    observe(running, False, "Failing over")
    assess(start)
    observe(running, True)
    assess(start + timedelta(seconds=90))
    observe(running, False, "Failing over")
    assess(start + timedelta(seconds=150))  # the clock started again

    running.refresh_from_db()
    assert running.health == Instance.Health.HEALTHY and mail.outbox == []


def test_a_stopped_instance_is_not_unhealthy(running, assess):
    start = timezone.now()
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.STOPPED)
    observe(running, False, "Cluster is hibernated")

    assess(start)
    assess(start + timedelta(minutes=10))

    running.refresh_from_db()
    assert running.health == Instance.Health.HEALTHY and running.unhealthy_since is None
    assert mail.outbox == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("mail_at_commit")
def test_beat_runs_overlapping_degrade_an_instance_once(tenant, owner):
    version = factories.postgres_version()
    [instance] = factories.make_instances(tenant, version, factories.cell(), 1, name="orders")
    observe(instance, False, "Failing over")
    health.instances_assess(timezone.now() - timedelta(minutes=5))
    later = timezone.now()

    results = race(lambda: health.instances_assess(later))

    assert sorted(r["degraded"] for r in results) == [0, 0, 0, 1]
    assert len(mail.outbox) == 1
    assert AuditEvent.objects.filter(action="instance.degraded").count() == 1


def test_the_deployments_list_shows_degraded_running_instances_first(running, owner_client):
    version = factories.postgres_version()
    later = factories.make_instances(running.tenant, version, running.cell, 2, name="newer")
    Instance.objects.filter(pk=running.pk).update(health=Instance.Health.DEGRADED)

    page = owner_client.get(f"/t/{running.tenant.slug}/deployments/").content.decode()

    names = [running.name] + [i.name for i in later]
    assert sorted(names, key=page.index) == ["orders-0", "newer-1", "newer-0"]
    assert page.count('class="badge badge-state-degraded">Degraded<') == 1


@pytest.mark.usefixtures("mail_at_commit")
def test_a_failed_server_makes_its_instance_degraded_and_it_recovers(
    worker, cell, plan, tenant, owner, sandbox_cluster
):
    from accounts.audit import Actor
    from deployments import services
    from deployments.cells import driver_for
    from deployments.models import Operation
    from tests.deployments.conftest import wait_done, wait_for

    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="health-create",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    instance = Instance.objects.get(pk=create.instance_id)

    def verdict():
        status.cell_observe(cell, driver_for(cell))  # as beat's status sync reads it
        instance.refresh_from_db()
        return instance.observed.get("healthy")

    assert verdict() is True
    sandbox_cluster.pod_fail(instance.namespace, f"{instance.pk}-2", seconds=None)
    wait_for(lambda: verdict() is False, timeout=30, what="the failing verdict")
    start = timezone.now()
    health.instances_assess(start)
    health.instances_assess(start + timedelta(minutes=3))

    instance.refresh_from_db()
    assert instance.health == Instance.Health.DEGRADED and instance.health_reason
    told = [m for m in mail.outbox if "degraded" in m.subject]  # (the create's "ready" too)
    assert [(m.subject, m.to) for m in told] == [
        ("[Opsdeck] orders is degraded", ["owner@example.com"])
    ]

    sandbox_cluster.pod_fail_clear(instance.namespace, f"{instance.pk}-2")
    wait_for(lambda: verdict() is True, timeout=30, what="the passing verdict")
    health.instances_assess(start + timedelta(minutes=4))

    instance.refresh_from_db()
    assert instance.health == Instance.Health.HEALTHY
    assert mail.outbox[-1].subject == "[Opsdeck] orders is healthy again"


def _degraded_then_stopped_and_started(running, assess):
    """Degraded half an hour ago, then stopped (beat looking on) and started again; when its
    incident began."""
    start = timezone.now() - timedelta(minutes=30)
    observe(running, False, "Failing over")
    assess(start)
    assess(start + timedelta(minutes=3))
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.STOPPED)
    assess(start + timedelta(minutes=10))
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.RUNNING)
    return start


@pytest.mark.usefixtures("mail_at_commit")
def test_a_degraded_instance_stopped_and_started_still_failing_keeps_its_incident(
    running, assess, owner_client, tenant
):
    """Stopping a degraded instance cleared when its incident began, its health left Degraded:
    started again, the dashboard and its Overview read "Degraded since None" until beat's next
    look, then "since just now", though no recovery was ever said. The incident goes on from
    when it began, and its emails are the one that said it began."""
    start = _degraded_then_stopped_and_started(running, assess)

    dashboard = owner_client.get(f"/t/{tenant.slug}/").content.decode()
    overview = owner_client.get(f"/t/{tenant.slug}/deployments/{running.pk}/").content.decode()
    assess(start + timedelta(minutes=20))

    running.refresh_from_db()
    assert (running.health, running.unhealthy_since) == (Instance.Health.DEGRADED, start)
    began = f'datetime="{start.isoformat()}"'
    assert began in dashboard.split("Degraded now", 1)[1].split("</section>", 1)[0]
    assert began in overview.split('id="instance-health-detail"', 1)[1].split("</dd>", 1)[0]
    assert [m.subject for m in mail.outbox] == ["[Opsdeck] orders-0 is degraded"]


@pytest.mark.usefixtures("mail_at_commit")
def test_a_degraded_instance_stopped_and_started_healthy_says_it_recovered(running, assess):
    start = _degraded_then_stopped_and_started(running, assess)
    observe(running, True)

    assert assess(start + timedelta(minutes=20))["recovered"] == 1
    assert [m.subject for m in mail.outbox] == [
        "[Opsdeck] orders-0 is degraded", "[Opsdeck] orders-0 is healthy again",
    ]  # fmt: skip


def _health_said(client, instance: Instance) -> str:
    page = client.get(f"/t/{instance.tenant.slug}/deployments/{instance.pk}/").content.decode()
    return page.split('id="instance-health-detail">', 1)[1].split("</dd>", 1)[0]


def test_an_instance_failing_its_check_says_so_before_it_is_degraded(running, assess, owner_client):
    """For the two minutes between a failing verdict and Degraded, the Overview said "Healthy"
    beside a status saying its servers were down."""
    observe(running, True)
    assert _health_said(owner_client, running).startswith("Healthy")
    start = timezone.now() - timedelta(seconds=30)
    observe(running, False, "Waiting for the instances to become active")
    assess(start)

    said = _health_said(owner_client, running)

    assert "Healthy" not in said
    assert ">Failing its check<" in said
    assert f'datetime="{start.isoformat()}"' in said
    assert ": Waiting for the instances to become active." in said
    assert "It is marked Degraded if this lasts 2\N{NO-BREAK SPACE}minutes." in said
    observe(running, True)
    assess(start + timedelta(seconds=60))
    assert _health_said(owner_client, running).startswith("Healthy")


def test_an_open_page_shows_a_failing_check_without_a_reload(running, owner_client):
    """The header's poll answered nothing while the verdict went from passing to failing: the
    page said Healthy until it was Degraded, two minutes later."""
    url = f"/t/{running.tenant.slug}/deployments/{running.pk}/"
    observe(running, True)
    page = owner_client.get(url).content.decode()
    again = page.split('id="instance-head"', 1)[1].split('hx-get="', 1)[1].split('"', 1)[0]

    def poll():
        return owner_client.get(
            again.replace("&amp;", "&"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-head",
            HTTP_HX_CURRENT_URL=f"http://testserver{url}",
        )  # fmt: skip

    assert poll().status_code == 204
    observe(running, False, "Failing over")
    changed = poll()

    assert changed.status_code == 200
    assert ">Failing its check<" in changed.content.decode()
