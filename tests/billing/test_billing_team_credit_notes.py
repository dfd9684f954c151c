"""Credit notes on Opsdeck's own invoices: the billing team takes part or all of a finalized
invoice back (refunded outside Opsdeck or credited) under a number of its own, and every page
reads it as it reads Stripe's credit notes."""

import csv
import io
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.test import Client

from accounts import services as account_services
from accounts.audit import Actor
from accounts.idempotency import REUSED
from accounts.models import AuditEvent
from billing import invoicing
from billing.models import CreditNote, Invoice, InvoiceCounter, InvoiceLine, Plan, Price
from billing.team_views import BILLING_TEAM
from tests.billing.test_billing_team import period_totals
from tests.concurrency import race
from tests.conftest import mail_forget

YEAR = f"{datetime.now(UTC):%Y}"


@pytest.fixture
def plan(db):
    plan = Plan.objects.create(key="pg", name="PostgreSQL", service="postgresql")
    Price.objects.create(plan=plan, dimension="cpu", unit="core", unit_price=Decimal("0.035"))
    return plan


@pytest.fixture
def finance(make_user):
    user = make_user("finance@opsdeck.example", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    return user


@pytest.fixture
def team_client(client, finance):
    client.force_login(finance)
    return client


def _invoice(tenant, plan, finance, *, total="40.00", status="paid", currency="usd",
             period="2026-10") -> Invoice:  # fmt: skip
    """An Opsdeck invoice finalized by the billing team (and paid, unless `status` says)."""
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period=period, currency=currency, total=Decimal(total)
    )
    InvoiceLine.objects.create(
        invoice=invoice, instance_id="inst-abcdefgh", instance_name="orders", dimension="cpu",
        quantity=Decimal(10), unit_price=Decimal("0.035"), amount=Decimal(total),
    )  # fmt: skip
    if status == "draft":
        return invoice
    staff = Actor(user=finance, staff=True)
    invoice = invoicing.invoice_finalize(actor=staff, invoice=invoice)
    if status == "paid":
        invoice = invoicing.invoice_mark_paid(actor=staff, invoice=invoice)
    elif status == "void":
        invoice = invoicing.invoice_void(actor=staff, invoice=invoice)
    return invoice


def _issue(team_client, invoice, **values):
    """Fill in the form, then confirm it: the page the team lands on."""
    data = {"amount": "10.00", "reason": "order_change", "memo": "", "refund": "credit",
            "request_id": "req-1", **values}  # fmt: skip
    url = f"/billing-team/invoices/{invoice.pk}/credit-notes/new/"
    checked = team_client.post(url, data)
    if checked.status_code != 200 or "Issue the credit note" not in checked.content.decode():
        return checked
    return team_client.post(url, {**data, "confirmed": "on"}, follow=True)


