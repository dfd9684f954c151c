"""Fleet operations in the admin: platform staff select instances across organizations and
cells, confirm, and an operation is queued on each, as the instance's owners would queue it."""

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import AuditEvent, User
from deployments import selectors, services
from deployments.fleet import fleet_run_advance, fleet_run_stop
from deployments.models import FleetRun, Instance, Operation
from deployments.parameters import split_values
from deployments.spec.params import validate_parameters
from tests.deployments.factories import SPEC, cell, make_instances, postgres_version

CHANGELIST = "/admin/deployments/instance/"


@pytest.fixture
def fleet(db, tenant, owner):
    """Running instances of two organizations on two cells, and a stopped one."""
    version = postgres_version()
    other = account_services.tenant_create(actor=Actor(user=owner), name="Globex")
    running = [
        *make_instances(tenant, version, cell("eu-1"), 2, name="acme"),
        *make_instances(other, version, cell("us-1", "us-east"), 2, name="globex"),
    ]
    stopped = make_instances(tenant, version, Instance.objects.first().cell, 1,
                             state="stopped", name="idle")  # fmt: skip
    # Each with its plan's defaults, as a create leaves them.
    spec = selectors.plan_spec(version)
    plain, _ = split_values(spec.main.parameters, validate_parameters(spec.main.parameters, {}))
    Instance.objects.update(parameters=plain)
    return running, stopped[0]


def _act(client, action, instances, **extra):
    return client.post(
        CHANGELIST, {"action": action, "_selected_action": [i.pk for i in instances], **extra}
    )


def _confirm(client, action, instances):
    """Open the confirmation page; its form's fields, which its button sends."""
    page = _act(client, action, instances)
    assert page.status_code == 200
    form = page.content.decode().split('<form method="post">')[1].split("</form>")[0]
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(
        r'<input type="hidden" name="([a-z0-9_-]+)" value="([^"]*)"', form
    ):
        fields.setdefault(name, []).append(value)
    return page, fields


def _send(client, fields):
    """The confirmation page's button; then the fleet run it started, advanced batch by batch
    as a worker advances it (`fleet.fleet_run_advance`)."""
    response = client.post(CHANGELIST, fields)
    for run in FleetRun.objects.filter(request_id=fields["fleet_request"][0]):
        while fleet_run_advance(run.pk):
            pass
    return response


def _run(fields) -> FleetRun:
    return FleetRun.objects.get(request_id=fields["fleet_request"][0])


def test_staff_restart_instances_of_several_organizations_once_confirmed(staff_client, fleet):
    running, stopped = fleet
    selected = [*running, stopped]

    page, fields = _confirm(staff_client, "restart", selected)

    text = page.content.decode()
    assert "Restart the selected instances: 5" in text
    assert all(i.name in text for i in selected) and "Globex" in text
    assert not Operation.objects.exists()  # nothing queued before the confirmation

    done = _send(staff_client, fields)

    run = _run(fields)
    assert done.status_code == 302 and done["Location"].endswith(f"/fleetrun/{run.pk}/change/")
    restarts = Operation.objects.filter(verb="restart")
    assert sorted(restarts.values_list("instance_id", flat=True)) == sorted(i.pk for i in running)
    assert (run.handled, run.queued, run.finished_at is not None) == (5, 4, True)
    [(instance, why)] = run.refused  # stopped: refused
    assert instance == str(stopped) and why
    shown = staff_client.get(done["Location"]).content.decode()
    assert "5 of 5" in shown and str(stopped) in shown
    staff_events = AuditEvent.objects.filter(action="instance.restart", result="ok")
    assert staff_events.count() == 4 and {e.actor_kind for e in staff_events} == {"staff"}
    started = AuditEvent.objects.get(action="fleet_run.start")
    assert started.payload == {"verb": "restart", "instances": 5, "wave": None,
                               "failures_allowed": 0}  # fmt: skip


