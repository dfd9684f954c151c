"""Each role against each action of `accounts.roles`, through the real pages.

`WAYS` is the spec: for every action in `roles.ACTIONS`, how a member does it in the browser
(the address, the method, what the form sends) and what it changes. Each role is then tried
on each action: a role the table allows is not refused and the change happens; a role it
forbids is refused, the refusal is in the audit log, and nothing changes.

A refusal is a 403 with the reason, except on the team page, whose forms come back to the
page with the reason in a message (a redirect). `ALSO` holds the other pages that need an
action of the table to the same rule; `REFUSAL_GAPS` names the refusals that do not follow
it yet.
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from html import unescape
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.urls import reverse

from accounts import roles
from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import ApiToken, AuditEvent, Invitation, Membership, Tenant
from accounts.roles import Role
from deployments import services
from deployments.models import BackupSchedule, Instance, Operation
from deployments.spec.loader import load_spec
from tests.conftest import PASSWORD
from tests.deployments.conftest import SPEC
from tests.deployments.factories import make_operation
from tests.deployments.test_instance_lifecycle_actions import _fail
from tests.deployments.test_instance_page import (  # noqa: F401 (fixtures)
    SECRET,
    instance,
    local_cell,
    plan,
)
from tests.deployments.test_instance_upgrade import _v2_text

REFUSED = 403
SAID_ON_THE_TEAM_PAGE = 302  # the team forms redirect back with the reason in a message


class World:
    """The organization as one member (`user`, with `role`) finds it; what an action needs
    (an instance with a completed backup, another member) is made on first use."""

    def __init__(self, request, client, tenant, user, role):
        self._request = request
        self.client = client
        self.tenant = tenant
        self.user = user
        self.role = role

    def url(self, name: str, **kwargs) -> str:
        return reverse(name, kwargs={"tenant_slug": self.tenant.slug, **kwargs})

    def page(self, name: str, **kwargs) -> str:
        """An instance page's address."""
        return self.url(name, instance_id=self.instance.pk, **kwargs)

    @cached_property
    def instance(self) -> Instance:
        return self._request.getfixturevalue("instance")

    @cached_property
    def snapshot(self):
        return self.instance.snapshots.get()

    @cached_property
    def plan_key(self) -> str:
        """The PostgreSQL plan's, with a cell to create in."""
        self._request.getfixturevalue("local_cell")
        return self._request.getfixturevalue("plan").key

    @cached_property
    def bob(self) -> Membership:
        """Another member, the one a team action is done to."""
        user = self._request.getfixturevalue("add_member")("bob@example.com", Role.MEMBER)
        return Membership.objects.get(tenant=self.tenant, user=user)

    def bob_role(self) -> str:
        return Membership.objects.get(pk=self.bob.pk).role

    @cached_property
    def other_owner(self) -> Membership:
        user = self._request.getfixturevalue("add_member")("olga@example.com", Role.OWNER)
        return Membership.objects.get(tenant=self.tenant, user=user)

    @cached_property
    def invitation(self) -> Invitation:
        owner = Actor(user=self._request.getfixturevalue("owner"))
        return account_services.invitation_create(
            actor=owner, tenant=self.tenant, email="ann@example.com", role=Role.MEMBER
        )

    @cached_property
    def token(self):
        """An API token the owner made, the one a revoke is for."""
        owner = Actor(user=self._request.getfixturevalue("owner"))
        return account_services.api_token_create(
            actor=owner, tenant=self.tenant, name="ci", role=Role.MEMBER
        )[0]

    @cached_property
    def pending(self) -> Operation:
        """A queued restart, the one a cancel is for."""
        return make_operation(self.instance, verb="restart", state=Operation.State.QUEUED)

    def upgrade_page(self) -> str:
        """The upgrade, once the plan has a newer version than the instance's."""
        page = self.page("instance_upgrade")
        services.plan_load(text=_v2_text(SPEC.read_text()))
        return page

    def rollback_page(self) -> str:
        """The roll back, once a modify has failed the instance."""
        _fail(self.instance, "modify")
        return self.page("instance_rollback")

    def schedule(self):
        return BackupSchedule.objects.get(instance=self.instance).interval_hours

    def operations(self) -> int:
        return Operation.objects.filter(instance=self.instance).count()


