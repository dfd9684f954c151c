import re
import time
import uuid
from datetime import UTC, datetime, timedelta

from allauth.account.decorators import reauthentication_required
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.html import format_html
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import reswap, retarget

from accounts import roles
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.htmx import current_address, partial_template, shown_digest, unchanged
from accounts.models import Tenant
from accounts.templatetags.times import relative
from accounts.tenancy import action_require, tenant_view
from accounts.text import name_plain
from billing import entitlements, pricing
from billing import selectors as billing_selectors
from billing.models import Plan, Price
from billing.pricing import Cost
from deployments import forms, lifecycle, metering, schedules, selectors, servers, services
from deployments.cells import driver_for
from deployments.entitlement_usage import create_refusal, create_refusals
from deployments.models import BackupSchedule, Cell, Instance, Operation, PlanVersion, Snapshot
from deployments.spec.model import PlanSpec
from deployments.templatetags.instance_page import duration, running_for
from deployments.workflow.driver import DriverError


def _list_filters(request, service_names: dict[str, str]) -> dict[str, str]:
    """The list's filters from the query string; a value no select offers is ignored."""
    state = request.GET.get("state", "")
    service = request.GET.get("service", "")
    return {
        # No name holds a NUL, and PostgreSQL refuses one in any text it compares.
        "search": request.GET.get("q", "").replace("\x00", "").strip()[:100],
        "state": state if state in Instance.State.values else "",
        "service": service if service in service_names else "",
    }


_REQUEST_ID = re.compile(r"[0-9a-f]{32}")


