"""Invoices computed by Opsdeck (billing without Stripe): a closed billing period becomes one
draft invoice per tenant and plan; staff finalize (number and freeze) or void drafts.

A period closes once every hour of it is metered (`billing.usage`). Its invoice has a line per
instance and dimension: the unit-hours used (the `UsageRecord`s billed in the period — late
usage of an earlier, closed period comes as a line of its own, `adjustment_of`), the price of a
unit-hour (a monthly price is spread over 730 hours, as everywhere) and the amount. A line's
amount is rounded half up to the currency's minor unit once; the total is the sum of the lines
as printed, so an invoice always adds up.

Finalized invoices are numbered `<year>-<000001>` in the order they were finalized, without
gaps: the number comes from an `InvoiceCounter` row locked in the finalizing transaction. A
database trigger (migration `0004_invoices`) refuses any change to a finalized invoice's
amounts, number or lines; its status may still move on to paid or void.

The billing team corrects a finalized invoice with credit notes (`credit_note_issue`): each
takes an amount off it, at most what earlier ones left, refunded outside Opsdeck or credited;
they are numbered `CN-<year>-<000001>` in a series of their own, and once issued only voided
(a trigger, migration `0027_local_credit_notes`).

With Stripe, usage sent to Stripe's meters is billed on Stripe's invoice (mirrored by
`stripe_sync.invoice_mirror`), not here: a tenant with a Stripe subscription gets a draft only
for what Stripe could not take — hours older than its meters accept (`MeterEvent` adjusted),
as adjustment lines.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, Max, OuterRef, Q, Sum
from django.db.models.functions import TruncMonth
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from accounts import idempotency, mail
from accounts.audit import Actor, audit_record, audited_action
from accounts.errors import ActionDenied
from billing import meter_events, stripe_sync, usage
from billing.models import (
    BillingPeriod,
    CreditNote,
    Invoice,
    InvoiceCounter,
    InvoiceLine,
    MeterEvent,
    Plan,
    Subscription,
    UsageRecord,
)
from billing.pricing import PriceBook, minor_unit, rounded
from billing.selectors import invoice_parties
from billing.services import subscription_recipients
from billing.stripe_gateway import stripe_bills

log = logging.getLogger(__name__)

_PERIOD = re.compile(r"^([0-9]{4})-(0[1-9]|1[0-2])$")  # ASCII digits only
# How long after a month ends its close may wait for the last hours' metering before a period
# still open is logged as a warning.
CLOSE_LATE_AFTER = timedelta(hours=6)


# The years a billing period may name: none before Unix time, and one whose next month a date
# can still hold.
_YEARS = range(1970, 9999)


def period_clean(key: str) -> str:
    """`key` if it names a month as "YYYY-MM" (of a year in _YEARS); else a ValidationError
    saying so."""
    found = _PERIOD.fullmatch(key.strip()) if isinstance(key, str) else None
    if found is None:
        raise ValidationError(f"{key!r} is not a billing period: write the month as YYYY-MM.")
    if int(found.group(1)) not in _YEARS:
        raise ValidationError(
            f"{key!r} is not a billing period: the year is between {_YEARS[0]} and {_YEARS[-1]}."
        )
    return key.strip()


# --- closing a period ------------------------------------------------------------------------


@dataclass(frozen=True)
class Closed:
    period: str
    invoices: list[Invoice]


@transaction.atomic
def period_close(key: str, *, now: datetime | None = None) -> Closed:
    """Close the billing period `key`: one draft invoice per tenant and plan with usage billed
    in it. Refused (ValidationError, nothing written) before the period has ended, while any
    of its hours is unmetered, or when it is already closed."""
    key = period_clean(key)
    now = now or timezone.now()
    end = usage.period_bounds(key)[1]
    if end > now:
        raise ValidationError(
            f"The period {key} has not ended yet: it can be closed from {end:%Y-%m-%d %H:%M} UTC."
        )
    BillingPeriod.objects.get_or_create(key=key)
    period = BillingPeriod.objects.select_for_update().get(key=key)
    if period.closed_at is not None:
        raise ValidationError(f"The period {key} was closed on {period.closed_at:%Y-%m-%d}.")
    _stripe_reachable(key)
    missing = usage.period_close_check(key)
    if missing:
        raise ValidationError(
            f"{len(missing)} hour{'s' if len(missing) != 1 else ''} of {key} "
            f"{'are' if len(missing) != 1 else 'is'} not metered yet (the first: "
            f"{missing[0]:%Y-%m-%d %H:00} UTC); meter them with `meter_usage --backfill-from "
            f"{missing[0]:%Y-%m-%dT%H:00Z}`, then close the period."
        )
    invoices = _drafts(key)
    period.closed_at = now
    period.save(update_fields=["closed_at"])
    return Closed(key, invoices)


def _stripe_reachable(key: str) -> None:
    """Refuse to close `key` in a process without Stripe's settings while Stripe bills some of
    its usage: its records not yet in the meter-event outbox would be invoiced here, then sent
    to Stripe's meters by the workers, and charged twice."""
    if stripe_bills():
        return
    used = UsageRecord.objects.filter(
        period=key, tenant_id=OuterRef("tenant_id"), plan_id=OuterRef("plan_id")
    )
    billed = Subscription.objects.exclude(stripe_subscription_id="").filter(Exists(used)).count()
    if billed:
        raise ValidationError(
            f"Stripe bills {billed} subscription{'s' if billed != 1 else ''} with usage in {key}, "
            "but Stripe is not configured here (STRIPE_API_KEY is empty): closing the period "
            "here would invoice that usage a second time. Close it where the workers run, with "
            "the same Stripe settings."
        )


