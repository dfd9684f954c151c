"""The instance page against a real worker and the sandbox cluster."""

from accounts.audit import Actor
from deployments import services
from deployments.models import Operation
from tests.deployments.conftest import wait_done


def test_pressing_stop_on_the_page_stops_the_instance(worker, cell, plan, tenant, owner, client):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders", parameters={},
        request_id="page-create",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    client.force_login(owner)
    url = f"/t/{tenant.slug}/deployments/{create.instance_id}/"
    assert 'class="badge badge-state-running"' in client.get(url).content.decode()

    pressed = client.post(f"{url}actions/stop/", {"request_id": "page-stop"})

    assert pressed.status_code == 302
    stop = Operation.objects.get(instance_id=create.instance_id, verb="stop")
    assert wait_done(stop).state == Operation.State.SUCCEEDED, stop.error
    page = client.get(url).content.decode()
    assert '<span class="badge badge-state-stopped" id="instance-state">Stopped</span>' in page
    assert ">Start</button>" in page and 'disabled aria-describedby="why-start"' not in page
