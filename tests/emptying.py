"""How the tables are emptied after each transactional test: a DELETE of the rows the test
left, rather than Django's flush, a TRUNCATE of every table.

A TRUNCATE gives each table, index and TOAST table it empties a new file (about 360 here),
and unlinks the old one. Over a run's couple of thousand transactional tests that is a
million files made: PostgreSQL's next checkpoint syncs each one (one took six minutes in a
full run), and every DROP DATABASE meanwhile (a benchmark's throwaway database, `make
clean`'s) waits for that checkpoint to end. A DELETE writes into the files there are.

What the next test finds is what a TRUNCATE leaves:
- no row: every table Django's flush names is emptied, in one transaction;
- no row still being written: the transaction first locks those tables as TRUNCATE does
  (ACCESS EXCLUSIVE), so a write another connection has in flight (a worker's, a server's)
  commits before the DELETE or waits for it to end, never between the two;
- no dead row nor index entry for a scan to read (tests count what their statements read):
  the tables deleted from are vacuumed, and a large one is truncated instead (LARGE_TABLE);
- the triggers that keep issued invoices as they were are not fired, as TRUNCATE does not
  fire them (`session_replication_role`, for that transaction, which takes a superuser as
  the local and the embedded PostgreSQL's roles are);
- the content types and permissions `post_migrate` makes, as the flush's `post_migrate`
  makes them again. Where the test left them as the last `post_migrate` made them (a
  test seldom touches them), they are kept rather than deleted and made again: making them
  was most of the emptying's time, some 70 ms a test. Otherwise they are deleted with the
  rest and `post_migrate` is sent.

A test that resets sequences, restores serialized data or names its apps, or a role that is
no superuser, gets Django's flush, as does any database but PostgreSQL.
"""

from django.core.management.sql import emit_post_migrate_signal
from django.db import connections, transaction
from django.test import TransactionTestCase

# A table of more bytes than this is truncated rather than deleted from: its DELETE would
# write as much again as the rows it removes, and its VACUUM read them.
LARGE_TABLE = 64 * 8192
# The tables `post_migrate` fills (its only receivers: auth's and contenttypes'), as Django
# names them (`auth.Permission`, `contenttypes.ContentType`).
MADE_BY_POST_MIGRATE = ("django_content_type", "auth_permission")
# Per database: those tables' rows as the last `post_migrate` left them (`_fingerprint`).
_made: dict[str, str] = {}


def install() -> None:
    flush = TransactionTestCase._fixture_teardown

    def _fixture_teardown(self):
        if self.reset_sequences or self.serialized_rollback or self.available_apps is not None:
            return flush(self)
        aliases = self._databases_names(include_mirrors=False)
        if not all(_can_delete_all(connections[alias]) for alias in aliases):
            return flush(self)
        for alias in aliases:
            if not tables_empty(alias, keep=_made.get(alias)):
                emit_post_migrate_signal(verbosity=0, interactive=False, db=alias)
                _made[alias] = _fingerprint(connections[alias])
        return None

    TransactionTestCase._fixture_teardown = _fixture_teardown


def tables_empty(alias: str, *, keep: str | None = None) -> bool:
    """Empty every table; but where the rows `post_migrate` makes still match `keep` (a
    `_fingerprint`), keep them. Whether they were kept."""
    connection = connections[alias]
    names = connection.introspection.django_table_names(only_existing=True, include_views=False)
    if not names:
        return False
    quote = connection.ops.quote_name
    deleted = []
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {', '.join(map(quote, names))} IN ACCESS EXCLUSIVE MODE")
        kept = keep is not None and _fingerprint(connection) == keep
        if kept:
            names = [name for name in names if name not in MADE_BY_POST_MIGRATE]
        cursor.execute(
            "SELECT relname FROM pg_class"
            " WHERE relname = ANY(%s) AND relkind = 'r' AND pg_relation_size(oid) > %s",
            [list(names), LARGE_TABLE],
        )
        large = {name for (name,) in cursor.fetchall()}
        if large:
            # CASCADE: any table referring to one of them is emptied with it.
            cursor.execute(f"TRUNCATE {', '.join(map(quote, sorted(large)))} CASCADE")
        cursor.execute("SET LOCAL session_replication_role = replica")
        for name in sorted(set(names) - large):
            cursor.execute(f"DELETE FROM {quote(name)}")  # noqa: S608
            if cursor.rowcount:
                deleted.append(name)
    if deleted:
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {', '.join(map(quote, deleted))}")
    return kept


def _fingerprint(connection) -> str:
    """A digest of every row of the tables `post_migrate` fills, in order."""
    quote = connection.ops.quote_name
    digest = "(SELECT md5(coalesce(string_agg(t::text, ';' ORDER BY t.id), '')) FROM {} t)"
    digests = ", ".join(digest.format(quote(name)) for name in MADE_BY_POST_MIGRATE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT concat_ws(',', {digests})")
        return cursor.fetchone()[0]


def _can_delete_all(connection) -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('is_superuser') = 'on'")
        return cursor.fetchone()[0]
