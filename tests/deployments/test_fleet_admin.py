"""Fleet operations in the admin: platform staff select instances across organizations and
cells, confirm, and an operation is queued on each, as the instance's owners would queue it."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import selectors, services
from deployments.models import Instance, Operation
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
    """The confirmation page's button."""
    return client.post(CHANGELIST, fields)


def test_staff_restart_instances_of_several_organizations_once_confirmed(staff_client, fleet):
    running, stopped = fleet
    selected = [*running, stopped]

    page, fields = _confirm(staff_client, "restart", selected)

    text = page.content.decode()
    assert "Restart the selected instances: 5" in text
    assert all(i.name in text for i in selected) and "Globex" in text
    assert not Operation.objects.exists()  # nothing queued before the confirmation

    done = _send(staff_client, fields)

    assert done.status_code == 302
    restarts = Operation.objects.filter(verb="restart")
    assert sorted(restarts.values_list("instance_id", flat=True)) == sorted(i.pk for i in running)
    messages = [str(m) for m in done.wsgi_request._messages]
    assert "Restart queued: 4." in messages
    assert any(m.startswith(f"Not done for {stopped}:") for m in messages)  # stopped: refused
    staff_events = AuditEvent.objects.filter(action="instance.restart", result="ok")
    assert staff_events.count() == 4 and {e.actor_kind for e in staff_events} == {"staff"}


def test_a_confirmation_sent_twice_queues_each_operation_once(staff_client, fleet):
    running, _ = fleet
    _, fields = _confirm(staff_client, "stop", running)

    _send(staff_client, fields)
    _send(staff_client, fields)  # a reload, a double click

    assert Operation.objects.filter(verb="stop").count() == len(running)


def test_an_upgrade_shows_each_instance_its_newest_version_and_moves_it_there(staff_client, fleet):
    running, _ = fleet
    newer = services.plan_load(text=SPEC.read_text() + "\n# version 2\n").version
    assert newer.number == running[0].plan_version.number + 1

    page, fields = _confirm(staff_client, "upgrade", running[:2])

    assert f"v{running[0].plan_version.number} → v{newer.number}" in page.content.decode()
    done = _send(staff_client, fields)
    upgrades = Operation.objects.filter(verb="upgrade")
    assert upgrades.count() == 2, [str(m) for m in done.wsgi_request._messages]
    assert {o.arguments["upgrade"]["to"] for o in upgrades} == {newer.number}


def test_an_upgrade_confirmed_after_a_newer_version_was_published_is_not_queued(
    staff_client, fleet
):
    running, _ = fleet
    services.plan_load(text=SPEC.read_text() + "\n# version 2\n")
    _, fields = _confirm(staff_client, "upgrade", running[:1])
    services.plan_load(text=SPEC.read_text() + "\n# version 3\n")  # unseen by whoever confirmed

    done = _send(staff_client, fields)

    assert not Operation.objects.filter(verb="upgrade").exists()
    assert any("Not done for" in str(m) for m in done.wsgi_request._messages)


def test_the_confirmation_page_costs_the_same_queries_for_many_instances(
    staff_client, fleet, tenant
):
    running, _ = fleet

    def queries(instances) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert _act(staff_client, "upgrade", instances).status_code == 200
        return len(captured)

    few = queries(running[:1])
    many = queries([*running, *make_instances(tenant, running[0].plan_version,
                                                  running[0].cell, 20, name="more")])  # fmt: skip
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
