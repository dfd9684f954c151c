import codecs
import csv
import io
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from accounts import services
from accounts.audit import Actor, audit_record
from accounts.errors import ActionDenied
from accounts.models import AppendOnlyError, AuditEvent, Invitation, Membership


@pytest.mark.django_db
def test_audit_events_cannot_be_changed_or_deleted(tenant):
    event = AuditEvent.objects.get(tenant=tenant, action="tenant.create")

    event.action = "tenant.forged"
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).update(action="tenant.forged")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).delete()

    assert AuditEvent.objects.get(pk=event.pk).action == "tenant.create"


@pytest.mark.django_db
def test_secrets_never_reach_the_payload(tenant, owner):
    event = audit_record(
        actor=Actor(user=owner),
        action="test.secret",
        tenant=tenant,
        payload={"password": "hunter2", "nested": {"api_token": "t0k", "name": "ok"}},
    )

    event.refresh_from_db()
    assert event.payload == {
        "password": "[redacted]",
        "nested": {"api_token": "[redacted]", "name": "ok"},
    }


@pytest.mark.django_db
def test_invitation_events_hold_no_link_or_token(tenant, owner):
    invitation = services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="member"
    )
    token = services.invitation_token(invitation)

    for event in AuditEvent.objects.filter(tenant=tenant):
        assert token not in str(event.payload)


@pytest.mark.django_db(transaction=True)
def test_a_denied_action_is_recorded_while_its_change_is_rolled_back(owner, tenant, add_member):
    viewer = add_member("vic@example.com", "viewer")
    target = Membership.objects.get(tenant=tenant, user=owner)

    with pytest.raises(ActionDenied):
        services.membership_change_role(actor=Actor(user=viewer), membership=target, role="viewer")

    target.refresh_from_db()
    assert target.role == "owner"
    denied = AuditEvent.objects.get(action="member.change_role")
    assert denied.result == "denied"
    assert denied.payload == {"reason": "Your role (Viewer) does not allow changing roles."}
    assert denied.target_id == str(target.pk)


@pytest.mark.django_db(transaction=True)
def test_a_refusal_after_a_write_leaves_no_trace_of_the_write(owner, tenant):
    """The last-owner rule fires after the role was read and locked: nothing is half-done."""
    me = Membership.objects.get(tenant=tenant, user=owner)

    with pytest.raises(ActionDenied):
        services.membership_remove(actor=Actor(user=owner), membership=me)

    assert Membership.objects.filter(pk=me.pk).exists()
    assert list(
        AuditEvent.objects.filter(action="member.leave").values_list("result", flat=True)
    ) == ["denied"]


@pytest.mark.django_db
def test_owners_see_the_log_and_can_filter_it(owner_client, tenant, owner, add_member):
    add_member("bob@example.com", "member")
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="new@example.com", role="member"
    )

    page = owner_client.get(f"/t/{tenant.slug}/audit/")
    assert page.status_code == 200
    assert b"tenant.create" in page.content
    assert b"member.invite" in page.content

    filtered = owner_client.get(f"/t/{tenant.slug}/audit/", {"action": "member.invite"})
    assert b"<code>member.invite</code>" in filtered.content
    # Who the invitation is for, not only its number.
    invitation = Invitation.objects.get(email="new@example.com")
    assert f"invitation {invitation.pk} (new@example.com)".encode() in filtered.content
    assert b"<code>tenant.create</code>" not in filtered.content

    nobody = owner_client.get(f"/t/{tenant.slug}/audit/", {"actor": "nobody@"})
    assert b"No events match." in nobody.content

    # A start of actions (a link, an address typed): the filter says which it applies.
    started = owner_client.get(f"/t/{tenant.slug}/audit/", {"action": "member."}).content
    assert b'<option value="member." selected>Starting with member.</option>' in started
    assert b"<code>member.invite</code>" in started and b"<code>tenant.create</code>" not in started