def test_a_confirmation_sent_twice_queues_each_operation_once(staff_client, fleet):
    running, _ = fleet
    _, fields = _confirm(staff_client, "stop", running)

    _send(staff_client, fields)
    _send(staff_client, fields)  # a reload, a double click
    assert AuditEvent.objects.filter(action="fleet_run.start").count() == 1

    assert Operation.objects.filter(verb="stop").count() == len(running)
    assert FleetRun.objects.get().queued == len(running)


def test_an_upgrade_shows_each_instance_its_newest_version_and_moves_it_there(staff_client, fleet):
    running, _ = fleet
    newer = services.plan_load(text=SPEC.read_text() + "\n# version 2\n").version
    assert newer.number == running[0].plan_version.number + 1

    page, fields = _confirm(staff_client, "upgrade", running[:2])

    assert f"v{running[0].plan_version.number} → v{newer.number}" in page.content.decode()
    _send(staff_client, fields)
    upgrades = Operation.objects.filter(verb="upgrade")
    assert upgrades.count() == 2, _run(fields).refused
    assert {o.arguments["upgrade"]["to"] for o in upgrades} == {newer.number}


def test_an_upgrade_to_a_change_taken_back_is_not_promised_on_the_confirmation(staff_client, fleet):
    """Version 3 is version 1's text again: the page said "v1 → v3", and the run then refused
    it as running its plan's newest version already."""
    running, _ = fleet
    services.plan_load(text=SPEC.read_text() + "\n# version 2\n")
    taken_back = services.plan_load(text=SPEC.read_text()).version
    assert (taken_back.number, taken_back.digest) == (3, running[0].plan_version.digest)

    page, fields = _confirm(staff_client, "upgrade", running[:1])
    _send(staff_client, fields)

    assert "v1 → v3" not in page.content.decode()
    assert "v1 (v3 has the same text: nothing to upgrade)" in page.content.decode()
    [(_, why)] = _run(fields).refused
    assert "newest version already" in why


def test_an_upgrade_confirmed_after_a_newer_version_was_published_is_not_queued(
    staff_client, fleet
):
    running, _ = fleet
    services.plan_load(text=SPEC.read_text() + "\n# version 2\n")
    _, fields = _confirm(staff_client, "upgrade", running[:1])
    services.plan_load(text=SPEC.read_text() + "\n# version 3\n")  # unseen by whoever confirmed

    _send(staff_client, fields)

    assert not Operation.objects.filter(verb="upgrade").exists()
    [(instance, why)] = _run(fields).refused
    assert instance == str(running[0]) and "published after" in why


def test_an_upgrade_to_a_version_for_other_cells_leaves_the_instances_where_it_does_not_run(
    staff_client, fleet
):
    running, _ = fleet
    text = SPEC.read_text().replace("  entitlements:\n", "  entitlements:\n    cells: [us-1]\n")
    services.plan_load(text=text)  # checked against us-1 alone
    acme, globex = running[0], running[2]  # in eu-1, in us-1
    page, fields = _confirm(staff_client, "upgrade", [acme, globex])

    _send(staff_client, fields)

    # The confirmation said so before it was sent, on acme's row alone.
    rows = page.content.decode().split("<tbody>")[1].split("</tr>")
    [flagged] = [row for row in rows if "Left as it is:" in row]
    assert acme.name in flagged and "does not run in the eu-1 cell" in flagged

    assert list(Operation.objects.values_list("instance_id", flat=True)) == [globex.pk]
    [(instance, why)] = _run(fields).refused
    assert instance == str(acme) and "does not run in the eu-1 cell" in why


