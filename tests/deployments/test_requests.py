"""Requests against instances as hostile, concurrent and careless users send them: one object
per request id, the role checked first, clear field errors for bad input, nothing changed."""

import importlib
import json
import re
import uuid
from datetime import datetime
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import services as account_services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent
from deployments import lifecycle, services
from deployments.models import Cell, Instance, Operation, Snapshot
from tests.concurrency import race
from tests.deployments.conftest import SPEC
from tests.deployments.factories import BACKUPS


def _create(owner, tenant, plan, *, request_id=None, name="orders", **parameters):
    return services.instance_create(
        actor=Actor(user=owner),
        tenant=tenant,
        plan=plan,
        name=name,
        parameters=parameters,
        request_id=request_id or uuid.uuid4().hex,
    )


def _act(user, instance, verb, request_id=None, **parameters):
    return services.instance_action(
        actor=Actor(user=user),
        instance=instance,
        verb=verb,
        request_id=request_id or uuid.uuid4().hex,
        parameters=parameters,
    )


@pytest.fixture
def running(cell, plan, tenant, owner):
    """An instance marked running (no worker: the operations below only queue)."""
    op = _create(owner, tenant, plan)
    Operation.objects.filter(pk=op.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=op.instance_id).update(state=Instance.State.RUNNING)
    return Instance.objects.get(pk=op.instance_id)