@tenant_view("instance.view")
@require_safe
def instance_list(request):
    tenant = request.tenant
    service_names = selectors.instance_services(tenant)
    filters = _list_filters(request, service_names)
    instances = selectors.instances_for_tenant(tenant, **filters)
    page = Paginator(instances, selectors.INSTANCES_PER_PAGE).get_page(request.GET.get("page"))
    rows = list(page.object_list)  # read once: the digest and the table share it
    shown = shown_digest(
        [page.paginator.count]
        + [(i.pk, i.name, i.state, i.health, i.pending, i.plan_version_id, i.cell_id) for i in rows]
    )
    if answer := unchanged(request, shown):  # the table's poll, and nothing changed to swap
        return answer
    query = request.GET.copy()
    query.pop("page", None)
    query.pop("shown", None)
    list_url = reverse("instance_list", kwargs={"tenant_slug": tenant.slug})
    context = {
        "page": page,
        # A row with an operation pending: the table polls until none has.
        "follows": any(i.pending for i in rows),
        "shown": shown,
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


# --- catalog and create form ---


@tenant_view("instance.view")
@require_safe
def instance_catalog(request):
    # Everyone who sees the deployments may compare plans and prices (billing members too);
    # only those who may create get the "Create instance" links.
    services = selectors.catalog(request.tenant)
    can_create = roles.can(request.membership.role, "instance.create")
    plans = [entry.plan for service in services for entry in service.plans]
    # What keeps the tenant from creating on a plan (no subscription, a limit reached): said on
    # its card, before anyone fills in its form, in place of a Create that could only fail.
    refusals = create_refusals(request.tenant, plans) if can_create else {}
    context = {
        "services": services,
        "can_create": can_create,
        "refusals": refusals,
        # The refused plans a subscription opens (by key, to look up): their card links the
        # Billing page's Subscribe.
        "to_subscribe": dict.fromkeys(
            billing_selectors.plans_to_subscribe(request.tenant, plans)
            if any(refusals.values())
            else (),
            True,
        ),
    }
    return render(request, "deployments/catalog.html", context)


def _plan_or_404(request, plan_key: str) -> tuple[PlanVersion, PlanSpec]:
    found = selectors.plan_available(request.tenant, plan_key)
    if found is None:
        raise Http404("No such plan.")
    return found


def _create_form_class(request, version: PlanVersion, spec: PlanSpec):
    """The create form of `version`: its regions, those offered to the tenant that its plan
    runs in (a region offered that the plan does not run in would only be refused)."""
    cells = Cell.objects.offered_to(request.tenant).order_by("name")
    runs_in = entitlements.limits_for(request.tenant, version.plan).cells
    if runs_in is not None:
        cells = cells.filter(name__in=runs_in)
    return forms.instance_create_form_class(
        spec.main.parameters,
        groups=spec.parameter_groups,
        cells=list(cells),
        # A form drawn with a choice of region keeps it, should all but one be withdrawn
        # meanwhile: the region chosen is checked, never replaced with the one left.
        chosen="cell" in request.POST,
    )


def _estimate(
    version: PlanVersion, values: dict | None, tenant: Tenant, prices: list[Price] | None = None
) -> Cost | None:
    """What typed parameter values cost `tenant` (at `prices` when they were read already);
    None when there are none (the form's are not valid) or a usage rule cannot price them."""
    if values is None:
        return None
    try:
        return metering.estimate(
            version.plan, selectors.plan_spec(version), values, tenant=tenant, prices=prices
        )
    except metering.UsageError:
        return None


def _estimate_context(version: PlanVersion, spec: PlanSpec, form, tenant: Tenant) -> dict:
    """The cost of the values a (bound or unbound) form holds; None when they are not valid."""
    if form.is_bound:
        form.is_valid()  # the parameters may be valid when another field is not
        values = form.values
    else:
        values = selectors.default_values(spec)
    return {"cost": _estimate(version, values, tenant), "plan": version.plan}


def _instance_page(request, instance_id: str):
    # The instance page is built beside this one; until its URL exists, the list is the page.
    try:
        return redirect("instance_detail", tenant_slug=request.tenant.slug, instance_id=instance_id)
    except NoReverseMatch:
        return redirect("instance_list", tenant_slug=request.tenant.slug)


def _form_made(request, sent_with: str, request_id: str, action: str) -> dict:
    """What a form that makes an instance says of the one it already made with the request id
    it went out with (`sent_with`), and the request id it goes out with next: the context's
    `made`, `form_done`, `request_id` and `action`.

    Brought back by Back (a GET), the form is not offered again: the page says what it made
    and links a new form (`form_done`), so that no click sends a second instance the person
    did not fill in (a restore form comes back filled in). Sent again with that id and other
    values (a stale tab), it is refused; it goes out next with a new id, so that corrected,
    it makes another instance, as the notice beside it says."""
    made = selectors.instance_made_by_request(request.tenant, sent_with, action)
    if made is not None:
        request_id = uuid.uuid4().hex
    return {
        "made": made,
        "form_done": made is not None and request.method == "GET",
        "request_id": request_id,
        "action": f"{request.path}?request={request_id}",
    }


@tenant_view("instance.create")  # outermost: another tenant's address is a 404, never a 405
@require_http_methods(["GET", "HEAD", "POST"])
def instance_create(request, plan_key: str):
    version, spec = _plan_or_404(request, plan_key)
    if request.method != "POST" and not _REQUEST_ID.fullmatch(request.GET.get("request", "")):
        # The request id goes in the address: a Back that re-fetches the form gets the same one,
        # and the page says what the form made instead of offering it again (`_form_made`).
        return redirect(f"{request.path}?request={uuid.uuid4().hex}")
    form = _create_form_class(request, version, spec)(
        request.POST if request.method == "POST" else None
    )
    request_id = form["request_id"].value() or request.GET.get("request") or uuid.uuid4().hex
    # What refuses any values (no subscription, a limit reached): said above the form, whose
    # submit it disables; the service refuses a submit sent anyway (a tab left open).
    refusal = create_refusal(request.tenant, version.plan)
    sent_with = request_id  # what the form went out with; a refused one goes out with a new one
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
            if exc.reason != refusal:  # said above the form already
                messages.error(request, exc.reason)
            request_id = uuid.uuid4().hex
        else:
            messages.success(request, f"Creating {operation.instance.name}.")
            return _instance_page(request, operation.instance_id)
    elif request.method == "POST" and "name" not in form.errors:
        # Values the form refuses never reach the service: the name is checked beside them, so
        # that one submit says everything to change.
        taken = services.instance_name_errors(request.tenant, form.cleaned_data["name"])
        for message in taken.values():
            form.add_error("name", message)
    context = {
        "form": form,
        "plan": version.plan,
        "version": version,
        "spec": spec,
        **_form_made(request, sent_with, request_id, "instance.create"),
        "refusal": refusal,
        "subscribe": bool(
            refusal and billing_selectors.plans_to_subscribe(request.tenant, [version.plan])
        ),
        **_estimate_context(version, spec, form, request.tenant),
    }
    return render(request, "deployments/instance_create.html", context)


@tenant_view("instance.create")  # outermost: another tenant's address is a 404, never a 405
@require_POST
def instance_estimate(request, plan_key: str):
    """The cost estimate of the values in the create form (htmx posts them as the user types;
    POST so a password typed in the form never lands in an address or a log)."""
    version, spec = _plan_or_404(request, plan_key)
    form_class = forms.parameter_form_class(spec.main.parameters, groups=spec.parameter_groups)
    context = _estimate_context(version, spec, form_class(request.POST), request.tenant)
    return render(request, "deployments/_estimate.html#estimate-figures", context)


# --- instance page ---

TABS = {
    "overview": "Overview",
    "connection": "Connection",
    "servers": "Servers",
    "metrics": "Metrics",
    "logs": "Logs",
    "events": "Events",
    "operations": "Operations",
    "backups": "Backups",
    "activity": "Activity",
}
# The tabs read live from the instance's cell each time they are shown or refreshed.
LIVE_TABS = {"servers", "logs", "events"}
# (connect, read) seconds for each of their requests to the cell: a page whose cell never
# answers says so well within the web server's own timeout (gunicorn's 30 s), which one
# request with kube.TIMEOUT's 30 s read would reach.
LIVE_TIMEOUT = (5, 10)
# Seconds "Follow" keeps polling a server's log after the last interaction with the tab.
FOLLOW_FOR = 300
DETAIL = "deployments/instance_detail.html"
# An htmx request names the element it swaps; each of these has a partial of its own.
SWAPPED = {"instance-page", "instance-head", "instance-tab", "instance-operations", "instance-live"}
ACTIVITY_PER_PAGE = 100  # events a page of the Activity tab lists
BACKUPS_PER_PAGE = 50  # snapshots a page of the Backups tab lists (an hourly schedule keeps many)
# Operations a page of the Operations tab lists: scheduled backups and their pruning add two a
# slot, tens of thousands over an instance's life.
OPERATIONS_PER_PAGE = 50
PENDING = {Operation.State.QUEUED, Operation.State.RUNNING}


def _instance(request, instance_id: str) -> Instance:
    instance = selectors.instance_for_tenant(request.tenant, instance_id)
    if instance is None:
        raise Http404("No such deployment.")
    return instance


def _page_url(instance: Instance, tab: str = "") -> str:
    url = reverse(
        "instance_detail",
        kwargs={"tenant_slug": instance.tenant.slug, "instance_id": instance.pk},
    )
    return f"{url}?tab={tab}" if tab else url


def _tab_context(
    instance: Instance, tab: str, actions: list, allowed: frozenset[str], params
) -> dict:
    """What one tab shows (`actions`: those the header offers; `allowed`: the role's;
    `params`: the request's query, which the Logs tab reads its choices from)."""
    if tab in LIVE_TABS:
        return _live_context(instance, tab, params)
    if tab == "operations":
        page = Paginator(selectors.operations_with_runs(instance), OPERATIONS_PER_PAGE).get_page(
            params.get("page")
        )
        operations = list(page)  # newest first: the pending ones are on the first page
        cancellable = _cancellable(instance, operations, allowed)
        return {
            "operations": operations,
            "operations_page": page,
            "pending": any(op.state in PENDING for op in operations),
            "timeline_shown": _timeline_shown(page, operations, cancellable),
            "verb_labels": selectors.verb_labels(instance.plan_version),
            "cancellable": cancellable,
            "settles_alone": lifecycle.SETTLES_ALONE,
            "cancel_fails": lifecycle.CANCEL_FAILS,
            "rolled_back": lifecycle.ROLLED_BACK,  # what undoes such a cancel: a roll back
        }
    if tab == "backups":
        schedule = selectors.backup_schedule_of(instance)
        page = Paginator(selectors.snapshots_listed(instance), BACKUPS_PER_PAGE).get_page(
            params.get("page")
        )
        return {
            "snapshots": list(page),
            "snapshots_page": page,
            # Kept past its expiry, as pruning keeps it (`services.snapshots_prune`).
            "newest_completed": selectors.snapshots_of_instance(instance)
            .filter(status=Snapshot.Status.COMPLETED)
            .values_list("pk", flat=True)
            .first(),
            "now": timezone.now(),
            "backup": next((a for a in actions if a.verb == "backup"), None),
            "schedule": schedule,
            "retention_unapplied": selectors.backup_retention_unapplied(instance, schedule),
            "retention_most": selectors.backup_retention_most(instance),
            # A plan without a backup verb has nothing to back up or to schedule.
            "takes_backups": "backup" in selectors.plan_spec(instance.plan_version).main.verbs,
        }
    if tab == "activity":
        shown = ("created_at", "actor_email", "action", "result", "payload")
        events = selectors.instance_audit_events(instance).only(*shown)
        page = Paginator(events, ACTIVITY_PER_PAGE).get_page(params.get("page"))
        return {
            "events": list(page),
            "events_page": page,
            "verb_labels": selectors.verb_labels(instance.plan_version),  # what a cancel stopped
            "parameter_labels": selectors.parameter_labels(instance.plan_version),
        }
    if tab == "metrics":  # the charts load apart, for the chosen window
        return {"metrics_window": params.get("window", "")}
    if tab == "connection":
        connection = selectors.instance_connection(instance)
        rows = [("Host", connection.host, "host"), ("Port", connection.port, "port")]
        rows += [("Database", connection.database, "database"), ("User", connection.user, "user")]
        return {
            "connection": connection,
            "connection_rows": [row for row in rows if row[1]],
            "masked_uri": connection.uri(),
            "copied_uri": connection.uri(password=None),  # a masked password is no use pasted
            "nothing_to_connect": (
                services.NOTHING_TO_CONNECT if instance.state == Instance.State.DELETED else ""
            ),
            "can_reveal": "instance.reveal_credentials" in allowed,
        }
    # A change that failed part-way: the servers may run some of it, not the values listed.
    left_by = selectors.instance_rollback_source(instance)
    return {
        "status": selectors.observed_status(instance),
        "restored_from": selectors.instance_restored_from(instance),
        "parameters": selectors.instance_parameters_shown(instance),
        "left_by": left_by,
        "setting_left": selectors.instance_setting_left(instance),
        # (then no roll back will apply the values again)
        "deletion_queued": left_by is not None
        and selectors.operations_pending(instance).filter(verb="delete").exists(),
    }


def _live_context(instance: Instance, tab: str, params) -> dict:
    """The Servers, Logs and Events tabs: read from the instance's cell now (a cell that
    cannot be read is said, not raised; the Logs tab keeps its choices, so a follow goes on);
    nothing for a deleted instance."""
    rule = servers.servers_rule(selectors.plan_spec(instance.plan_version).extensions)
    namespace = instance.namespace
    chosen = _logs_chosen(params) if tab == "logs" else {}
    if instance.state == Instance.State.DELETED:
        # Its objects went with its namespace: nothing to read, nor to follow.
        return {**chosen, "following": False, "server_gone": bool(chosen.get("server_name"))}
    try:
        # A cell whose configuration cannot be used raises.
        driver = driver_for(instance.cell, timeout=LIVE_TIMEOUT)
        if tab == "events":
            return {"events": servers.events_read(driver, namespace)}
        found = servers.servers_read(driver, namespace, rule) if rule else []
        if tab == "servers":
            return {
                "servers": found,
                # A plan whose servers have no roles (none labels them) shows no Role column.
                "roles_shown": any(server.role for server in found),
                "claims": servers.claims_read(driver, namespace),
            }
        return {**chosen, **_logs_read(driver, namespace, rule, found, chosen)}
    except DriverError as exc:
        return {**chosen, "live_error": f"The cluster could not be read: {exc.message}"}


def _logs_chosen(params) -> dict:
    """What the Logs tab's form chose: the server and container named (else the first, once
    read), the line count, the filter text; following for FOLLOW_FOR seconds after the last
    change."""
    tail = _whole(params.get("tail", ""))
    now = int(time.time())
    # "start" (the checkbox, or any change of the form while it is ticked) starts a new period;
    # the polls carry the time it ends.
    follow = params.get("follow", "")
    until = now + FOLLOW_FOR if follow == "start" else _whole(follow)
    if isinstance(until, int):
        until = min(until, now + FOLLOW_FOR)  # never longer than a period from now
    return {
        "server_name": params.get("server", ""),
        "container": params.get("container", ""),
        "tail": tail if tail in servers.LOG_TAILS else servers.LOG_TAILS[0],
        "tails": servers.LOG_TAILS,
        "contains": params.get("q", "").strip()[:200],
        "as_written": params.get("format") == "raw",
        "following": isinstance(until, int) and until > now,
        "follow_until": until if isinstance(until, int) else 0,
        "follow_stopped": isinstance(until, int) and until <= now,
        "follow_minutes": FOLLOW_FOR // 60,
    }


def _logs_read(driver, namespace: str, rule, found: list, chosen: dict) -> dict:
    """The Logs tab's servers and the chosen server's (the first by default) chosen
    container's last lines containing the filter text."""
    by_name = {server.name: server for server in found}
    named = chosen["server_name"]
    # A chosen server that no longer runs (removed, or being recreated) is said to be gone,
    # never replaced by another's log under its name.
    server = by_name.get(named) if named else (found[0] if found else None)
    if server is None:
        return {"servers": found, "server": None, "server_gone": bool(named)}
    preferred = rule.container if rule else ""
    container = chosen["container"]
    if container not in server.containers:
        container = preferred if preferred in server.containers else server.containers[0]
    fields = rule.logs if rule else None
    lines = servers.log_read(
        driver,
        namespace,
        server,
        container=container,
        tail=chosen["tail"],
        contains=chosen["contains"],
        fields=None if chosen["as_written"] else fields,
    )
    return {
        "servers": found,
        "server": server,
        "server_name": server.name,
        "container": container,
        "lines": lines,
        "structured": fields is not None,  # the plan reads its lines: "As written" is offered
    }


def _page(
    request,
    instance: Instance,
    *,
    tab: str,
    status: int = 200,
    part: str | None = None,
    params=None,
    **extra,
):
    """The instance page, or for htmx the part it swaps (`part`, else the one the request
    names; the whole page's part after an action, whatever asked). `params`: the query the
    tab reads its choices from (the request's by default)."""
    if part is None and request.htmx and not request.htmx.history_restore_request:
        part = request.htmx.target if request.method == "GET" else "instance-page"
        part = part if part in SWAPPED else "instance-page"
    if part in {None, "instance-page"} and "head_follows" not in extra:
        # While an operation is pending, the header follows it (it polls every 2 s); else it
        # watches the instance's state and health (every 15 s), which the cluster changes.
        instance, extra["head_follows"] = selectors.instance_now(instance)
    allowed = roles.allowed_actions(request.membership.role)
    actions = selectors.instance_actions(instance, allowed)
    context = {
        "instance": instance,
        "page_url": _page_url(instance),
        "tab": tab,
        "tabs": TABS,
        "part": part,
        "actions": actions,
        "refusals": [a for a in actions if a.refusal],
        "failed_by": _failed_by(instance),
        **extra,
    }
    pending = bool(context.get("head_follows"))
    context["head_watches"] = not pending and instance.state != Instance.State.DELETED
    if pending or context["head_watches"]:
        context["head_shown"] = _head_shown(instance, actions, pending)
    if part != "instance-head" or context.get("dialogs_follow"):
        # What the delete dialog promises can be restored.
        context["snapshot_count"] = selectors.snapshots_restorable(instance).count()
        context["takes_last_backup"] = selectors.last_backup_taken(instance)
    if part != "instance-head":
        shown = _tab_context(
            instance, tab, actions, allowed, request.GET if params is None else params
        )
        context.update({**shown, **extra})
        polled = tab == "operations" and part == "instance-operations"
        if polled and (answer := unchanged(request, context["timeline_shown"])):
            return answer  # the timeline's poll, and nothing it shows changed
    template = f"{DETAIL}#{part}" if part else DETAIL
    # Only the parts with the dialogs need the modify form (not each poll of the timeline).
    dialogs = (
        template in {DETAIL, f"{DETAIL}#instance-page"} or context.get("dialogs_follow")
    ) and "modify_form" not in context
    if dialogs and any(a.verb == "modify" and not a.refusal for a in actions):
        context.update(_modify_context(instance))
    if dialogs:
        bound = context.get("verb_forms") or {}
        with_form = [a for a in actions if a.parameters and a.verb != "modify" and not a.refusal]
        holds = _verb_holds(instance, with_form)
        context["verb_forms"] = {
            a.verb: bound.get(a.verb) or _verb_form(a.verb, a.parameters, holds=holds.get(a.verb))
            for a in with_form
        }
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ["HX-Request", "HX-Target", "HX-Current-URL"])
    return response


