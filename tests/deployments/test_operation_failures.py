"""What happens when operations go wrong: an operator slow to roll a change out, a cluster
that keeps answering errors, a cancel, and what the emails then say."""

import time
import uuid
from pathlib import Path

import pytest

from accounts.audit import Actor
from deployments import services
from deployments.models import Instance, Operation
from tests.deployments.conftest import wait_done, wait_for
from tests.deployments.test_operation_cancel import _act, _create

VALKEY = Path(__file__).resolve().parents[2] / "specs" / "valkey.yaml"


@pytest.fixture
def running(worker, cell, plan, tenant, owner):
    create = _create(owner, tenant, plan)
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    return Instance.objects.get(pk=create.instance_id)


def _pod_cpus(kube, instance) -> set:
    return {
        p["spec"]["containers"][0].get("resources", {}).get("requests", {}).get("cpu")
        for p in kube.list_objects("v1", "Pod", label_selector=f"cnpg.io/cluster={instance.pk}")
        if p["metadata"]["namespace"] == instance.namespace
    }


def test_a_postgres_cpu_modify_is_not_reported_succeeded_before_the_operator_rolled_it_out(
    running, owner, faults, kube
):
    """The operator has not picked the change up (frozen): the modify said it succeeded, and
    stored 2 cores as deployed, while every server still ran 1. It succeeds once they run 2."""
    assert _pod_cpus(kube, running) == {"1"}
    faults(frozen=["clusters"])
    modify = _act(owner, running, "modify", cpu="2")
    time.sleep(5)
    modify.refresh_from_db()
    during = (modify.state, _pod_cpus(kube, running))
    faults(frozen=[])

    assert during == (Operation.State.RUNNING, {"1"})
    assert wait_done(modify).state == Operation.State.SUCCEEDED
    assert _pod_cpus(kube, running) == {"2"}


def test_a_postgres_memory_modify_succeeds_only_once_the_servers_run_the_new_size(
    running, owner, kube
):
    """No fault at all: at the moment Opsdeck records the modify as succeeded (and stores the
    new size as deployed), the servers must run it."""
    modify = _act(owner, running, "modify", memoryGi="4")

    def ended():
        modify.refresh_from_db()
        return modify.state != Operation.State.RUNNING and modify.state != Operation.State.QUEUED

    wait_for(ended, interval=0.01, what="the modify to end")
    pods = {
        p["spec"]["containers"][0]["resources"]["requests"]["memory"]
        for p in kube.list_objects("v1", "Pod", label_selector=f"cnpg.io/cluster={running.pk}")
        if p["metadata"]["namespace"] == running.namespace
    }
    assert modify.state == Operation.State.SUCCEEDED
    assert pods == {"4Gi"}, f"succeeded while the servers run memory={pods}"


def _plan_with_create_deadline(seconds: int):
    from tests.deployments.conftest import SPEC

    text = SPEC.read_text()
    text = text.replace("plan: postgres-cnpg", "plan: postgres-short-deadline", 1)
    text = text.replace("activeDeadlineSeconds: 3600", f"activeDeadlineSeconds: {seconds}", 1)
    return services.plan_load(text=text).plan


def test_a_create_on_a_cluster_that_keeps_answering_errors_ends_at_its_deadline(
    worker, cell, tenant, owner, faults
):
    """The cluster answers 503 to everything: the create must end at its deadline (as it does
    when the operator never gets healthy), not retry its namespace for ever."""
    plan = _plan_with_create_deadline(3)
    faults(error_503=1.0)
    create = _create(owner, tenant, plan)
    try:
        wait_done(create, timeout=60)
    except AssertionError:
        create.refresh_from_db()
        instance = Instance.objects.get(pk=create.instance_id)
        pytest.fail(
            f"60 s after a 3 s deadline the create is still {create.state} "
            f"(instance {instance.state}, error {create.error!r}, "
            f"{create.transient_failures} retries)"
        )
    assert create.state == Operation.State.FAILED


def test_cancelling_a_create_while_the_cluster_answers_errors_stops_it(
    worker, cell, plan, tenant, owner, faults
):
    """Cancel from the portal while the cluster is down: the run should stop at its next step
    (nothing was taken by the cluster), leaving the instance failed with Retry/Delete."""
    faults(error_503=1.0)
    create = _create(owner, tenant, plan)
    wait_for(
        lambda: Operation.objects.get(pk=create.pk).error.startswith("Retrying"),
        what="the create to retry",
    )
    services.operation_cancel(
        actor=Actor(user=owner), operation=create, request_id=uuid.uuid4().hex
    )
    try:
        wait_done(create, timeout=45)
    except AssertionError:
        create.refresh_from_db()
        pytest.fail(
            f"45 s after the cancel the create is still {create.state}: {create.error!r} "
            f"(cancel_reason {create.cancel_reason!r})"
        )
    assert create.state == Operation.State.CANCELLED