def test_a_fleet_restart_that_fails_is_told_to_the_organization_and_to_staff_with_their_link(
    staff_client, fleet, tenant, add_member
):
    """Only the staff member who confirmed it was told, with a link to the organization's page
    they cannot open; the organization whose database failed to restart heard nothing."""
    from django.utils import timezone

    from accounts.models import OutgoingEmail
    from deployments import emails

    add_member("admin@example.com", "admin")
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running[:1])
    _send(staff_client, fields)
    restart = Operation.objects.get(verb="restart")
    Operation.objects.filter(pk=restart.pk).update(  # as the runner ends it
        state=Operation.State.FAILED, finished_at=timezone.now(), error="pods never came back"
    )

    emails.operation_ended(
        Operation.objects.select_related("instance__tenant", "requested_by").get(pk=restart.pk)
    )

    told = {tuple(sorted(email.to)): email for email in OutgoingEmail.objects.all()}
    assert set(told) == {("admin@example.com", "owner@example.com"), ("staff@example.com",)}
    organization, staff = told["admin@example.com", "owner@example.com"], told["staff@example.com",]
    assert organization.subject == staff.subject == "[Opsdeck] acme-0: restart failed"
    assert f"acme-0 ({restart.instance_id}) that the platform team started failed" in (
        organization.body
    )
    assert f"/t/{tenant.slug}/deployments/{restart.instance_id}/" in organization.body
    assert f"acme-0 ({restart.instance_id}, of Acme) you asked for failed" in staff.body
    assert f"/admin/deployments/operation/{restart.pk}/change/" in staff.body


def test_a_fleet_run_request_id_a_member_sends_is_not_told_as_the_platform_teams(
    staff_client, fleet, owner
):
    from django.utils import timezone

    from accounts.models import OutgoingEmail
    from deployments import emails

    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running[2:3])  # Globex's
    _send(staff_client, fields)
    restart = services.instance_action(
        actor=Actor(user=owner), instance=running[0], verb="restart",
        request_id=f"fleet-{_run(fields).request_id}-{running[0].pk}",
    )  # fmt: skip
    Operation.objects.filter(pk=restart.pk).update(
        state=Operation.State.FAILED, finished_at=timezone.now(), error="pods never came back"
    )

    emails.operation_ended(Operation.objects.get(pk=restart.pk))

    [email] = OutgoingEmail.objects.all()
    assert email.to == ["owner@example.com"] and "you asked for failed" in email.body


def test_the_confirmation_page_costs_the_same_queries_for_many_instances(
    staff_client, fleet, tenant, owner
):
    running, _ = fleet

    def queries(instances) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert _act(staff_client, "upgrade", instances).status_code == 200
        return len(captured)

    few = queries(running[:1])
    others = [
        account_services.tenant_create(actor=Actor(user=owner), name=f"Org {n}") for n in range(5)
    ]
    more = [instance for org in [tenant, *others]
            for instance in make_instances(org, running[0].plan_version, running[0].cell, 4,
                                           name="more")]  # fmt: skip
    many = queries([*running, *more])
    assert many == few