def _export(team_client) -> dict[str, dict[str, str]]:
    response = team_client.get("/billing-team/invoices.csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode("utf-8-sig"))))
    return {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}


def test_the_team_credits_part_of_a_paid_invoice_after_confirming_it(
    team_client, tenant, plan, finance
):
    invoice = _invoice(tenant, plan, finance)
    shown = team_client.get(f"/billing-team/invoices/{invoice.pk}/").content.decode()
    form = team_client.get(f"/billing-team/invoices/{invoice.pk}/credit-notes/new/")
    data = {"amount": "10.00", "reason": "order_change", "memo": "Two cores were never used.",
            "refund": "credit", "request_id": "req-1"}  # fmt: skip
    checked = team_client.post(f"/billing-team/invoices/{invoice.pk}/credit-notes/new/", data)

    assert "Issue a credit note" in shown
    assert "Remains to credit" in form.content.decode() and "40.00 USD" in form.content.decode()
    assert "Check the credit note before issuing it" in checked.content.decode()
    assert "<dd>Two cores were never used.</dd>" in checked.content.decode()
    assert "10.00 USD" in checked.content.decode()
    assert not CreditNote.objects.exists()  # not before it is confirmed

    done = team_client.post(
        f"/billing-team/invoices/{invoice.pk}/credit-notes/new/",
        {**data, "confirmed": "on"},
        follow=True,
    )

    page = done.content.decode()
    note = CreditNote.objects.get()
    assert (note.number, note.source, note.amount, note.refunded) == (
        f"CN-{YEAR}-000001",
        "local",
        Decimal("10.00"),
        Decimal(0),
    )
    assert (note.reason, note.memo, note.stripe_credit_note_id) == (
        "Order change",
        "Two cores were never used.",
        None,
    )
    assert f"Credit note CN-{YEAR}-000001 issued on invoice {invoice.number}" in page
    assert "Two cores were never used." in page and ">Void</button>" in page
    invoice.refresh_from_db()
    assert invoice.status_text() == "Credited (10.00 of 40.00)"
    assert invoice.amount_remaining == Decimal("30.00")
    # The team's list, invoice page and export read it as they read Stripe's.
    listed = team_client.get("/billing-team/").content.decode()
    shown = team_client.get(f"/billing-team/invoices/{invoice.pk}/").content.decode()
    assert "Credited (10.00 of 40.00)" in listed and "badge-invoice-credited" in listed
    assert f"CN-{YEAR}-000001" in shown and "Order change" in shown and "Remains paid" in shown
    assert f'href="/billing-team/credit-notes/{note.pk}/"' in shown
    row = _export(team_client)[invoice.number]
    assert (row["status"], row["total"], row["refunded"], row["credited"]) == (
        "Credited (10.00 of 40.00)",
        "40.00",
        "0.00",
        "10.00",
    )
    event = AuditEvent.objects.get(action="invoice.credit_note_issue")
    assert (event.actor_email, event.actor_kind, event.result) == (
        "finance@opsdeck.example",
        "staff",
        "ok",
    )
    assert event.payload["credit_note"] == note.number and event.payload["amount"] == "10.00"


def test_the_totals_per_period_say_what_credit_notes_took_back_and_what_remains(
    team_client, tenant, plan, finance, owner
):
    """The totals counted an invoice a credit note took back whole at its full total: the
    period's 60.00 read as earned, 40.00 of it given back."""
    other = account_services.tenant_create(actor=Actor(user=owner), name="Globex")
    credited = _invoice(tenant, plan, finance)
    _invoice(other, plan, finance, total="20.00")
    _issue(team_client, credited, amount="40.00")

    page = team_client.get("/billing-team/").content.decode()

    assert period_totals(page) == [["2026-10", "2", "60.00 USD", "40.00 USD", "20.00 USD"]]


def test_a_refund_outside_opsdeck_reads_refunded_and_numbers_follow_each_other(
    team_client, tenant, plan, finance
):
    invoice = _invoice(tenant, plan, finance)

    _issue(team_client, invoice, amount="15", refund="refund", request_id="a")
    _issue(team_client, invoice, amount="25.00", refund="refund", request_id="b")

    assert list(CreditNote.objects.values_list("number", "refunded")) == [
        (f"CN-{YEAR}-000001", Decimal("15.00")),
        (f"CN-{YEAR}-000002", Decimal("25.00")),
    ]
    invoice.refresh_from_db()
    assert invoice.status_text() == "Refunded" and invoice.badge == "refunded"
    # Nothing remains to credit: the page no longer offers it, and the form says why.
    shown = team_client.get(f"/billing-team/invoices/{invoice.pk}/").content.decode()
    assert "Issue a credit note</a>" not in shown
    again = team_client.get(f"/billing-team/invoices/{invoice.pk}/credit-notes/new/", follow=True)
    assert "Nothing remains to credit" in again.content.decode()
    # The invoice series is its own: the next invoice is numbered after the last invoice.
    other = _invoice(tenant, plan, finance, period="2026-11")
    assert other.number == f"{YEAR}-000002"


def test_an_unpaid_invoice_is_credited_off_what_is_due_not_refunded(
    team_client, tenant, plan, finance
):
    invoice = _invoice(tenant, plan, finance, status="open")

    refused = _issue(team_client, invoice, refund="refund")
    _issue(team_client, invoice, amount="40", request_id="req-2")

    assert "is not paid: there is nothing to refund" in refused.content.decode()
    # The summary's link leads to the choices it is about.
    assert '<a href="#id_refund">' in refused.content.decode()
    assert '<fieldset id="id_refund"' in refused.content.decode()
    invoice.refresh_from_db()
    assert invoice.status_text() == "Finalized; credited"
    assert CreditNote.objects.count() == 1


@pytest.mark.parametrize(
    ("currency", "amount", "said"),
    [
        ("usd", "0", "Enter an amount above 0."),
        ("usd", "-5", "Enter an amount above 0."),
        ("usd", "40.01", "At most 40.00 USD remains to credit"),
        ("usd", "1e200000", "At most 40.00 USD remains to credit"),
        ("usd", "10.001", "USD amounts have at most 2 decimal places."),
        ("jpy", "10.5", "JPY amounts are whole numbers."),
        ("kwd", "1.0005", "KWD amounts have at most 3 decimal places."),
        ("usd", "ten", "Enter the amount as a number, e.g. 10.00."),
        ("usd", "NaN", "Enter the amount as a number, e.g. 10.00."),
    ],
)
def test_a_bad_amount_is_refused_beside_its_field_and_changes_nothing(
    team_client, tenant, plan, finance, currency, amount, said
):
    invoice = _invoice(tenant, plan, finance, currency=currency)

    response = _issue(team_client, invoice, amount=amount)

    page = response.content.decode()
    assert response.status_code == 200
    assert said in page and "No credit note was issued" in page
    assert 'class="field-error"' in page
    assert not CreditNote.objects.exists()
    assert not InvoiceCounter.objects.filter(series=f"CN-{YEAR}").exists()


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"reason": ""}, "Reason: Choose a reason."),
        ({"reason": "fraudulent"}, "Reason: Choose a reason."),
        ({"memo": "x" * 501}, "Use at most 500 characters (this has 501)."),
        ({"memo": "Refund \u202eRUO"}, "Use letters, digits, spaces, punctuation and line breaks"),
        ({"refund": "maybe"}, "How is it settled?"),
    ],
)
def test_a_bad_reason_memo_or_settlement_is_refused_and_changes_nothing(
    team_client, tenant, plan, finance, values, said
):
    invoice = _invoice(tenant, plan, finance)

    response = _issue(team_client, invoice, **values)

    assert said in response.content.decode()
    assert not CreditNote.objects.exists()