def test_concurrent_creates_with_one_request_id_make_one_instance(cell, plan, tenant, owner):
    results = race(lambda: _create(owner, tenant, plan, request_id="double-submit"))

    assert all(isinstance(r, Operation) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert Instance.objects.filter(tenant=tenant).count() == 1
    assert AuditEvent.objects.filter(tenant=tenant, action="instance.create").count() == 1


def _each_refused_as_taken(owner, tenant, plan, names, taken):
    """Each of `names` is refused as the name `taken` another instance has."""
    for same in names:
        with pytest.raises(ValidationError) as refused:
            _create(owner, tenant, plan, name=same)

        assert refused.value.message_dict == {
            "name": [
                f"Another instance of your organization is called “{taken}”: choose another name."
            ]
        }


def test_an_organization_names_one_live_instance_by_a_name_whatever_its_case(
    cell, plan, tenant, owner, make_user
):
    first = _create(owner, tenant, plan, name="orders")

    # Fullwidth letters too.
    _each_refused_as_taken(
        owner, tenant, plan, ["Orders", "\uff4f\uff52\uff44\uff45\uff52\uff53"], "orders"
    )
    assert list(Instance.objects.filter(tenant=tenant)) == [first.instance]
    assert Operation.objects.filter(instance__tenant=tenant).count() == 1
    # Another organization's instance may have it; a deleted one leaves it free.
    other = account_services.tenant_create(actor=Actor(user=make_user("o@example.com")), name="O")
    services.instance_create(
        actor=Actor(user=other.memberships.get().user), tenant=other, plan=plan, name="orders",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Instance.objects.filter(pk=first.instance_id).update(state=Instance.State.DELETED)
    assert _create(owner, tenant, plan, name="ORDERS").instance.name == "ORDERS"


def test_a_name_with_a_hyphen_that_looks_like_another_is_that_name(cell, plan, tenant, owner):
    first = _create(owner, tenant, plan, name="orders-db")

    # A non-breaking hyphen, minus signs, en and em dashes, a horizontal bar, the Armenian
    # hyphen: each reads as "orders-db".
    look_alikes = ["\u2011", "\u2212", "\u2013", "\u2014", "\u2015", "\u02d7", "\u2796", "\u058a"]
    _each_refused_as_taken(
        owner, tenant, plan, [f"orders{dash}db" for dash in look_alikes], "orders-db"
    )
    assert list(Instance.objects.filter(tenant=tenant)) == [first.instance]
    # Alone, such a name is kept with the hyphen it reads as.
    assert _create(owner, tenant, plan, name="cache\u2010eu").instance.name == "cache-eu"
    # The marks of East Asian text that are no hyphen stay as typed.
    for name in ("\u30c7\u30fc\u30bf", "\u6771\u4eac\u301c\u5927\u962a"):
        assert _create(owner, tenant, plan, name=name).instance.name == name


def test_a_proposed_name_is_one_no_live_instance_has_and_fits(cell, plan, tenant, owner):
    from deployments import selectors

    wanted = "x" * 98 + "-restored"
    first = selectors.instance_name_free(tenant, wanted, services.NAME_MAX)
    _create(owner, tenant, plan, name=first)

    second = selectors.instance_name_free(tenant, wanted, services.NAME_MAX)

    assert first == wanted[:100] and second == wanted[:98] + "-2"


def test_concurrent_creates_of_one_name_make_one_instance(cell, plan, tenant, owner):
    results = race(lambda: _create(owner, tenant, plan, name="orders"))

    made = [r for r in results if isinstance(r, Operation)]
    refused = [r for r in results if isinstance(r, ValidationError)]
    assert len(made) == 1 and len(refused) == 3, results
    assert all(list(r.message_dict) == ["name"] for r in refused)
    assert Instance.objects.filter(tenant=tenant).count() == 1


def test_a_create_refused_for_its_values_says_too_what_is_wrong_with_its_name(
    cell, plan, tenant, owner
):
    _create(owner, tenant, plan, name="orders")

    for name, says in [("Orders", "Another instance of your organization is called “orders”"),
                       ("x" * 101, "Use at most 100 characters.")]:  # fmt: skip
        with pytest.raises(ValidationError) as refused:
            _create(owner, tenant, plan, name=name, instances="99")

        assert refused.value.message_dict["name"][0].startswith(says)
        assert "instances" in refused.value.message_dict
    assert Instance.objects.filter(tenant=tenant).count() == 1


def test_a_name_typed_short_but_long_once_written_out_is_told_what_it_counts(
    cell, plan, tenant, owner
):
    """Names are stored with plain letters: "\u337b" (one character) is "\u5e73\u6210" (two), so
    60 of them typed, under the field's 100, are 120 stored."""
    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, name="\u337b" * 60)

    assert refused.value.message_dict["name"] == [
        "Use at most 100 characters (this has 120 once written out)."
    ]
    assert not Instance.objects.exists()


def test_a_create_writes_what_it_makes_in_one_statement_however_many_the_tenant_holds(
    cell, plan, tenant, owner
):
    def create(name):
        with CaptureQueriesContext(connection) as statements:
            operation = _create(owner, tenant, plan, name=name)
        return operation, [q["sql"] for q in statements.captured_queries]

    create("first")  # what a process reads once (the plan's spec) is read by its first create
    _, statements = create("orders")
    for n in range(3):
        _create(owner, tenant, plan, name=f"more-{n}")
    later, statements_later = create("billing")

    # The instance, its first state change, its backup schedule, its operation and the audit
    # event, all in one statement that binds the request id to the operation, beside the
    # request id's claim.
    writes = [sql for sql in statements if sql.lstrip().startswith(("INSERT", "WITH"))]
    assert len(writes) == 2, writes
    made = writes[1]
    for table in [
        "deployments_instance",
        "deployments_instancestatechange",
        "deployments_backupschedule",
        "deployments_operation",
        "accounts_auditevent",
    ]:
        assert f"INSERT INTO {table} " in made, table
    assert "UPDATE accounts_requestkey SET" in made
    # 11: the tenant is locked once, before the role is read; the limits are checked under it.
    # No savepoint: a name taken is looked up once the create has rolled back.
    assert len(statements) == len(statements_later) == 11, statements
    assert not [sql for sql in statements if "SAVEPOINT" in sql]
    assert sum("FOR NO KEY UPDATE" in sql for sql in statements) == 1
    # The plan's spec is parsed once per process: no create reads its text again.
    assert not [sql for sql in statements_later if "spec_text" in sql]
    instance = later.instance
    assert instance.history.get().to_state == Instance.State.CREATING
    assert instance.backup_schedule.next_run_at is not None
    assert (
        AuditEvent.objects.get(action="instance.create", target_id=instance.pk).payload["name"]
        == "billing"
    )


def test_instances_that_shared_a_name_are_told_apart_before_the_constraint(db, tenant, owner):
    from django.apps import apps
    from django.db import connection

    migration = importlib.import_module("deployments.migrations.0019_instance_names_apart")
    with connection.cursor() as cursor:  # as before the constraint (the test's rollback undoes it)
        cursor.execute("DROP INDEX instance_name_once")
    Cell.objects.create(name="eu-1", region="eu", is_default=True, **BACKUPS)
    plan = services.plan_load(text=SPEC.read_text()).plan
    made = [_create(owner, tenant, plan, name=f"n{i}").instance for i in range(4)]
    for instance, name in zip(made, ["orders", "Orders", "orders (2)", "orders"], strict=True):
        Instance.objects.filter(pk=instance.pk).update(name=name)
    Instance.objects.filter(pk=made[3].pk).update(state=Instance.State.DELETED)

    migration.names_apart(apps, SimpleNamespace(connection=connection))

    names = dict(Instance.objects.values_list("pk", "name"))
    assert [names[i.pk] for i in made] == ["orders", "Orders (3)", "orders (2)", "orders"]


def test_a_create_request_id_reused_with_other_parameters_is_refused(cell, plan, tenant, owner):
    _create(owner, tenant, plan, request_id="r-1", instances="1")

    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, request_id="r-1", instances="2")

    assert "already sent with different values" in str(refused.value)
    assert Instance.objects.filter(tenant=tenant).count() == 1


