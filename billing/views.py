import logging
import uuid
from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect

from accounts import roles
from accounts.audit import Actor
from accounts.errors import ActionDenied
from accounts.tenancy import action_require, tenant_view
from billing import reports, selectors, services, stripe_sync, usage
from billing.forms import BillingDetailsForm
from billing.models import BillingProfile, Plan, StripeCustomer, Subscription
from billing.stripe_gateway import StripeFailure, StripeRefused, gateway

log = logging.getLogger(__name__)

INVOICES_PER_PAGE = 24


@tenant_view("billing.view")
@require_safe
def overview(request):
    rows = selectors.plan_rows(request.tenant)
    plans = {
        "rows": rows,
        "request_id": uuid.uuid4().hex,  # one per rendering: a double submit sends it twice
        "stripe_checkout": gateway() is not None,
        "now": timezone.now(),  # whether the stop of an ended subscription's instances is past
        # A return that names its plan is `_payment_return`'s to tell (older pages named none).
        "checkout": _checkout_said(request.GET.get("checkout", ""), rows)
        if "plan" not in request.GET
        else "",
        **_payment_return(request, rows),
    }
    if request.htmx and request.htmx.target == "billing-live":  # the plans follow a payment
        return render(request, "billing/_plans.html", plans)
    profile = selectors.billing_profile_of(request.tenant)
    period = usage.period_key(timezone.now())
    # Last month's cost stays on the page until an invoice the organization can open bills it:
    # its last hour is metered after midnight, and staff review its invoice before issuing it.
    last = usage.period_key(usage.period_bounds(period)[0] - usage.HOUR)
    context = {
        **plans,
        "cost": reports.period_cost(request.tenant, period),
        "last_cost": reports.period_cost(request.tenant, last)
        if selectors.invoice_to_come(request.tenant, last)
        else None,
        # Newest first, a page at a time (two plans make 24 invoices a year).
        "invoices": Paginator(selectors.invoices_of(request.tenant), INVOICES_PER_PAGE).get_page(
            request.GET.get("page")
        ),
        "billing_profile": profile,
        "billing_details": selectors.billing_details_from(request.tenant, profile),
        # Stripe keeps payment details once a subscription was paid for (a checkout page left
        # unpaid leaves a customer with nothing to manage).
        "payment_kept": StripeCustomer.objects.filter(tenant=request.tenant).exists()
        and Subscription.objects.filter(tenant=request.tenant)
        .exclude(stripe_subscription_id="")
        .exists(),
    }
    return render(request, "billing/overview.html", context)


CHECKOUT_RECENT = timedelta(hours=1)


def _checkout_said(returned: str, rows) -> str:
    """What Stripe's Checkout came back saying (`?checkout=`), when it is so: "done" only
    while a subscription paid through it waits for Stripe or started within the hour, not for
    anyone who adds it to the address."""
    if returned != "done":
        return "cancelled" if returned == "cancelled" else ""
    since = timezone.now() - CHECKOUT_RECENT
    paid = any(
        row.subscription is not None
        and row.subscription.stripe_customer_id
        and (
            row.subscription.status == Subscription.Status.PENDING
            or row.subscription.updated_at >= since
        )
        for row in rows
    )
    return "done" if paid else ""


CONFIRMING_FOR = timedelta(minutes=2)  # how long the page follows a payment Stripe confirms


def _payment_return(request, rows) -> dict:
    """What the page says of the plan paid for on Stripe's Checkout page it came back from
    (`?checkout=done&plan=KEY`), its subscription paid through Checkout:
    - `confirming` (the plan's key): it waits for Stripe's confirmation, and the plans follow
      it (`follow_url`) for CONFIRMING_FOR from the return (`since`, which the address keeps);
    - `confirmed` (the plan's name): it started within the hour;
    - `unconfirmed` (the plan's name): it still waits after that (a payment not finished, or an
      answer from Stripe still to come)."""
    said = {"confirming": "", "confirmed": "", "unconfirmed": "", "follow_url": ""}
    query = request.GET
    if query.get("checkout") != "done" or "plan" not in query:
        return said
    row = next((r for r in rows if r.plan.key == query["plan"]), None)
    subscription = row.subscription if row is not None else None
    if subscription is None or not subscription.stripe_customer_id:
        return said
    now = timezone.now()
    if subscription.status == Subscription.Status.ACTIVE:
        if subscription.updated_at >= now - CHECKOUT_RECENT:
            said["confirmed"] = row.plan.name
    elif subscription.status == Subscription.Status.PENDING:
        try:
            since = min(float(query.get("since", "")), now.timestamp())
        except ValueError:
            since = now.timestamp()  # the return itself: the following starts now
        if now.timestamp() - since < CONFIRMING_FOR.total_seconds():
            said["confirming"] = row.plan.key
            said["follow_url"] = f"{request.path}?" + urlencode(
                {"checkout": "done", "plan": row.plan.key, "since": int(since)}
            )
        else:
            said["unconfirmed"] = row.plan.name
    return said