def fresh() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Way:
    """How a member does an action through the pages."""

    url: Callable[[World], str]
    method: str = "post"
    data: Callable[[World], dict] = lambda w: {}
    # What the action changes: a refusal leaves it as it was, an allowed action changes it.
    effect: Callable[[World], object] | None = None
    # The action name the audit log gives the refusal (the service's, not always the role's).
    audited: str = ""
    refusal: int = REFUSED
    reauthenticate: bool = False  # allauth asks for the password first (a reveal)


WAYS: dict[str, Way | None] = {
    "tenant.view": Way(lambda w: w.url("dashboard"), method="get"),
    "tenant.rename": Way(
        lambda w: w.url("organization_rename"),
        data=lambda w: {"name": "Renamed"},
        effect=lambda w: Tenant.objects.get(pk=w.tenant.pk).name,
        audited="tenant.rename",
    ),
    "tenant.delete": Way(
        lambda w: w.url("organization_delete"),
        data=lambda w: {"confirm_name": w.tenant.name},
        effect=lambda w: Tenant.objects.get(pk=w.tenant.pk).deleted_at,
        audited="tenant.delete",
    ),
    "tenant.tokens": Way(
        lambda w: w.url("api_token_create"),
        data=lambda w: {"name": "ci", "role": Role.VIEWER, "expires": "30"},
        effect=lambda w: ApiToken.objects.filter(tenant=w.tenant).count(),
        audited="tenant.tokens",
    ),
    "member.view": Way(lambda w: w.url("team"), method="get"),
    "member.invite": Way(
        lambda w: w.url("team_invite"),
        data=lambda w: {"email": "new@example.com", "role": Role.MEMBER, "request_id": fresh()},
        effect=lambda w: Invitation.objects.filter(tenant=w.tenant).count(),
        audited="member.invite",
        refusal=SAID_ON_THE_TEAM_PAGE,
    ),
    "member.change_role": Way(
        lambda w: w.url("member_role", membership_id=w.bob.pk),
        data=lambda w: {"role": Role.VIEWER},
        effect=World.bob_role,
        audited="member.change_role",
        refusal=SAID_ON_THE_TEAM_PAGE,
    ),
    "member.remove": Way(
        lambda w: w.url("member_remove", membership_id=w.bob.pk),
        effect=lambda w: w.tenant.memberships.count(),
        audited="member.remove",
        refusal=SAID_ON_THE_TEAM_PAGE,
    ),
    "member.manage_owners": Way(
        lambda w: w.url("member_role", membership_id=w.bob.pk),
        data=lambda w: {"role": Role.OWNER},
        effect=World.bob_role,
        audited="member.change_role",
        refusal=SAID_ON_THE_TEAM_PAGE,
    ),
    "audit.view": Way(lambda w: w.url("audit_log"), method="get", audited="audit.view"),
    "billing.view": Way(lambda w: w.url("billing_overview"), method="get", audited="billing.view"),
    # The tenant is already subscribed (tests' default), so an allowed subscribe returns its
    # subscription and changes nothing: the refusal is what this row proves.
    "billing.manage": Way(
        lambda w: w.url("billing_subscribe", plan_key=w.plan_key),
        data=lambda w: {"request_id": fresh()},
        audited="billing.manage",
    ),
    "instance.view": Way(lambda w: w.page("instance_detail"), method="get"),
    "instance.create": Way(
        lambda w: w.url("instance_create", plan_key=w.plan_key) + f"?request={fresh()}",
        data=lambda w: {"name": "matrix-db", "p-instances": "1", "request_id": fresh()},
        effect=lambda w: Instance.objects.count(),
        audited="instance.create",
    ),
    "instance.modify": Way(
        lambda w: w.page("instance_modify"),
        data=lambda w: {"p-instances": "3", "request_id": fresh()},
        effect=World.operations,
        audited="instance.modify",
    ),
    "instance.operate": Way(
        lambda w: w.page("instance_act", verb="restart"),
        data=lambda w: {"request_id": fresh()},
        effect=World.operations,
        audited="instance.restart",
    ),
    "instance.delete": Way(
        lambda w: w.page("instance_delete"),
        data=lambda w: {"confirm_name": w.instance.name, "request_id": fresh()},
        effect=World.operations,
        audited="instance.delete",
    ),
    "instance.reveal_credentials": Way(
        lambda w: w.page("instance_credentials_reveal"),
        effect=lambda w: AuditEvent.objects.filter(
            action="instance.reveal_credentials", result=AuditEvent.Result.OK
        ).count(),
        audited="instance.reveal_credentials",
        reauthenticate=True,
    ),
    "instance.protect": Way(
        lambda w: w.page("instance_protect"),
        data=lambda w: {"protect": "on"},
        effect=lambda w: Instance.objects.get(pk=w.instance.pk).deletion_protected,
        audited="instance.protect",
    ),
    "backup.create": Way(
        lambda w: w.page("instance_act", verb="backup"),
        data=lambda w: {"request_id": fresh()},
        effect=World.operations,
        audited="instance.backup",
    ),
    "backup.restore": Way(
        lambda w: w.page("snapshot_restore", snapshot_id=w.snapshot.pk),
        data=lambda w: {"name": "orders-copy", "request_id": fresh()},
        effect=lambda w: Instance.objects.count(),
        audited="instance.restore",
    ),
    "backup.delete": Way(
        lambda w: w.page("snapshot_delete", snapshot_id=w.snapshot.pk),
        data=lambda w: {"request_id": fresh()},
        effect=World.operations,
        audited="backup.delete",
    ),
}


