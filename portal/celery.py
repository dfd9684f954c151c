"""The Celery application: configured from Django settings (CELERY_*), tasks autodiscovered."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("opsdeck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
