"""What a browser refused under the Content-Security-Policy reaches the platform team's log:
the policy names `/csp-report`, each report in either form browsers send is one warning line
(no query string from the page's address), and anyone posting there is bounded."""

import json
import logging
import uuid

import pytest

from portal import csp_reports
from tests.portal.test_security_headers import _policy

VIOLATION = {
    "document-uri": "https://opsdeck.example.com/t/acme/deployments/?token=secret#x",
    "referrer": "",
    "violated-directive": "script-src-elem",
    "effective-directive": "script-src-elem",
    "original-policy": "default-src 'self'; report-uri /csp-report",
    "blocked-uri": "inline",
    "source-file": "https://opsdeck.example.com/static/js/opsdeck.js?v=3",
    "line-number": 12,
    "status-code": 200,
}


def _address() -> str:
    """A client address of the test's own: the rate is counted per address, in the cache the
    test processes share."""
    return f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"


def _post(client, body, *, content_type="application/csp-report", address=None):
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(
        "/csp-report", data=data, content_type=content_type, REMOTE_ADDR=address or _address()
    )


def _logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "opsdeck.csp"]


def test_every_answer_names_the_report_address(client):
    assert _policy(client.get("/accounts/login/"))["report-uri"] == ["/csp-report"]


def test_a_report_is_one_warning_without_the_pages_query(client, caplog):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")

    response = _post(client, {"csp-report": VIOLATION})

    assert response.status_code == 204
    assert _logged(caplog) == [
        "The Content-Security-Policy refused script-src-elem inline on "
        "https://opsdeck.example.com/t/acme/deployments/ "
        "(at https://opsdeck.example.com/static/js/opsdeck.js:12)"
    ]


def test_the_reporting_apis_form_is_read_too_and_other_reports_are_left_out(client, caplog):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")
    reports = [
        {"type": "deprecation", "url": "https://opsdeck.example.com/", "body": {"id": "x"}},
        {
            "type": "csp-violation",
            "url": "https://opsdeck.example.com/billing/",
            "body": {
                "documentURL": "https://opsdeck.example.com/billing/?session=abc",
                "effectiveDirective": "form-action",
                "blockedURL": "https://pay.elsewhere.example/checkout?c=1",
                "disposition": "enforce",
            },
        },
    ]

    response = _post(client, reports, content_type="application/reports+json")

    assert response.status_code == 204
    assert _logged(caplog) == [
        "The Content-Security-Policy refused form-action https://pay.elsewhere.example/checkout "
        "on https://opsdeck.example.com/billing/ (at ?)"
    ]


def test_an_address_that_does_not_read_as_one_is_logged_without_its_query(client, caplog):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")
    odd = {**VIOLATION, "blocked-uri": "http://[::1/x?k=secret", "document-uri": 7}

    response = _post(client, {"csp-report": odd})

    assert response.status_code == 204
    assert _logged(caplog) == [
        "The Content-Security-Policy refused script-src-elem http://[::1/x on 7 "
        "(at https://opsdeck.example.com/static/js/opsdeck.js:12)"
    ]


@pytest.mark.parametrize(
    "body",
    ["not json", {"report": "of something else"}, [1, 2], {"csp-report": "text"}, "[" * 10_000],
)
def test_what_is_not_a_report_is_a_400_and_logs_nothing(client, caplog, body):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")

    response = _post(client, body)

    assert response.status_code == 400
    assert "error" in response.json()
    assert not _logged(caplog)


def test_a_report_too_large_is_refused_unread(client, caplog):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")
    large = {"csp-report": {**VIOLATION, "script-sample": "x" * csp_reports.REPORT_BYTES}}

    response = _post(client, large)

    assert response.status_code == 413
    assert not _logged(caplog)


def test_a_post_full_of_violations_logs_a_few(client, caplog):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")
    many = [{"type": "csp-violation", "body": {"effectiveDirective": "img-src"}}] * 200

    response = _post(client, many, content_type="application/reports+json")

    assert response.status_code == 204
    assert len(_logged(caplog)) == csp_reports.VIOLATIONS_LOGGED


def test_one_address_is_heard_so_often_and_another_still_is(client, caplog):
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")
    flooding = _address()
    most = int(csp_reports.RATE.split("/")[0])

    answers = [_post(client, {"csp-report": VIOLATION}, address=flooding) for _ in range(most + 3)]
    other = _post(client, {"csp-report": VIOLATION})

    assert [a.status_code for a in answers] == [204] * most + [429] * 3
    assert int(answers[-1]["Retry-After"]) > 0
    assert other.status_code == 204
    assert len(_logged(caplog)) == most + 1
