# ruff: noqa: F811 (the instance fixture of the instance page tests is a parameter here)
"""Keyboard focus in a real browser, at 1280 px and 390 px: whatever the Tab key reaches shows a
ring a person can see against the page (WCAG 1.4.11: 3:1)."""

import pytest

from tests.browser.conftest import htmx_settled
from tests.browser.test_instance_page import instance  # noqa: F401 (fixture)

BOTH_WIDTHS = pytest.mark.parametrize("width", ["wide", "narrow"])

RING_CONTRAST = """() => {
    const el = document.activeElement;
    const s = getComputedStyle(el);
    const parse = (c) => {
        const m = c && c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
        const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
        return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
    let ring = null;
    if (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 1) ring = parse(s.outlineColor);
    else if (s.boxShadow && s.boxShadow !== 'none') ring = parse(s.boxShadow);
    let node = el.parentElement, bg = [255, 255, 255];
    while (node) { const c = parse(getComputedStyle(node).backgroundColor);
        if (c && c[3] > 0) { bg = c.slice(0, 3); break; } node = node.parentElement; }
    const name = el.tagName.toLowerCase() + ' ' + (el.textContent || '').trim().slice(0, 30);
    if (!ring) return [name, 1];
    const mix = [0, 1, 2].map((k) => ring[k] * ring[3] + bg[k] * (1 - ring[3]));
    const lum = ([r, g, b]) => { const f = (v) => { v /= 255;
        return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
    const [a, b] = [lum(mix), lum(bg)];
    return [name, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)];
}"""

# Pico's ring fades in: until the focused element's transitions have ended.
RING_SHOWN = """() => Promise.all(document.activeElement.getAnimations()
    .filter((a) => a.effect.getComputedTiming().endTime !== Infinity)
    .map((a) => a.finished.catch(() => null)))"""


@BOTH_WIDTHS
def test_every_link_and_menu_reached_with_the_keyboard_shows_a_focus_ring_that_can_be_seen(
    open_page, owner, instance, width
):
    """The focused element's ring (its outline, else its shadow) against the page behind it:
    Pico's translucent shadow on links, the tabs and the menus' summaries was 1.76:1."""
    page = open_page(owner, f"/t/{instance.tenant.slug}/deployments/{instance.pk}/", width)
    htmx_settled(page)
    faint = {}
    for _ in range(40):
        page.keyboard.press("Tab")
        page.evaluate(RING_SHOWN)
        name, ratio = page.evaluate(RING_CONTRAST)
        if name.startswith("body"):
            break
        if ratio < 3:
            faint[name] = round(ratio, 2)

    assert faint == {}, faint