def test_more_than_earlier_credit_notes_left_is_refused(team_client, tenant, plan, finance):
    invoice = _invoice(tenant, plan, finance)
    _issue(team_client, invoice, amount="30", request_id="a")

    response = _issue(team_client, invoice, amount="10.01", request_id="b")

    assert "At most 10.00 USD remains to credit" in response.content.decode()
    assert CreditNote.objects.count() == 1


@pytest.mark.parametrize("status", ["draft", "void", "stripe"])
def test_an_invoice_that_takes_no_credit_note_says_why_and_changes_nothing(
    team_client, tenant, plan, finance, status
):
    if status == "stripe":
        invoice = Invoice.objects.create(
            tenant=tenant, plan=plan, period="2026-10", source="stripe", status="paid",
            number="S-1", total=Decimal("40"), stripe_invoice_id="in_1",
        )  # fmt: skip
    else:
        invoice = _invoice(tenant, plan, finance, status=status)
    said = {
        "draft": "is a draft: finalize it first",
        "void": "is void: nothing of it is owed",
        "stripe": "is issued by Stripe: issue its credit notes in Stripe",
    }[status]

    shown = team_client.get(f"/billing-team/invoices/{invoice.pk}/").content.decode()
    form = team_client.get(f"/billing-team/invoices/{invoice.pk}/credit-notes/new/", follow=True)
    sent = team_client.post(
        f"/billing-team/invoices/{invoice.pk}/credit-notes/new/",
        {"amount": "10", "reason": "duplicate", "refund": "credit", "confirmed": "on"},
    )
    with pytest.raises(ValidationError, match=said):
        invoicing.credit_note_issue(
            actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(10),
            reason="duplicate",
        )  # fmt: skip

    assert "Issue a credit note" not in shown
    assert said in form.content.decode()
    assert said in sent.content.decode()
    assert not CreditNote.objects.exists()


