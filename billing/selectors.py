"""Reads for billing pages: only the columns a page shows, in a constant number of queries."""

from __future__ import annotations

from django.db.models import QuerySet

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
