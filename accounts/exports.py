"""CSV downloads that a spreadsheet opens safely, streamed row by row."""

from __future__ import annotations

import csv
from collections.abc import Iterable

from django.http import StreamingHttpResponse


class _Echo:
    def write(self, value):
        return value


def spreadsheet_safe(value: str) -> str:
    """`value`, defused: a spreadsheet runs a cell starting with = + - @ as a formula, and
    one starting with a tab or a carriage return, which it skips before one of those."""
    return "'" + value if value[:1] in {"=", "+", "-", "@", "\t", "\r"} else value


def csv_download(filename: str, header: list[str], rows: Iterable[list]) -> StreamingHttpResponse:
    """A CSV attachment of `header` and `rows`, written as the rows are read (text cells are
    made spreadsheet-safe). UTF-8, said by its charset and by a byte-order mark first: Excel
    reads a saved file without one in the system's code page ("Zoë" as "ZoÃ«")."""
    writer = csv.writer(_Echo())

    def lines():
        yield "\ufeff"
        yield writer.writerow(header)
        for row in rows:
            yield writer.writerow(
                [spreadsheet_safe(value) if isinstance(value, str) else value for value in row]
            )

    return StreamingHttpResponse(
        lines(),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