@pytest.mark.parametrize("who", ["member", "staff outside the team", "team, not staff"])
def test_only_the_billing_team_issues_and_voids_credit_notes(
    client, make_user, tenant, plan, finance, owner, who
):
    invoice = _invoice(tenant, plan, finance)
    note = invoicing.credit_note_issue(
        actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(5),
        reason="duplicate",
    )  # fmt: skip
    if who == "member":
        client.force_login(owner)
    elif who == "staff outside the team":
        client.force_login(make_user("admin@example.com", is_staff=True))
    else:
        user = make_user("ex-staff@example.com")
        user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
        client.force_login(user)

    for url in [f"/billing-team/invoices/{invoice.pk}/credit-notes/new/",
                f"/billing-team/credit-notes/{note.pk}/"]:  # fmt: skip
        assert client.get(url).status_code == 404, url
    sent = client.post(
        f"/billing-team/invoices/{invoice.pk}/credit-notes/new/",
        {"amount": "10", "reason": "duplicate", "refund": "credit", "confirmed": "on"},
    )
    voided = client.post(f"/billing-team/credit-notes/{note.pk}/void/")

    assert (sent.status_code, voided.status_code) == (404, 404)
    assert list(CreditNote.objects.values_list("status", flat=True)) == ["issued"]


def test_an_actor_not_acting_as_staff_is_refused_and_the_refusal_recorded(
    tenant, plan, finance, owner
):
    invoice = _invoice(tenant, plan, finance)

    with pytest.raises(Exception, match="Only platform staff"):
        invoicing.credit_note_issue(
            actor=Actor(user=owner), invoice=invoice, amount=Decimal(5), reason="duplicate"
        )

    assert not CreditNote.objects.exists()
    assert AuditEvent.objects.filter(action="invoice.credit_note_issue", result="denied").exists()


def test_the_team_voids_a_credit_note_which_keeps_its_number_and_takes_nothing_off(
    team_client, tenant, plan, finance
):
    invoice = _invoice(tenant, plan, finance)
    _issue(team_client, invoice, amount="10", request_id="a")
    note = CreditNote.objects.get()

    done = team_client.post(f"/billing-team/credit-notes/{note.pk}/void/", follow=True)
    again = team_client.post(f"/billing-team/credit-notes/{note.pk}/void/", follow=True)

    assert f"Credit note {note.number} voided" in done.content.decode()
    assert "is already void" in again.content.decode()
    note.refresh_from_db()
    assert (note.status, note.number, note.amount) == ("void", f"CN-{YEAR}-000001", Decimal(10))
    assert note.voided_at is not None
    invoice.refresh_from_db()
    assert invoice.status_text() == "Paid" and invoice.amount_remaining == Decimal("40.00")
    assert AuditEvent.objects.filter(action="invoice.credit_note_void", result="ok").count() == 1
    # The next one takes the next number: the voided one keeps its own.
    _issue(team_client, invoice, amount="40", request_id="b")
    assert CreditNote.objects.latest("pk").number == f"CN-{YEAR}-000002"


def test_an_invoice_is_not_voided_while_its_credit_notes_stand(team_client, tenant, plan, finance):
    invoice = _invoice(tenant, plan, finance, status="open")
    _issue(team_client, invoice, amount="10", request_id="a")

    refused = team_client.post(f"/billing-team/invoices/{invoice.pk}/void/", follow=True)

    assert "has credit notes: void them first" in refused.content.decode()
    assert Invoice.objects.get(pk=invoice.pk).status == "open"


