"""The portal's pages under its Content-Security-Policy in a real browser: nothing a page needs
is refused (no script, style, image or form the policy blocks), htmx still swaps, Chart.js
still draws, the Copy buttons still write to the clipboard, and Django's admin still works."""

import logging
import re
import time
from datetime import timedelta

from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from billing import usage
from deployments import metering
from deployments.models import ServerSample
from tests.browser.conftest import htmx_settled
from tests.conftest import PASSWORD
from tests.deployments import factories
from tests.deployments.test_metrics_sampling import postgres_with_servers

TABS = ["Connection", "Servers", "Metrics", "Logs", "Events", "Operations", "Backups",
        "Activity", "Overview"]  # fmt: skip


def _watched(page) -> list[str]:
    """What the browser refuses on `page` from now on, as it says it (console) and as the
    page is told (`securitypolicyviolation`), across its navigations."""
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text)
            if re.search(r"Content Security Policy|Permissions-Policy|htmx:", message.text)
            else None
        ),
    )
    page.expose_function("cspViolation", lambda said: refused.append(said))
    page.add_init_script(
        """document.addEventListener("securitypolicyviolation", (event) => window.cspViolation(
            `${event.violatedDirective} ${event.blockedURI}`
            + ` at ${event.sourceFile}:${event.lineNumber}`
        ));"""
    )
    return refused


def _chart_drawn(page, selector: str) -> None:
    page.wait_for_function(
        "(selector) => !!Chart.getChart(document.querySelector(selector))", arg=selector
    )


def test_every_page_works_under_the_policy_with_nothing_refused(open_page, owner, tenant):
    owner.is_staff = owner.is_superuser = True
    owner.save()
    version = postgres_with_servers()
    cell = factories.cell()
    cell.is_default = True
    cell.save()
    # Running for the last two full hours, metered (the Billing page's chart), and sampled
    # each minute of the last quarter hour (the Metrics tab's charts).
    latest = metering.last_full_hour()
    instance = factories.ran_since(tenant, version, cell, latest - usage.HOUR)
    this_month = usage.period_bounds(usage.period_key(timezone.now()))[0]
    metering.meter_hours([h for h in (latest - usage.HOUR, latest) if h >= this_month])
    minute = timezone.now().replace(second=0, microsecond=0)
    ServerSample.objects.bulk_create(
        ServerSample(instance=instance, server=f"{instance.pk}-1", role="primary",
                     minute=minute - timedelta(minutes=n), cpu=0.5, memory=2**30)
        for n in range(15)
    )  # fmt: skip
    group = Group.objects.create(name="Auditors")
    base = f"/t/{tenant.slug}"

    page = open_page(owner, f"{base}/")
    refused = _watched(page)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.reload()  # watched from its first line
    expect(page.locator("h1")).to_have_text(tenant.name)

    page.goto(f"{page.url.split('/t/')[0]}{base}/deployments/")
    expect(page.locator("#deployment-table")).to_contain_text(instance.name)

    page.goto(f"{page.url.split('/t/')[0]}{base}/deployments/new/{version.plan.key}/")
    htmx_settled(page)
    hourly = page.locator("#estimate-hour").text_content()
    page.get_by_label("Servers").fill("3")  # the live estimate, an htmx request
    expect(page.locator("#estimate-hour")).not_to_have_text(hourly)

    page.goto(f"{page.url.split('/t/')[0]}{base}/deployments/{instance.pk}/")
    expect(page.locator("h1")).to_have_text(instance.name)
    for tab in TABS:  # each swapped in by htmx, its address pushed
        htmx_settled(page)
        page.get_by_role("link", name=tab, exact=True).click()
        expect(page.get_by_role("link", name=tab, exact=True)).to_have_attribute(
            "aria-current", "page"
        )
        expect(page).to_have_url(re.compile(rf"tab={tab.lower()}$|/{instance.pk}/$"))
        if tab == "Metrics":
            _chart_drawn(page, "#metrics-cpu canvas")
    copy = page.get_by_role("button", name=re.compile("Copy the instance id"))
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == instance.pk

    for path, heading in [
        ("billing/", "Billing"),
        ("team/", "Team"),
        ("settings/", "Settings"),
        ("audit/", "Audit log"),
    ]:
        page.goto(f"{page.url.split('/t/')[0]}{base}/{path}")
        expect(page.locator("h1").first).to_contain_text(heading)
        if path == "billing/" and latest >= this_month:
            _chart_drawn(page, "#daily-cost-usd canvas")

    root = page.url.split("/t/")[0]
    for path in ["/accounts/email/", "/accounts/password/change/", "/accounts/2fa/"]:
        page.goto(root + path)
        expect(page.locator("main")).to_be_visible()
    page.goto(root + "/accounts/2fa/totp/activate/")  # asks for the password again first
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name=re.compile("Confirm", re.I)).click()
    expect(page.locator("img[src^='data:image/svg+xml']")).to_be_visible()  # the QR code

    page.goto(root + "/admin/")
    expect(page.locator("#site-name")).to_be_visible()
    page.goto(root + "/admin/accounts/user/")
    page.locator("#changelist-filter").get_by_role("link", name="Yes").first.click()
    expect(page).to_have_url(re.compile(r"is_active__exact=1|is_staff__exact=1"))
    page.goto(root + "/admin/billing/planoverride/add/")  # a change form with date widgets
    page.locator(".datetimeshortcuts").first.get_by_role("link", name="Today").click()
    expect(page.locator("#id_effective_from_0")).to_have_value(re.compile(r"\d{4}-\d\d-\d\d"))
    page.locator(".datetimeshortcuts .date-icon").first.click()
    expect(page.locator(".calendarbox").first).to_be_visible()
    page.goto(root + f"/admin/auth/group/{group.pk}/delete/")
    page.get_by_role("link", name=re.compile("No, take me back")).click()  # its script: back
    expect(page).to_have_url(re.compile(r"/admin/billing/planoverride/add/$"))
    page.goto(root + f"/admin/deployments/instance/{instance.pk}/change/")
    expect(page.locator("#content")).to_contain_text(instance.name)

    assert sorted(set(refused)) == [], "\n".join(sorted(set(refused)))


