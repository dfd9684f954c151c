"""Which cells a tenant may create instances on: public ones, and private ones offered to it."""

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services as account_services
from accounts.audit import Actor
from deployments import services
from deployments.models import Cell, Instance
from tests.deployments.conftest import SPEC


@pytest.fixture
def plan(db):
    return services.plan_load(text=SPEC.read_text()).plan


@pytest.fixture
def private_cell(db):
    return Cell.objects.create(name="private-eu", region="eu-private", public=False)


def create(owner, tenant, plan, cell, request_id="r1"):
    return services.instance_create(
        actor=Actor(user=owner),
        tenant=tenant,
        plan=plan,
        name="db",
        parameters={},
        request_id=request_id,
        cell=cell,
    )


def test_a_private_cell_not_offered_to_the_tenant_is_refused_on_its_field(
    owner, tenant, plan, private_cell
):
    Cell.objects.create(name="public", region="us", is_default=True)
    other = account_services.tenant_create(actor=Actor(user=owner), name="Other")
    private_cell.tenants.add(other)

    with pytest.raises(ValidationError) as caught:
        create(owner, tenant, plan, private_cell)

    assert caught.value.message_dict == {
        "cell": ["This region is not offered to your organization."]
    }
    assert not Instance.objects.exists()


def test_a_private_cell_offered_to_the_tenant_is_accepted(owner, tenant, plan, private_cell):
    private_cell.tenants.add(tenant)

    operation = create(owner, tenant, plan, private_cell)

    assert operation.instance.cell == private_cell
    assert list(Cell.objects.offered_to(tenant)) == [private_cell]


def test_without_a_cell_the_tenant_gets_an_offered_one_never_a_private_default(
    owner, tenant, plan, private_cell
):
    private_cell.is_default = True
    private_cell.save()
    public = Cell.objects.create(name="public", region="us")

    operation = create(owner, tenant, plan, None)

    assert operation.instance.cell == public


def test_a_create_without_a_cell_does_not_decrypt_its_cells_secrets(owner, tenant, plan):
    Cell.objects.create(
        name="public", region="us", kubeconfig="apiVersion: v1", backup_credentials={"K": "v"}
    )

    with CaptureQueriesContext(connection) as statements:
        operation = create(owner, tenant, plan, None)

    cell = operation.instance.cell
    assert {"kubeconfig", "backup_credentials"} <= cell.get_deferred_fields()
    assert not [q for q in statements if "kubeconfig" in q["sql"]]
    assert cell.kubeconfig == "apiVersion: v1"  # read, and decrypted, once asked for


def test_with_only_cells_not_offered_to_it_the_tenant_is_told_to_ask_the_platform_team(
    owner, tenant, plan, private_cell
):
    with pytest.raises(ValidationError) as caught:
        create(owner, tenant, plan, None)

    assert caught.value.messages == [
        "No region is offered to your organization yet: ask the platform team."
    ]
    assert not Instance.objects.exists()


@pytest.mark.parametrize("named", [True, False], ids=["region-chosen", "default-region"])
@pytest.mark.django_db(transaction=True)
def test_a_region_withdrawn_while_a_create_goes_on_is_withdrawn_after_it(owner, tenant, named):
    import threading
    import time

    from django.db import connection, transaction

    plan = services.plan_load(text=SPEC.read_text()).plan
    cell = Cell.objects.create(name="eu", region="eu", is_default=True)
    checked, made_before = threading.Event(), []

    def creating() -> None:
        try:
            with transaction.atomic():
                create(owner, tenant, plan, cell if named else None)
                checked.set()
                time.sleep(0.5)  # the rest of the create's transaction
        finally:
            connection.close()

    def withdrawing() -> None:
        try:
            region = Cell.objects.get(pk=cell.pk)
            region.public = False
            region.save()  # as the admin saves it
            made_before.append(Instance.objects.filter(cell=cell).exists())
        finally:
            connection.close()

    creator = threading.Thread(target=creating)
    creator.start()
    assert checked.wait(30)  # the create found the region offered ...
    platform_team = threading.Thread(target=withdrawing)  # ... when it is withdrawn
    platform_team.start()
    creator.join(30)
    platform_team.join(30)

    # The create came first: its instance was made while the region was offered, and the
    # withdrawal, once saved, sees it.
    assert made_before == [True]
    assert Instance.objects.filter(cell=cell).count() == 1
    assert not Cell.objects.get(pk=cell.pk).public