def test_an_issued_credit_note_never_changes_but_to_be_voided(tenant, plan, finance):
    invoice = _invoice(tenant, plan, finance)
    note = invoicing.credit_note_issue(
        actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(5),
        reason="duplicate", memo="As agreed.",
    )  # fmt: skip

    for change in [
        {"amount": Decimal(50)},
        {"memo": "Changed."},
        {"number": "CN-X"},
        {"status": "void"},
    ]:  # fmt: skip  (void without saying when)
        with pytest.raises(DatabaseError, match="it can only be voided"), transaction.atomic():
            CreditNote.objects.filter(pk=note.pk).update(**change)
    with pytest.raises(DatabaseError, match="cannot be deleted"), transaction.atomic():
        CreditNote.objects.filter(pk=note.pk).delete()

    invoicing.credit_note_void(actor=Actor(user=finance, staff=True), credit_note=note)
    with pytest.raises(DatabaseError, match="it can only be voided"), transaction.atomic():
        CreditNote.objects.filter(pk=note.pk).update(status="issued", voided_at=None)
    assert CreditNote.objects.get(pk=note.pk).status == "void"


def test_the_same_form_sent_twice_issues_one_credit_note(team_client, tenant, plan, finance):
    invoice = _invoice(tenant, plan, finance)

    first = _issue(team_client, invoice, amount="10", request_id="same")
    second = _issue(team_client, invoice, amount="10", request_id="same")
    other = _issue(team_client, invoice, amount="12", request_id="same")

    assert CreditNote.objects.count() == 1
    note = CreditNote.objects.get()
    assert first.redirect_chain[-1][0] == second.redirect_chain[-1][0]
    assert f"/billing-team/credit-notes/{note.pk}/" == second.redirect_chain[-1][0]
    assert REUSED in other.content.decode()
    invoice.refresh_from_db()
    assert invoice.amount_credited == Decimal("10.00")


@pytest.mark.django_db(transaction=True)
def test_credit_notes_issued_at_once_never_take_off_more_than_the_invoice(tenant, plan, finance):
    invoice = _invoice(tenant, plan, finance)
    staff = Actor(user=finance, staff=True)
    ids = iter(range(100))

    results = race(
        lambda: invoicing.credit_note_issue(
            actor=staff, invoice=invoice, amount=Decimal(30), reason="duplicate",
            request_id=f"r-{next(ids)}",
        ),
        times=2,
    )  # fmt: skip

    issued = [r for r in results if isinstance(r, CreditNote)]
    refused = [r for r in results if isinstance(r, ValidationError)]
    assert (len(issued), len(refused)) == (1, 1), results
    assert "At most 10.00 USD remains" in " ".join(refused[0].messages)
    assert list(CreditNote.objects.values_list("number", flat=True)) == [f"CN-{YEAR}-000001"]
    invoice.refresh_from_db()
    assert invoice.amount_credited == Decimal("30.00")


@pytest.mark.django_db(transaction=True)
def test_one_request_sent_twice_at_once_issues_one_credit_note(tenant, plan, finance):
    invoice = _invoice(tenant, plan, finance)
    staff = Actor(user=finance, staff=True)

    results = race(
        lambda: invoicing.credit_note_issue(
            actor=staff, invoice=invoice, amount=Decimal(10), reason="duplicate",
            request_id="double",
        ),
        times=2,
    )  # fmt: skip

    assert all(isinstance(r, CreditNote) for r in results), results
    assert results[0].pk == results[1].pk
    assert CreditNote.objects.count() == 1


# --- the organization's pages and email ----------------------------------------------------------

ISSUER = "Opsdeck Cloud Ltd\nDublin D01 AB12"