def _failed_by(instance: Instance) -> Operation | None:
    """The operation that left the instance failed, named as the timeline names its verb."""
    return _labelled(instance, selectors.instance_failed_by(instance))


def _labelled(instance: Instance, operation: Operation | None) -> Operation | None:
    """`operation`, with its verb named as the timeline names it (`verb_label`)."""
    if operation is not None:
        labels = selectors.verb_labels(instance.plan_version)
        operation.verb_label = labels.get(operation.verb, operation.verb)
    return operation


def _head_shown(instance: Instance, actions: list, pending: bool) -> str:
    """A digest of what the header shows that a pending operation, or the cluster, may change,
    and of whether an operation is pending: its poll gets nothing to swap while it is unchanged
    (a swap every 2 s would close what the member opened in it and move the keyboard focus)."""
    shown = [
        pending,
        instance.state,
        instance.health,
        instance.health_reason,
        instance.observed.get("healthy"),  # a failing check, before it is Degraded
        instance.plan_version_id,
        instance.deletion_protected,
        [(a.verb, a.refusal) for a in actions],
    ]
    return shown_digest(shown)


def _header_followed(request, instance: Instance):
    """The header's poll: nothing while what it shows is unchanged (`_head_shown`); else the
    header again while an operation is pending, or, once none is, the whole page as the browser
    shows it (its tab and the tab's choices, from the address it is at): an operation's end
    changes more than the header — the actions it offers and their dialogs, the status, the
    parameters, the outputs — as does the cluster's changing the instance's health."""
    instance, pending = selectors.instance_now(instance)
    actions = selectors.instance_actions(instance, roles.allowed_actions(request.membership.role))
    if answer := unchanged(request, _head_shown(instance, actions, pending)):
        return answer
    if pending:
        # Changed: its dialogs come too, for the actions the header may now offer.
        return _page(
            request,
            instance,
            tab="overview",
            part="instance-head",
            head_follows=True,
            dialogs_follow=True,
        )
    address = current_address(request)  # None when it does not parse: the overview
    shown = QueryDict(address.query if address else "")
    tab = shown.get("tab", "overview")
    response = _page(
        request,
        instance,
        tab=tab if tab in TABS else "overview",
        part="instance-page",
        params=shown,
        focus=shown.get("operation", ""),
        head_follows=False,
        ended=_labelled(instance, selectors.operation_last_ended(instance)),
    )
    return reswap(retarget(response, "#instance-page"), "outerHTML")