def test_staff_who_may_only_view_instances_are_offered_no_fleet_action(client, make_user, fleet):
    from django.contrib.auth.models import Permission

    viewer = make_user("viewer@example.com", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_instance"))
    client.force_login(viewer)
    running, _ = fleet

    listed = client.get(CHANGELIST).content.decode()
    forged = _act(client, "restart", running, confirmed="yes", fleet_request="a" * 32)

    assert 'value="restart"' not in listed
    assert forged.status_code in (200, 302)
    assert not Operation.objects.exists()


def test_an_upgrade_of_more_instances_than_a_request_has_fields_for_is_queued(
    staff_client, tenant, fleet, settings
):
    """Two fields a row made the confirmation of 500 instances more than a request may hold
    (Django's DATA_UPLOAD_MAX_NUMBER_FIELDS, 1,000), refused whole with 400: the page sends
    its selection in one field. Shown here with a limit of 30 fields and 20 instances."""
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 30
    running, _ = fleet
    more = make_instances(tenant, running[0].plan_version, running[0].cell, 16, name="more")
    plain = Instance.objects.get(pk=running[0].pk).parameters  # its plan's defaults
    Instance.objects.filter(pk__in=[i.pk for i in more]).update(parameters=plain)
    services.plan_load(text=SPEC.read_text() + "\n# version 2\n")
    page, fields = _confirm(staff_client, "upgrade", [*running, *more])
    assert "newest version: 20" in page.content.decode()

    done = _send(staff_client, fields)

    assert done.status_code == 302
    assert Operation.objects.filter(verb="upgrade").count() == 20


def test_a_worker_queues_a_fleet_run_a_batch_at_a_time_until_it_is_done(worker, tenant, make_user):
    """The confirmation returns at once; a real worker queues the run's operations, one batch
    (`fleet.BATCH`) a task, each task sending the next."""
    from accounts.audit import Actor as Who
    from deployments import fleet
    from tests.deployments.conftest import wait_for

    instances = make_instances(tenant, postgres_version(), cell(), fleet.BATCH + 10, name="o")
    staff = Who(user=make_user("staff@example.com", is_staff=True, is_superuser=True), staff=True)
    with transaction.atomic():
        run = fleet.fleet_run_start(
            actor=staff, verb="stop", request_id="b" * 32,
            selection=[(instance.pk, None) for instance in instances],
        )  # fmt: skip

    wait_for(
        lambda: FleetRun.objects.filter(pk=run.pk, finished_at__isnull=False).exists(),
        timeout=60,
        what="the run to end",
    )
    run.refresh_from_db()
    assert (run.handled, run.queued, run.refused) == (len(instances), len(instances), [])
    assert Operation.objects.filter(verb="stop").count() == len(instances)


def test_a_run_whose_worker_died_is_sent_again_and_carries_on_where_it_was(
    staff_client, fleet, broker
):
    """A worker that died in a batch left the run claimed, with nothing of that batch
    recorded: once its claim lapses beat sends the run again, and the batch done again queues
    nothing twice (each instance's request id)."""
    from datetime import timedelta

    from django.utils import timezone

    from deployments import fleet as fleet_runs

    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)
    staff_client.post(CHANGELIST, fields)
    run = _run(fields)
    broker.back()
    assert fleet_runs.fleet_runs_resume() == 0  # a minute for its own message
    assert fleet_runs.fleet_run_advance(run.pk)  # the first batch: every instance queued ...
    FleetRun.objects.filter(pk=run.pk).update(  # ... and its worker died before recording it
        handled=0, queued=0, finished_at=None, claimed_until=timezone.now() + timedelta(minutes=2)
    )

    assert fleet_runs.fleet_runs_resume() == 0  # its claim holds
    later = timezone.now() + fleet_runs.CLAIM + timedelta(seconds=1)
    assert fleet_runs.fleet_runs_resume(now=later) == 1
    assert broker.sent == [("deployments.tasks.fleet_run_advance", [run.pk])]
    assert fleet_runs.fleet_run_advance(run.pk, now=later)

    run.refresh_from_db()
    assert (run.handled, run.queued, run.finished_at is not None) == (4, 4, True)
    assert Operation.objects.filter(verb="restart").count() == 4


@pytest.mark.django_db(transaction=True)
def test_one_confirmation_sent_at_once_from_several_tabs_starts_one_run(tenant, make_user):
    from accounts.audit import Actor as Who
    from deployments import fleet as fleet_runs
    from tests.concurrency import race

    instances = make_instances(tenant, postgres_version(), cell(), 2, name="o")
    staff = Who(user=make_user("staff@example.com", is_staff=True, is_superuser=True), staff=True)

    runs = race(
        lambda: fleet_runs.fleet_run_start(
            actor=staff,
            verb="restart",
            request_id="c" * 32,
            selection=[(instance.pk, None) for instance in instances],
        )
    )

    assert all(isinstance(run, FleetRun) for run in runs), runs
    assert len({run.pk for run in runs}) == 1 and FleetRun.objects.count() == 1


def test_staff_who_may_operate_instances_see_the_fleet_run_they_started(client, make_user, fleet):
    """The run's page needed a permission of its own no one was given: 403 for all but
    superusers, right after the confirmation sent them there."""
    from django.contrib.auth.models import Permission

    operator = make_user("operator@example.com", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_instance", "change_instance"])
    )
    client.force_login(operator)
    running, _ = fleet
    _, fields = _confirm(client, "restart", running)

    done = client.post(CHANGELIST, fields)

    assert done.status_code == 302 and _run(fields).requested_by == operator
    assert client.get(done["Location"]).status_code == 200
    assert client.get("/admin/deployments/fleetrun/").status_code == 200


