"""What browsers refused under the Content-Security-Policy, told to the platform team.

The policy (`settings.CONTENT_SECURITY_POLICY`) names `/csp-report` as its `report-uri`: a
browser that blocks something on a page (a script, a style, a form's destination) posts a
report there, and each one is logged as a warning on the `opsdeck.csp` logger, one line: the
directive, what was blocked and the page, query strings left out (they may hold a token). A
page the policy breaks after a change (a vendored file that evaluates code, say) shows in the
log rather than only in a customer's console.

Anyone can post here, so a report is small (at most REPORT_BYTES), read as JSON in either
form browsers send (`application/csp-report`, or the Reporting API's
`application/reports+json`), at most VIOLATIONS_LOGGED of one post are logged, and each client
address is heard at most RATE: past it, 429."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from allauth.account.adapter import get_adapter
from django.core.exceptions import PermissionDenied
from rest_framework import permissions
from rest_framework.exceptions import ParseError
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from accounts.api import JSONParser

log = logging.getLogger("opsdeck.csp")

REPORT_BYTES = 16 * 1024
RATE = "30/min"
VIOLATIONS_LOGGED = 10  # of one post: a browser sends a few; more is someone filling the log
FIELD_CHARS = 300  # the most of any one field a log line holds


# The API's parser (a body nested too deeply is a 400), under the media types browsers send.
class CspReportParser(JSONParser):
    media_type = "application/csp-report"


class ReportsParser(JSONParser):
    media_type = "application/reports+json"


class ReportRate(SimpleRateThrottle):
    """RATE reports per client address, as the sign-in rate limits count addresses (allauth's,
    which honours ALLAUTH_TRUSTED_PROXY_COUNT): a forwarded-for header a client writes
    itself does not make it someone else."""

    scope = "csp-report"
    rate = RATE

    def get_cache_key(self, request, view) -> str:
        try:
            address = get_adapter(request._request).get_client_ip(request._request)
        except PermissionDenied:
            address = "unknown"
        return self.cache_format % {"scope": self.scope, "ident": address}


def _url(value: Any) -> str:
    """A URL as the log says it: without its query or fragment; a keyword as sent, and what
    does not read as a URL up to its first "?" or "#"."""
    text = str(value or "")[:FIELD_CHARS]
    try:
        parts = urlsplit(text)
    except ValueError:  # a host that is no address ("http://[::1")
        return text.split("?", 1)[0].split("#", 1)[0]
    if not parts.scheme or not parts.netloc:
        return text
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def violations(data: Any) -> list[dict[str, str]]:
    """The violations a report holds, each as the log says it; ParseError when it is not a
    CSP report in either form."""
    if isinstance(data, dict) and isinstance(data.get("csp-report"), dict):
        bodies = [data["csp-report"]]
    elif isinstance(data, list) and all(
        isinstance(report, dict) and isinstance(report.get("body"), dict) for report in data
    ):
        bodies = [report["body"] for report in data if report.get("type") == "csp-violation"]
    else:
        raise ParseError("This is not a Content-Security-Policy report.")
    said = []
    for body in bodies:
        directive = (
            body.get("effective-directive")
            or body.get("effectiveDirective")
            or body.get("violated-directive")
            or ""
        )
        source = body.get("source-file") or body.get("sourceFile") or ""
        line = body.get("line-number") or body.get("lineNumber")
        said.append({
            "directive": str(directive)[:FIELD_CHARS],
            "blocked": _url(body.get("blocked-uri") or body.get("blockedURL")),
            "page": _url(body.get("document-uri") or body.get("documentURL")),
            "source": f"{_url(source)}:{line}" if source and line else _url(source),
        })  # fmt: skip
    return said


class CspReport(APIView):
    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    parser_classes = [CspReportParser, ReportsParser, JSONParser]
    throttle_classes = [ReportRate]

    def post(self, request):
        try:
            size = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            size = 0
        if size > REPORT_BYTES:
            return Response({"error": "The report is too large."}, status=413)
        for violation in violations(request.data)[:VIOLATIONS_LOGGED]:
            log.warning(
                "The Content-Security-Policy refused %s %s on %s (at %s)",
                violation["directive"] or "?",
                violation["blocked"] or "?",
                violation["page"] or "?",
                violation["source"] or "?",
            )
        return Response(status=204)
