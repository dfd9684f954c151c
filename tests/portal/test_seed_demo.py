import pytest
from allauth.account.models import EmailAddress
from django.core.management import CommandError, call_command

from accounts.models import AuditEvent, Membership, Tenant, User


def _snapshot():
    return {
        "users": list(User.objects.values_list("email", flat=True)),
        "tenants": list(Tenant.objects.values_list("slug", "name")),
        "memberships": list(Membership.objects.values_list("user__email", "tenant__slug", "role")),
        "emails": list(EmailAddress.objects.values_list("email", "verified", "primary")),
        "events": AuditEvent.objects.count(),
    }


@pytest.mark.django_db
def test_seed_demo_twice_gives_the_same_data_and_the_printed_credentials_work(client, capsys):
    call_command("seed_demo", production=True)  # tests run with DEBUG off
    first = _snapshot()
    out = capsys.readouterr().out
    call_command("seed_demo", production=True)

    assert _snapshot() == first
    [(email, slug, role)] = first["memberships"]
    assert (email, role) == ("demo@opsdeck.example", "owner")
    assert slug.startswith("demo-company-")
    assert first["emails"] == [("demo@opsdeck.example", True, True)]
    email = out.split("email:")[1].split()[0]
    password = out.split("password:")[1].split()[0]
    signed_in = client.post("/accounts/login/", {"login": email, "password": password}, follow=True)
    assert signed_in.request["PATH_INFO"] == f"/t/{slug}/"


@pytest.mark.django_db
def test_seed_demo_refuses_the_public_password_in_production():
    with pytest.raises(CommandError, match="published demo password"):
        call_command("seed_demo")

    assert not User.objects.exists()