@pytest.mark.django_db
def test_a_bad_date_range_is_explained_not_crashed(owner_client, tenant):
    response = owner_client.get(
        f"/t/{tenant.slug}/audit/", {"since": "2026-05-02", "until": "2026-05-01"}
    )

    assert response.status_code == 200
    assert b"The start date is after the end date." in response.content
    # The summary takes the focus, as the portal's other refused forms' do: a keyboard or
    # screen reader user was left on the button, below what to correct.
    assert b'class="error-summary" role="alert" tabindex="-1" autofocus' in response.content


@pytest.mark.django_db
def test_the_log_exports_as_csv(owner_client, tenant):
    response = owner_client.get(f"/t/{tenant.slug}/audit/export.csv")

    assert response["Content-Type"] == "text/csv; charset=utf-8"
    body = b"".join(response.streaming_content)
    assert body.startswith(codecs.BOM_UTF8)  # what a spreadsheet opening the file goes by
    rows = list(csv.reader(io.StringIO(body.decode("utf-8-sig"))))
    assert rows[0] == [
        "time", "actor", "actor_kind", "action", "target_type", "target_id", "result", "ip",
        "target_name",
    ]  # fmt: skip
    assert rows[1][1:4] == ["owner@example.com", "user", "tenant.create"]
    assert rows[1][8] == "Acme"  # the organization it made


@pytest.mark.django_db
def test_the_export_of_an_organization_with_accents_reads_as_typed_in_a_spreadsheet(
    client, make_user
):
    owner = make_user("zoe@example.com")
    tenant = services.tenant_create(actor=Actor(user=owner), name="Zoë Café Ünited")
    client.force_login(owner)

    response = client.get(f"/t/{tenant.slug}/audit/export.csv")
    body = b"".join(response.streaming_content)

    # UTF-8, said by the response and by the file itself: a spreadsheet opening the saved file
    # without its byte-order mark reads it in the system's code page ("ZoÃ« CafÃ© Ãœnited").
    assert "charset=utf-8" in response["Content-Type"]
    assert body.startswith(codecs.BOM_UTF8) and "Zoë Café Ünited".encode() in body


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["member", "viewer", "billing"])
def test_roles_below_admin_cannot_read_the_log(client, tenant, add_member, role):
    client.force_login(add_member("someone@example.com", role))

    assert client.get(f"/t/{tenant.slug}/audit/").status_code == 403
    assert client.get(f"/t/{tenant.slug}/audit/export.csv").status_code == 403


@pytest.mark.django_db
def test_one_tenants_log_never_shows_anothers_events(owner_client, tenant, make_user):
    stranger = make_user("other@example.com")
    with transaction.atomic():
        services.tenant_create(actor=Actor(user=stranger), name="Secret Corp")

    page = owner_client.get(f"/t/{tenant.slug}/audit/export.csv")

    assert b"other@example.com" not in b"".join(page.streaming_content)


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "plain"])
def test_an_invalid_date_is_flagged_and_the_other_filters_still_apply(
    owner_client, tenant, owner, htmx
):
    services.invitation_create(
        actor=Actor(user=owner), tenant=tenant, email="bob@example.com", role="member"
    )
    headers = {"HX-Request": "true"} if htmx else {}

    response = owner_client.get(
        f"/t/{tenant.slug}/audit/",
        {"action": "member.invite", "since": "2026-02-30"},
        headers=headers,
    )

    html = response.content.decode()
    assert response.status_code == 200
    # The action filter still applies...
    assert "<code>member.invite</code>" in html
    assert "<code>tenant.create</code>" not in html
    assert '<option value="member.invite" selected>' in html
    # ...and the bad date is flagged beside its field and in the summary, keeping what was typed.
    assert 'id="f-since" name="since" type="date" value="2026-02-30" aria-invalid="true"' in html
    assert '<small class="field-error" id="f-since-error">Enter a valid date.</small>' in html
    assert '<a href="#f-since">From: Enter a valid date.</a>' in html


@pytest.mark.django_db
def test_an_end_before_the_start_flags_the_end_and_keeps_the_start(owner_client, tenant):
    today = timezone.now().date()

    response = owner_client.get(
        f"/t/{tenant.slug}/audit/", {"since": str(today), "until": str(today - timedelta(days=1))}
    )

    html = response.content.decode()
    assert 'id="f-until-error">The start date is after the end date.</small>' in html
    assert "<code>tenant.create</code>" in html  # "From" today still applies; "To" is left out


