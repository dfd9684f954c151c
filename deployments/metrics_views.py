"""The instance page's Metrics tab: CPU and memory charts of its servers (`metrics`)."""

from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from accounts.tenancy import tenant_view
from deployments import metrics, selectors


@tenant_view("instance.view")
@require_safe
def instance_metrics(request, instance_id: str):
    instance = selectors.instance_for_tenant(request.tenant, instance_id)
    if instance is None:
        raise Http404("No such deployment.")
    window = metrics.window_of(request.GET.get("window"))
    kwargs = {"tenant_slug": request.tenant.slug, "instance_id": instance.pk}
    url = reverse("instance_metrics", kwargs=kwargs)
    page_url = reverse("instance_detail", kwargs=kwargs)
    windows = [
        {
            "label": w.label,
            "url": f"{url}?window={w.key}",
            "page_url": f"{page_url}?tab=metrics&window={w.key}",
            "current": w is window,
        }
        for w in metrics.WINDOWS.values()
    ]
    context = {
        "instance": instance,
        "charts": metrics.instance_charts(instance, window),
        "windows": windows,
        "refresh_url": f"{url}?window={window.key}",
    }
    return render(request, "deployments/_instance_metrics.html", context)
