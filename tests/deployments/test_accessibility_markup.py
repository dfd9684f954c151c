# ruff: noqa: F811 (the instance page tests' fixtures are parameters here)
"""What the instance page's markup alone tells a screen reader: headings in order, a title of
its own per tab."""

import itertools
import re

import pytest

from tests.deployments.test_instance_page import instance, local_cell, plan  # noqa: F401

HEADING = re.compile(r"<h([1-6])\b")
TITLE = re.compile(r"<title>(.*?)</title>", re.S)


def _tab(client, instance, tab) -> str:
    response = client.get(f"/t/{instance.tenant.slug}/deployments/{instance.pk}/?tab={tab}")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.parametrize("tab", ["overview", "connection", "servers", "backups", "operations"])
def test_each_tab_s_headings_go_down_one_level_at_a_time(owner_client, instance, tab):
    """The Backups tab went from the instance's h1 to an h3 "Schedule", the Connection tab to
    an h3 "URI": a screen reader's list of headings has a level missing."""
    # A closed dialog's headings are not on the page a reader moves through.
    html = re.sub(r"<dialog\b.*?</dialog>", "", _tab(owner_client, instance, tab), flags=re.S)
    levels = [int(level) for level in HEADING.findall(html)]

    assert [(a, b) for a, b in itertools.pairwise(levels) if b > a + 1] == [], levels


def test_each_tab_has_a_title_of_its_own(owner_client, instance):
    """Every tab was titled "<name> · Opsdeck": a screen reader's window list, the history and
    bookmarks could not tell them apart."""
    titles = {
        tab: TITLE.findall(_tab(owner_client, instance, tab))
        for tab in ["overview", "connection", "backups", "operations", "activity"]
    }

    assert titles == {
        "overview": [f"{instance.name} · Opsdeck"],
        "connection": [f"Connection · {instance.name} · Opsdeck"],
        "backups": [f"Backups · {instance.name} · Opsdeck"],
        "operations": [f"Operations · {instance.name} · Opsdeck"],
        "activity": [f"Activity · {instance.name} · Opsdeck"],
    }