def _drafts(key: str) -> list[Invoice]:
    """The draft invoices of the period `key`, from its usage records summed in the database
    per tenant, plan, instance, dimension, price span (`PriceBook`) and, for late usage, the
    month it was used in."""
    start, end = usage.period_bounds(key)
    # Usage that went to Stripe's meters is on Stripe's invoice; what Stripe could not take
    # (older than it accepts) is billed here, as adjustment lines.
    meter_events.enqueue()
    records = UsageRecord.objects.filter(period=key).exclude(
        Exists(
            MeterEvent.objects.filter(usage_record=OuterRef("pk")).exclude(
                status=MeterEvent.Status.ADJUSTED
            )
        )
    )
    plans = Plan.objects.prefetch_related("prices").in_bulk(
        set(records.values_list("plan_id", flat=True).distinct().order_by())
    )
    book = PriceBook.for_records(plans, records, start, end)
    sums = (
        records.annotate(used_in=TruncMonth("hour"), span=book.span(), late=billed_late())
        .values("tenant_id", "plan_id", "instance_id", "dimension", "late", "used_in", "span")
        .annotate(quantity=Sum("quantity"), name=Max("instance_name"), unit=Max("unit"))
        .order_by("tenant_id", "plan_id", "name", "instance_id", "dimension", "used_in", "span")
    )  # fmt: skip
    by_invoice: dict[tuple[int, int], list[dict]] = {}
    for row in sums:
        by_invoice.setdefault((row["tenant_id"], row["plan_id"]), []).append(row)
    invoices = []
    for (tenant_id, plan_id), rows in by_invoice.items():
        plan = plans[plan_id]
        units = {p.dimension: p.unit for p in plan.prices.all()}
        # One line per instance, dimension, month used in and unit price (spans of an
        # override that leaves a dimension's price as it was add up into one line), on an
        # invoice per currency: a plan's new currency applies from the period its new prices
        # do, so a month billed late may be priced in the one before.
        quantities: dict[str, dict[tuple, Decimal]] = {}
        names: dict[str, str] = {}
        for row in rows:
            priced = book.per_hour(tenant_id, plan_id, row["span"], row["dimension"])
            if priced is None or not row["quantity"]:
                continue  # a dimension the plan does not price is free
            unit_price, currency = priced
            used_in = f"{row['used_in']:%Y-%m}" if row["late"] else ""
            line_key = (row["instance_id"], row["dimension"], row["unit"], used_in, unit_price)
            in_currency = quantities.setdefault(currency, {})
            in_currency[line_key] = in_currency.get(line_key, Decimal(0)) + row["quantity"]
            names[row["instance_id"]] = row["name"]
        if not quantities:  # only what the plan does not price: an invoice at 0
            quantities = {next((p.currency for p in plan.prices.all()), "usd"): {}}
        for currency, in_currency in quantities.items():
            lines = [
                InvoiceLine(
                    instance_id=instance_id,
                    instance_name=names[instance_id],
                    dimension=dimension,
                    unit=units.get(dimension) or unit,
                    quantity=quantity,
                    unit_price=unit_price.quantize(Decimal("1e-12"), rounding=ROUND_HALF_UP),
                    amount=rounded(quantity * unit_price, currency),
                    adjustment_of=used_in,
                )
                for (instance_id, dimension, unit, used_in, unit_price), quantity in (
                    in_currency.items()
                )
            ]
            invoice = Invoice.objects.create(
                tenant_id=tenant_id,
                plan=plan,
                period=key,
                currency=currency,
                total=sum((line.amount for line in lines), Decimal(0)),
            )
            for line in lines:
                line.invoice = invoice
            InvoiceLine.objects.bulk_create(lines)
            invoices.append(invoice)
    return invoices


