"""The billing team's pages: every tenant's invoices (review, finalize, void, credit, export)
and usage. For staff in the "Billing team" group; anyone else gets 404 (the pages do not exist
for them). Actions go through `billing.invoicing`, which audits them."""

import uuid
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.exports import csv_download
from accounts.htmx import sent_to
from accounts.models import Tenant
from billing import invoicing, reports, selectors, usage
from billing.forms import CreditNoteForm, InvoiceFilterForm
from billing.models import CreditNote
from billing.pricing import minor_unit, rounded

BILLING_TEAM = "Billing team"


def in_billing_team(user) -> bool:
    return bool(
        user.is_authenticated and user.is_staff and user.groups.filter(name=BILLING_TEAM).exists()
    )


def billing_team_view(view):
    """A page of the billing team's. Never kept by the browser (`Cache-Control: no-store`), as
    tenant pages and the admin are not: Back after Finalize must not show the draft with its
    buttons, nor a signed-out browser every organization's invoices."""

    @never_cache
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not in_billing_team(request.user):
            raise Http404("No such page.")
        return view(request, *args, **kwargs)

    return wrapper


def _filtered(request, *, export: bool = False):
    form = InvoiceFilterForm(request.GET or None)
    filters = {}
    if form.is_bound:
        form.is_valid()  # flags each bad field; the valid ones still apply
        filters = {
            key: value for key, value in form.cleaned_data.items() if value not in ("", None)
        }
    return form, selectors.invoices_for_team(export=export, **filters)


@billing_team_view
@require_safe
def invoices(request):
    form, found = _filtered(request)
    page = Paginator(found, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "billing/team/invoices.html",
        {
            "form": form,
            "page": page,
            "query": query.urlencode(),
            "totals": selectors.period_totals(found),
        },
    )


@billing_team_view
@require_safe
def invoices_export(request):
    _, found = _filtered(request, export=True)
    header = ["number", "organization", "plan", "period", "status", "currency", "total"]
    # Added last, so that a sheet reading the columns before by position still reads them.
    header += ["finalized_at", "organization_deleted_at", "refunded", "credited"]
    rows = (
        [
            invoice.number or "",
            invoice.tenant.name,
            invoice.plan.name,
            invoice.period,
            invoice.status_text(),  # as the pages say it: "Finalized", not "open"
            invoice.currency,
            rounded(invoice.total, invoice.currency),
            invoice.finalized_at.isoformat() if invoice.finalized_at else "",
            # As the page marks it: an organization deleted since (its invoices are kept).
            invoice.tenant.deleted_at.isoformat() if invoice.tenant.deleted_at else "",
            # What refunds and credit notes took back of a Stripe invoice (its total stays).
            rounded(invoice.amount_refunded, invoice.currency),
            rounded(invoice.amount_credited, invoice.currency),
        ]
        for invoice in found.iterator(chunk_size=500)
    )
    return csv_download("invoices.csv", header, rows)


@billing_team_view
@require_safe
def invoice(request, invoice_id: int):
    found = selectors.invoice_for_team(invoice_id)
    if found is None:
        raise Http404("No such invoice.")
    billed_to, issuer = selectors.invoice_parties(found)
    context = {"invoice": found, "billed_to": billed_to, "issuer": issuer, "team": True}
    return render(request, "billing/team/invoice.html", context)


_ACTIONS = {
    "finalize": (invoicing.invoice_finalize, "Invoice {} finalized."),
    "void": (invoicing.invoice_void, "Invoice {} voided."),
    "mark_paid": (invoicing.invoice_mark_paid, "Invoice {} marked paid."),
}


@billing_team_view
@require_POST
def invoice_act(request, invoice_id: int, action: str):
    """Finalize, void or mark paid one invoice; the refusal is shown on its page."""
    found = selectors.invoice_for_team(invoice_id)
    if found is None or action not in _ACTIONS:
        raise Http404("No such invoice.")
    call, done = _ACTIONS[action]
    try:
        changed = call(actor=Actor.from_request(request, staff=True), invoice=found)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except ActionDenied as exc:
        messages.error(request, exc.reason)
    else:
        messages.success(request, done.format(changed))
    return sent_to(request, reverse("billing_team_invoice", args=[found.pk]))


