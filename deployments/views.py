from django.shortcuts import render

from accounts.tenancy import tenant_view


@tenant_view("instance.view")
def instance_list(request):
    return render(request, "deployments/instance_list.html")