def _back(request):
    return redirect("billing_overview", tenant_slug=request.tenant.slug)


def _refusal(exc: ActionDenied | ValidationError) -> str:
    return exc.reason if isinstance(exc, ActionDenied) else " ".join(exc.messages)


@tenant_view("billing.manage")
@require_POST
def subscribe(request, plan_key: str):
    plan = get_object_or_404(Plan, key=plan_key)
    gw = gateway() if plan.paid_at_checkout else None  # nothing to pay: no checkout
    try:
        subscription = services.subscribe(
            actor=Actor.from_request(request),
            tenant=request.tenant,
            plan=plan,
            request_id=request.POST.get("request_id", ""),
            check=(lambda: stripe_sync.subscribe_check(gw, request.tenant, plan)) if gw else None,
        )
    except (ActionDenied, ValidationError) as exc:
        messages.error(request, _refusal(exc))
        return _back(request)
    except StripeFailure as exc:
        log.error("subscribing %s to %s: %s", request.tenant.pk, plan.key, exc)
        messages.error(request, "Stripe could not be reached; please try again.")
        return _back(request)
    if subscription.status == Subscription.Status.CANCELLED:  # this form, sent before
        messages.warning(
            request,
            f"This form was sent before, for a subscription to {plan.name} cancelled since; "
            "subscribe again from this page.",
        )
        return _back(request)
    if gw is not None and subscription.status == Subscription.Status.PENDING:
        return _resume_or_checkout(request, gw, subscription)
    if subscription.status == Subscription.Status.PENDING:
        messages.success(
            request,
            f"Your subscription to {plan.name} awaits approval by the platform team; "
            "we will email you once it is approved.",
        )
    else:
        messages.success(request, f"You are subscribed to {plan.name}.")
    return _back(request)


def _overview_url(request) -> str:
    return request.build_absolute_uri(
        reverse("billing_overview", kwargs={"tenant_slug": request.tenant.slug})
    )


def _resume_or_checkout(request, gw, subscription: Subscription):
    """A cancelled subscription still billing in Stripe until its period ends goes on
    (`stripe_sync.subscription_resume`); else off to Stripe's Checkout page."""
    try:
        resumed = stripe_sync.subscription_resume(
            gw, subscription, actor=Actor.from_request(request)
        )
    except StripeFailure as exc:
        log.error("resuming for subscription %s: %s", subscription.pk, exc)
        messages.error(request, "Stripe could not be reached; please try again.")
        return _back(request)
    except ValidationError as exc:
        messages.error(request, _refusal(exc))
        return _back(request)
    if resumed is None:
        return _checkout(request, gw, subscription)
    if resumed.status == Subscription.Status.ACTIVE:
        messages.success(
            request,
            f"You are subscribed to {subscription.plan.name} again: the subscription you "
            "cancelled goes on, on the payment details Stripe holds.",
        )
    return _back(request)


def _checkout(request, gw, subscription: Subscription):
    """Off to Stripe's Checkout page for a subscription waiting for payment."""
    back = _overview_url(request)
    try:
        url = stripe_sync.checkout_start(
            gw,
            subscription,
            success_url=f"{back}?{urlencode({'checkout': 'done', 'plan': subscription.plan.key})}",
            cancel_url=f"{back}?checkout=cancelled",
            email=request.user.email,
        )
    except (stripe_sync.CatalogMissing, StripeFailure) as exc:
        log.error("checkout for subscription %s: %s", subscription.pk, exc)
        messages.error(
            request,
            "Payment by card is not available right now; please try again later or contact "
            "the platform team.",
        )
        return _back(request)
    return redirect(url) if url else _back(request)  # no longer waiting: the page says why


@tenant_view("billing.manage")
@require_POST
def payment_manage(request):
    """Stripe's customer portal: payment methods and past invoices."""
    gw = gateway()
    customer = StripeCustomer.objects.filter(tenant=request.tenant).first()
    if gw is None or customer is None:
        raise Http404("No payment method is kept for this organization.")
    try:
        session = gw.billing_portal_session_create(
            customer_id=customer.customer_id, return_url=_overview_url(request)
        )
    except StripeFailure as exc:
        log.error("billing portal for %s: %s", request.tenant.slug, exc)
        messages.error(request, "The payment page is not available right now; try again later.")
        return _back(request)
    return redirect(session.url)


