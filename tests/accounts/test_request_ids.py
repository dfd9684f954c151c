"""One organization or invitation per request id, however many submits race; the role first."""

import pytest
from django.core import mail
from django.core.exceptions import ValidationError

from accounts import services
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.models import AuditEvent, Invitation, Tenant
from tests.concurrency import race


@pytest.mark.django_db(transaction=True)
def test_concurrent_new_organization_submits_make_one_organization(owner):
    results = race(
        lambda: services.tenant_create(actor=Actor(user=owner), name="Globex", request_id="r-1")
    )

    assert all(isinstance(r, Tenant) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert Tenant.objects.filter(name="Globex").count() == 1
    assert AuditEvent.objects.filter(action="tenant.create", payload__name="Globex").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_tabs_sending_one_name_with_their_own_ids_make_one_organization(owner, make_user):
    ids = iter(["tab-1", "tab-2", "tab-3", "tab-4"])

    results = race(
        lambda: services.tenant_create(
            actor=Actor(user=owner), name="Twin Org", request_id=next(ids)
        )
    )

    made = [r for r in results if isinstance(r, Tenant)]
    refused = [r for r in results if isinstance(r, ValidationError)]
    assert len(made) == 1 and len(refused) == 3, results
    assert refused[0].message_dict["name"] == [
        "You already belong to an organization called “Twin Org”: choose another name."
    ]
    assert Tenant.objects.filter(name="Twin Org").count() == 1
    full_width = "".join(chr(ord(c) + 0xFEE0) if c != " " else c for c in "Twin Org")
    for n, alike in enumerate(["twin ORG", full_width, "Twin\u00a0Org"]):
        with pytest.raises(ValidationError):  # whatever its case or its letters' width
            services.tenant_create(actor=Actor(user=owner), name=alike, request_id=f"alike-{n}")
    # Names are not unique across users: another one may have a Twin Org of their own.
    other = services.tenant_create(
        actor=Actor(user=make_user("other@example.com")), name="Twin Org", request_id="x"
    )
    assert other.name == "Twin Org"


@pytest.mark.django_db(transaction=True)
def test_concurrent_invitation_submits_make_one_invitation_and_one_email(tenant, owner, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the mail is sent in-process, after commit
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"

    results = race(
        lambda: services.invitation_create(
            actor=Actor(user=owner),
            tenant=tenant,
            email="new@example.com",
            role="member",
            request_id="r-2",
        )
    )

    assert all(isinstance(r, Invitation) for r in results), results
    assert Invitation.objects.filter(tenant=tenant).count() == 1
    assert len([m for m in mail.outbox if m.to == ["new@example.com"]]) == 1


@pytest.mark.django_db
def test_a_request_id_reused_with_other_input_is_refused(tenant, owner):
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="a@example.com", role="member", request_id="r"
    )

    with pytest.raises(ValidationError) as refused:
        services.invitation_create(
            actor=Actor(user=owner),
            tenant=tenant,
            email="b@example.com",
            role="member",
            request_id="r",
        )

    assert "already sent with different values" in str(refused.value)
    assert list(Invitation.objects.values_list("email", flat=True)) == ["a@example.com"]


@pytest.mark.django_db
def test_a_viewer_reposting_an_invitation_request_id_is_denied_and_audited(
    tenant, owner, add_member
):
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="a@example.com", role="member", request_id="r"
    )
    viewer = add_member("viewer@example.com", "viewer")

    with pytest.raises(ActionDenied) as denied:
        services.invitation_create(
            actor=Actor(user=viewer),
            tenant=tenant,
            email="a@example.com",
            role="member",
            request_id="r",
        )

    assert "does not allow inviting members" in str(denied.value)
    assert AuditEvent.objects.filter(
        tenant=tenant, action="member.invite", result="denied", actor=viewer
    ).exists()


@pytest.mark.django_db
def test_a_request_id_over_64_characters_is_a_field_error(owner):
    with pytest.raises(ValidationError) as refused:
        services.tenant_create(actor=Actor(user=owner), name="Initech", request_id="x" * 65)

    assert "request_id" in refused.value.message_dict
    assert not Tenant.objects.filter(name="Initech").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["a\x00b", 5, None])
