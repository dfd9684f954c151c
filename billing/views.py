from django.http import Http404
from django.shortcuts import render
from django.utils import timezone

from accounts.tenancy import tenant_view
from billing import reports, selectors, usage


@tenant_view("billing.view")
def overview(request):
    return render(
        request,
        "billing/overview.html",
        {
            "cost": reports.period_cost(request.tenant, usage.period_key(timezone.now())),
            "invoices": list(selectors.invoices_of(request.tenant)[:24]),
        },
    )


@tenant_view("billing.view")
def invoice_detail(request, invoice_id: int):
    """One invoice, laid out to be printed or saved as a PDF from the browser."""
    invoice = selectors.invoice_of(request.tenant, invoice_id)
    if invoice is None:
        raise Http404("No such invoice.")
    return render(request, "billing/invoice_detail.html", {"invoice": invoice})