@tenant_view("instance.view")
@require_safe
def instance_detail(request, instance_id: str):
    instance = _instance(request, instance_id)
    if request.htmx and request.htmx.target == "instance-head":
        return _header_followed(request, instance)
    tab = request.GET.get("tab", "overview")
    focus = request.GET.get("operation", "")  # the operation to show unfolded
    return _page(request, instance, tab=tab if tab in TABS else "overview", focus=focus)


@tenant_view("instance.view")
@require_safe
def operation_detail(request, instance_id: str, operation_id):
    """An operation's address: the operations tab, opened at it, on the page that lists it (a
    failed one behind fifty newer, hourly backups say, from the failure banner)."""
    instance = _instance(request, instance_id)
    operation = get_object_or_404(instance.operations.only("pk", "created_at"), pk=operation_id)
    url = _page_url(instance, "operations")
    page = selectors.operation_listed_page(instance, operation, OPERATIONS_PER_PAGE)
    if page > 1:
        url += f"&page={page}"
    return redirect(f"{url}&operation={operation.pk}#operation-{operation.pk}")


def _queued(request, instance: Instance, operation: Operation, what: str, *, tab: str):
    """After an action: say what was queued, linking to the operation, and show the page."""
    _operation_said(request, operation, what)
    return _after(request, _instance(request, instance.pk), tab)


def _operation_said(request, operation: Operation, what: str) -> None:
    """Say where the operation an action queued stands, linking to it: queued, or — a form sent
    again (Back, a double submit) answers with what the first sending made — running or ended."""
    url = reverse(
        "operation_detail",
        kwargs={
            "tenant_slug": request.tenant.slug,
            "instance_id": operation.instance_id,
            "operation_id": operation.pk,
        },
    )
    state = Operation.State(operation.state)
    if state == Operation.State.QUEUED:
        messages.success(request, format_html('{} is <a href="{}">queued</a>.', what, url))
    elif state == Operation.State.RUNNING:
        messages.info(request, format_html('{} is <a href="{}">running</a>.', what, url))
    elif operation.request_id == request.POST.get("request_id"):
        said = 'This form was sent before: {} <a href="{}">{}</a>.'
        messages.info(request, format_html(said, what, url, state.label.lower()))
    else:  # another request's (a delete asked for again once done)
        said = '{} <a href="{}">{}</a> already.'
        messages.info(request, format_html(said, what, url, state.label.lower()))


def _after(request, instance: Instance, tab: str):
    if request.htmx:
        response = _page(request, instance, tab=tab)
        response["HX-Push-Url"] = _page_url(instance, tab)
        return response
    return redirect(_page_url(instance, tab))


def _errors(exc: ValidationError) -> dict[str, list[str]]:
    if hasattr(exc, "error_dict"):
        return exc.message_dict
    return {"__all__": exc.messages}


