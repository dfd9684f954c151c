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