def billed_late():
    """Whether a usage record is billed after the month it was used in: metered after that
    month closed (an adjustment), or too old for Stripe's meters by the time it was sent. Its
    invoice line says the month (`used_in`), apart from the period's own usage."""
    return ExpressionWrapper(
        Q(adjustment=True) | Q(meter_event__status=MeterEvent.Status.ADJUSTED),
        output_field=BooleanField(),
    )


def period_close_due(*, now: datetime | None = None) -> list[Closed]:
    """Close every month that has ended and is not closed yet, oldest first (run by beat
    hourly): the month just ended once its last hours are metered, and an earlier one still
    open because an hour of it was never metered, once it has been (`meter_usage
    --backfill-from`). A month with unmetered hours is left for the next run; from
    CLOSE_LATE_AFTER past its end, each run logs it as a warning, however many months ago it
    ended. The periods closed, in order."""
    now = now or timezone.now()
    current = usage.period_key(now)
    keys = set(
        BillingPeriod.objects.filter(closed_at__isnull=True, key__lt=current).values_list(
            "key", flat=True
        )
    )
    # The month just ended, even with no row yet (nothing metered in it so far).
    just_ended = usage.period_key(usage.period_bounds(current)[0] - usage.HOUR)
    if not BillingPeriod.objects.filter(key=just_ended, closed_at__isnull=False).exists():
        keys.add(just_ended)
    closed = []
    for key in sorted(keys):
        try:
            closed.append(period_close(key, now=now))
        except ValidationError as exc:
            # Early in a month, the last hours' metering is still to come; later, staff must know.
            if now - usage.period_bounds(key)[1] > CLOSE_LATE_AFTER:
                log.warning("billing period %s is still open: %s", key, " ".join(exc.messages))
    return closed


# --- staff actions ---------------------------------------------------------------------------


def _staff_require(actor: Actor) -> None:
    if not actor.is_platform_staff:
        raise ActionDenied("Only platform staff may finalize, void or settle invoices.")


def _locked(invoice: Invoice, doing: str = "finalize, void or settle it") -> Invoice:
    """The invoice, locked; refused when it is Stripe's (Stripe finalizes, voids, collects and
    credits it; Opsdeck mirrors what Stripe holds). `doing`: what the refusal says to do in
    Stripe."""
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.source == Invoice.Source.STRIPE:
        raise ValidationError(
            f"Invoice {invoice} is issued by Stripe: {doing} in Stripe, and Opsdeck follows."
        )
    return invoice