def _tab_shown(request, default: str) -> str:
    """The tab of the page that sent an htmx request (its address's `tab`, the Overview without
    one): a dialog shown again over it keeps it, as htmx pushes no address for it. `default`
    for a form sent without htmx, whose answer is a page of its own."""
    address = current_address(request) if request.htmx else None
    if not address or not address.path:
        return default
    tab = QueryDict(address.query).get("tab", "overview")
    return tab if tab in TABS else "overview"


def _dialog_again(
    request, instance: Instance, dialog: str | None, errors: dict, *, tab: str, **extra
):
    """The page with the dialog open again, showing what to correct; nothing was done. An
    action without a dialog (None) says it in a message instead, on the tab it names."""
    if dialog is None:
        messages.error(request, " ".join(m for listed in errors.values() for m in listed))
        return _after(request, instance, tab)
    return _page(
        request,
        instance,
        tab=_tab_shown(request, tab),
        status=200 if request.htmx else 400,
        open_dialog=dialog,
        errors=errors,
        **extra,
    )


def _refused(request, instance: Instance, exc: ActionDenied, action: str, *, tab: str):
    """A refusal: a forged request the role does not allow is a 403 (already audited); one
    the role allows (the state or a limit forbids it now) is said on the page."""
    if not roles.can(request.membership.role, action):
        raise exc
    messages.error(request, exc.reason)
    return _after(request, instance, tab)


def _verb_form(
    verb: str, parameters: list, data=None, *, holds: dict | None = None
) -> forms.ParameterForm:
    """A custom workflow's form, from its own `apiParameters`; its ids are its dialog's, so
    they never clash with another dialog's on the page. `holds`: values its parameters start
    from instead of their defaults (what the instance holds of those the verb sets)."""
    form_class = forms.parameter_form_class(parameters, starts=holds)
    return form_class(data, auto_id=f"dialog-{verb}-%s")


def _verb_holds(instance: Instance, actions: list) -> dict[str, dict]:
    """Per custom verb with a dialog, the values its parameters start from: those the verb
    sets on the instance (`x-opsdeck.updates`), as the instance will hold them once its queued
    operations have run (a verb that sets the eviction policy starts from the policy). Never
    a password: one is not read back into a form, not even one that does not show it."""
    verbs = selectors.plan_spec(instance.plan_version).main.verbs
    setting = {}
    for action in actions:
        secret = {p.key for p in action.parameters if p.type == "Password"}
        updates = verbs[action.verb].updates if action.verb in verbs else {}
        kept = {key: param for key, param in updates.items() if param not in secret}
        if kept:
            setting[action.verb] = kept
    if not setting:
        return {}  # nothing to read: the instance's secrets stay encrypted
    projected = services.instance_parameters_projected(instance)
    return {
        verb: {param: projected[key] for key, param in updates.items() if key in projected}
        for verb, updates in setting.items()
    }


@tenant_view("instance.view")
@require_POST
def instance_act(request, instance_id: str, verb: str):
    instance = _instance(request, instance_id)
    spec_verb = selectors.plan_spec(instance.plan_version).main.verbs.get(verb)
    if spec_verb is None or verb == "delete":
        raise Http404("No such action.")
    tab = "backups" if verb == "backup" else "operations"
    action = lifecycle.rule(verb, custom=spec_verb.custom).action
    form = _verb_form(verb, spec_verb.parameters, request.POST) if spec_verb.parameters else None
    valid = form is None or form.is_valid()
    # The service refuses (403, audited) a role without the action, whatever the form holds.
    if valid or not roles.can(request.membership.role, action):
        try:
            operation = services.instance_action(
                actor=Actor.from_request(request),
                instance=instance,
                verb=verb,
                request_id=request.POST.get("request_id", ""),
                parameters=(form.given if valid else {}) if form is not None else None,
            )
        except ActionDenied as exc:
            return _refused(request, instance, exc, action, tab=tab)
        except ValidationError as exc:
            if form is None:
                return _dialog_again(request, instance, None, _errors(exc), tab=tab)
            form.errors_from(exc)
        else:
            label = selectors.verb_labels(instance.plan_version).get(verb, verb)
            return _queued(request, instance, operation, f"{label} of {instance.name}", tab=tab)
    return _page(
        request,
        instance,
        tab=_tab_shown(request, tab),
        status=200 if request.htmx else 400,
        open_dialog=f"dialog-{verb}",
        verb_forms={verb: form},
    )


@tenant_view("instance.view")
@require_POST
def instance_delete(request, instance_id: str):
    instance = _instance(request, instance_id)
    typed = request.POST.get("confirm_name", "")
    confirmed = name_plain(typed) == instance.name  # as names are stored
    # A role that may not delete is refused (and audited) by the service, whatever was typed.
    if not confirmed and roles.can(request.membership.role, "instance.delete"):
        errors = {"confirm_name": [f"Type the instance's name, {instance.name}, to delete it."]}
        return _dialog_again(request, instance, "dialog-delete", errors, tab="overview")
    try:
        operation = services.instance_delete(
            actor=Actor.from_request(request),
            instance=instance,
            request_id=request.POST.get("request_id", ""),
            last_backup=request.POST.get("without_last_backup") != "on",
        )
    except ActionDenied as exc:
        return _refused(request, instance, exc, "instance.delete", tab="overview")
    except ValidationError as exc:
        return _dialog_again(request, instance, "dialog-delete", _errors(exc), tab="overview")
    return _queued(request, instance, operation, f"Deletion of {instance.name}", tab="operations")


def _snapshot(instance: Instance, snapshot_id: int, *, deleted: bool = False) -> Snapshot:
    snapshot = selectors.snapshot_of_instance(instance, snapshot_id, deleted=deleted)
    if snapshot is None:
        raise Http404("No such backup.")
    return snapshot


def _local(moment) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _second_up(moment):
    """The first whole second at or after `moment`: the form's seconds, which a window's start
    within a second would otherwise cut to one before it (and refuse)."""
    whole = moment.replace(microsecond=0)
    return whole if whole == moment else whole + timedelta(seconds=1)


def _restore_form(snapshot: Snapshot, name: str, data=None) -> forms.RestoreForm:
    spec = selectors.plan_spec(snapshot.plan_version)
    bounds = None
    if selectors.restores_to_point_in_time(snapshot.plan_version):
        low, high = selectors.recovery_window(snapshot, timezone.now())
        bounds = (_local(min(_second_up(low), high)), _local(high))
    form_class = forms.restore_form_class(
        spec.main.parameters,
        groups=spec.parameter_groups,
        snapshot_values=selectors.snapshot_values(snapshot),
        point_in_time=bounds,
    )
    if data is not None:
        return form_class(data)
    wanted = selectors.instance_name_free(snapshot.tenant, f"{name}-restored", services.NAME_MAX)
    return form_class(initial={"name": wanted})


