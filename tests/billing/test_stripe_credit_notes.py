"""Refunds and credit notes of Stripe's invoices: mirrored from Stripe's webhooks, and shown on
the invoice list and the invoice's page (a refunded invoice read "Paid" and its full total)."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import AuditEvent
from billing import meter_events, reports, selectors, stripe_sync
from billing.models import CreditNote, Invoice, MeterEvent, StripeMeter, StripePrice
from tests.billing import test_stripe_invoices as stripe_invoices
from tests.billing.test_stripe_invoices import _deliver, _this_hour
from tests.concurrency import race

subscription = stripe_invoices.subscription  # a fixture: the tenant subscribed through Checkout

pytestmark = pytest.mark.unsubscribed


def _invoiced(emulator, record_usage, subscription, *, paid: bool = True) -> dict:
    """800 core-hours at 0.05: a Stripe invoice of 40.00 USD, finalized (and paid), none of
    its events delivered yet."""
    record_usage(_this_hour(), ("inst-a", "cpu", "800"))
    meter_events.enqueue()
    assert meter_events.flush().sent == 1
    draft = emulator.close_period(subscription.stripe_subscription_id)
    invoice = emulator.finalize_invoice(draft["id"])
    if paid:
        emulator.pay_invoice(invoice["id"])
    return invoice


def _pages(owner_client, tenant, stored) -> tuple[str, str]:
    listed = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    detail = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{stored.pk}/")
    assert detail.status_code == 200
    return listed, detail.content.decode()


def test_a_partly_refunded_invoice_says_so_once_however_often_stripe_tells(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    invoice = _invoiced(emulator, record_usage, subscription)
    _deliver(client, emulator.events("invoice.paid")[-1])

    emulator.refund_invoice(invoice["id"], 1200)
    refunded = emulator.events("charge.refunded")[-1]
    _deliver(client, refunded)
    _deliver(client, refunded)  # delivered again: changes nothing

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert (stored.status, stored.total, stored.amount_refunded) == (
        "paid", Decimal("40.00"), Decimal("12.00"),
    )  # fmt: skip
    listed, detail = _pages(owner_client, tenant, stored)
    assert "Partly refunded (12.00 of 40.00)" in listed and ">Paid<" not in listed
    assert "Partly refunded (12.00 of 40.00)" in detail
    assert "Remains paid" in detail and "28.00 USD" in detail
    assert AuditEvent.objects.filter(action="invoice.stripe_refunded").count() == 1

    emulator.refund_invoice(invoice["id"])  # the rest
    _deliver(client, emulator.events("charge.refunded")[-1])
    _deliver(client, refunded)  # an older copy, late: never lowers what was refunded

    listed, detail = _pages(owner_client, tenant, stored)
    assert "badge-invoice-refunded" in listed and ">Refunded<" in listed
    assert ">Refunded<" in detail and "Remains paid" in detail and "0.00 USD" in detail


def _paid_at_once(client, emulator, record_usage, subscription) -> tuple[dict, dict]:
    """Two Stripe invoices, of 40.00 and 20.00 USD (the next period's), paid by one payment of
    60.00 (Stripe lists the payments newest first: the 20.00 one's first); their events
    delivered."""
    first = _invoiced(emulator, record_usage, subscription, paid=False)
    # Half as many core-hours in the next period, sent to Stripe's meter once it has begun.
    gw = stripe_sync.gateway()
    begun = gw.subscription(subscription.stripe_subscription_id)["items"]["data"][0]
    start = begun["current_period_start"]
    emulator.advance_clock(start + 3600 - emulator.advance_clock(0))
    sent = MeterEvent.objects.get()
    gw.meter_event_send(
        event_name=sent.event_name, customer_id=sent.customer_id, value=str(int(sent.value) // 2),
        identifier="next-period", timestamp=start + 60, attempt=1,
    )  # fmt: skip
    second = emulator.finalize_invoice(
        emulator.close_period(subscription.stripe_subscription_id)["id"]
    )
    assert (first["amount_due"], second["amount_due"]) == (4000, 2000)
    emulator.pay_invoices_at_once([first["id"], second["id"]])
    for paid in emulator.events("invoice.paid"):
        _deliver(client, paid)
    return first, second


def _refunded(*invoices: dict) -> dict[str, Decimal]:
    """What each of the Stripe invoices reads refunded, by Stripe id."""
    rows = Invoice.objects.filter(stripe_invoice_id__in=[each["id"] for each in invoices])
    return {row.stripe_invoice_id: row.amount_refunded for row in rows}


def test_a_refund_of_one_payment_of_two_invoices_is_counted_once_not_on_each(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    """A customer paid two invoices at once (one payment of 60.00 for 40.00 and 20.00); Stripe
    refunded 12.00 of that payment: each invoice read "Partly refunded (12.00 …)", 24.00 in
    all. The refund is counted once, against the invoices in the order Stripe lists their
    payments, each at most what it paid."""
    first, second = _paid_at_once(client, emulator, record_usage, subscription)

    emulator.refund_invoice(first["id"], 1200)
    _deliver(client, emulator.events("charge.refunded")[-1])
    partly = _refunded(first, second)
    emulator.refund_invoice(first["id"])  # the rest of the payment
    _deliver(client, emulator.events("charge.refunded")[-1])
    whole = _refunded(first, second)

    assert sum(partly.values()) == Decimal("12.00"), partly
    assert sorted(partly.values()) == [Decimal("0.00"), Decimal("12.00")]
    assert whole == {first["id"]: Decimal("40.00"), second["id"]: Decimal("20.00")}
    listed = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert listed.count(">Refunded<") == 2 and "Partly refunded" not in listed


def test_a_credit_note_refund_of_a_payment_of_two_invoices_counts_on_its_invoice_alone(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    """One payment of 60.00 paid invoices of 40.00 and 20.00; a credit note of the 40.00 one
    refunded it whole. The 20.00 one, of which nothing was refunded, read "Refunded" too:
    60.00 refunded in all, of a payment refunded 40.00. A credit note's refund is its
    invoice's; only refunds outside credit notes are counted in the order Stripe lists the
    invoices' payments, each within what credit notes left of what the payment paid of it."""
    first, second = _paid_at_once(client, emulator, record_usage, subscription)

    emulator.create_credit_note(first["id"], amount=4000, refund_amount=4000, reason="duplicate")
    _deliver(client, emulator.events("charge.refunded")[-1])  # before the credit note's own
    _deliver(client, emulator.events("credit_note.created")[-1])

    assert _refunded(first, second) == {first["id"]: Decimal("40.00"), second["id"]: Decimal("0")}
    listed = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert listed.count(">Refunded<") == 1 and listed.count(">Paid<") == 1
    totals = selectors.period_totals(Invoice.objects.all())  # the billing team's
    assert sum(each.taken_back for each in totals) == Decimal("40.00")

    emulator.refund_invoice(second["id"], 1200)  # outside any credit note: the second's
    _deliver(client, emulator.events("charge.refunded")[-1])

    assert _refunded(first, second) == {
        first["id"]: Decimal("40.00"), second["id"]: Decimal("12.00"),
    }  # fmt: skip
    listed = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert "Partly refunded (12.00 of 20.00)" in listed and listed.count(">Refunded<") == 1


@pytest.mark.parametrize("given_back", ["credit_amount", "out_of_band_amount"])
def test_a_refund_of_a_payment_of_two_invoices_skips_one_a_credit_note_gave_back_whole(
    client, owner_client, tenant, subscription, emulator, record_usage, given_back
):
    """One payment of 60.00 paid invoices of 40.00 and 20.00; a credit note of the 20.00 one
    gave it back whole to the customer's balance (or outside Stripe), then 40.00 of the payment
    was refunded. The 20.00 one read "Refunded" (20.00 refunded and 20.00 credited) and the
    40.00 one "Partly refunded (20.00 of 40.00)": the billing team's totals took 40.00 back of
    the 60.00 given back. Nothing of the 20.00 one was left to refund: the 40.00 is the other's."""
    first, second = _paid_at_once(client, emulator, record_usage, subscription)

    emulator.create_credit_note(second["id"], amount=2000, **{given_back: 2000})
    _deliver(client, emulator.events("credit_note.created")[-1])
    emulator.refund_invoice(first["id"], 4000)  # outside any credit note
    _deliver(client, emulator.events("charge.refunded")[-1])

    assert _refunded(first, second) == {first["id"]: Decimal("40.00"), second["id"]: Decimal("0")}
    listed = owner_client.get(f"/t/{tenant.slug}/billing/").content.decode()
    assert listed.count(">Refunded<") == 1 and listed.count(">Credited<") == 1
    assert "Partly refunded" not in listed
    totals = selectors.period_totals(Invoice.objects.all())  # the billing team's
    assert sorted(each.taken_back for each in totals) == [Decimal("20.00"), Decimal("40.00")]


def test_a_credit_note_giving_back_an_invoice_a_refund_was_counted_on_moves_no_refund_twice(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    """A refund counted on the 20.00 invoice (listed first) stays counted there when a credit
    note then credits that invoice whole: a later refund is counted on the 40.00 one, each unit
    refunded once in all."""
    first, second = _paid_at_once(client, emulator, record_usage, subscription)

    emulator.refund_invoice(first["id"], 2000)
    _deliver(client, emulator.events("charge.refunded")[-1])
    assert _refunded(first, second) == {first["id"]: Decimal("0"), second["id"]: Decimal("20.00")}
    emulator.create_credit_note(second["id"], amount=2000, credit_amount=2000)
    _deliver(client, emulator.events("credit_note.created")[-1])
    emulator.refund_invoice(first["id"], 1000)
    _deliver(client, emulator.events("charge.refunded")[-1])

    assert _refunded(first, second) == {
        first["id"]: Decimal("10.00"), second["id"]: Decimal("20.00"),
    }  # fmt: skip


def test_a_refund_of_an_invoice_paid_alone_counts_whole_whatever_its_credit_notes_credited(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    """An invoice paid by a payment of its own: what the payment refunded is the invoice's,
    also beyond what its credit notes left (Stripe refunded it all the same)."""
    invoice = _invoiced(emulator, record_usage, subscription)
    emulator.create_credit_note(invoice["id"], amount=1000, credit_amount=1000)
    emulator.refund_invoice(invoice["id"])  # all 40.00
    for event in emulator.events("invoice.paid") + emulator.events("credit_note.created"):
        _deliver(client, event)
    _deliver(client, emulator.events("charge.refunded")[-1])

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert (stored.amount_refunded, stored.amount_credited) == (Decimal("40.00"), Decimal("10.00"))


def test_a_credit_note_arriving_before_its_invoice_mirrors_both_and_counts_its_refund_once(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    invoice = _invoiced(emulator, record_usage, subscription)
    note = emulator.create_credit_note(
        invoice["id"], amount=1500, refund_amount=1000, credit_amount=500,
        reason="product_unsatisfactory", memo="Downtime on 3 May",
    )  # fmt: skip
    assert not Invoice.objects.exists()

    _deliver(client, emulator.events("credit_note.created")[-1])  # before any invoice event
    _deliver(client, emulator.events("charge.refunded")[-1])  # the credit note's refund
    _deliver(client, emulator.events("invoice.paid")[-1])  # late

    stored = Invoice.objects.get(stripe_invoice_id=invoice["id"])
    assert stored.status == "paid" and stored.number == invoice["number"]
    assert (stored.amount_refunded, stored.amount_credited) == (Decimal("10.00"), Decimal("5.00"))
    (credit_note,) = stored.credit_notes.all()
    assert (credit_note.number, credit_note.status, credit_note.amount) == (
        note["number"], "issued", Decimal("15.00"),
    )  # fmt: skip
    assert credit_note.reason == "Product unsatisfactory"
    listed, detail = _pages(owner_client, tenant, stored)
    said = "Partly refunded (10.00 of 40.00), credited 5.00"
    assert said in listed and said in detail
    assert note["number"] in detail and "Downtime on 3 May" in detail
    assert "Product unsatisfactory" in detail and "15.00 USD" in detail
    assert f'href="{note["pdf"]}"' in detail
    assert "Remains paid" in detail and "25.00 USD" in detail


def test_a_voided_credit_note_shows_void_and_takes_nothing_off_even_when_its_creation_comes_late(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    invoice = _invoiced(emulator, record_usage, subscription, paid=False)
    _deliver(client, emulator.events("invoice.finalized")[-1])
    note = emulator.create_credit_note(invoice["id"], amount=1000, reason="order_change")
    created = emulator.events("credit_note.created")[-1]
    _deliver(client, created)
    stored = Invoice.objects.get()
    listed, detail = _pages(owner_client, tenant, stored)
    assert "Finalized; credited (10.00 of 40.00)" in listed
    assert "Remains due" in detail and "30.00 USD" in detail

    emulator.void_credit_note(note["id"])
    _deliver(client, emulator.events("credit_note.voided")[-1])
    _deliver(client, created)  # a late copy of when it was issued

    stored.refresh_from_db()
    assert stored.credit_notes.get().status == "void"
    assert (stored.amount_refunded, stored.amount_credited) == (0, 0)
    listed, detail = _pages(owner_client, tenant, stored)
    assert "credited" not in listed and ">Finalized<" in listed
    assert note["number"] in detail and "no longer counts" in detail
    assert "Remains due" in detail and "40.00 USD" in detail
    assert list(
        AuditEvent.objects.filter(action__startswith="invoice.stripe_credit_note")
        .order_by("pk")
        .values_list("action", flat=True)
    ) == ["invoice.stripe_credit_note_issued", "invoice.stripe_credit_note_void"]


def test_a_credit_note_covering_an_open_invoice_whole_reads_credited(
    client, owner_client, tenant, subscription, emulator, record_usage
):
    invoice = _invoiced(emulator, record_usage, subscription, paid=False)
    emulator.create_credit_note(invoice["id"], amount=4000, reason="duplicate")

    _deliver(client, emulator.events("credit_note.created")[-1])

    stored = Invoice.objects.get()
    assert stored.status == "paid"  # Stripe holds nothing more due
    listed, _ = _pages(owner_client, tenant, stored)
    assert ">Credited<" in listed and "badge-invoice-refunded" in listed


def test_the_credit_note_of_another_customers_invoice_is_ignored(
    client, gw, subscription, emulator
):
    """A sale of the same Stripe account that is not Opsdeck's: its invoice, its credit note
    and its refund are none of ours."""
    stripe = gw.client
    stranger = stripe.v1.customers.create({"name": "Someone else"})
    session = stripe.v1.checkout.sessions.create(
        {
            "mode": "subscription",
            "customer": stranger.id,
            "line_items": [
                {"price": StripePrice.objects.get(price__dimension="cpu").stripe_price_id}
            ],
            "success_url": "https://shop.example/done",
        }
    )
    emulator.complete_checkout(session.id)
    theirs = stripe.v1.checkout.sessions.retrieve(session.id).subscription
    stripe.v1.billing.meter_events.create(
        {
            "event_name": StripeMeter.objects.get(dimension="cpu").event_name,
            "payload": {"stripe_customer_id": stranger.id, "value": "100000000"},
            "identifier": "someone-else-1",
            "timestamp": int(timezone.now().timestamp()) + 1,  # in its period, begun now
        }
    )
    invoice = emulator.close_period(theirs)
    emulator.pay_invoice(invoice["id"])
    emulator.create_credit_note(
        invoice["id"], amount=500, refund_amount=200, out_of_band_amount=300
    )

    for event in emulator.events("credit_note.*") + emulator.events("charge.refunded"):
        _deliver(client, event)

    assert len(emulator.events("charge.refunded")) == 1
    assert not CreditNote.objects.exists()
    assert not Invoice.objects.filter(stripe_invoice_id=invoice["id"]).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_about_one_credit_note_store_it_once(
    subscription, emulator, gw, record_usage
):
    invoice = _invoiced(emulator, record_usage, subscription)
    stored = stripe_sync.invoice_mirror(gw.invoice(invoice["id"]), [])
    note = emulator.create_credit_note(invoice["id"], amount=500, out_of_band_amount=500)

    results = race(lambda: stripe_sync.credit_note_mirror(stored, note["id"], gw))

    assert all(isinstance(r, CreditNote) for r in results), results
    stored.refresh_from_db()
    assert stored.credit_notes.count() == 1 and stored.amount_credited == Decimal("5.00")
    assert AuditEvent.objects.filter(action="invoice.stripe_credit_note_issued").count() == 1


def test_a_refund_changes_no_cost_the_billing_page_reports(
    client, tenant, subscription, emulator, record_usage
):
    """A refund gives money back; it is not usage: the month's cost stays what was used."""
    invoice = _invoiced(emulator, record_usage, subscription)
    _deliver(client, emulator.events("invoice.paid")[-1])
    period = f"{_this_hour():%Y-%m}"
    before = reports.period_cost(tenant, period)

    emulator.create_credit_note(invoice["id"], amount=4000, refund_amount=4000)
    _deliver(client, emulator.events("credit_note.created")[-1])
    _deliver(client, emulator.events("charge.refunded")[-1])

    assert Invoice.objects.get().amount_refunded == Decimal("40.00")
    after = reports.period_cost(tenant, period)
    assert [(m.currency, m.total) for m in after.currencies] == [
        (m.currency, m.total) for m in before.currencies
    ]
    assert [m.total for m in after.currencies] == [Decimal("40.00")]


def _refunded_invoice(tenant, plan, n: int) -> Invoice:
    """A Stripe invoice of 40.00 USD, paid, then 12.00 refunded and 3.00 credited by its
    credit note."""
    invoice = Invoice.objects.create(
        tenant=tenant, plan=plan, period=f"2025-{n:02d}", source="stripe",
        status="paid", number=f"S-{n}", total=Decimal("40"), currency="usd",
        stripe_invoice_id=f"in_{n}", finalized_at=timezone.now(),
        amount_refunded=Decimal("12"), amount_credited=Decimal("3"),
    )  # fmt: skip
    CreditNote.objects.create(
        invoice=invoice, stripe_credit_note_id=f"cn_{n}", number=f"S-{n}-CN-01",
        currency="usd", amount=Decimal("15"), refunded=Decimal("12"), reason="Duplicate",
        pdf_url=f"https://files.stripe.test/cn_{n}.pdf", created=timezone.now(),
    )  # fmt: skip
    return invoice


def test_the_invoice_list_reads_refunds_and_credits_in_a_constant_number_of_queries(
    owner_client, tenant, priced_plan
):
    url = f"/t/{tenant.slug}/billing/"
    _refunded_invoice(tenant, priced_plan, 1)
    owner_client.get(url)
    with CaptureQueriesContext(connection) as few:
        page = owner_client.get(url).content.decode()
    assert page.count("Partly refunded (12.00 of 40.00), credited 3.00") == 1
    for n in range(2, 8):
        _refunded_invoice(tenant, priced_plan, n)
    with CaptureQueriesContext(connection) as many:
        page = owner_client.get(url).content.decode()

    assert page.count("Partly refunded (12.00 of 40.00), credited 3.00") == 7
    assert len(many) == len(few), "\n".join(q["sql"][:150] for q in many)


def test_another_organizations_refunded_invoice_is_not_found(
    client, owner_client, tenant, priced_plan, make_user
):
    from accounts.models import Membership, Tenant

    other = Tenant.objects.create(name="Other", slug="other")
    invoice = Invoice.objects.create(
        tenant=other, plan=priced_plan, period="2025-01", source="stripe", status="paid",
        number="S-1", total=Decimal("40"), stripe_invoice_id="in_other",
        amount_refunded=Decimal("40"),
    )  # fmt: skip
    assert Membership.objects.filter(tenant=other).count() == 0

    response = owner_client.get(f"/t/{tenant.slug}/billing/invoices/{invoice.pk}/")

    assert response.status_code == 404


def test_staff_see_an_invoices_credit_notes_in_the_admin(staff_client, tenant, priced_plan):
    invoice = Invoice.objects.create(
        tenant=tenant, plan=priced_plan, period="2025-01", source="stripe", status="paid",
        number="S-1", total=Decimal("40"), stripe_invoice_id="in_1",
        amount_refunded=Decimal("15"),
    )  # fmt: skip
    CreditNote.objects.create(
        invoice=invoice, stripe_credit_note_id="cn_1", number="S-1-CN-01", currency="usd",
        amount=Decimal("15"), refunded=Decimal("15"), created=timezone.now(),
    )  # fmt: skip

    page = staff_client.get(f"/admin/billing/invoice/{invoice.pk}/change/").content.decode()

    assert "S-1-CN-01" in page


# --- the billing team's pages ------------------------------------------------------------------


@pytest.fixture
def team_client(client, make_user):
    from django.contrib.auth.models import Group

    from billing.team_views import BILLING_TEAM

    user = make_user("finance@opsdeck.example", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=BILLING_TEAM)[0])
    client.force_login(user)
    return client


def test_the_billing_team_sees_what_was_refunded_and_credited(team_client, tenant, priced_plan):
    invoice = _refunded_invoice(tenant, priced_plan, 1)
    said = "Partly refunded (12.00 of 40.00), credited 3.00"

    listed = team_client.get("/billing-team/").content.decode()
    shown = team_client.get(f"/billing-team/invoices/{invoice.pk}/").content.decode()
    export = team_client.get("/billing-team/invoices.csv")

    assert said in listed and "badge-invoice-credited" in listed
    assert said in shown and "S-1-CN-01" in shown and "Duplicate" in shown
    assert 'href="https://files.stripe.test/cn_1.pdf"' in shown
    assert "Remains paid" in shown and "25.00 USD" in shown
    header, row = list(
        csv.reader(io.StringIO(b"".join(export.streaming_content).decode("utf-8-sig")))
    )
    assert dict(zip(header, row, strict=True)) | {"finalized_at": ""} == {
        "number": "S-1", "organization": tenant.name, "plan": priced_plan.name,
        "period": "2025-01", "status": said, "currency": "usd", "total": "40.00",
        "refunded": "12.00", "credited": "3.00", "finalized_at": "",
        "organization_deleted_at": "",
    }  # fmt: skip


def test_the_billing_teams_list_reads_refunds_in_a_constant_number_of_queries(
    team_client, tenant, priced_plan
):
    _refunded_invoice(tenant, priced_plan, 1)
    team_client.get("/billing-team/")
    with CaptureQueriesContext(connection) as few:
        team_client.get("/billing-team/")
    for n in range(2, 8):
        _refunded_invoice(tenant, priced_plan, n)
    with CaptureQueriesContext(connection) as many:
        page = team_client.get("/billing-team/").content.decode()

    assert page.count("Partly refunded (12.00 of 40.00), credited 3.00") == 7
    assert len(many) == len(few), "\n".join(q["sql"][:150] for q in many)


@pytest.mark.parametrize(
    ("currency", "total", "refunded", "credited", "said"),
    [
        ("usd", "40", "12", "0", "Partly refunded (12.00 of 40.00)"),
        ("jpy", "4000", "1200", "0", "Partly refunded (1200 of 4000)"),  # no minor unit
        ("kwd", "4", "0", "1.2", "Credited (1.200 of 4.000)"),  # thousandths
        ("usd", "40", "40", "0", "Refunded"),
        ("usd", "40", "0", "40", "Credited"),
        ("usd", "40", "0", "0", "Paid"),
    ],
)
def test_a_paid_invoice_says_what_was_taken_back_in_its_currencys_units(
    currency, total, refunded, credited, said
):
    invoice = Invoice(
        status="paid", currency=currency, total=Decimal(total),
        amount_refunded=Decimal(refunded), amount_credited=Decimal(credited),
    )  # fmt: skip

    assert invoice.status_text() == said
