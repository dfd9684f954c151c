"""htmx requests get the fragment they swap; every other request gets the whole page."""

import hashlib
import json
from urllib.parse import SplitResult, urlsplit

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.cache import patch_vary_headers


def partial_template(request: HttpRequest, template: str, name: str) -> str:
    """`template#name` for htmx requests (not history restores, which need the whole page)."""
    if request.htmx and not request.htmx.history_restore_request:
        return f"{template}#{name}"
    return template


def sent_to(request: HttpRequest, url: str) -> HttpResponse:
    """To `url`, which htmx follows as a whole page rather than a swapped panel."""
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)


def current_address(request: HttpRequest) -> SplitResult | None:
    """The address of the page the browser shows (htmx's `HX-Current-URL`), split; None when
    there is none or it does not parse (the header is the client's to send)."""
    try:
        return urlsplit(request.htmx.current_url or "")
    except ValueError:
        return None


def shown_digest(shown: list) -> str:
    """A short digest of what a part of a page that follows a change shows: its poll sends it
    back (`shown`) and gets nothing to swap while it is unchanged (`unchanged`), so nothing the
    reader opened or focused in it is swapped away."""
    return hashlib.blake2s(json.dumps(shown, default=str).encode(), digest_size=8).hexdigest()


def unchanged(request: HttpRequest, shown: str) -> HttpResponse | None:
    """The answer to a poll that sent back the digest of what it shows when that is still
    `shown`: 204, nothing to swap. None for any other request."""
    if not (request.htmx and request.GET.get("shown") == shown):
        return None
    response = HttpResponse(status=204)
    patch_vary_headers(response, ["HX-Request"])
    return response