@pytest.fixture
def valkey_plan(transactional_db):
    return services.plan_load(text=VALKEY.read_text()).plan


def test_a_cancel_stops_a_waiting_operation_now_not_at_its_next_poll(
    running, owner, faults, settings
):
    """The cancel's step, sent at once, was dropped as early (the operation was due at its next
    poll), so the cancel waited for the poll (OPSDECK_POLL_MAX may be raised to 30 s)."""
    settings.OPSDECK_POLL_FIRST = 20
    settings.OPSDECK_POLL_MAX = 20
    faults(frozen=["clusters"])
    modify = _act(owner, running, "modify", instances="2")
    wait_for(lambda: modify.task_runs.filter(state="Running").exists(), what="the modify to wait")
    time.sleep(1)
    services.operation_cancel(actor=Actor(user=owner), operation=modify, request_id="stop-now")
    asked = time.monotonic()
    wait_done(modify, timeout=40)
    took = time.monotonic() - asked
    faults(frozen=[])
    assert modify.state == Operation.State.CANCELLED
    assert took < 5, f"the cancel took {took:.1f} s to stop the operation"


def test_the_email_about_a_cancelled_eviction_policy_change_names_it_as_the_portal_does(
    worker, cell, valkey_plan, tenant, owner, faults
):
    """The portal says "Set eviction policy"; the email said "setEvictionPolicy", the spec's
    own identifier."""
    from django.core import mail

    from tests.deployments.test_valkey_plan import eviction_change_cancelled

    create = _create(owner, tenant, valkey_plan, name="cache", servers="1")
    assert wait_done(create, timeout=90).state == Operation.State.SUCCEEDED, create.error
    instance = Instance.objects.get(pk=create.instance_id)
    change = eviction_change_cancelled(owner, instance, faults)
    assert change.state == Operation.State.CANCELLED
    wait_for(lambda: any("cancelled" in m.subject for m in mail.outbox), what="the email")
    email = next(m for m in mail.outbox if "cancelled" in m.subject)
    assert email.subject == "[Opsdeck] cache: set eviction policy cancelled"
    assert "setEvictionPolicy" not in email.body


def test_a_delete_after_a_cancel_keeps_the_cancels_reason(running, owner, faults):
    """The operation a user cancelled, then deleted under, read "The instance is being
    deleted." instead of who cancelled it."""
    faults(frozen=["clusters"])
    modify = _act(owner, running, "modify", instances="2")
    wait_for(lambda: modify.task_runs.filter(state="Running").exists(), what="the modify to wait")
    services.operation_cancel(actor=Actor(user=owner), operation=modify, request_id="stop")
    services.instance_delete(actor=Actor(user=owner), instance=running, request_id="gone")
    faults(frozen=[])

    assert wait_done(modify).state == Operation.State.CANCELLED
    assert modify.error == "Cancelled by owner@example.com."


@pytest.mark.usefixtures("mail_at_commit")
def test_a_removed_member_is_told_nothing_more_and_their_failed_operation_goes_to_the_owners(
    tenant, owner, add_member
):
    """A member started a modify, was removed, and the modify then failed: the email, with the
    instance's name, its error and a link they can no longer open, went to them, and to no
    one who is still in the organization."""
    from django.core import mail

    from accounts import services as accounts_services
    from accounts.models import Membership
    from deployments import emails
    from tests.deployments import factories

    dev = add_member("dev@example.com", "member")
    [instance] = factories.make_instances(
        tenant, factories.postgres_version(), factories.cell(), 1, name="orders"
    )
    failed = factories.make_operation(instance, verb="modify", state="failed", error="disk full")
    Operation.objects.filter(pk=failed.pk).update(requested_by=dev)
    membership = Membership.objects.get(tenant=tenant, user=dev)
    accounts_services.membership_remove(actor=Actor(user=owner), membership=membership)
    mail.outbox.clear()

    emails.operation_ended(
        Operation.objects.select_related("instance__tenant", "requested_by").get(pk=failed.pk)
    )

    assert [m.to for m in mail.outbox] == [[owner.email]]
    assert "that a member who has since left, or whose account was closed, asked for" in (
        mail.outbox[0].body
    )


