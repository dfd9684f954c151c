"""Browser tests: Playwright drives Debian's Chromium against pytest-django's live server.

Only the system Chromium is used (`apt-get install chromium`); Playwright's own browser
downloads are never needed. Without it these tests skip, saying why; `.ci/run` installs it.
"""

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("OPSDECK_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDTHS = {"wide": (1280, 900), "narrow": (390, 844)}
SHOTS = os.environ.get("OPSDECK_SHOTS", "")  # a folder to save screenshots in, if set


@pytest.fixture(scope="module")
def browser(django_db_setup):
    """One Chromium per test module; gone (with Playwright's event loop) when the module ends,
    so that modules elsewhere in the suite that import this fixture never hold two at once."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` to run browser tests")
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        # Playwright's sync API keeps an event loop running in this thread, which Django's
        # guard takes for async code calling the ORM; the tests' queries are synchronous.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def _served_like_a_browser_expects(settings):
    # The live server speaks plain HTTP, and its static handler serves source files (not the
    # hashed names the manifest storage would write into pages).
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def open_page(browser, live_server, client):
    """`open_page(user, path, width="wide")`: a page of its own, signed in as `user`."""
    from django.conf import settings

    contexts = []

    def open_(user, path: str, width: str = "wide"):
        w, h = WIDTHS[width]
        context = browser.new_context(viewport={"width": w, "height": h})
        contexts.append(context)
        if user is not None:
            client.force_login(user)
            cookie = client.cookies[settings.SESSION_COOKIE_NAME]
            context.add_cookies(
                [{"name": cookie.key, "value": cookie.value, "url": live_server.url}]
            )
        page = context.new_page()
        page.goto(live_server.url + path)
        return page

    yield open_
    for context in contexts:
        context.close()


def laid_out(page) -> None:
    """Until the page's stylesheets are in. A click that loads a new page returns once it has
    begun: a width measured then is of the page without its styles (980 px wide on a
    390 px phone), which a person never sees, since a browser does not paint before them."""
    page.wait_for_load_state("load")


def scrolls_sideways(page) -> bool:
    laid_out(page)
    return page.evaluate("document.documentElement.scrollWidth > window.innerWidth")


def select_cuts_its_text(page, selector: str) -> bool:
    """Whether the select shows its chosen option's text cut short: the text, in the select's
    own font, is wider than the box leaves it beside the arrow."""
    laid_out(page)
    return page.evaluate(
        """(selector) => {
            const select = document.querySelector(selector);
            const style = getComputedStyle(select);
            const span = document.createElement("span");
            span.style.font = style.font;
            span.style.whiteSpace = "pre";
            span.textContent = select.options[select.selectedIndex].text;
            document.body.appendChild(span);
            const text = span.getBoundingClientRect().width;
            span.remove();
            const room = select.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight);
            return text > room;
        }""",
        selector,
    )


def htmx_settled(page) -> None:
    """Until htmx has no request in flight and has settled what it swapped in. htmx 2 binds
    the triggers of new content when it settles (20 ms after the swap): a change made before
    that is lost, which a person never manages but a test easily does."""
    busy = ".htmx-request, .htmx-swapping, .htmx-settling, .htmx-added"
    page.wait_for_function(f"() => !document.querySelector('{busy}')")


def shot(page, name: str) -> None:
    """Save a full-page screenshot to $OPSDECK_SHOTS (for a person to look at), if set."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)