@tenant_view("billing.manage")
@require_POST
def subscription_cancel(request, subscription_id: int):
    subscription = (
        Subscription.objects.filter(tenant=request.tenant, pk=subscription_id)
        .select_related("plan")
        .first()
    )
    if subscription is None:
        raise Http404("No such subscription.")
    try:
        services.subscription_cancel(
            actor=Actor.from_request(request),
            subscription=subscription,
            then=stripe_sync.subscription_end,
        )
    except (ActionDenied, ValidationError) as exc:
        messages.error(request, _refusal(exc))
    else:
        said = f"Your subscription to {subscription.plan.name} is cancelled."
        if subscription.stripe_subscription_id and subscription.current_period_end:
            said += (
                " Stripe bills this period's usage when the period ends, on "
                f"{subscription.current_period_end:%-d %b %Y}."
            )
        messages.success(request, said)
    return _back(request)


@tenant_view("billing.view")
@require_safe
def invoice_detail(request, invoice_id: int):
    """One invoice, laid out to be printed or saved as a PDF from the browser."""
    invoice = selectors.invoice_of(request.tenant, invoice_id)
    if invoice is None:
        raise Http404("No such invoice.")
    cost = reports.period_cost(
        request.tenant, invoice.period, plan=invoice.plan, billed_by=invoice.source
    )
    billed_to, issuer = selectors.invoice_parties(invoice)
    context = {"invoice": invoice, "cost": cost, "billed_to": billed_to, "issuer": issuer}
    return render(request, "billing/invoice_detail.html", context)


@tenant_view("billing.view")
@require_safe
def credit_note_detail(request, invoice_id: int, credit_note_id: int):
    """One of Opsdeck's credit notes on one of the tenant's invoices, laid out to be printed
    (Stripe's have Stripe's PDF)."""
    note = selectors.credit_note_of(request.tenant, invoice_id, credit_note_id)
    if note is None:
        raise Http404("No such credit note.")
    billed_to, issuer = selectors.invoice_parties(note.invoice)
    context = {"note": note, "invoice": note.invoice, "billed_to": billed_to, "issuer": issuer}
    return render(request, "billing/credit_note.html", context)


@tenant_view("billing.view")
@require_http_methods(["GET", "HEAD", "POST"])
def billing_details(request):
    """Whom the tenant's invoices are made out to: a form for the roles that manage billing,
    the details as they are for the others."""
    profile = selectors.billing_profile_of(request.tenant)
    if request.method == "POST":
        action_require(request, "billing.manage", target=profile)
        form = BillingDetailsForm(request.POST)
        if form.is_valid():
            try:
                profile, changed = services.billing_details_update(
                    actor=Actor.from_request(request),
                    tenant=request.tenant,
                    details=form.cleaned_data,
                )
            except ActionDenied as exc:  # the role changed since the request began
                messages.error(request, exc.reason)
                return _details_done(request)
            except ValidationError as exc:
                form.add_error(None, exc)
            else:
                _details_said(request, profile, changed)
                return _details_done(request)
    else:
        details = selectors.billing_details_from(request.tenant, profile)
        form = BillingDetailsForm(initial=details)
    context = {
        "form": form,
        "billing_profile": profile,
        "billing_details": selectors.billing_details_from(request.tenant, profile),
        "may_edit": roles.can(request.membership.role, "billing.manage"),
    }
    if request.htmx:
        return render(request, "billing/billing_details.html#details-form", context)
    return render(request, "billing/billing_details.html", context)


def _details_done(request):
    url = reverse("billing_overview", kwargs={"tenant_slug": request.tenant.slug})
    url += "#billing-details"
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


def _details_said(request, profile: BillingProfile, changed: list[str]) -> None:
    """Say what saving the details did, Stripe's customer included (told now, outside the
    saving transaction; beat tries again when it could not be)."""
    if not changed:
        messages.info(request, "Nothing changed: your billing details are as they were.")
        return
    gw = gateway()
    try:
        if gw is not None:
            stripe_sync.billing_details_push(gw, request.tenant.pk)
    except stripe_sync.TaxIdRefused as exc:
        messages.warning(
            request,
            f"Your billing details are saved, but Stripe refused the tax ID: {exc.said} Stripe's "
            "invoices show the new name and address, with the tax ID it held before, if any. "
            "Correct the tax ID and save again.",
        )
    except StripeRefused as exc:
        messages.warning(
            request,
            "Your billing details are saved, but Stripe refused them, so Stripe's invoices "
            f"still show the details it held before: {exc.said} Correct them and save again.",
        )
    except stripe_sync.TaxIdUnreached:
        messages.warning(
            request,
            "Your billing details are saved, and Stripe has the new name and address, but it "
            "could not be reached for the tax ID just now: it is tried again automatically "
            "within minutes.",
        )
    except StripeFailure:
        messages.warning(
            request,
            "Your billing details are saved, but Stripe could not be updated just now: it is "
            "tried again automatically within minutes.",
        )
    else:
        messages.success(
            request, "Your billing details are saved: new invoices are made out to them."
        )