def test_an_organization_name_that_is_not_clean_text_is_a_field_error(owner, name):
    with pytest.raises(ValidationError) as refused:
        services.tenant_create(actor=Actor(user=owner), name=name)

    assert "name" in refused.value.message_dict


@pytest.mark.django_db
def test_request_ids_older_than_the_days_kept_are_forgotten_and_the_rest_still_answer(
    owner, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from accounts import idempotency
    from accounts.models import RequestKey
    from accounts.tasks import request_ids_prune

    settings.OPSDECK_REQUEST_IDS_KEPT_DAYS = 30
    actor = Actor(user=owner)
    old = services.tenant_create(actor=actor, name="Old", request_id="r-old")
    services.tenant_create(actor=actor, name="Older", request_id="r-older")
    recent = services.tenant_create(actor=actor, name="Recent", request_id="r-recent")
    RequestKey.objects.filter(request_id__in=["r-old", "r-older"]).update(
        created_at=timezone.now() - timedelta(days=31)
    )

    assert idempotency.request_ids_prune(batch=1) == 2  # a batch at a time
    assert list(RequestKey.objects.values_list("request_id", flat=True)) == ["r-recent"]
    # Within the days kept, a repeat still returns what the first request made ...
    assert services.tenant_create(actor=actor, name="Recent", request_id="r-recent") == recent
    # ... and beat's daily task forgets nothing more.
    assert settings.CELERY_BEAT_SCHEDULE["request-ids-prune"]["task"] == request_ids_prune.name
    assert request_ids_prune.apply().get() == 0
    assert Tenant.objects.filter(pk=old.pk).exists()  # forgetting the id keeps what it made


@pytest.mark.django_db
def test_an_invitation_sent_with_an_unusable_request_id_says_why_and_invites_no_one(
    owner_client, tenant
):
    answer = owner_client.post(
        f"/t/{tenant.slug}/team/invite/",
        {"email": "new@example.com", "role": "member", "request_id": "ab\x01cd"},
    )

    assert answer.status_code == 400
    assert "The request id may hold only printable characters." in answer.content.decode()
    assert not Invitation.objects.exists()


@pytest.mark.parametrize(
    "request_id",
    [
        "schedule-20261206T000000Z",
        "prune-41",
        "last-snapshot-ab12",
        "plan-change-9f",
        "suspended-stop-1",
    ],
)
def test_a_request_id_opsdeck_makes_for_itself_is_a_field_error(request_id):
    """Sent by a request, such an id took the place of the operation Opsdeck makes with it."""
    from accounts.idempotency import RESERVED, request_id_clean

    with pytest.raises(ValidationError) as refused:
        request_id_clean(request_id)
    assert refused.value.message_dict == {"request_id": [RESERVED]}
    assert request_id_clean("schedules-1") == "schedules-1"  # only Opsdeck's own are kept


@pytest.mark.parametrize(
    ("error", "passing"),
    [
        ("DeadlockDetected", True),
        ("SerializationFailure", True),
        ("AdminShutdown", True),
        ("TooManyConnections", True),
        ("DiskFull", False),
        ("ProgramLimitExceeded", False),
        ("QueryCanceled", False),
    ],
)
def test_only_the_databases_passing_trouble_stops_a_round_to_be_done_again(error, passing):
    """A round over many items (a fleet run's batch, beat's backups) stops at the database's
    passing trouble and is done again; an error a statement makes whatever the moment is left
    with its item, or the round failed the same way for ever."""
    import psycopg
    from django.db import OperationalError

    from accounts.errors import database_trouble

    wrapped = OperationalError(error)
    wrapped.__cause__ = getattr(psycopg.errors, error)(error)
    assert database_trouble(wrapped) is passing
    lost = OperationalError("server closed the connection unexpectedly")
    lost.__cause__ = psycopg.OperationalError("server closed the connection unexpectedly")
    assert database_trouble(lost)
    assert not database_trouble(ValueError(error))