def test_a_script_the_policy_refuses_in_the_browser_reaches_the_log(open_page, caplog):
    """Something injected into a page (here an inline script) is refused, and the browser's
    report of it is a warning in the platform team's log, naming the page."""
    caplog.set_level(logging.WARNING, logger="opsdeck.csp")
    page = open_page(None, "/accounts/login/?next=/secret-path")

    page.evaluate(
        """() => document.body.appendChild(
            Object.assign(document.createElement("script"), {textContent: "window.ran = 1"}))"""
    )

    assert page.evaluate("() => window.ran") is None  # refused
    deadline = time.monotonic() + 10
    while not [r for r in caplog.records if r.name == "opsdeck.csp"]:
        assert time.monotonic() < deadline, "no report reached the log"
        time.sleep(0.1)
    (said,) = [r.getMessage() for r in caplog.records if r.name == "opsdeck.csp"]
    assert said.startswith("The Content-Security-Policy refused script-src-elem inline on ")
    assert "/accounts/login/ " in said and "secret-path" not in said


def test_an_attribute_a_browser_extension_styles_is_not_copied_into_a_swap(
    open_page, owner, tenant
):
    """A password manager or a highlighter styles elements through the CSSOM, which the policy
    allows. htmx copied an element's style attribute onto the element that replaced it while
    settling, as an inline style the policy refuses: a console error, and a report the
    platform team's log would fill with."""
    page = open_page(owner, f"/t/{tenant.slug}/audit/")
    refused = _watched(page)
    page.reload()
    page.evaluate("() => { document.getElementById('audit-log').style.outline = '2px solid red' }")

    with page.expect_response(lambda r: "/audit/" in r.url and r.request.method == "GET"):
        page.get_by_label("Actor email").fill("nobody@example.com")
        page.get_by_label("Actor email").press("Enter")
    htmx_settled(page)

    assert "nobody%40example.com" in page.url  # swapped
    assert refused == []