def invoice_finalize(*, actor: Actor, invoice: Invoice) -> Invoice:
    """Number a draft and freeze it, made out to the tenant's billing details as they are now
    and issued by the OPSDECK_INVOICE_ISSUER: from now on only its status may change (paid,
    void)."""
    with audited_action(
        actor=actor, action="invoice.finalize", tenant=invoice.tenant, target=invoice
    ):
        _staff_require(actor)
        invoice = _locked(invoice)
        if invoice.status != Invoice.Status.DRAFT:
            raise ValidationError(f"Invoice {invoice} is {invoice.get_status_display().lower()}.")
        # Made out as the draft shows it (the tenant's details now), and frozen with the rest.
        invoice.billed_to, invoice.issuer = invoice_parties(invoice)
        now = timezone.now()
        invoice.number = _number_next(now)
        invoice.status = Invoice.Status.OPEN
        invoice.finalized_at = now
        invoice.save(update_fields=["number", "status", "finalized_at", "billed_to", "issuer"])
        audit_record(
            actor=actor,
            action="invoice.finalize",
            tenant=invoice.tenant,
            target=invoice,
            payload={
                "number": invoice.number,
                "total": str(rounded(invoice.total, invoice.currency)),
            },
        )
    return invoice


def _number_next(now: datetime, prefix: str = "") -> str:
    """The next invoice number of `now`'s year (with `prefix`, the next of that series: "CN-"
    for credit notes); the counter row stays locked until the numbering transaction ends, so
    numbers are given in order and a rollback frees its one."""
    series = f"{prefix}{now:%Y}"
    InvoiceCounter.objects.get_or_create(series=series)
    counter = InvoiceCounter.objects.select_for_update().get(series=series)
    counter.last += 1
    counter.save(update_fields=["last"])
    return f"{series}-{counter.last:06d}"


def invoice_void(*, actor: Actor, invoice: Invoice) -> Invoice:
    """Cancel a draft or a finalized, unpaid invoice; a finalized one keeps its number."""
    with audited_action(actor=actor, action="invoice.void", tenant=invoice.tenant, target=invoice):
        _staff_require(actor)
        invoice = _locked(invoice)
        if invoice.status not in {Invoice.Status.DRAFT, Invoice.Status.OPEN}:
            raise ValidationError(
                f"Invoice {invoice} is {invoice.get_status_display().lower()}: "
                "only a draft or an unpaid invoice can be voided."
            )
        if invoice.credit_notes.filter(status=CreditNote.Status.ISSUED).exists():
            # Voided, it would take off the whole total once more.
            raise ValidationError(
                f"Invoice {invoice} has credit notes: void them first, then the invoice."
            )
        invoice.status = Invoice.Status.VOID
        invoice.voided_at = timezone.now()
        invoice.save(update_fields=["status", "voided_at"])
        audit_record(
            actor=actor, action="invoice.void", tenant=invoice.tenant, target=invoice, payload={}
        )
    return invoice


def invoice_mark_paid(*, actor: Actor, invoice: Invoice) -> Invoice:
    """Record that a finalized invoice was paid (a bank transfer, outside Opsdeck)."""
    with audited_action(
        actor=actor, action="invoice.mark_paid", tenant=invoice.tenant, target=invoice
    ):
        _staff_require(actor)
        invoice = _locked(invoice)
        if invoice.status != Invoice.Status.OPEN:
            raise ValidationError(
                f"Invoice {invoice} is {invoice.get_status_display().lower()}: only a "
                "finalized, unpaid invoice can be marked paid."
            )
        invoice.status = Invoice.Status.PAID
        invoice.paid_at = timezone.now()
        invoice.save(update_fields=["status", "paid_at"])
        audit_record(actor=actor, action="invoice.mark_paid", tenant=invoice.tenant, target=invoice)
    return invoice


# --- credit notes ------------------------------------------------------------------------------

CREDIT_NOTE_SERIES = "CN-"
MEMO_MAX = 500


