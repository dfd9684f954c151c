from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers

from accounts import roles
from accounts.htmx import partial_template
from accounts.tenancy import tenant_view
from deployments import selectors
from deployments.models import Instance


def _list_filters(request, services: list[str]) -> dict[str, str]:
    """The list's filters from the query string; a value no select offers is ignored."""
    state = request.GET.get("state", "")
    service = request.GET.get("service", "")
    return {
        "search": request.GET.get("q", "").strip()[:100],
        "state": state if state in Instance.State.values else "",
        "service": service if service in services else "",
    }


@tenant_view("instance.view")
def instance_list(request):
    tenant = request.tenant
    services = selectors.instance_services(tenant)
    filters = _list_filters(request, services)
    instances = selectors.instances_for_tenant(tenant, **filters)
    page = Paginator(instances, selectors.INSTANCES_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    list_url = reverse("instance_list", kwargs={"tenant_slug": tenant.slug})
    context = {
        "page": page,
        "filters": filters,
        "filtered": any(filters.values()),
        "query": query.urlencode(),
        "services": services,
        "states": Instance.State.choices,
        "list_url": list_url,
        # The create page has no URL name yet: it lives at deployments/new/.
        "new_url": list_url + "new/",
        "can_create": roles.can(request.membership.role, "instance.create"),
    }
    template = partial_template(request, "deployments/instance_list.html", "deployment-table")
    response = render(request, template, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- placeholder, replaced by the instance page ---


@tenant_view("instance.view")
def instance_detail(request, instance_id: str):
    instance = get_object_or_404(Instance.objects.for_tenant(request.tenant), pk=instance_id)
    return render(request, "deployments/instance_placeholder.html", {"instance": instance})
