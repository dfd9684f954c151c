"""What PostgreSQL counted of a test's own statements on a table, inside the transaction in
progress: the rows its scans read and the rows it updated."""


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


def rows_read(model) -> int:
    """The index entries and rows that this connection's scans of `model`'s table read in the
    transaction in progress (as `row_updates`, not yet sent to PostgreSQL's statistics)."""
    from django.db import connection

    with connection.cursor() as cursor:
        # Returned by a table: its rows read by sequential scans; by an index: its entries.
        cursor.execute(
            """
            SELECT sum(pg_stat_get_xact_tuples_returned(r))
              FROM (SELECT %s::regclass::oid UNION ALL
                    SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass) AS read (r)
            """,
            [model._meta.db_table] * 2,
        )
        return cursor.fetchone()[0]