def test_a_hostile_version_in_the_fleet_selection_is_taken_as_none_shown(staff_client, fleet):
    """A version `str.isdigit()` takes and `int()` does not ("²", 5,000 digits) was a server
    error; it is no version the page showed, and the upgrade is refused as one confirmed on a
    page that showed none."""
    running, _ = fleet
    services.plan_load(text=SPEC.read_text() + "\n# version 2\n")
    _, fields = _confirm(staff_client, "upgrade", running[:1])

    for n, version in enumerate(["\u00b2", "9" * 5000]):
        fields["fleet_selection"] = [f"{running[0].pk}:{version}"]
        fields["fleet_request"] = [f"{n:032x}"]
        assert _send(staff_client, fields).status_code == 302
        assert _run(fields).handled == 1


@pytest.mark.parametrize("stranger", ["inst-\x00bad", "inst-TOOLONG00", "*"])
def test_a_fleet_selection_naming_no_instance_id_is_refused_with_a_message(
    staff_client, fleet, stranger
):
    """A NUL character was a server error (PostgreSQL refuses it in the `pk IN (...)` read)."""
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running[:1])
    fields["fleet_selection"] = [f"{running[0].pk} {stranger}"]

    refused = staff_client.post(CHANGELIST, fields, follow=True)

    assert refused.status_code == 200
    assert "named something that is no instance, and nothing was queued" in (
        refused.content.decode()
    )
    assert not FleetRun.objects.exists() and not Operation.objects.exists()


def test_a_run_whose_requester_is_no_longer_staff_queues_nothing_more(fleet, tenant, owner):
    """The worker acted as its requester read at each batch: no longer staff, the run went on
    as their membership allowed (queued where they are owner, recorded as staff's, refused
    elsewhere as "not a member"). It stops, each instance left refused with why."""
    from accounts.audit import Actor as Who
    from deployments import fleet as fleet_runs

    running, _ = fleet
    owner.is_staff = owner.is_superuser = True
    owner.save(update_fields=["is_staff", "is_superuser"])
    run = fleet_runs.fleet_run_start(
        actor=Who(user=owner, staff=True), verb="restart", request_id="d" * 32,
        selection=[(instance.pk, None) for instance in running],
    )  # fmt: skip
    owner.is_staff = False  # left the platform team before a worker got to it
    owner.save(update_fields=["is_staff"])

    while fleet_run_advance(run.pk):
        pass

    run.refresh_from_db()
    assert not Operation.objects.exists()
    assert (run.handled, run.queued, run.finished_at is not None) == (4, 0, True)
    assert {why for _, why in run.refused} == {"Its requester may no longer run fleet actions."}


def test_a_confirmation_sent_again_as_another_action_names_the_run_it_started(staff_client, fleet):
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)
    staff_client.get(_send(staff_client, fields)["Location"])  # its message, read

    again = staff_client.post(CHANGELIST, {**fields, "action": ["stop"]}, follow=True)

    assert "The restart of 4 instances is being queued" in again.content.decode()
    assert "The stop of" not in again.content.decode()
    assert FleetRun.objects.get().verb == "restart"
    assert not Operation.objects.filter(verb="stop").exists()


def test_an_instance_that_fails_unexpectedly_is_refused_and_the_run_goes_on(fleet, tenant, owner):
    """An error no refusal names (here the instance's plan version, corrupted in the database,
    no longer loads) rolled the whole batch back: the worker failed, beat sent the run again a
    few minutes later, it failed the same way, and the run stayed unfinished for ever, its
    other instances never queued. That instance is now refused, and the rest go on."""
    import hashlib

    from deployments import fleet as fleet_runs
    from deployments.models import PlanVersion

    running, _ = fleet
    good = running[0]
    text = "spec: [unclosed\n"
    broken = PlanVersion.objects.create(
        plan=good.plan_version.plan, number=99, spec_text=text, parsed={},
        digest=hashlib.sha256(text.encode()).hexdigest(),
    )  # fmt: skip
    Instance.objects.filter(pk=running[1].pk).update(plan_version=broken)
    owner.is_staff = owner.is_superuser = True
    owner.save(update_fields=["is_staff", "is_superuser"])
    run = fleet_runs.fleet_run_start(
        actor=Actor(user=owner, staff=True), verb="restart", request_id="e" * 32,
        selection=[(running[1].pk, None), (good.pk, None)],
    )  # fmt: skip

    while fleet_run_advance(run.pk):
        pass

    run.refresh_from_db()
    assert (run.handled, run.queued, run.finished_at is not None) == (2, 1, True)
    assert Operation.objects.get().instance_id == good.pk
    [(name, why)] = run.refused
    assert name == str(Instance.objects.get(pk=running[1].pk))
    assert why.startswith("An unexpected error")


