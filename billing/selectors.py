"""Reads for billing pages: only the columns a page shows, in a constant number of queries."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum

from accounts.models import Tenant
from billing.models import Invoice

# What a list of invoices shows (never the lines).
_INVOICE_ROW = [
    "id",
    "number",
    "period",
    "status",
    "source",
    "currency",
    "total",
    "finalized_at",
    "hosted_invoice_url",
    "pdf_url",
    "plan__name",
]


def invoices_of(tenant: Tenant) -> QuerySet[Invoice]:
    """The tenant's invoices, newest period first: finalized, paid and void ones (a draft is
    under staff review and not shown to the tenant)."""
    return (
        Invoice.objects.filter(tenant=tenant)
        .exclude(status=Invoice.Status.DRAFT)
        .select_related("plan")
        .only(*_INVOICE_ROW)
        .order_by("-period", "-finalized_at", "-pk")
    )


def invoice_of(tenant: Tenant, invoice_id: int) -> Invoice | None:
    """One of the tenant's invoices a tenant may see, with its lines; None otherwise."""
    return (
        Invoice.objects.filter(tenant=tenant, pk=invoice_id)
        .exclude(status=Invoice.Status.DRAFT)
        .select_related("plan", "tenant")
        .prefetch_related("lines")
        .first()
    )


# --- the billing team's pages ---------------------------------------------------------------

_TEAM_ROW = [*_INVOICE_ROW, "created_at", "tenant__name", "tenant__slug"]


def invoices_for_team(
    *,
    status: str = "",
    period: str = "",
    tenant: str = "",
    min_total: Decimal | None = None,
    max_total: Decimal | None = None,
) -> QuerySet[Invoice]:
    """Every tenant's invoices (drafts included), filtered, newest period first."""
    invoices = Invoice.objects.select_related("plan", "tenant").only(*_TEAM_ROW)
    if status:
        invoices = invoices.filter(status=status)
    if period:
        invoices = invoices.filter(period=period)
    if tenant:
        invoices = invoices.filter(Q(tenant__name__icontains=tenant) | Q(tenant__slug=tenant))
    if min_total is not None:
        invoices = invoices.filter(total__gte=min_total)
    if max_total is not None:
        invoices = invoices.filter(total__lte=max_total)
    return invoices.order_by("-period", "tenant__name", "plan__name", "-pk")


@dataclass(frozen=True)
class PeriodTotal:
    period: str
    currency: str
    invoices: int
    total: Decimal


def period_totals(invoices: QuerySet[Invoice]) -> list[PeriodTotal]:
    """Totals per period and currency of `invoices`, voided ones left out, newest first."""
    rows = (
        invoices.exclude(status=Invoice.Status.VOID)
        .order_by()
        .values("period", "currency")
        .annotate(count=Count("pk"), amount=Sum("total"))
        .order_by("-period", "currency")
    )
    return [PeriodTotal(r["period"], r["currency"], r["count"], r["amount"]) for r in rows]


def invoice_for_team(invoice_id: int) -> Invoice | None:
    return (
        Invoice.objects.filter(pk=invoice_id)
        .select_related("plan", "tenant")
        .prefetch_related("lines")
        .first()
    )
