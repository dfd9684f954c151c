"""What PostgreSQL counted of a test's own statements on a table, inside the transaction in
progress: the rows its scans read (`rows_read`, the counter `make bench` reads too) and the rows
it updated."""

from bench.support import rows_read

__all__ = ["row_updates", "rows_read"]


def row_updates(model) -> tuple[int, int]:
    """The updates of `model`'s rows this connection made and has not yet sent to PostgreSQL's
    statistics (those of the transaction in progress among them), and how many of them were
    made in the row's page (HOT: no new entry in any of the table's indexes)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_updated(%s::regclass),"
            " pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
            [model._meta.db_table] * 2,
        )
        return cursor.fetchone()