def test_an_instance_already_on_the_newest_version_is_not_flagged_as_an_upgrade_refused(
    staff_client, fleet, tenant
):
    """Staff limited Acme to the us-1 cell (an override of the plan's cells) after its
    databases were made in eu-1. A fleet upgrade's confirmation lists acme-0, already on the
    plan's newest version ("(the newest)": nothing to upgrade, the run leaves it alone without
    a word), and yet says on its row "Left as it is: Version 1 of the PostgreSQL plan does not
    run in the eu-1 cell, where acme-0 runs" — of the very version it runs there now."""
    running, _ = fleet
    acme = running[0]
    from billing.models import PlanOverride

    PlanOverride.objects.create(
        tenant=tenant, plan=acme.plan_version.plan, limits={"cells": ["us-1"]}
    )

    page, _ = _confirm(staff_client, "upgrade", [acme])

    [row] = [r for r in page.content.decode().split("<tbody>")[1].split("</tr>") if acme.name in r]
    assert "(the newest)" in row, row
    assert "Left as it is:" not in row, row


def _end(operations, state=Operation.State.SUCCEEDED):
    """The operations end, as a worker would end them (their fleet run is then sent again)."""
    Operation.objects.filter(pk__in=[o.pk for o in operations]).update(state=state)


def test_a_run_in_waves_queues_the_next_wave_once_every_operation_of_the_last_has_ended(
    staff_client, fleet
):
    """Every selected instance got its operation at once: an upgrade that broke the first
    ones broke them all. Two at a time, the next two wait for the first two to end."""
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)

    _send(staff_client, {**fields, "fleet_wave": ["2"]})

    run = _run(fields)
    first = list(Operation.objects.filter(verb="restart"))
    assert (len(first), run.handled, run.finished_at) == (2, 2, None)
    assert not fleet_run_advance(run.pk)  # both still queued: it waits
    _end(first[:1])
    assert not fleet_run_advance(run.pk)  # one still queued
    _end(first[1:])
    assert fleet_run_advance(run.pk)
    run.refresh_from_db()
    last = (run.handled, run.queued, run.finished_at)
    _end(Operation.objects.filter(state=Operation.State.QUEUED))
    assert fleet_run_advance(run.pk)  # as the last operation's end sends it

    run.refresh_from_db()
    assert last == (4, 4, None)  # its last wave queued, not ended yet
    assert Operation.objects.filter(verb="restart").count() == 4
    assert (run.handled, run.queued, run.finished_at is not None) == (4, 4, True)
    page = staff_client.get(f"/admin/deployments/fleetrun/{run.pk}/change/").content.decode()
    assert "2: the next ones once the operations of these have ended" in page


def test_a_run_in_waves_stops_once_more_of_its_operations_failed_than_allowed(staff_client, fleet):
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)
    _send(staff_client, {**fields, "fleet_wave": ["1"], "fleet_failures": ["1"]})
    run = _run(fields)

    _end(Operation.objects.all(), Operation.State.FAILED)  # one failure: allowed
    assert fleet_run_advance(run.pk)
    _end(Operation.objects.filter(state=Operation.State.QUEUED), Operation.State.FAILED)
    assert fleet_run_advance(run.pk)  # two: one too many

    run.refresh_from_db()
    why = "Not queued: the run stopped after 2 of its operations failed (at most 1 allowed)."
    assert Operation.objects.count() == 2 and run.finished_at is not None
    assert (run.failed, run.stopped) == (2, why)
    assert [w for _, w in run.refused] == [why, why]
    page = staff_client.get(f"/admin/deployments/fleetrun/{run.pk}/change/").content.decode()
    assert why in page and "2 of the waves ended (1 allowed)" in page


