"""htmx requests get the fragment they swap; every other request gets the whole page."""

import hashlib
import json

from django.http import HttpRequest


def partial_template(request: HttpRequest, template: str, name: str) -> str:
    """`template#name` for htmx requests (not history restores, which need the whole page)."""
    if request.htmx and not request.htmx.history_restore_request:
        return f"{template}#{name}"
    return template


def shown_digest(shown: list) -> str:
    """A short digest of what a part of a page that follows a change shows: its poll sends it
    back and gets nothing to swap (204) while it is unchanged, so nothing the reader opened or
    focused in it is swapped away."""
    return hashlib.blake2s(json.dumps(shown, default=str).encode(), digest_size=8).hexdigest()
