import re
import uuid

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from accounts import roles
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.htmx import partial_template
from accounts.tenancy import tenant_view
from deployments import forms, metering, selectors, services
from deployments.models import Cell, Instance, PlanVersion
from deployments.spec.model import PlanSpec


def _list_filters(request, service_names: list[str]) -> dict[str, str]:
    """The list's filters from the query string; a value no select offers is ignored."""
    state = request.GET.get("state", "")
    service = request.GET.get("service", "")
    return {
        "search": request.GET.get("q", "").strip()[:100],
        "state": state if state in Instance.State.values else "",
        "service": service if service in service_names else "",
    }


_REQUEST_ID = re.compile(r"[0-9a-f]{32}")


@tenant_view("instance.view")
def instance_list(request):
    tenant = request.tenant
    service_names = selectors.instance_services(tenant)
    filters = _list_filters(request, service_names)
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
        "services": service_names,
        "states": Instance.State.choices,
        "list_url": list_url,
        "new_url": reverse("instance_catalog", kwargs={"tenant_slug": tenant.slug}),
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


# --- catalog and create form ---


@tenant_view("instance.view")
def instance_catalog(request):
    # Everyone who sees the deployments may compare plans and prices (billing members too);
    # only those who may create get the "Create instance" links.
    context = {
        "services": selectors.catalog(request.tenant),
        "can_create": roles.can(request.membership.role, "instance.create"),
    }
    return render(request, "deployments/catalog.html", context)


def _plan_or_404(request, plan_key: str) -> tuple[PlanVersion, PlanSpec]:
    found = selectors.plan_available(request.tenant, plan_key)
    if found is None:
        raise Http404("No such plan.")
    return found


def _create_form_class(request, spec: PlanSpec):
    return forms.instance_create_form_class(
        spec.main.parameters,
        groups=spec.parameter_groups,
        cells=list(Cell.objects.offered_to(request.tenant).order_by("name")),
    )


def _estimate_context(version: PlanVersion, spec: PlanSpec, form) -> dict:
    """The cost of the values a (bound or unbound) form holds; None when they are not valid."""
    if form.is_bound:
        form.is_valid()  # the parameters may be valid when another field is not
        values = form.values
    else:
        values = selectors.default_values(spec)
    try:
        cost = metering.estimate(version.plan, spec, values) if values is not None else None
    except metering.UsageError:
        cost = None
    return {"cost": cost, "plan": version.plan}


def _instance_page(request, instance_id: str):
    # The instance page is built beside this one; until its URL exists, the list is the page.
    try:
        return redirect("instance_detail", tenant_slug=request.tenant.slug, instance_id=instance_id)
    except NoReverseMatch:
        return redirect("instance_list", tenant_slug=request.tenant.slug)


@tenant_view("instance.create")
def instance_create(request, plan_key: str):
    version, spec = _plan_or_404(request, plan_key)
    if request.method == "GET" and not _REQUEST_ID.fullmatch(request.GET.get("request", "")):
        # The request id goes in the address: a Back that re-fetches the form gets the same one,
        # so submitting it again returns the instance the first submit made.
        return redirect(f"{request.path}?request={uuid.uuid4().hex}")
    form = _create_form_class(request, spec)(request.POST or None)
    request_id = form["request_id"].value() or request.GET.get("request") or uuid.uuid4().hex
    if request.method == "POST" and form.is_valid():
        try:
            operation = services.instance_create(
                actor=Actor.from_request(request),
                tenant=request.tenant,
                plan=version.plan,
                name=form.cleaned_data["name"],
                parameters=form.given,
                request_id=form.cleaned_data["request_id"],
                cell=form.cleaned_data.get("cell"),
            )
        except ValidationError as exc:
            form.errors_from(exc)
            # Nothing was made: the corrected form goes out as a new request.
            request_id = uuid.uuid4().hex
        except ActionDenied as exc:
            messages.error(request, exc.reason)
            request_id = uuid.uuid4().hex
        else:
            messages.success(request, f"Creating {operation.instance.name}.")
            return _instance_page(request, operation.instance_id)
    context = {
        "form": form,
        "plan": version.plan,
        "version": version,
        "spec": spec,
        "request_id": request_id,
        "action": f"{request.path}?request={request_id}",
        **_estimate_context(version, spec, form),
    }
    return render(request, "deployments/instance_create.html", context)


@tenant_view("instance.create")  # outermost: another tenant's address is a 404, never a 405
@require_POST
def instance_estimate(request, plan_key: str):
    """The cost estimate of the values in the create form (htmx posts them as the user types;
    POST so a password typed in the form never lands in an address or a log)."""
    version, spec = _plan_or_404(request, plan_key)
    form_class = forms.parameter_form_class(spec.main.parameters, groups=spec.parameter_groups)
    context = _estimate_context(version, spec, form_class(request.POST))
    return render(request, "deployments/_estimate.html", context)
