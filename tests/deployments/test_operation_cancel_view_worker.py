"""Cancel on the Operations tab against a real worker and the sandbox cluster."""

from accounts.audit import Actor
from deployments import services
from deployments.models import Operation
from tests.deployments.conftest import wait_done, wait_for


def test_cancel_on_the_page_stops_a_running_operation(
    worker, cell, plan, tenant, owner, client, faults
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders", parameters={},
        request_id="cancel-create",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    client.force_login(owner)
    url = f"/t/{tenant.slug}/deployments/{create.instance_id}/"
    faults(frozen=["clusters"])  # the stop waits on the operator for ever
    client.post(f"{url}actions/stop/", {"request_id": "page-stop"})
    stop = Operation.objects.get(instance_id=create.instance_id, verb="stop")
    wait_for(lambda: stop.task_runs.filter(state="Running").exists(), what="the stop to wait")

    pressed = client.post(
        f"{url}operations/{stop.pk}/cancel/", {"request_id": "page-cancel"}, follow=True
    )
    faults(frozen=[])

    assert "Stop of orders stops at its next step" in pressed.content.decode()
    assert wait_done(stop).state == Operation.State.CANCELLED
    assert stop.error.startswith("Cancelled by owner@example.com.")
    tab = client.get(url, {"tab": "operations"}).content.decode()
    assert f"operations/{stop.pk}/cancel/" not in tab
