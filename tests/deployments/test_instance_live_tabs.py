"""The Servers and Events tabs read a running instance's pods, volume claims and Kubernetes
events from its cell when shown, and refresh themselves (the sandbox cluster, a real worker)."""

import uuid

import yaml

from accounts import services as accounts_services
from accounts.audit import Actor
from deployments import services
from deployments.models import Cell, Operation
from tests.deployments import factories
from tests.deployments.conftest import wait_done


def test_a_running_instances_servers_claims_and_events_are_shown_to_its_members(
    worker, cell, plan, tenant, owner, client, add_member
):
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={"instances": "2"}, request_id="live-create",
    )  # fmt: skip
    assert wait_done(create).state == Operation.State.SUCCEEDED, create.error
    instance_id = create.instance_id
    client.force_login(add_member("viewer@example.com", "viewer"))  # reading needs no more
    url = f"/t/{tenant.slug}/deployments/{instance_id}/"

    page = client.get(url, {"tab": "servers"}).content.decode()

    # Both servers, with the role the plan's role label gives them, ready, and their claims.
    assert f"<code>{instance_id}-1</code>" in page and f"<code>{instance_id}-2</code>" in page
    assert "Primary" in page and "Replica" in page
    assert page.count('<span class="badge badge-ok">Running</span>') == 2
    assert 'id="instance-claims"' in page and '<span class="badge badge-ok">Bound</span>' in page
    # It refreshes itself: a poll answers only the live part.
    poll = client.get(
        url, {"tab": "servers"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-live"
    )
    text = poll.content.decode().strip()
    assert text.startswith('<div id="instance-live"') and "<nav" not in text
    assert 'hx-trigger="every 5s' in text and f"{instance_id}-2" in text

    events = client.get(url, {"tab": "events"}).content.decode()
    assert "ClusterPrimaryReady" in events and f"Cluster/{instance_id}" in events


def test_a_cell_that_cannot_be_reached_is_said_not_raised(db, tenant, owner_client):
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }  # fmt: skip
    gone = Cell.objects.create(name="gone", region="nowhere", kubeconfig=yaml.safe_dump(kubeconfig))
    version = factories.postgres_version()
    [instance] = factories.make_instances(tenant, version, gone, 1, name="orders")
    url = f"/t/{tenant.slug}/deployments/{instance.pk}/"

    for tab in ("servers", "events", "logs"):
        response = owner_client.get(url, {"tab": tab})
        assert response.status_code == 200, tab
        assert "The cluster could not be read" in response.content.decode(), tab


def test_another_tenants_instance_tabs_are_a_404(db, tenant, owner_client, make_user):
    stranger = make_user("stranger@example.com")
    other = accounts_services.tenant_create(actor=Actor(user=stranger), name="Globex")
    version = factories.postgres_version()
    [theirs] = factories.make_instances(other, version, factories.cell(), 1, name="their-db")

    for tab in ("servers", "events", "logs"):
        response = owner_client.get(
            f"/t/{tenant.slug}/deployments/{theirs.pk}/", {"tab": tab, "server": uuid.uuid4().hex}
        )
        assert response.status_code == 404, tab