def test_a_request_id_reused_for_another_verb_is_refused(running, owner):
    _act(owner, running, "restart", request_id="r-2")

    with pytest.raises(ValidationError):
        _act(owner, running, "stop", request_id="r-2")

    assert list(running.operations.values_list("verb", flat=True)) == ["restart", "create"]


def test_a_repeated_create_without_a_password_returns_the_first_instance(cell, plan, tenant, owner):
    # A blank password is generated on each submit: the repeat is recognised by what was sent.
    first = _create(owner, tenant, plan, request_id="r-3", password="")
    again = _create(owner, tenant, plan, request_id="r-3", password="")

    assert again.pk == first.pk


def test_a_stranger_with_another_tenants_request_id_gets_a_denial_not_the_operation(
    cell, plan, tenant, owner, make_user
):
    op = _create(owner, tenant, plan, request_id="secret-request")
    stranger = make_user("stranger@example.com")

    with pytest.raises(ActionDenied):
        _create(stranger, tenant, plan, request_id="secret-request")

    assert Operation.objects.count() == 1
    assert AuditEvent.objects.filter(actor=stranger, result="denied").exists()
    assert op.instance.tenant == tenant


def test_concurrent_modifies_with_one_request_id_queue_one_operation(running, owner):
    results = race(lambda: _act(owner, running, "modify", request_id="m-1", instances=2))

    assert all(isinstance(r, Operation) for r in results), results
    assert running.operations.filter(verb="modify").count() == 1


def test_a_second_delete_returns_the_pending_one(running, owner, tenant):
    _act(owner, running, "restart")  # still queued: the delete waits behind nothing, cancels it
    first = services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d-1")
    second = services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d-2")

    first.refresh_from_db()
    assert second.pk == first.pk
    assert first.state == Operation.State.QUEUED
    assert AuditEvent.objects.filter(tenant=tenant, action="instance.delete").count() == 1


def test_a_delete_queued_behind_a_running_operation_is_returned_again(running, owner):
    running_op = _act(owner, running, "restart")
    Operation.objects.filter(pk=running_op.pk).update(state=Operation.State.RUNNING)
    first = services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d-3")
    second = services.instance_delete(actor=Actor(user=owner), instance=running, request_id="d-4")

    assert second.pk == first.pk
    assert running.operations.filter(verb="delete").count() == 1


def test_the_last_snapshot_before_deletion_keeps_its_derived_id_short(cell, tenant, owner):
    text = SPEC.read_text().replace("snapshotBeforeDeletion: false", "snapshotBeforeDeletion: true")
    plan = services.plan_load(text=text.replace("plan: postgres-cnpg", "plan: pg-last")).plan
    op = _create(owner, tenant, plan)
    Instance.objects.filter(pk=op.instance_id).update(state=Instance.State.RUNNING)
    Operation.objects.filter(pk=op.pk).update(state=Operation.State.SUCCEEDED)
    instance = Instance.objects.get(pk=op.instance_id)

    services.instance_delete(actor=Actor(user=owner), instance=instance, request_id="d" * 64)

    backup = instance.operations.get(verb="backup")
    assert len(backup.request_id) <= 64
    assert Snapshot.objects.filter(operation=backup).exists()


# --- bad input: a field error, nothing stored -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "field"),
    [("x" * 101, "name"), ("bad\x00name", "name"), ("   ", "name")],
)
def test_an_unusable_instance_name_is_a_field_error(cell, plan, tenant, owner, name, field):
    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, name=name)

    assert field in refused.value.message_dict
    assert not Instance.objects.exists()


def test_a_request_id_over_64_characters_is_a_field_error(cell, plan, tenant, owner):
    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, request_id="r" * 65)

    assert "request_id" in refused.value.message_dict
    assert not Instance.objects.exists()