@tenant_view("instance.view")
@require_http_methods(["GET", "HEAD", "POST"])
def snapshot_restore(request, instance_id: str, snapshot_id: int):
    """The restore form of a completed backup (GET) and the restore itself (POST): a new
    instance from the backup's parameters, the fixed ones as the backup holds them."""
    instance = _instance(request, instance_id)
    # A deleted one too, to say so: a teammate may delete it while the form is open.
    snapshot = _snapshot(instance, snapshot_id, deleted=True)
    # The role first, whichever backup (a restore sent is refused by the service, audited as
    # the restore it is; one of a backup deleted meanwhile here, before saying so).
    if request.method != "POST" or snapshot.status == Snapshot.Status.DELETED:
        action_require(request, "backup.restore")
    if snapshot.status == Snapshot.Status.DELETED:
        messages.error(
            request, f"The backup {snapshot.name} was deleted: it can no longer be restored."
        )
        return redirect(_page_url(instance, "backups"))
    if request.method != "POST":
        status, forgetting = selectors.snapshot_restorable(snapshot)
        if status != Snapshot.Status.COMPLETED or forgetting:
            refusal = services.RESTORE_FORGETTING if forgetting else services.RESTORE_COMPLETED
            messages.error(request, refusal)
            return redirect(_page_url(instance, "backups"))
        if not _REQUEST_ID.fullmatch(request.GET.get("request", "")):
            return redirect(f"{request.path}?request={uuid.uuid4().hex}")
    posted = request.POST if request.method == "POST" else None
    form = _restore_form(snapshot, instance.name, posted)
    request_id = form["request_id"].value() or request.GET.get("request") or uuid.uuid4().hex
    sent_with = request_id  # what the form went out with; a refused one goes out with a new one
    # The service refuses (403, audited) a role without restore, whatever the form holds.
    valid = request.method == "POST" and form.is_valid()
    if valid or (
        request.method == "POST" and not roles.can(request.membership.role, "backup.restore")
    ):
        target_time = _target_time(form) if valid else None
        try:
            operation = services.snapshot_restore(
                actor=Actor.from_request(request),
                snapshot=snapshot,
                name=form.cleaned_data.get("name", "") if valid else "",
                request_id=request_id,
                parameters=form.given if valid else {},
                target_time=target_time,
            )
        except ActionDenied as exc:
            if not roles.can(request.membership.role, "backup.restore"):
                raise
            messages.error(request, exc.reason)
            request_id = uuid.uuid4().hex
        except ValidationError as exc:
            form.errors_from(exc)
            request_id = uuid.uuid4().hex  # nothing was made: the corrected form is a new request
        else:
            what = f"Restore of {snapshot.name} into {operation.instance.name}"
            _operation_said(request, operation, what)
            return _instance_page(request, operation.instance_id)
    context = {
        "form": form,
        "instance": instance,
        "snapshot": snapshot,
        "version": snapshot.plan_version,
        **_form_made(request, sent_with, request_id, "instance.restore"),
        "cost": _restore_cost(snapshot, form, request.tenant),
    }
    # A form to correct answers 200, as the create form does (a 400 page is a console error).
    return render(request, "deployments/instance_restore.html", context)


def _target_time(form: forms.RestoreForm) -> datetime | None:
    """The restore form's point in time, if one was given (the field says it is UTC)."""
    target_time = form.cleaned_data.get("target_time")
    if target_time is not None and timezone.is_naive(target_time):
        target_time = target_time.replace(tzinfo=UTC)
    return target_time


def _restore_cost(snapshot: Snapshot, form: forms.RestoreForm, tenant: Tenant) -> Cost | None:
    """What the instance the restore form would make costs: the backup's values (or, to a
    point in time, the instance's then) with the form's changes, priced by the backup's plan
    version (the one it restores on); None while a parameter field holds a value that is not
    valid."""
    given, at = {}, None
    if form.is_bound:
        form.is_valid()
        if any(forms.field_name(p.key) in form.errors for p in form.shown):
            return None
        given, at = form.given, _target_time(form)
    values = selectors.restore_values(snapshot, given, at)
    return _estimate(snapshot.plan_version, values, tenant)


@tenant_view("backup.restore")
@require_POST
def snapshot_restore_estimate(request, instance_id: str, snapshot_id: int):
    """The restore form's cost estimate, as the user types (see `instance_estimate`)."""
    snapshot = _snapshot(_instance(request, instance_id), snapshot_id)
    form = _restore_form(snapshot, "", request.POST)  # bound: no name proposed
    return render(
        request,
        "deployments/_estimate.html#estimate-figures",
        {"cost": _restore_cost(snapshot, form, request.tenant)},
    )


@tenant_view("instance.view")
@require_POST
def snapshot_delete(request, instance_id: str, snapshot_id: int):
    instance = _instance(request, instance_id)
    # A deleted one too: the form sent again once the deletion finished (a second tab, a
    # reload) hears that it is done, not that the backup does not exist.
    snapshot = _snapshot(instance, snapshot_id, deleted=True)
    gone = snapshot.status == Snapshot.Status.DELETED
    try:
        operation = services.snapshot_delete(
            actor=Actor.from_request(request),
            snapshot=snapshot,
            request_id=request.POST.get("request_id", ""),
        )
    except ActionDenied as exc:
        return _refused(request, instance, exc, "backup.delete", tab="backups")
    except ValidationError as exc:
        dialog = f"dialog-delete-backup-{snapshot.pk}"
        # On the page that lists it, so that its dialog opens again.
        page = selectors.snapshot_listed_page(instance, snapshot, BACKUPS_PER_PAGE)
        return _dialog_again(
            request, instance, dialog, _errors(exc), tab="backups", params={"page": str(page)}
        )
    if operation is None:
        done = "was deleted already" if gone else "deleted"
        messages.success(request, f"Backup {snapshot.name} {done}.")
        return _after(request, instance, "backups")
    return _queued(
        request, instance, operation, f"Deletion of backup {snapshot.name}", tab="backups"
    )


# --- backup schedule ---

SCHEDULE_FIELDS = ("timing", "interval_hours", "cron", "retention_days", "retention_count")
TIMING_NEEDED = "Choose when backups run: every few hours, or at the times of a cron expression."


_WHOLE = re.compile(r"-?[0-9]{1,18}")