def test_the_log_the_export_and_the_dashboard_read_no_account_of_the_people_in_it(
    owner_client, tenant, owner
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    audit_record(actor=Actor(user=owner), action="tenant.rename", tenant=tenant)
    pages = [f"/t/{tenant.slug}/audit/", f"/t/{tenant.slug}/audit/export.csv", f"/t/{tenant.slug}/"]

    for url in pages:
        with CaptureQueriesContext(connection) as queries:
            response = owner_client.get(url)
            body = b"".join(response.streaming_content) if response.streaming else response.content
        assert response.status_code == 200 and owner.email in body.decode(), url
        # Who acted is shown as recorded (`actor_email`); their account (its password hash
        # too) stays in the database.
        read = [q["sql"] for q in queries.captured_queries if "accounts_auditevent" in q["sql"]]
        assert read and not [sql for sql in read if '"accounts_user"' in sql], url
        # Nor the browser it came from, which none of them shows.
        assert not [sql for sql in read if "user_agent" in sql], url


def _events_of_four_actions(tenant) -> list[str]:
    """3,000 events of four actions in turn, a minute apart; the actions. The events an
    earlier test rolled back are dead rows still, which a page's index scan would read: the
    table is vacuumed first (outside a transaction: the tests calling this are transactional)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM accounts_auditevent")
    actions = ["instance.create", "instance.stop", "instance.start", "member.invite"]
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(tenant=tenant, actor_kind="user", action=actions[n % len(actions)],
                   created_at=now - timedelta(minutes=n))
        for n in range(3000)
    )  # fmt: skip
    return actions


# Emptied (TRUNCATE) after, not rolled back: 3,000 dead events would be read by the next
# test's counts of what a page read.
@pytest.mark.django_db(transaction=True)
def test_the_logs_action_menu_offers_the_organizations_actions_without_reading_every_event(
    owner_client, tenant, make_user
):
    from django.db import connection

    from bench.support import rows_read

    stranger = make_user("other@example.com")
    theirs = services.tenant_create(actor=Actor(user=stranger), name="Secret Corp")
    audit_record(actor=Actor(user=stranger), action="tenant.rename", tenant=theirs)
    actions = _events_of_four_actions(tenant)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE accounts_auditevent")
    url = f"/t/{tenant.slug}/audit/"
    owner_client.get(url)  # the session's first request reads more

    def read(query: dict) -> tuple[int, str]:
        before = rows_read(AuditEvent)
        page = owner_client.get(url, query).content.decode()
        return rows_read(AuditEvent) - before, page

    everything, page = read({})
    stopped, _ = read({"action": "instance.stop"})

    for action in [*actions, "tenant.create"]:  # each of the organization's, to filter on
        assert f'<option value="{action}">' in page, action
    assert "tenant.rename" not in page  # another organization's
    # The page counts the events it finds (every one, unfiltered): its menu of actions is not
    # a second read of all of them; filtered to a quarter of them, nor a read of the rest.
    assert everything < 1.5 * 3000, everything
    assert stopped < 3000, stopped


# Emptied (TRUNCATE) after, not rolled back: 3,000 dead events would be read by the next
# test's counts of what a page read.
@pytest.mark.django_db(transaction=True)
def test_no_filter_of_the_log_is_counted_along_the_index_of_its_actions(tenant):
    """A (organization, action) index for the Action menu was chosen by the planner to count
    the admin's one-action filter, reading every entry of a small log: the menu's index orders
    actions byte by byte, which no filter compares by."""
    from django.db import connection

    _events_of_four_actions(tenant)
    filters = [
        AuditEvent.objects.filter(action="instance.stop"),  # the admin's
        AuditEvent.objects.filter(tenant=tenant, action__startswith="instance.stop"),  # the page's
    ]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE accounts_auditevent")
        for events in filters:
            sql, params = events.values("pk").query.sql_with_params()
            cursor.execute(f"EXPLAIN SELECT COUNT(*) FROM ({sql}) counted", params)  # noqa: S608
            plan = "\n".join(row for (row,) in cursor.fetchall())
            assert "audit_tenant_action_c" not in plan, plan
