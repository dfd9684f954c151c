import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from psycopg import sql


class Command(BaseCommand):
    help = (
        "Drop the development database that `make run` created on a local PostgreSQL server "
        "(used by `make clean`). Refuses unless DEBUG is on and the database is the local default."
    )

    def handle(self, *args, **options):
        if not settings.DEBUG or settings.OPSDECK_DATABASE_SOURCE != "local":
            raise CommandError(
                "Only the development database on the local server is dropped here "
                "(DEBUG on, DATABASE_URL unset)."
            )
        db = settings.DATABASES["default"]
        connections.close_all()
        dsn = f"host={db['HOST']} port={db['PORT'] or 5432} user={db['USER']} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(db["NAME"])
                )
            )
        self.stdout.write(f"Dropped database {db['NAME']}.")