@billing_team_view
@require_http_methods(["GET", "HEAD", "POST"])
def credit_note_new(request, invoice_id: int):
    """Issue a credit note on an Opsdeck invoice: the form, checked and shown back to be
    confirmed, then issued. An invoice that takes none says why on its own page."""
    found = selectors.invoice_for_team(invoice_id)
    if found is None:
        raise Http404("No such invoice.")
    back = reverse("billing_team_invoice", args=[found.pk])
    confirming = False
    if request.method != "POST":
        try:  # the least amount: refused only when the invoice takes no credit note at all
            invoicing.credit_note_check(
                found, amount=minor_unit(found.currency), reason="other", memo="", refund=False
            )
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
            return redirect(back)
        form = CreditNoteForm(initial={"request_id": uuid.uuid4().hex})
    else:
        form = CreditNoteForm(request.POST)
        if form.is_valid():
            values = {key: form.cleaned_data[key] for key in ("amount", "reason", "memo", "refund")}
            try:
                if not form.cleaned_data["confirmed"] or "change" in request.POST:
                    invoicing.credit_note_check(found, **values)
                    confirming = "change" not in request.POST
                else:
                    note = invoicing.credit_note_issue(
                        actor=Actor.from_request(request, staff=True),
                        invoice=found,
                        request_id=form.cleaned_data["request_id"],
                        **values,
                    )
                    messages.success(
                        request,
                        f"Credit note {note.number} issued on invoice {found}: "
                        f"{rounded(note.amount, note.currency)} {note.currency.upper()} "
                        f"{'refunded' if note.refunded else 'credited'}.",
                    )
                    return redirect("billing_team_credit_note", credit_note_id=note.pk)
            except ValidationError as exc:
                form.add_error(None, exc)
            except ActionDenied as exc:
                messages.error(request, exc.reason)
                return redirect(back)
    context = {"invoice": found, "form": form, "confirming": confirming}
    if confirming:
        context["reason"] = CreditNote.LOCAL_REASONS[form.cleaned_data["reason"]]
    return render(request, "billing/team/credit_note_new.html", context)


@billing_team_view
@require_safe
def credit_note(request, credit_note_id: int):
    """An Opsdeck credit note as the organization prints it, with the team's Void."""
    note = selectors.credit_note_for_team(credit_note_id)
    if note is None:
        raise Http404("No such credit note.")
    billed_to, issuer = selectors.invoice_parties(note.invoice)
    context = {"note": note, "invoice": note.invoice, "billed_to": billed_to, "issuer": issuer}
    return render(request, "billing/team/credit_note.html", {**context, "team": True})


@billing_team_view
@require_POST
def credit_note_void(request, credit_note_id: int):
    note = selectors.credit_note_for_team(credit_note_id)
    if note is None:
        raise Http404("No such credit note.")
    try:
        invoicing.credit_note_void(actor=Actor.from_request(request, staff=True), credit_note=note)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except ActionDenied as exc:
        messages.error(request, exc.reason)
    else:
        messages.success(request, f"Credit note {note} voided: it no longer takes anything off.")
    return sent_to(request, reverse("billing_team_credit_note", args=[note.pk]))


@billing_team_view
@require_safe
def tenant_usage(request, tenant_slug: str):
    """One tenant's usage and cost in a period, with the chart its Billing page shows."""
    tenant = get_object_or_404(Tenant, slug=tenant_slug)
    period = request.GET.get("period", "")
    try:
        period = invoicing.period_clean(period)
    except ValidationError as exc:
        if period:
            messages.error(request, " ".join(exc.messages))
        period = usage.period_key(timezone.now())
    return render(
        request,
        "billing/team/usage.html",
        {"tenant": tenant, "period": period, "cost": reports.period_cost(tenant, period)},
    )