def _whole(text: str) -> int | str | None:
    """A number field as typed: a whole number written in plain digits, None when empty, else
    the text (which the service refuses with the field's message). Not Python's `int` syntax
    (`1_2`, `+12`, other scripts' digits), which the parameter fields refuse too."""
    text = text.strip()
    if not text:
        return None
    return int(text) if _WHOLE.fullmatch(text) else text


def _changes_over_theirs(instance: Instance, submitted: dict, seen: str | None) -> dict:
    """What the schedule form holds after a teammate changed the schedule since the page was
    opened: each field this person changed as they typed it, the others as the schedule
    stands now."""
    before = BackupSchedule.settings_of_token(seen)
    now = BackupSchedule.settings_of_token(selectors.backup_schedule_of(instance).settings_token)
    if before is None or now is None:
        return submitted
    return {name: now[name] if v == before[name] else v for name, v in submitted.items()}


@tenant_view("instance.view")
@require_POST
def backup_schedule_update(request, instance_id: str):
    instance = _instance(request, instance_id)
    submitted = {name: request.POST.get(name, "") for name in SCHEDULE_FIELDS}
    submitted["enabled"] = request.POST.get("enabled") == "on"
    by_cron = submitted["timing"] == "cron"
    retention = _whole(submitted["retention_days"])
    try:
        # The form sends one of the two; a role without backups is refused by the service
        # first (403, audited), whatever the form holds.
        if submitted["timing"] not in ("interval", "cron") and roles.can(
            request.membership.role, "backup.create"
        ):
            raise ValidationError({"timing": TIMING_NEEDED})
        services.backup_schedule_update(
            actor=Actor.from_request(request),
            instance=instance,
            interval_hours=None if by_cron else _whole(submitted["interval_hours"]),
            cron=submitted["cron"] if by_cron else "",
            retention_days=retention,
            retention_count=_whole(submitted["retention_count"]),
            enabled=submitted["enabled"],
            seen=request.POST.get("seen"),
            request_id=request.POST.get("request_id"),
        )
    except ActionDenied as exc:
        longer = isinstance(retention, int) and retention > selectors.backup_retention_most(
            instance
        )
        if not longer or not roles.can(request.membership.role, "backup.create"):
            return _refused(request, instance, exc, "backup.create", tab="backups")
        # The plan keeps backups for less: said beside the retention, in the form, which keeps
        # what was typed.
        submitted["seen"] = request.POST.get("seen")
        return _schedule_refused(request, instance, {"retention_days": [exc.reason]}, submitted)
    except ValidationError as exc:
        errors = _errors(exc)
        if by_cron and not submitted["cron"].strip():  # not a number of hours it lacks
            errors.pop("interval_hours", None)
            errors["cron"] = [f"Give a cron expression. {schedules.CRON_HELP}"]
        if services.SCHEDULE_CHANGED in errors.get("__all__", []):
            submitted = _changes_over_theirs(instance, submitted, request.POST.get("seen"))
        else:
            # Fields to correct stay based on the schedule this person saw, even when a
            # teammate changed it since this save was refused.
            submitted["seen"] = request.POST.get("seen")
        return _schedule_refused(request, instance, errors, submitted)
    messages.success(request, f"The backup schedule of {instance.name} is saved.")
    return _after(request, instance, "backups")


def _schedule_refused(request, instance: Instance, errors: dict, submitted: dict):
    """The Backups tab with the schedule form open again, as it was sent, saying `errors`."""
    return _page(
        request,
        instance,
        tab="backups",
        status=200 if request.htmx else 400,
        schedule_errors=errors,
        schedule_submitted=submitted,
    )


# --- modify ---


def _modify_form(instance: Instance, data=None) -> forms.ParameterForm:
    """The modify form: the modifiable parameters, prefilled with the values the instance
    will hold once the operations queued on it have run, which a modify changes from."""
    spec = selectors.plan_spec(instance.plan_version)
    projected = services.instance_parameters_projected(instance)
    form_class = forms.parameter_form_class(
        spec.main.parameters,
        groups=spec.parameter_groups,
        current=projected,
        current_is=services.current_is(instance, projected),
    )
    return form_class(data)


def _modify_context(instance: Instance, form: forms.ParameterForm | None = None) -> dict:
    """The modify dialog's form and the cost now and after the change (None when the values
    entered are not valid)."""
    form = form or _modify_form(instance)
    if form.is_bound:
        form.is_valid()
        values = form.values
    else:
        values = form.current
    version = instance.plan_version
    prices = pricing.prices_for(instance.tenant, [version.plan])[version.plan_id]
    return {
        "modify_form": form,
        # What it runs now (priced by its plain values); the form starts from what it will
        # hold after its queued changes.
        "current_cost": _estimate(version, instance.parameters, instance.tenant, prices),
        "new_cost": _estimate(version, values, instance.tenant, prices),
    }


def _changed(form: forms.ParameterForm) -> dict:
    """What the user changed or filled in: the entries whose typed value differs from the one
    the dialog showed (a password only when one was typed). A value left as shown is not sent,
    so a dialog drawn before another modify was queued does not undo that one."""
    shown = form.shown_values()
    return {
        key: value
        for key, value in form.given.items()
        if key not in shown or form.values[key] != shown[key]
    }


@tenant_view("instance.view")
@require_POST
def instance_modify(request, instance_id: str):
    instance = _instance(request, instance_id)
    form = _modify_form(instance, request.POST)
    valid = form.is_valid()
    # The service refuses (403, audited) a role without modify, whatever the form holds.
    if valid or not roles.can(request.membership.role, "instance.modify"):
        try:
            operation = services.instance_action(
                actor=Actor.from_request(request),
                instance=instance,
                verb="modify",
                request_id=request.POST.get("request_id", ""),
                parameters=_changed(form) if valid else {},
            )
        except ActionDenied as exc:
            return _refused(request, instance, exc, "instance.modify", tab="operations")
        except ValidationError as exc:
            form.errors_from(exc)
        else:
            return _queued(
                request, instance, operation, f"Modification of {instance.name}", tab="operations"
            )
    return _page(
        request,
        instance,
        tab=_tab_shown(request, "operations"),
        status=200 if request.htmx else 400,
        open_dialog="dialog-modify",
        **_modify_context(instance, form),
    )


@tenant_view("instance.modify")
@require_POST
def instance_modify_estimate(request, instance_id: str):
    """The cost now and after the change, for the values in the modify dialog (POST: a
    password typed there never lands in an address)."""
    instance = _instance(request, instance_id)
    context = _modify_context(instance, _modify_form(instance, request.POST))
    return render(request, "deployments/_modify_estimate.html#modify-estimate-figures", context)


# --- cancel an operation ---


