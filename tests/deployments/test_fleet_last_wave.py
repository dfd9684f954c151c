"""A fleet run in waves ended as its last wave was queued: the failures of that wave were
never counted, and the run read finished while its last operations still ran."""

import pytest

from deployments.fleet import fleet_run_advance
from deployments.models import Operation
from tests.deployments.test_fleet_admin import (  # noqa: F401 - fixtures
    _confirm,
    _end,
    _run,
    _send,
    fleet,
)

pytestmark = pytest.mark.django_db


def test_the_failures_of_a_runs_last_wave_are_counted_on_its_page(staff_client, fleet):  # noqa: F811
    running, _ = fleet
    _, fields = _confirm(staff_client, "restart", running)
    _send(staff_client, {**fields, "fleet_wave": ["2"]})
    run = _run(fields)
    _end(Operation.objects.all())  # the first wave succeeds
    assert fleet_run_advance(run.pk)  # the last wave is queued

    _end(Operation.objects.filter(state=Operation.State.QUEUED), Operation.State.FAILED)
    fleet_run_advance(run.pk)  # as the last operation's end sends it (`operation_ended`)

    run.refresh_from_db()
    page = staff_client.get(f"/admin/deployments/fleetrun/{run.pk}/change/").content.decode()
    assert run.failed == 2
    assert "0 of the waves ended" not in page