def test_a_number_too_large_for_a_float_is_a_field_error(cell, plan, tenant, owner):
    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, storageGi=10**400)

    assert refused.value.message_dict["storageGi"] == ["Must be a number."]


@pytest.mark.parametrize("given", [["instances", 2], "instances=2"])
def test_parameters_that_are_not_a_mapping_are_a_field_error(
    cell, plan, tenant, owner, running, given
):
    with pytest.raises(ValidationError) as refused:
        services.instance_create(
            actor=Actor(user=owner), tenant=tenant, plan=plan, name="x", parameters=given,
            request_id=uuid.uuid4().hex,
        )  # fmt: skip
    assert "parameters" in refused.value.message_dict
    with pytest.raises(ValidationError):
        services.instance_action(
            actor=Actor(user=owner), instance=running, verb="modify", parameters=given,
            request_id=uuid.uuid4().hex,
        )  # fmt: skip


def test_a_fractional_server_count_is_refused_before_anything_runs(running, owner):
    with pytest.raises(ValidationError) as refused:
        _act(owner, running, "modify", instances="2.5")

    assert refused.value.message_dict["instances"] == ["Must be a whole number."]
    assert not running.operations.filter(verb="modify").exists()


def test_a_custom_verb_without_parameters_refuses_unknown_ones(running, owner):
    with pytest.raises(ValidationError) as refused:
        _act(owner, running, "reloadConfiguration", x=1)

    assert refused.value.message_dict["x"] == ["Unknown parameter."]
    assert not running.operations.filter(verb="reloadConfiguration").exists()


def test_a_system_verb_refuses_parameters_it_does_not_take(running, owner):
    with pytest.raises(ValidationError):
        _act(owner, running, "stop", force=True)


def test_a_point_in_time_without_a_time_zone_is_a_field_error(running, owner, tenant):
    snapshot = Snapshot.objects.create(
        tenant=tenant, instance=running, source_instance_id=running.pk,
        plan_version=running.plan_version, name="s", status=Snapshot.Status.COMPLETED,
    )  # fmt: skip

    with pytest.raises(ValidationError) as refused:
        services.snapshot_restore(
            actor=Actor(user=owner), snapshot=snapshot, name="copy", request_id="t-1",
            target_time=datetime(2026, 11, 30, 12, 0),
        )  # fmt: skip

    assert "target_time" in refused.value.message_dict
    assert Instance.objects.count() == 1


def test_an_organization_member_without_the_role_is_denied_before_the_repeat(
    cell, plan, tenant, owner, add_member
):
    _create(owner, tenant, plan, request_id="r-9")
    viewer = add_member("viewer@example.com", "viewer")

    with pytest.raises(ActionDenied):
        _create(viewer, tenant, plan, request_id="r-9")

    assert AuditEvent.objects.filter(actor=viewer, result="denied").exists()


def test_operations_queued_before_the_upgrade_keep_their_request_and_their_secrets(running, owner):
    import importlib

    from django.apps import apps

    from deployments import runner
    from deployments.parameters import verb_values

    # As the earlier code queued them: the whole parameter set, a verb's passwords mixed in.
    hidden = json.loads(running.secret_parameters)
    rotation = Operation.objects.create(
        instance=running, verb="rotateCredentials", request_id="old-1",
        plan_version=running.plan_version, parameters=running.parameters,
        secret_parameters=json.dumps({**hidden, "newPassword": "the-new-password"}),
    )  # fmt: skip
    modify = Operation.objects.create(
        instance=running, verb="modify", request_id="old-2", plan_version=running.plan_version,
        parameters={**running.parameters, "instances": 3}, secret_parameters=json.dumps(hidden),
    )  # fmt: skip

    importlib.import_module("deployments.migrations.0005_requested_changes").forwards(apps, None)
    token = runner._claim(str(rotation.pk), timezone.now()).claim_token
    runner._begin(
        Operation.objects.select_related("instance").get(pk=rotation.pk), timezone.now(), token
    )

    rotation.refresh_from_db()
    modify.refresh_from_db()
    assert (
        "newPassword" not in rotation.parameters and "newPassword" not in rotation.secret_parameters
    )
    assert verb_values(rotation) == {"newPassword": "the-new-password"}
    assert modify.requested["instances"] == 3


