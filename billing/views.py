from django.shortcuts import render

from accounts.tenancy import tenant_view


@tenant_view("billing.view")
def overview(request):
    return render(request, "billing/overview.html")