def credit_note_check(
    invoice: Invoice, *, amount: Decimal, reason: str, memo: str, refund: bool
) -> Decimal:
    """Refuse a credit note of `amount` on `invoice` (ValidationError, by field where one is
    wrong) unless the invoice is Opsdeck's and finalized, the amount above 0, in the invoice's
    currency's minor unit and at most what earlier credit notes left of it, the reason one of
    `CreditNote.LOCAL_REASONS`, and a refund one of a paid invoice. What remains to credit
    after it. Read under the invoice's lock by `credit_note_issue`; unlocked, for a preview."""
    if invoice.source == Invoice.Source.STRIPE:
        raise ValidationError(
            f"Invoice {invoice} is issued by Stripe: issue its credit notes in Stripe, and "
            "Opsdeck follows."
        )
    if invoice.status == Invoice.Status.DRAFT:
        raise ValidationError(
            f"Invoice {invoice} is a draft: finalize it first; only a finalized invoice takes "
            "credit notes."
        )
    if invoice.status == Invoice.Status.VOID:
        raise ValidationError(
            f"Invoice {invoice} is void: nothing of it is owed, so there is nothing to credit."
        )
    errors: dict[str, str] = {}
    code = invoice.currency.upper()
    left = credit_note_left(invoice)
    if amount <= 0:
        errors["amount"] = "Enter an amount above 0."
    elif amount > left:
        errors["amount"] = (
            f"At most {rounded(left, invoice.currency)} {code} remains to credit of invoice "
            f"{invoice} ({rounded(invoice.total, invoice.currency)} {code}, less its credit "
            "notes)."
            if left
            else f"Nothing remains to credit of invoice {invoice}: its credit notes cover it."
        )
    elif amount != rounded(amount, invoice.currency):
        places = -minor_unit(invoice.currency).as_tuple().exponent
        errors["amount"] = (
            f"{code} amounts are whole numbers."
            if not places
            else f"{code} amounts have at most {places} decimal places."
        )
    if reason not in CreditNote.LOCAL_REASONS:
        errors["reason"] = "Choose a reason."
    if len(memo) > MEMO_MAX:
        errors["memo"] = f"Use at most {MEMO_MAX} characters (this has {len(memo)})."
    elif not all(c.isprintable() or c in "\r\n" for c in memo):  # printed, and mailed
        errors["memo"] = "Use letters, digits, spaces, punctuation and line breaks only."
    if refund and invoice.status != Invoice.Status.PAID:
        errors["refund"] = (
            f"Invoice {invoice} is not paid: there is nothing to refund. Credit it instead "
            "(it lowers what is due)."
        )
    if errors:
        raise ValidationError(errors)
    return left - amount


def credit_note_left(invoice: Invoice) -> Decimal:
    """What remains of the invoice's total to credit: less its issued credit notes."""
    issued = invoice.credit_notes.filter(status=CreditNote.Status.ISSUED)
    return invoice.total - (issued.aggregate(sum=Sum("amount"))["sum"] or Decimal(0))