def test_the_organization_reads_the_credit_note_on_its_billing_and_invoice_pages_and_prints_it(
    client, settings, tenant, plan, finance, owner
):
    from billing import services
    from tests.billing.test_billing_details import DETAILS

    settings.OPSDECK_INVOICE_ISSUER = ISSUER
    services.billing_details_update(actor=Actor(user=owner), tenant=tenant, details=DETAILS)
    invoice = _invoice(tenant, plan, finance)
    note = invoicing.credit_note_issue(
        actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(10),
        reason="product_unsatisfactory", memo="The October outage, as agreed.", refund=True,
    )  # fmt: skip
    # Changed since: the credit note is made out as its invoice was.
    services.billing_details_update(
        actor=Actor(user=owner), tenant=tenant, details={**DETAILS, "legal_name": "Acme AG"}
    )
    client.force_login(owner)

    billing = client.get(f"/t/{tenant.slug}/billing/").content.decode()
    shown = client.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/").content.decode()
    url = f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/credit-notes/{note.pk}/"
    printed = client.get(url).content.decode()

    assert "Partly refunded (10.00 of 40.00)" in billing
    assert "Partly refunded (10.00 of 40.00)" in shown and note.number in shown
    assert f'href="{url}"' in shown and "Remains paid" in shown and "30.00 USD" in shown
    assert f"Credit note {note.number}" in printed
    assert "Acme GmbH" in printed and "Acme AG" not in printed
    assert "Opsdeck Cloud Ltd<br>Dublin D01 AB12" in printed
    assert f"On invoice {invoice.number}" in printed
    assert "Product unsatisfactory" in printed and "The October outage, as agreed." in printed
    assert "10.00 USD" in printed and "Refunded" in printed
    assert f'<time datetime="{note.created.isoformat()}">' in printed


def test_another_organization_and_a_stripe_credit_note_are_not_found(
    client, tenant, plan, finance, make_user
):
    from accounts import services as account_services

    invoice = _invoice(tenant, plan, finance)
    note = invoicing.credit_note_issue(
        actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(10),
        reason="duplicate",
    )  # fmt: skip
    stranger = make_user("stranger@example.com")
    theirs = account_services.tenant_create(actor=Actor(user=stranger), name="Theirs")
    stripes = CreditNote.objects.create(
        invoice=invoice, stripe_credit_note_id="cn_1", number="S-CN-1", currency="usd",
        amount=Decimal(1), created=invoice.finalized_at,
    )  # fmt: skip
    client.force_login(stranger)

    for path in [
        f"/t/{theirs.slug}/billing/invoices/{invoice.pk}/credit-notes/{note.pk}/",
        f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/credit-notes/{note.pk}/",
    ]:
        assert client.get(path).status_code == 404, path
    client.force_login(tenant.memberships.get().user)
    assert client.get(
        f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/credit-notes/{stripes.pk}/"
    ).status_code == 404  # fmt: skip
    assert client.get(
        f"/t/{tenant.slug}/billing/invoices/{invoice.pk + 1}/credit-notes/{note.pk}/"
    ).status_code == 404  # fmt: skip


def test_the_owners_and_billing_members_are_emailed_the_credit_note(
    settings, tenant, plan, finance, owner, add_member, django_capture_on_commit_callbacks
):
    from django.core import mail

    settings.CELERY_TASK_ALWAYS_EAGER = True  # the mail is sent in-process, after commit
    add_member("books@example.com", "billing")
    add_member("dev@example.com", "member")
    invoice = _invoice(tenant, plan, finance, status="open")
    mail.outbox.clear()

    with django_capture_on_commit_callbacks(execute=True):
        note = invoicing.credit_note_issue(
            actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal("12.50"),
            reason="duplicate", memo="Billed twice for orders.",
        )  # fmt: skip

    (sent,) = mail.outbox
    assert sorted(sent.to) == ["books@example.com", "owner@example.com"]
    assert sent.subject == f"[Opsdeck] Credit note {note.number} on invoice {invoice.number}"
    assert "Credited: 12.50 USD" in sent.body and "Billed twice for orders." in sent.body
    assert "Remains due on the invoice: 27.50 USD" in sent.body
    assert f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/credit-notes/{note.pk}/" in sent.body


