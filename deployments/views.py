from django.shortcuts import render

from accounts.tenancy import tenant_view
from deployments import selectors


@tenant_view("instance.view")
def instance_list(request):
    instances = selectors.instances_for_tenant(request.tenant)
    return render(request, "deployments/instance_list.html", {"instances": instances})