def test_staff_stop_a_run_and_what_it_queued_runs_on(staff_client, fleet):
    running, _ = fleet
    _, fields = _confirm(staff_client, "stop", running)
    _send(staff_client, {**fields, "fleet_wave": ["1"]})
    run = _run(fields)

    done = staff_client.post(
        "/admin/deployments/fleetrun/", {"action": "stop", "_selected_action": [run.pk]},
        follow=True,
    )  # fmt: skip

    run.refresh_from_db()
    why = "Not queued: staff@example.com stopped the run."
    assert "Stopped 1 run: it queues nothing more" in done.content.decode()
    # Its wave's operation runs on, and the run ends with it.
    assert run.finished_at is None and run.stopped == why
    assert list(Operation.objects.values_list("state", flat=True)) == ["queued"]
    assert not fleet_run_advance(run.pk)  # queues nothing while it runs
    again = staff_client.post(
        "/admin/deployments/fleetrun/", {"action": "stop", "_selected_action": [run.pk]},
        follow=True,
    )  # fmt: skip
    assert "was stopping already, was left as it was" in again.content.decode()

    _end(Operation.objects.all(), Operation.State.FAILED)
    assert fleet_run_advance(run.pk)  # as the operation's end sends it

    run.refresh_from_db()
    assert run.finished_at is not None and (run.stopped, run.failed) == (why, 1)
    assert [w for _, w in run.refused] == [why] * 3
    assert Operation.objects.count() == 1
    assert not fleet_run_advance(run.pk)  # ended: nothing more
    page = staff_client.get(f"/admin/deployments/fleetrun/{run.pk}/change/").content.decode()
    assert "1 of the waves ended (none allowed)" in page


def test_a_run_stopped_after_its_wave_ended_counts_that_waves_failures(staff_client, fleet):
    """Its last operation failed, and staff stopped it before the run was sent again: the
    failure is counted as the wave's end would have counted it."""
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)
    _send(staff_client, {**fields, "fleet_wave": ["2"], "fleet_failures": ["3"]})
    run = _run(fields)
    _end(Operation.objects.all()[:1], Operation.State.FAILED)
    _end(Operation.objects.filter(state=Operation.State.QUEUED))

    assert fleet_run_stop(run, actor=Actor(user=User.objects.get(email="staff@example.com")))

    run.refresh_from_db()
    assert run.finished_at is not None and run.failed == 1
    assert len(run.refused) == len(running) - 2
    assert Operation.objects.count() == 2


@pytest.mark.parametrize("wave", ["0", "51", "two", "-1"])
def test_a_wave_that_is_no_whole_number_in_range_queues_nothing_and_says_why(
    staff_client, fleet, wave
):
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)

    done = staff_client.post(CHANGELIST, {**fields, "fleet_wave": [wave]}, follow=True)

    text = done.content.decode()
    assert "Nothing was queued: select the instances and confirm again." in text
    assert not FleetRun.objects.exists() and not Operation.objects.exists()


def test_an_upgrade_is_offered_in_waves_of_a_few_and_a_restart_all_at_once(staff_client, fleet):
    running, _ = fleet
    upgrade, _ = _confirm(staff_client, "upgrade", running)
    restart, _ = _confirm(staff_client, "restart", running)

    wave = r'<input type="number" id="fleet-wave" name="fleet_wave" min="1" max="50" value="(\d*)"'
    assert re.search(wave, upgrade.content.decode()).group(1) == "5"
    assert re.search(wave, restart.content.decode()).group(1) == ""