@pytest.mark.usefixtures("mail_at_commit")
def test_an_account_staff_closed_is_told_nothing_more_of_its_organizations(
    tenant, owner, add_member
):
    """Closed (it signs in no more), an admin's account was still among those told of the
    organization's instances and billing, and alone told of a failure it had asked for."""
    from django.core import mail

    from billing.services import subscription_recipients
    from deployments import emails
    from tests.deployments import factories

    admin = add_member("admin@example.com", "admin")
    billing = add_member("billing@example.com", "billing")
    for closed in (admin, billing):
        closed.is_active = False
        closed.save(update_fields=["is_active"])
    [instance] = factories.make_instances(
        tenant, factories.postgres_version(), factories.cell(), 1, name="orders"
    )
    failed = factories.make_operation(instance, verb="modify", state="failed", error="disk full")
    Operation.objects.filter(pk=failed.pk).update(requested_by=admin)
    mail.outbox.clear()

    emails.operation_ended(
        Operation.objects.select_related("instance__tenant", "requested_by").get(pk=failed.pk)
    )

    assert emails.organization_told(tenant) == subscription_recipients(tenant) == [owner.email]
    assert [m.to for m in mail.outbox] == [[owner.email]]


def test_a_step_the_cluster_throttled_waits_as_long_as_the_cluster_asked(created, faults):
    """A 429 carries Retry-After (API Priority and Fairness sends it): the step came back
    after its own backoff, a quarter of a second, sooner than the cluster asked."""
    from django.utils import timezone

    from deployments import runner

    faults(error_429=1.0)  # each answer: 429, "Retry-After: 1"
    before = timezone.now()

    runner.operation_step(str(created.pk))

    op = Operation.objects.get(pk=created.pk)
    assert op.transient_failures == 1 and op.error.startswith(runner.RETRYING)
    assert (op.next_step_at - before).total_seconds() >= 1.0


@pytest.mark.usefixtures("mail_at_commit")
def test_an_instance_a_removed_member_asked_for_is_ready_and_the_owners_are_told(
    tenant, owner, add_member
):
    """A member asked for a database and was removed before it was ready: the organization
    then had an instance running, and billed, that no one in it had heard of."""
    from django.core import mail

    from accounts import services as accounts_services
    from accounts.models import Membership
    from deployments import emails
    from tests.deployments import factories

    dev = add_member("dev@example.com", "member")
    [instance] = factories.make_instances(
        tenant, factories.postgres_version(), factories.cell(), 1, name="orders"
    )
    created = factories.make_operation(instance, verb="create", state="succeeded")
    Operation.objects.filter(pk=created.pk).update(requested_by=dev)
    membership = Membership.objects.get(tenant=tenant, user=dev)
    accounts_services.membership_remove(actor=Actor(user=owner), membership=membership)
    mail.outbox.clear()

    emails.operation_ended(
        Operation.objects.select_related("instance__tenant", "requested_by").get(pk=created.pk)
    )

    [sent] = mail.outbox
    assert (sent.to, sent.subject) == ([owner.email], "[Opsdeck] orders-0 is ready")
    assert "its create, asked for by a member who has since left or whose account was " in (
        " ".join(sent.body.split())
    )


def _guarded_cell(kubeconfig: dict) -> None:
    """A cell "guarded" on a sandbox that asks for a token (the one `kubeconfig` holds)."""
    import yaml

    services.cell_register(
        name="guarded", kubeconfig=yaml.safe_dump(kubeconfig), region="local",
        backup_destination="s3://sandbox-backups/opsdeck",
        backup_credentials={"ACCESS_KEY_ID": "a", "ACCESS_SECRET_KEY": "b"},
    )  # fmt: skip


def test_a_create_on_a_cell_whose_credentials_expired_waits_for_new_ones_then_runs(
    worker, plan, tenant, owner
):
    """The cell's token expired: the create failed at once, saying "Unauthorized", as if the
    customer had been refused. It waits, saying the platform team must renew them, and runs
    once they have (add_cell with the new kubeconfig)."""
    import yaml

    from deployments.kube import UNAUTHORIZED
    from deployments.models import Cell
    from deployments.runner import RETRYING
    from sandbox.api import Sandbox

    with Sandbox(token="right-token", speed=200) as guarded:
        config = guarded.kubeconfig()
        _guarded_cell(config)
        cell = Cell.objects.get(name="guarded")
        expired = yaml.safe_load(yaml.safe_dump(config))
        expired["users"][0]["user"]["token"] = "expired-token"
        cell.kubeconfig = yaml.safe_dump(expired)
        cell.save(update_fields=["kubeconfig"])
        create = _create(owner, tenant, plan)

        def refused():
            create.refresh_from_db()
            return create.error == f"{RETRYING}{UNAUTHORIZED}"

        wait_for(refused, what="the create to say the credentials were refused")
        assert create.state in (Operation.State.QUEUED, Operation.State.RUNNING)
        services.cell_register(name="guarded", kubeconfig=yaml.safe_dump(config))

        assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    assert Instance.objects.get(pk=create.instance_id).state == Instance.State.RUNNING


