"""What an htmx request gets when the page it came from no longer holds."""

from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect


class HtmxPageGoneMiddleware:
    """An htmx request — a part of a page that polls, a form sent in place — whose page no
    longer holds sends the browser to what is true now. Its answer would otherwise be one htmx
    does not swap (a poll would ask again every few seconds for as long as the tab is open), or
    one it swaps into the part:

    - signed out meanwhile (the session ended): the login page, which leads back to the page
      the browser is on;
    - the page's organization or object gone or no longer the member's (404), or what it does
      no longer allowed to the member's role (403): the page is loaded again, and says so.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if not getattr(request, "htmx", False):
            return response
        if response.status_code in (403, 404):
            response["HX-Refresh"] = "true"
        elif response.status_code == 302 and _is_login(response.url):
            return HttpResponseClientRedirect(redirect_to_login(_page_shown(request)).url)
        return response


def _is_login(url: str) -> bool:
    return urlsplit(url).path == resolve_url(settings.LOGIN_URL)


def _page_shown(request) -> str:
    """The path (and query) of the page the browser is on: the part's own address is no page
    to come back to. Only the path: the header is the client's to send."""
    try:
        shown = urlsplit(request.htmx.current_url or "")
    except ValueError:
        shown = None
    if not shown or not shown.path.startswith("/") or shown.path.startswith("//"):
        return "/"
    return f"{shown.path}?{shown.query}" if shown.query else shown.path