def test_a_worker_queues_each_wave_once_the_operations_of_the_last_have_ended(
    worker, cell, plan, tenant, owner, make_user
):
    """The operation ending the wave sends the run again: the next wave does not wait for
    beat's minute."""
    import uuid

    from accounts.audit import Actor as Who
    from deployments import fleet
    from tests.deployments.conftest import wait_done, wait_for

    creates = [
        services.instance_create(
            actor=Who(user=owner),
            tenant=tenant,
            plan=plan,
            name=f"db-{n}",
            parameters={},
            request_id=uuid.uuid4().hex,
        )
        for n in range(2)
    ]
    assert all(wait_done(c).state == Operation.State.SUCCEEDED for c in creates)
    staff = Who(user=make_user("staff@example.com", is_staff=True, is_superuser=True), staff=True)
    with transaction.atomic():
        run = fleet.fleet_run_start(
            actor=staff, verb="restart", request_id="f" * 32, wave=1,
            selection=[(c.instance_id, None) for c in creates],
        )  # fmt: skip

    wait_for(
        lambda: FleetRun.objects.filter(pk=run.pk, finished_at__isnull=False).exists(),
        timeout=60,
        what="the run to end",
    )
    first, second = Operation.objects.filter(verb="restart").order_by("created_at")
    assert first.state == Operation.State.SUCCEEDED
    assert second.created_at >= first.finished_at  # queued once the first wave had ended
    assert wait_done(second).state == Operation.State.SUCCEEDED


def test_a_wave_whose_last_operation_is_cancelled_while_queued_sends_its_run_again(
    staff_client, fleet, owner, broker, django_capture_on_commit_callbacks
):
    """Cancelled before it ran, the operation never reached the runner, which sends the run
    when an operation ends: the next wave waited for beat's minute."""
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)
    _send(staff_client, {**fields, "fleet_wave": ["1"]})
    run = _run(fields)
    [queued] = Operation.objects.all()
    broker.back()

    with django_capture_on_commit_callbacks(execute=True):
        services.operation_cancel(actor=Actor(user=owner), operation=queued, request_id="cancel-1")

    assert ("deployments.tasks.fleet_run_advance", [run.pk]) in broker.sent
    assert fleet_run_advance(run.pk)  # the next wave
    assert Operation.objects.filter(state=Operation.State.QUEUED).count() == 1


@pytest.mark.django_db
def test_staff_stopping_a_run_is_in_the_audit_log(staff_client, owner):
    """The instances left unqueued never get the operation planned for them: nothing but
    Django's own admin log said who stopped it."""
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    run = FleetRun.objects.create(
        request_id="a" * 32, verb="restart", requested_by=owner,
        selection=[["inst-abcdefgh", None], ["inst-bcdefghi", None]],
    )  # fmt: skip

    staff_client.post(
        "/admin/deployments/fleetrun/", {"action": "stop", ACTION_CHECKBOX_NAME: [run.pk]}
    )

    run.refresh_from_db()
    assert run.finished_at is not None and run.stopped
    event = AuditEvent.objects.get(action="fleet_run.stop")
    assert event.actor_email == "staff@example.com"
    assert event.payload == {"verb": "restart", "instances": 2, "not_queued": 2}


@pytest.mark.django_db
def test_the_runs_list_reads_no_runs_selection_and_the_same_queries_for_many(staff_client, owner):
    """Each row's checkbox is labelled with the run's name, which counted its instances: each
    row read its whole selection (thousands of ids for a fleet-wide run) in a query of its own."""

    def runs(count):
        for n in range(FleetRun.objects.count(), count):
            FleetRun.objects.create(
                request_id=f"{n:032x}", verb="restart", requested_by=owner,
                selection=[[f"inst-{i:08d}", None] for i in range(1000)],
            )  # fmt: skip

    def queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert staff_client.get("/admin/deployments/fleetrun/").status_code == 200
        return [query["sql"] for query in captured.captured_queries]

    runs(1)
    queries()  # the first request of a session reads what later ones find cached
    one = queries()
    runs(10)
    many = queries()

    assert len(many) == len(one)
    assert not [sql for sql in many if '"selection" FROM' in sql]


@pytest.mark.django_db
def test_an_action_posted_with_a_null_character_in_an_id_changes_nothing_and_says_so(
    staff_client, fleet
):
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    running, _ = fleet

    answer = staff_client.post(
        CHANGELIST, {"action": "restart", ACTION_CHECKBOX_NAME: [running[0].pk + "\x00"]}
    )

    assert answer.status_code == 302
    assert not Operation.objects.exists() and not FleetRun.objects.exists()