def test_a_stop_cancelled_while_the_cluster_throttled_every_request_leaves_it_running(
    running, owner, faults
):
    """A 429 is answered before the request is handled: nothing of the stop was applied. A
    stop the customer cancelled while the cluster throttled it left the instance "Stopped"
    (metered so, Start offered) while its servers ran on."""
    from tests.deployments.test_operation_cancel import _cancel

    faults(error_429=1.0)
    stop = _act(owner, running, "stop")
    wait_for(
        lambda: Operation.objects.get(pk=stop.pk).transient_failures > 0,
        what="the stop to be throttled",
    )
    _cancel(owner, stop)
    ended = wait_done(stop)
    faults(error_429=0.0)

    assert ended.state == Operation.State.CANCELLED
    running.refresh_from_db()
    assert running.state == Instance.State.RUNNING


def test_a_delete_on_a_cell_whose_credentials_stay_refused_fails_at_its_deadline(
    worker, tenant, owner, tmp_path
):
    """The cell's credentials were revoked and nobody renews them: a delete retries the 401,
    saying so, until its workflow's deadline, then fails, rather than waiting for ever; the
    instance runs on, as nothing of a request the cluster refused was done. Once they are
    renewed, a delete removes the instance and its namespace."""
    import yaml

    from deployments.kube import UNAUTHORIZED, KubeDriver, api_client_from_kubeconfig
    from deployments.runner import RETRYING
    from sandbox.api import Sandbox
    from tests.deployments.conftest import SPEC

    delete_head = "      delete:\n        workflow:\n          entrypoint: main\n"
    text = SPEC.read_text().replace("plan: postgres-cnpg", "plan: postgres-short-delete", 1)
    text = text.replace(f"{delete_head}          activeDeadlineSeconds: 1800\n",
                        f"{delete_head}          activeDeadlineSeconds: 3\n", 1)  # fmt: skip
    plan = services.plan_load(text=text).plan
    with Sandbox(token="first-token", speed=200) as guarded:
        config = guarded.kubeconfig()
        _guarded_cell(config)
        create = _create(owner, tenant, plan)
        assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
        instance = Instance.objects.get(pk=create.instance_id)
        guarded.token = "second-token"  # what Opsdeck holds is refused from now on

        delete = services.instance_delete(
            actor=Actor(user=owner), instance=instance, request_id=uuid.uuid4().hex,
            last_backup=False,
        )  # fmt: skip

        def refused():
            delete.refresh_from_db()
            return delete.error == f"{RETRYING}{UNAUTHORIZED}"

        wait_for(refused, what="the delete to say the credentials were refused")
        assert wait_done(delete, timeout=60).state == Operation.State.FAILED
        assert delete.error.startswith("The workflow exceeded its deadline of 3 s."), delete.error
        assert delete.error.endswith(f"The last cluster error: {UNAUTHORIZED}")
        # Nothing was deleted: it runs on.
        assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
        config["users"][0]["user"]["token"] = "second-token"
        renewed = yaml.safe_dump(config)
        cluster = {"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
                   "metadata": {"name": instance.pk, "namespace": instance.namespace}}  # fmt: skip
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": instance.pk}}
        kube = KubeDriver(api_client_from_kubeconfig(renewed), cache_file=str(tmp_path / "d"))
        assert kube.get(cluster) is not None  # the refused delete deleted nothing

        services.cell_register(name="guarded", kubeconfig=renewed)
        again = services.instance_delete(
            actor=Actor(user=owner), instance=Instance.objects.get(pk=instance.pk),
            request_id=uuid.uuid4().hex, last_backup=False,
        )  # fmt: skip

        assert wait_done(again).state == Operation.State.SUCCEEDED, again.error
        assert kube.get(cluster) is None
        gone = kube.get(namespace)
        assert gone is None or gone["metadata"].get("deletionTimestamp")
        kube.close()
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.DELETED