def test_the_owners_and_billing_members_are_emailed_a_voided_credit_note_and_what_is_due(
    settings, tenant, plan, finance, owner, add_member, django_capture_on_commit_callbacks
):
    """They were told of the credit note and of the less they owed; voiding it said nothing,
    and the invoice asked for more again without a word."""
    from django.core import mail

    settings.CELERY_TASK_ALWAYS_EAGER = True
    add_member("books@example.com", "billing")
    add_member("dev@example.com", "member")
    invoice = _invoice(tenant, plan, finance, status="open")
    staff = Actor(user=finance, staff=True)
    note = invoicing.credit_note_issue(
        actor=staff, invoice=invoice, amount=Decimal("12.50"), reason="duplicate"
    )
    mail_forget()

    with django_capture_on_commit_callbacks(execute=True):
        invoicing.credit_note_void(actor=staff, credit_note=note)

    (sent,) = mail.outbox
    assert sorted(sent.to) == ["books@example.com", "owner@example.com"]
    assert sent.subject == f"[Opsdeck] Credit note {note.number} on invoice {invoice.number} voided"
    assert "was voided: its 12.50 USD credited are no longer taken off" in sent.body
    assert "Remains due on the invoice: 40.00 USD" in sent.body
    assert f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/credit-notes/{note.pk}/" in sent.body

    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ValidationError):
        invoicing.credit_note_void(actor=staff, credit_note=note)  # already void
    assert mail.outbox == []


def test_a_refused_credit_note_emails_no_one(
    settings, tenant, plan, finance, django_capture_on_commit_callbacks
):
    from django.core import mail

    settings.CELERY_TASK_ALWAYS_EAGER = True
    invoice = _invoice(tenant, plan, finance)
    mail.outbox.clear()

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ValidationError):
        invoicing.credit_note_issue(
            actor=Actor(user=finance, staff=True), invoice=invoice, amount=Decimal(41),
            reason="duplicate",
        )  # fmt: skip

    assert mail.outbox == []


def _said(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_a_void_invoice_says_nothing_of_it_remains_rather_than_its_total_paid(
    team_client, tenant, plan, finance, owner
):
    """Credited in part, the credit note voided, then the invoice voided: its pages said
    "Remains paid 40.00 USD" of an invoice nothing was paid on."""
    invoice = _invoice(tenant, plan, finance, status="open")
    _issue(team_client, invoice, amount="10", request_id="a")
    team_client.post(f"/billing-team/credit-notes/{CreditNote.objects.get().pk}/void/")
    team_client.post(f"/billing-team/invoices/{invoice.pk}/void/")
    assert Invoice.objects.get(pk=invoice.pk).status == Invoice.Status.VOID
    customer = Client()
    customer.force_login(owner)

    pages = [
        customer.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/").content.decode(),
        team_client.get(f"/billing-team/invoices/{invoice.pk}/").content.decode(),
    ]

    for page in pages:
        assert "Total 40.00 USD Remains Nothing: the invoice is void" in _said(page)
        assert "Remains paid" not in page


def test_a_draft_the_team_voided_is_never_shown_to_the_organization(
    team_client, tenant, plan, finance, owner
):
    """A wrong draft voided before it was finalized was listed on the Billing page, numbered
    "—", for 9,999.00 USD, an invoice the organization was never sent."""
    draft = _invoice(tenant, plan, finance, status="draft", total="9999.00")
    sent = _invoice(tenant, plan, finance, status="open", total="12.00", period="2026-09")
    team_client.post(f"/billing-team/invoices/{draft.pk}/void/")
    assert Invoice.objects.get(pk=draft.pk).status == Invoice.Status.VOID
    customer = Client()
    customer.force_login(owner)

    listed = customer.get(f"/t/{tenant.slug}/billing/").content.decode()

    assert "9,999.00" not in listed and "9999.00" not in listed
    assert sent.number in listed
    assert customer.get(f"/t/{tenant.slug}/billing/invoices/{draft.pk}/").status_code == 404
