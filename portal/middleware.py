"""The portal's own middleware: addresses no page is found by, addresses only a form is sent
to, account pages the browser does not keep, what an htmx request gets when the page it
came from no longer holds, and the Content-Security-Policy's Stripe part."""

from urllib.parse import urlsplit

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render, resolve_url
from django.urls import Resolver404, resolve
from django.utils.cache import add_never_cache_headers
from django_htmx.http import HttpResponseClientRedirect

from accounts.htmx import current_address
from billing.stripe_gateway import stripe_page_origins


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's, with forms allowed on to Stripe's Checkout and customer portal: the
    Billing page's forms are sent here and redirected there, and a browser checks a form's
    redirect against `form-action` too. Read on each answer, as billing reads its settings."""

    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        stripe_pages = stripe_page_origins()
        if stripe_pages:
            update = dict(parts.update or {})
            update["form-action"] = [*update.get("form-action", []), *stripe_pages]
            parts.update = update
        return parts


class NullCharacterMiddleware:
    """PostgreSQL cannot compare text holding a null character: a lookup by one (an admin page
    by id, a list filter, a search) would fail with a database error, a 500. An address whose
    path holds one finds nothing (404), as any address no page has; a query's null characters
    are dropped, so a search finds what the rest of it names."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            raise Http404("null character in the address")
        if any(
            "\x00" in key or any("\x00" in value for value in values)
            for key, values in request.GET.lists()
        ):
            # Written out again, each null character is "%00" (a "%" typed is "%25").
            request.GET = QueryDict(request.GET.urlencode().replace("%00", ""))
        return self.get_response(request)


class FormOnlyAddressMiddleware:
    """An address only a form is sent to (an action's, a role change's), opened as a page — from
    the history, a reload after the form was sent, a link copied — answers 405 with nothing in
    it, which the browser shows as a blank page. It gets a page saying so, with a link to the
    nearest page above it (the instance's, the team's), still 405 with its `Allow` header."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or request.method != "GET" or response.content:
            return response
        address, name = _page_above(request.path)
        context = {"page": address, "page_name": name}
        page = render(request, "405.html", context, status=405)
        page["Allow"] = response.get("Allow", "POST")
        return page


# What the link to the page above a form-only address says, by the page's URL name.
_PAGE_NAMES = {
    "instance_detail": "the deployment",
    "instance_list": "Deployments",
    "team": "Team",
    "billing_overview": "Billing",
    "audit_log": "Audit log",
    "dashboard": "the dashboard",
}


def _page_above(path: str) -> tuple[str, str]:
    """The nearest address above `path` that some view answers ("/" at the last), and what a
    link to it says."""
    parts = path.strip("/").split("/")
    for end in range(len(parts) - 1, 0, -1):
        above = "/" + "/".join(parts[:end]) + "/"
        try:
            found = resolve(above)
        except Resolver404:
            continue
        return above, _PAGE_NAMES.get(found.url_name, "the page above")
    return "/", "the home page"


class AccountPagesNotKeptMiddleware:
    """No account page (/accounts/: sign-in, addresses, sessions, the authenticator's key and
    QR code, the recovery codes) is kept by the browser (`Cache-Control: no-store`), as no
    organization's page is (`accounts.tenancy`): Back after signing out on a shared computer
    showed them again from the browser's history, a second factor handed to the next person."""

    PREFIX = "/accounts/"

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith(self.PREFIX):
            add_never_cache_headers(response)
        return response


class HtmxPageGoneMiddleware:
    """An htmx request — a part of a page that polls, a form sent in place — whose page no
    longer holds sends the browser to what is true now. Its answer would otherwise be one htmx
    does not swap (a poll would ask again every few seconds for as long as the tab is open), or
    one it swaps into the part:

    - signed out meanwhile (the session ended): the login page, which leads back to the page
      the browser is on;
    - the page's organization or object gone or no longer the member's (404), or what it does
      no longer allowed to the member's role (403, whose reason the page then shows): the page
      is loaded again.

    Not a history restore (Back to a page htmx did not keep): htmx reads none of these headers
    for one, and it swaps its answer as it comes.
    """

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not _in_place(request):
            return response
        if response.status_code in (403, 404):
            response["HX-Refresh"] = "true"
            if refusal := getattr(request, "_refusal", ""):
                # Added once the error page is rendered (which shows, and so spends, messages):
                # the page loaded again says it.
                messages.error(request, refusal)
        elif response.status_code == 302 and _is_login(response.get("Location", "")):
            return HttpResponseClientRedirect(redirect_to_login(_page_shown(request)).url)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        if isinstance(exception, PermissionDenied):
            request._refusal = str(exception)  # why, for the page loaded again


def _in_place(request: HttpRequest) -> bool:
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request


def _is_login(url: str) -> bool:
    return urlsplit(url).path == resolve_url(settings.LOGIN_URL)


def _page_shown(request: HttpRequest) -> str:
    """The path (and query) of the page the browser is on: the part's own address is no page
    to come back to. Only a path of this site: the header is the client's to send."""
    shown = current_address(request)
    if not shown or not shown.path.startswith("/") or shown.path.startswith("//"):
        return "/"
    return f"{shown.path}?{shown.query}" if shown.query else shown.path
