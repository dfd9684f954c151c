"""The Celery application: configured from Django settings (CELERY_*), tasks autodiscovered.

A task is to a worker what a request is to the web tier: around each one, database connections
past `DATABASE_CONN_MAX_AGE` or unusable are closed, and a kept one is checked before reuse
(`CONN_HEALTH_CHECKS`). Celery's own fixup would close them all after every task; it is told to
reuse them (`CELERY_DB_REUSE_MAX`).
"""

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("opsdeck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def _connections_tidy(sender=None, **_kwargs) -> None:
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # run in the caller's process, inside its transaction: its connection
    from django.db import close_old_connections

    close_old_connections()
