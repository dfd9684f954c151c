"""Every page under /t/<slug>/ answers 404 to a signed-in user who is not a member.

The list of pages comes from the URL configuration itself, so pages added
later are covered without touching this test.
"""

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from accounts.models import Tenant


def _tenant_routes(resolver=None, prefix=""):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _tenant_routes(entry, route)
        elif isinstance(entry, URLPattern) and "<slug:tenant_slug>" in route:
            yield route


def _concrete(route: str, slug: str) -> str:
    path = route.replace("<slug:tenant_slug>", slug)
    path = re.sub(r"<uuid:\w+>", "00000000-0000-0000-0000-000000000001", path)
    return "/" + re.sub(r"<int:\w+>", "1", re.sub(r"<(str|slug):\w+>", "x", path))


TENANT_ROUTES = sorted(set(_tenant_routes()))


def test_the_route_list_is_not_empty():
    assert {"t/<slug:tenant_slug>/", "t/<slug:tenant_slug>/team/"} <= set(TENANT_ROUTES)


@pytest.mark.django_db
@pytest.mark.parametrize("route", TENANT_ROUTES)
def test_a_non_member_gets_404_on_every_tenant_page(client, tenant, make_user, route):
    client.force_login(make_user("stranger@example.com"))
    path = _concrete(route, tenant.slug)
    assert resolve(path).route == route  # the 404 must come from the view, not a bad path

    assert client.get(path).status_code == 404
    assert client.post(path, {"role": "owner", "email": "x@example.com"}).status_code in {404, 405}


@pytest.mark.django_db
@pytest.mark.parametrize("route", TENANT_ROUTES)
def test_a_missing_organization_is_404_too(client, make_user, route):
    client.force_login(make_user("stranger@example.com"))
    assert not Tenant.objects.filter(slug="no-such-org").exists()

    assert client.get(_concrete(route, "no-such-org")).status_code == 404


@pytest.mark.django_db
def test_a_member_cannot_reach_another_organizations_member_by_id(client, tenant, make_user):
    from accounts import services
    from accounts.audit import Actor

    outsider = make_user("other@example.com")
    other = services.tenant_create(actor=Actor(user=outsider), name="Other")
    victim = other.memberships.get()
    client.force_login(tenant.memberships.get().user)

    response = client.post(f"/t/{tenant.slug}/team/{victim.pk}/role/", {"role": "viewer"})

    assert response.status_code == 404
    victim.refresh_from_db()
    assert victim.role == "owner"


# Each object a route can name, and where a member of another organization finds its real id.
OBJECT_PARAMETERS = {
    "instance_id", "operation_id", "snapshot_id", "membership_id", "invitation_id", "invoice_id",
    "credit_note_id", "token_id",
}  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_member_using_another_organizations_real_ids_gets_404_on_every_object_route(
    client, tenant, make_user, add_member
):
    """Generated from the URL configuration: every route naming an object, filled with the
    real ids of another organization's instance, operation, snapshot, member, invitation,
    invoice and credit note under the member's own organization, answers 404 and changes nothing."""
    import uuid
    from decimal import Decimal

    from accounts import services as account_services
    from accounts.audit import Actor
    from accounts.models import AuditEvent
    from billing.models import CreditNote, Invoice
    from deployments import services
    from deployments.models import Cell, Instance, Operation, Snapshot
    from tests.deployments.conftest import SPEC

    stranger = make_user("stranger@example.com")
    theirs = account_services.tenant_create(actor=Actor(user=stranger), name="Theirs")
    plan = services.plan_load(text=SPEC.read_text()).plan
    Cell.objects.create(name="local", region="local", is_default=True)
    create = services.instance_create(
        actor=Actor(user=stranger), tenant=theirs, plan=plan, name="their-db",
        parameters={}, request_id=uuid.uuid4().hex,
    )  # fmt: skip
    Operation.objects.filter(pk=create.pk).update(state=Operation.State.SUCCEEDED)
    Instance.objects.filter(pk=create.instance_id).update(state=Instance.State.RUNNING)
    snapshot = Snapshot.objects.create(
        tenant=theirs, instance=create.instance, source_instance_id=create.instance_id,
        plan_version=create.plan_version, name="their-backup", status="completed",
    )  # fmt: skip
    invitation = account_services.invitation_create(
        actor=Actor(user=stranger), tenant=theirs, email="x@example.com", role="member"
    )
    invoice = Invoice.objects.create(
        tenant=theirs, plan=plan, period="2026-10", status="open", number="2026-000001"
    )
    credit_note = CreditNote.objects.create(
        invoice=invoice, source="local", number="CN-2026-000001", currency="usd",
        amount=Decimal(0), created=invoice.created_at,
    )  # fmt: skip
    token, _ = account_services.api_token_create(
        actor=Actor(user=stranger), tenant=theirs, name="their-ci", role="member"
    )
    real = {
        "token_id": str(token.pk),
        "instance_id": create.instance_id,
        "invoice_id": str(invoice.pk),
        "credit_note_id": str(credit_note.pk),
        "operation_id": str(create.pk),
        "snapshot_id": str(snapshot.pk),
        "membership_id": str(theirs.memberships.get().pk),
        "invitation_id": str(invitation.pk),
        "verb": "restart",
    }
    client.force_login(add_member("member@example.com", "admin"))  # of `tenant`, not `theirs`
    events = AuditEvent.objects.filter(tenant=theirs).count()

    checked = 0
    for route in TENANT_ROUTES:
        names = set(re.findall(r"<\w+:(\w+)>", route)) - {"tenant_slug"}
        if not names & OBJECT_PARAMETERS:
            continue
        path = "/" + route.replace("<slug:tenant_slug>", tenant.slug)
        path = re.sub(r"<\w+:(\w+)>", lambda m: real[m.group(1)], path)
        data = {"request_id": uuid.uuid4().hex, "role": "viewer", "confirm_name": "their-db",
                "name": "copy", "on": "off", "p-instances": "2"}  # fmt: skip
        # A method the route does not take is refused before any object is looked up, the
        # same for every id (it tells nothing of theirs); any other request finds nothing.
        assert client.get(path).status_code in {404, 405}, path
        assert client.post(path, data).status_code in {404, 405}, path
        checked += 1

    assert checked >= 10
    assert Operation.objects.filter(instance__tenant=theirs).count() == 1
    assert not Instance.objects.filter(name="copy").exists()
    assert theirs.memberships.get().role == "owner"
    assert theirs.api_tokens.get().revoked_at is None
    assert AuditEvent.objects.filter(tenant=theirs).count() == events