def credit_note_issue(
    *,
    actor: Actor,
    invoice: Invoice,
    amount: Decimal,
    reason: str,
    memo: str = "",
    refund: bool = False,
    request_id: str = "",
) -> CreditNote:
    """Take `amount` off a finalized Opsdeck invoice with a credit note: refunded outside
    Opsdeck (`refund`, a paid invoice's) or credited; numbered next in its own series, frozen,
    and mailed to the organization's owners and billing members. Checked
    (`credit_note_check`) under the invoice's lock, so that credit notes issued at once never
    take off more than its total. One credit note per request id: a repeat returns it."""
    memo = memo.strip()
    with audited_action(
        actor=actor, action="invoice.credit_note_issue", tenant=invoice.tenant, target=invoice
    ):
        _staff_require(actor)
        request_id = idempotency.request_id_clean(request_id)
        claim = idempotency.request_claim(
            scope=idempotency.user_scope(actor.user),
            request_id=request_id,
            action="invoice.credit_note_issue",
            raw={
                "invoice": invoice.pk, "amount": str(amount), "reason": reason, "memo": memo,
                "refund": refund,
            },
        )  # fmt: skip
        if claim.earlier is not None:
            return CreditNote.objects.get(pk=claim.earlier.target_id)
        invoice = _locked(invoice, "issue its credit notes")
        credit_note_check(invoice, amount=amount, reason=reason, memo=memo, refund=refund)
        now = timezone.now()
        note = CreditNote(
            invoice=invoice,
            source=Invoice.Source.LOCAL,
            number=_number_next(now, CREDIT_NOTE_SERIES),
            currency=invoice.currency,
            amount=rounded(amount, invoice.currency),  # "10.000" dollars are 10.00
            refunded=rounded(amount, invoice.currency) if refund else Decimal(0),
            reason=CreditNote.LOCAL_REASONS[reason],
            memo=memo,
            created=now,
        )
        note.full_clean()
        note.save()
        claim.bind(note)
        # What the invoice's pages say taken back: one sum for Opsdeck's and Stripe's alike.
        stripe_sync.invoice_credits_total(invoice)
        invoice.refresh_from_db(fields=["amount_refunded", "amount_credited"])
        audit_record(
            actor=actor,
            action="invoice.credit_note_issue",
            tenant=invoice.tenant,
            target=invoice,
            payload={
                "credit_note": note.number,
                "amount": str(rounded(amount, invoice.currency)),
                "refunded": refund,
                "reason": note.reason,
            },
        )
        credit_note_email_send(credit_note=note)
    return note


def credit_note_void(*, actor: Actor, credit_note: CreditNote) -> CreditNote:
    """Void an Opsdeck credit note: it keeps its number and takes nothing off its invoice."""
    invoice = credit_note.invoice
    with audited_action(
        actor=actor, action="invoice.credit_note_void", tenant=invoice.tenant, target=invoice
    ):
        _staff_require(actor)
        invoice = _locked(invoice, "void its credit notes")
        note = CreditNote.objects.select_for_update().get(pk=credit_note.pk)
        if note.status != CreditNote.Status.ISSUED:
            raise ValidationError(f"Credit note {note} is already void.")
        note.status = CreditNote.Status.VOID
        note.voided_at = timezone.now()
        note.save(update_fields=["status", "voided_at"])
        stripe_sync.invoice_credits_total(invoice)
        audit_record(
            actor=actor,
            action="invoice.credit_note_void",
            tenant=invoice.tenant,
            target=invoice,
            payload={
                "credit_note": note.number,
                "amount": str(rounded(note.amount, note.currency)),
            },
        )
        invoice.refresh_from_db(fields=["amount_refunded", "amount_credited"])
        note.invoice = invoice
        credit_note_email_send(credit_note=note)
    return note


def credit_note_email_send(*, credit_note: CreditNote) -> None:
    """Tell the organization's owners and billing members of a credit note issued on one of
    its invoices, or voided, with the link to it; written in the transaction that issued or
    voided it (`accounts.mail`). Not for a deleted organization: its members can no longer
    open it."""
    invoice = credit_note.invoice
    if invoice.tenant.deleted_at is not None:
        return
    recipients = subscription_recipients(invoice.tenant)
    if not recipients:
        return
    void = credit_note.status == CreditNote.Status.VOID
    path = reverse(
        "credit_note_detail",
        kwargs={"tenant_slug": invoice.tenant.slug, "invoice_id": invoice.pk,
                "credit_note_id": credit_note.pk},
    )  # fmt: skip
    context = {
        "note": credit_note,
        "invoice": invoice,
        "link": settings.OPSDECK_BASE_URL.rstrip("/") + path,
    }
    subject = f"[Opsdeck] Credit note {credit_note.number} on invoice {invoice.number}"
    mail.send(
        subject=f"{subject} voided" if void else subject,
        body=render_to_string(
            "billing/email/credit_note_void.txt" if void else "billing/email/credit_note.txt",
            context,
        ),
        to=recipients,
    )