def _timeline_shown(page, operations: list, cancellable: set) -> str:
    """A digest of what the operations timeline shows, its times worded as it words them: its
    poll gets nothing to swap while it is unchanged (a swap every 2 s would move the keyboard
    focus, and a screen reader's place, out of it)."""
    shown = [page.number, page.paginator.count]
    for op in operations:
        took = duration(op.started_at, op.finished_at) if op.finished_at else None
        shown += [op.pk, op.state, op.pk in cancellable, op.cancel_reason, op.error]
        shown += [relative(op.created_at), took or running_for(op.started_at)]
        shown += [
            (
                run.node,
                run.attempt,
                run.state,
                run.message,
                relative(run.started_at),
                run.finished_at,
            )
            for run in op.task_runs.all()
        ]
    return shown_digest(shown)


def _cancellable(instance: Instance, operations: list, allowed: frozenset[str]) -> set:
    """The operations the reader may cancel: queued or running ones not already stopping,
    never a delete nor a running verb the cluster carries through, whose verb the role
    allows."""
    pending = [op for op in operations if op.state in PENDING and op.verb != "delete"]
    rules = {op.verb: selectors.verb_rule(instance.plan_version, op.verb) for op in pending}
    return {
        op.pk
        for op in pending
        if not op.cancel_reason
        and not (op.state == Operation.State.RUNNING and rules[op.verb].runs_through)
        and rules[op.verb].action in allowed
    }


@tenant_view("instance.view")
@require_POST
def operation_cancel(request, instance_id: str, operation_id):
    instance = _instance(request, instance_id)
    operation = get_object_or_404(instance.operations.all(), pk=operation_id)
    try:
        operation = services.operation_cancel(
            actor=Actor.from_request(request),
            operation=operation,
            request_id=request.POST.get("request_id", ""),
        )
    except ActionDenied as exc:
        action = selectors.verb_rule(operation.plan_version, operation.verb).action
        return _refused(request, instance, exc, action, tab="operations")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return _after(request, instance, "operations")
    label = selectors.verb_labels(instance.plan_version).get(operation.verb, operation.verb)
    if operation.state == Operation.State.CANCELLED:
        messages.success(request, f"{label} of {instance.name} is cancelled.")
    else:
        messages.success(
            request,
            f"{label} of {instance.name} stops at its next step.",
        )
    return _after(request, _instance(request, instance.pk), "operations")


# --- connection ---


@tenant_view("instance.view")
@require_http_methods(["GET", "HEAD", "POST"])
def instance_credentials_reveal(request, instance_id: str):
    """The Connection tab with the password shown once: never cached, never in an address.
    A GET (a reload of the answer) is the tab again, the password masked."""
    instance = _instance(request, instance_id)  # another tenant's id: a 404 before anything
    # A role without it: 403, audited as a refusal to reveal this instance's password, before
    # the recent sign-in is asked for.
    action_require(request, "instance.reveal_credentials", target=instance)
    if request.method != "POST":
        return redirect(_page_url(instance, "connection"))
    return _credentials_reveal(request, instance)


@reauthentication_required  # else allauth asks for the password, then replays the POST
def _credentials_reveal(request, instance: Instance):
    try:
        password = services.instance_credentials_reveal(
            actor=Actor.from_request(request), instance=instance
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect(_page_url(instance, "connection"))
    uri = selectors.instance_connection(instance).uri(password)
    response = _page(request, instance, tab="connection", revealed=password, revealed_uri=uri)
    response["Cache-Control"] = "no-store"
    return response


# --- upgrade, roll back, protection ---


@tenant_view("instance.view")
@require_POST
def instance_upgrade(request, instance_id: str):
    instance = _instance(request, instance_id)
    # The version the dialog showed; one no dialog could show is a changed one.
    seen = _whole(request.POST.get("version", ""))
    try:
        operation = services.instance_upgrade(
            actor=Actor.from_request(request),
            instance=instance,
            request_id=request.POST.get("request_id", ""),
            seen=seen if seen is None or isinstance(seen, int) else -1,
        )
    except ActionDenied as exc:
        return _refused(request, instance, exc, "instance.modify", tab="operations")
    except ValidationError as exc:
        return _dialog_again(request, instance, "dialog-upgrade", _errors(exc), tab="overview")
    number = operation.plan_version.number
    return _queued(
        request, instance, operation, f"Upgrade of {instance.name} to v{number}", tab="operations"
    )


@tenant_view("billing.manage")
@require_POST
def plan_change(request, plan_key: str):
    """The Billing page's "Change plan": move the instances on one plan to another."""
    source = get_object_or_404(Plan, key=plan_key)
    key = str(request.POST.get("plan", ""))[:100]
    # PostgreSQL compares no text holding a null character: no key holds one.
    target = Plan.objects.filter(key=key).first() if "\x00" not in key else None
    back = redirect("billing_overview", tenant_slug=request.tenant.slug)
    if target is None:
        messages.error(request, "Choose the plan to move your instances to.")
        return back
    try:
        change = services.plan_change(
            actor=Actor.from_request(request),
            tenant=request.tenant,
            source=source,
            target=target,
            request_id=request.POST.get("request_id", ""),
        )
    except ActionDenied as exc:
        messages.error(request, exc.reason)
        return back
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return back
    count = len(change.operations)
    messages.success(
        request,
        f"Moving {count} instance{pluralize(count)} from {source.name} to {target.name}; "
        "follow each on its Operations tab. Cancel your "
        f"{source.name} subscription once they have moved.",
    )
    return back


@tenant_view("instance.view")
@require_POST
def instance_rollback(request, instance_id: str):
    instance = _instance(request, instance_id)
    try:
        operation = services.instance_rollback(
            actor=Actor.from_request(request),
            instance=instance,
            request_id=request.POST.get("request_id", ""),
        )
    except ActionDenied as exc:
        return _refused(request, instance, exc, "instance.modify", tab="operations")
    except ValidationError as exc:
        return _dialog_again(request, instance, "dialog-rollback", _errors(exc), tab="overview")
    return _queued(request, instance, operation, f"Roll back of {instance.name}", tab="operations")


@tenant_view("instance.view")
@require_POST
def instance_protect(request, instance_id: str):
    instance = _instance(request, instance_id)
    on = {"on": True, "off": False}.get(request.POST.get("protect", ""))
    try:
        instance = services.instance_protect(
            actor=Actor.from_request(request), instance=instance, on=on
        )
    except ActionDenied as exc:
        return _refused(request, instance, exc, "instance.protect", tab="overview")
    except ValidationError as exc:  # neither on nor off, once the role allows it
        messages.error(request, " ".join(exc.messages))
        return _after(request, instance, "overview")
    state = "on" if instance.deletion_protected else "off"
    messages.success(request, f"Deletion protection of {instance.name} is {state}.")
    return _after(request, instance, "overview")
