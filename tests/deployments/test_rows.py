"""Rows the runner writes in SQL (`deployments.rows`) are the rows the ORM would write: read
back through the ORM, they hold the same values, encrypted and JSON fields included."""

import json
import uuid

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import rows, services
from deployments.models import Cell, Instance, InstanceStateChange, Operation
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS


def _instance(tenant, owner) -> Instance:
    Cell.objects.create(name="local", region="eu-local", is_default=True, **BACKUPS)
    plan = services.plan_load(text=SPEC.read_text()).plan
    create = services.instance_create(
        actor=Actor(user=owner), tenant=tenant, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    return create.instance


def test_an_update_in_sql_writes_what_save_would(db, tenant, owner):
    instance = _instance(tenant, owner)
    instance.parameters = {**instance.parameters, "instances": 3}
    instance.secret_parameters = json.dumps({"password": "s3cret"})
    instance.state = Instance.State.RUNNING

    rows.writes((), (instance, ["parameters", "secret_parameters", "plan_version", "state"])).run()

    fresh = Instance.objects.get(pk=instance.pk)
    assert fresh.parameters["instances"] == 3 and fresh.state == Instance.State.RUNNING
    assert json.loads(fresh.secret_parameters) == {"password": "s3cret"}
    with connection.cursor() as cursor:  # stored encrypted, as the field stores it
        cursor.execute("SELECT secret_parameters FROM deployments_instance WHERE id = %s",
                       [instance.pk])  # fmt: skip
        assert "s3cret" not in cursor.fetchone()[0]


def test_an_insert_in_sql_applies_the_defaults_and_takes_the_generated_key(db, tenant, owner):
    instance = _instance(tenant, owner)
    before = timezone.now()
    change = InstanceStateChange(instance=instance, from_state="creating", to_state="running")

    rows.insert(change)

    assert change.pk is not None and not change._state.adding
    stored = InstanceStateChange.objects.get(pk=change.pk)
    assert (stored.instance_id, stored.from_state, stored.to_state, stored.reason) == (
        instance.pk, "creating", "running", "",
    )  # fmt: skip
    assert before <= stored.at <= timezone.now() and stored.operation_id is None


def test_rows_inserted_together_are_one_statement_and_may_name_each_other(db, tenant, owner):
    instance = _instance(tenant, owner)
    operation = Operation(
        instance=instance, verb="backup", request_id="r-1", plan_version=instance.plan_version,
        requested_secret=json.dumps({"password": "s3cret"}),
    )  # fmt: skip
    change = InstanceStateChange(instance=instance, to_state="running", operation=operation)
    event = AuditEvent(tenant=tenant, actor=owner, action="operation.queued", payload={"n": 1})

    with CaptureQueriesContext(connection) as statements:
        rows.insert(operation, change, event)

    assert len(statements.captured_queries) == 1
    # The generated keys of each (the operation's was made before), read as the ORM reads them.
    assert change.pk is not None and event.pk is not None
    assert InstanceStateChange.objects.get(pk=change.pk).operation_id == operation.pk
    assert AuditEvent.objects.get(pk=event.pk).payload == {"n": 1}
    assert json.loads(Operation.objects.get(pk=operation.pk).requested_secret) == {
        "password": "s3cret"
    }
