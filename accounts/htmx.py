"""htmx requests get the fragment they swap; every other request gets the whole page."""

from django.http import HttpRequest


def partial_template(request: HttpRequest, template: str, name: str) -> str:
    """`template#name` for htmx requests (not history restores, which need the whole page)."""
    if request.htmx and not request.htmx.history_restore_request:
        return f"{template}#{name}"
    return template