@pytest.mark.parametrize("password", ["\ud800" * 12, "with-a-nul\x00-inside", "bell\x07-bell-bell"])
def test_a_password_that_is_not_clean_text_is_a_field_error(cell, plan, tenant, owner, password):
    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, password=password)

    assert "password" in refused.value.message_dict
    assert not Instance.objects.exists()


def test_values_too_long_to_read_are_refused_before_anything_is_stored(cell, plan, tenant, owner):
    with pytest.raises(ValidationError) as refused:
        _create(owner, tenant, plan, storageGi=10**5000)

    assert "cannot be read" in str(refused.value)
    assert not Instance.objects.exists()


def test_an_action_that_is_not_a_name_is_refused(running, owner):
    with pytest.raises(ValidationError):
        _act(owner, running, ["stop"])


def test_a_modify_that_changes_nothing_is_refused(running, owner):
    with pytest.raises(ValidationError) as refused:
        _act(owner, running, "modify", instances=running.parameters["instances"])

    assert "already has these values: change one to modify it" in str(refused.value)
    assert not running.operations.filter(verb="modify").exists()


def test_a_custom_verb_cannot_set_a_value_the_instance_parameter_refuses(cell, tenant, owner):
    # A rotation whose own parameter allows 1 character, for a password that needs 12.
    text = re.sub(
        r"(key: newPassword\n(?:.*\n){3}\s*limits: )\{min: 12", r"\1{min: 1", SPEC.read_text()
    )
    assert "limits: {min: 1, max: 100}" in text
    plan = services.plan_load(text=text.replace("plan: postgres-cnpg", "plan: pg-short")).plan
    op = _create(owner, tenant, plan)
    Operation.objects.filter(pk=op.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=op.instance_id).update(state=Instance.State.RUNNING)

    with pytest.raises(ValidationError) as refused:
        _act(owner, op.instance, "rotateCredentials", newPassword="short")

    assert refused.value.message_dict["newPassword"] == [
        "Must be between 12 and 100 characters long."
    ]


def test_only_an_instance_whose_create_failed_can_run_it_again(running, owner):
    modify = _act(owner, running, "modify", instances=2)
    Operation.objects.filter(pk=modify.pk).update(
        state=Operation.State.FAILED, started_at=timezone.now()
    )
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.FAILED)

    with pytest.raises(ValidationError) as refused:
        _act(owner, running, "create")

    assert "whose create failed" in str(refused.value)


def test_a_second_cancel_of_a_stopping_operation_says_so_and_changes_nothing(running, owner):
    stop = _act(owner, running, "stop")
    Operation.objects.filter(pk=stop.pk).update(state=Operation.State.RUNNING)
    services.operation_cancel(actor=Actor(user=owner), operation=stop, request_id="tab-1")

    with pytest.raises(ValidationError) as again:  # another tab's form, another request id
        services.operation_cancel(actor=Actor(user=owner), operation=stop, request_id="tab-2")

    assert again.value.messages == [
        "The operation is stopping already: Cancelled by owner@example.com."
    ]
    assert AuditEvent.objects.filter(action="operation.cancel").count() == 1
    # The first form sent again is the same request: its answer, not an error.
    assert (
        services.operation_cancel(actor=Actor(user=owner), operation=stop, request_id="tab-1")
        == stop
    )


def test_a_refusal_tells_the_state_now_from_the_one_queued_operations_will_leave(running, owner):
    with pytest.raises(ActionDenied) as now:
        _act(owner, running, "start")
    assert now.value.reason == "The instance is running; start needs it to be stopped."

    _act(owner, running, "stop")  # queued: the instance still runs
    with pytest.raises(ActionDenied) as later:
        _act(owner, running, "restart")

    assert later.value.reason.startswith(
        "Once the operations queued before it have run, the instance will be stopped; restart"
        " needs it to be "
    )
    assert Operation.objects.filter(instance=running, verb="restart").count() == 0


@pytest.mark.parametrize(
    ("verb", "state", "queued", "reason"),
    [
        ("start", "failed", False, "The instance has failed; start needs it to be stopped."),
        (
            "stop", "failed", True,
            "Once the operations queued before it have run, the instance will have failed; stop"
            " needs it to be running.",
        ),
        (
            "rollback", "running", False,
            "The instance is running; roll back is for an instance that has failed.",
        ),
    ],
)  # fmt: skip
def test_a_refusal_says_an_instance_has_failed_rather_than_is_failed(verb, state, queued, reason):
    label = "Roll back" if verb == "rollback" else ""
    assert lifecycle.refusal(verb, state, queued=queued, label=label) == reason
