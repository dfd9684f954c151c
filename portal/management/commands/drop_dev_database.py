import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from psycopg import sql

from portal.broker import cache_forget, queue_forget
from portal.celery import app


class Command(BaseCommand):
    help = (
        "Remove what `make run` left on local servers shared with other checkouts (used by "
        "`make clean`): its development database on the local PostgreSQL, and its Celery queue "
        "and cache keys on the local Redis. Refuses unless DEBUG is on. What is on the embedded "
        "servers goes with var/."
    )

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("Only a development checkout's data is removed here (DEBUG on).")
        if settings.OPSDECK_DATABASE_SOURCE == "local":
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
        if settings.OPSDECK_BROKER_SOURCE == "local":
            # Only this checkout's keys: the queues and the cache prefix are named after its
            # database (`portal.launch`).
            queues = (settings.CELERY_TASK_DEFAULT_QUEUE, settings.OPSDECK_MAIL_QUEUE)
            for queue in queues:
                queue_forget(app, queue)
            cache_forget(settings.CACHE_URL, settings.CACHES["default"]["KEY_PREFIX"])
            self.stdout.write(f"Removed queues {', '.join(queues)} and its cache keys from Redis.")