# The other pages that need an action of the table, held to the same rule.
ALSO: dict[str, tuple[str, Way]] = {
    # No other plan of the service here: an allowed change is refused by the service (nothing
    # changes); the refusal of the roles without billing.manage is what this row proves.
    "change-plan": (
        "billing.manage",
        Way(
            lambda w: w.url("billing_plan_change", plan_key=w.plan_key),
            data=lambda w: {"plan": w.plan_key, "request_id": fresh()},
            audited="billing.manage",
        ),
    ),
    "revoke-invitation": (
        "member.invite",
        Way(
            lambda w: w.url("invitation_revoke", invitation_id=w.invitation.pk),
            effect=lambda w: Invitation.objects.get(pk=w.invitation.pk).revoked_at,
            audited="invitation.revoke",
            refusal=SAID_ON_THE_TEAM_PAGE,
        ),
    ),
    "invite-an-owner": (
        "member.manage_owners",
        Way(
            lambda w: w.url("team_invite"),
            data=lambda w: {"email": "new@example.com", "role": Role.OWNER, "request_id": fresh()},
            effect=lambda w: Invitation.objects.filter(tenant=w.tenant).count(),
            audited="member.invite",
            refusal=SAID_ON_THE_TEAM_PAGE,
        ),
    ),
    "remove-an-owner": (
        "member.manage_owners",
        Way(
            lambda w: w.url("member_remove", membership_id=w.other_owner.pk),
            effect=lambda w: w.tenant.memberships.count(),
            audited="member.remove",
            refusal=SAID_ON_THE_TEAM_PAGE,
        ),
    ),
    "revoke-token": (
        "tenant.tokens",
        Way(
            lambda w: w.url("api_token_revoke", token_id=w.token.pk),
            effect=lambda w: ApiToken.objects.get(pk=w.token.pk).revoked_at,
            audited="tenant.tokens",
        ),
    ),
    "export": (
        "audit.view",
        Way(lambda w: w.url("audit_export"), method="get", audited="audit.view"),
    ),
    "estimate": (
        "instance.create",
        Way(
            lambda w: w.url("instance_estimate", plan_key=w.plan_key),
            data=lambda w: {"p-instances": "3"},
            audited="instance.create",
        ),
    ),
    "modify-estimate": (
        "instance.modify",
        Way(
            lambda w: w.page("instance_modify_estimate"),
            data=lambda w: {"p-instances": "3"},
            audited="instance.modify",
        ),
    ),
    "upgrade": (
        "instance.modify",
        Way(
            lambda w: w.upgrade_page(),
            data=lambda w: {"request_id": fresh()},
            effect=World.operations,
            audited="instance.upgrade",
        ),
    ),
    "rollback": (
        "instance.modify",
        Way(
            lambda w: w.rollback_page(),
            data=lambda w: {"request_id": fresh()},
            effect=World.operations,
            audited="instance.rollback",
        ),
    ),
    "custom-verb": (
        "instance.operate",
        Way(
            lambda w: w.page("instance_act", verb="reloadConfiguration"),
            data=lambda w: {"request_id": fresh()},
            effect=World.operations,
            audited="instance.reloadConfiguration",
        ),
    ),
    "cancel-a-restart": (
        "instance.operate",
        Way(
            lambda w: w.page("operation_cancel", operation_id=w.pending.pk),
            data=lambda w: {"request_id": fresh()},
            effect=lambda w: Operation.objects.get(pk=w.pending.pk).state,
            audited="operation.cancel",
        ),
    ),
    "schedule": (
        "backup.create",
        Way(
            lambda w: w.page("backup_schedule_update"),
            data=lambda w: {"timing": "interval", "interval_hours": "12", "retention_days": "7"},
            effect=World.schedule,
            audited="backup.schedule",
        ),
    ),
    "restore-form": (
        "backup.restore",
        Way(
            lambda w: w.page("snapshot_restore", snapshot_id=w.snapshot.pk),
            method="get",
            audited="backup.restore",
        ),
    ),
}


