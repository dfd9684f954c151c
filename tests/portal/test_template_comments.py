"""Django's `{# … #}` comments end on their line: one spread over several lines is printed as
text. Every page showed "{# Back and Forward load the page again … #}" above its top bar, and
the create and modify forms their estimate's comment beside the price."""

import re
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
# A comment opened on a line that does not close it there.
UNCLOSED = re.compile(r"\{#(?!.*#\})")


def _templates() -> list[Path]:
    skipped = {".venv", "node_modules", ".git", "var"}
    return [
        path
        for path in ROOT.rglob("*.html")
        if not skipped & set(path.relative_to(ROOT).parts) and "templates" in path.parts
    ]


def test_no_template_holds_a_comment_django_would_print():
    templates = _templates()
    unclosed = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in templates
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if UNCLOSED.search(line)
    ]

    assert len(templates) > 50  # the project's templates, found
    assert unclosed == [], "use {% comment %} for a comment of several lines"


@pytest.mark.django_db
def test_a_page_shows_none_of_its_templates_comments(owner_client, tenant):
    html = owner_client.get(f"/t/{tenant.slug}/").content.decode()

    assert "<html" in html and "{#" not in html and "#}" not in html