# Refusals that do not yet follow the rule (the role is refused, but not as the others are).
REFUSAL_GAPS: dict[str, str] = {}


def test_the_table_covers_exactly_the_actions_of_the_roles_table():
    assert list(WAYS) == list(roles.ACTIONS)


def _case(role: str, action: str, way: Way | None, name: str = ""):
    allowed = roles.can(role, action)
    marks = [pytest.mark.skip(reason=f"no page does {action} yet")] if way is None else []
    if not allowed and name in REFUSAL_GAPS:
        marks.append(pytest.mark.xfail(strict=True, reason=REFUSAL_GAPS[name]))
    case = f"{role}-{'may' if allowed else 'not'}-{action}" + (f"-{name}" if name else "")
    return pytest.param(role, action, way, marks=marks, id=case)


CASES = [
    *(_case(role, action, way) for role in Role.values for action, way in WAYS.items()),
    *(
        _case(role, action, way, name)
        for role in Role.values
        for name, (action, way) in ALSO.items()
    ),
]


@lru_cache
def _spec_loaded(text: str):
    return load_spec(text)


@pytest.fixture(autouse=True)
def _quick(settings, monkeypatch):
    """Some 150 cases, each with its users and its plan: passwords hashed the cheap
    way, and the plan's spec read once (as the pages read it, `selectors.plan_spec`); the
    rows are made anew each time. Neither is under test here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    monkeypatch.setattr(services, "load_spec", _spec_loaded)


@pytest.fixture(scope="module")
def _one_client():
    return Client()


@pytest.fixture
def client(_one_client):
    """One test client for all the cases, signed out between them: its middleware loads once
    (WhiteNoise indexes every static file when it does)."""
    _one_client.cookies.clear()
    return _one_client


@pytest.fixture
def world(request, client, tenant, owner, add_member):
    role = request.node.callspec.params["role"]
    user = owner if role == Role.OWNER else add_member(f"{role}@example.com", role)
    client.force_login(user)
    return World(request, client, tenant, user, role)


def _send(world: World, way: Way, url: str, data: dict):
    response = getattr(world.client, way.method)(url, data)
    asked = response.status_code == 302 and urlsplit(response["Location"]).path == reverse(
        "account_reauthenticate"
    )
    if way.reauthenticate and asked:
        # As the connection tab's tests do: allauth asks for the password, then replays.
        response = world.client.post(response["Location"], {"password": PASSWORD})
    return response


# What a refusal may say to each role: "Your role (…) does not allow <an action it lacks>."
REASONS = {
    role: {roles.denial_message(role, a) for a in roles.ACTIONS if not roles.can(role, a)}
    for role in Role.values
}


def _denials(world: World):
    return AuditEvent.objects.filter(
        tenant=world.tenant, actor=world.user, result=AuditEvent.Result.DENIED
    )


def _text(response) -> str:
    return unescape(response.content.decode())


@pytest.mark.parametrize(("role", "action", "way"), CASES)
def test_each_role_against_each_action(world, role, action, way):
    allowed = roles.can(role, action)
    url, data = way.url(world), way.data(world)  # makes what the action needs
    before = way.effect(world) if way.effect else None

    response = _send(world, way, url, data)

    after = way.effect(world) if way.effect else None
    if allowed:
        assert response.status_code < 400, f"{role} was refused {action}"
        assert not _denials(world).exists(), [e.payload for e in _denials(world)]
        if way.effect:
            assert after != before, f"{action} by {role} changed nothing"
        if way.reauthenticate:
            assert SECRET in _text(response)
        return

    assert response.status_code == way.refusal, f"{role} was not refused {action}"
    if way.refusal == SAID_ON_THE_TEAM_PAGE:
        response = world.client.get(response["Location"])
    denied = _denials(world).get()
    assert denied.action == way.audited
    assert denied.payload["reason"] in REASONS[role]  # it names an action the role lacks
    assert denied.payload["reason"] in _text(response)  # and the member reads it
    assert after == before, f"{action} by {role} changed something"
