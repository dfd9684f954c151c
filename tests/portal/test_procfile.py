"""The Procfile's mail worker consumes the queue the portal sends its emails to, and only it."""

import os
import subprocess
from pathlib import Path

import pytest

PROCFILE = Path(__file__).resolve().parents[2] / "Procfile"


def _queues(process: str, environment: dict[str, str]) -> str | None:
    """What the Procfile's `process` is told to consume (`--queues`), as the shell expands its
    line (honcho runs each through one); None: the default queue alone."""
    line = next(
        text.split(":", 1)[1]
        for text in PROCFILE.read_text().splitlines()
        if text.startswith(f"{process}:")
    )
    expanded = subprocess.run(  # noqa: S603 - the Procfile's own line
        ["/bin/sh", "-c", f"printf '%s\\n' {line}"],
        env={"PATH": os.environ["PATH"], **environment},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return expanded[expanded.index("--queues") + 1] if "--queues" in expanded else None


@pytest.mark.parametrize(
    ("environment", "queue"),
    [
        ({}, "opsdeck.mail"),
        ({"CELERY_QUEUE": "opsdeck_dev_1a2b"}, "opsdeck_dev_1a2b.mail"),
        ({"CELERY_QUEUE": "eu", "CELERY_MAIL_QUEUE": "eu-mail"}, "eu-mail"),
    ],
)
def test_the_mail_worker_consumes_the_mail_queue_and_the_worker_does_not(environment, queue):
    assert _queues("mail", environment) == queue
    assert _queues("worker", environment) is None


def test_the_settings_name_the_mail_queue_as_the_procfile_does(settings):
    # This run sets CELERY_QUEUE, not CELERY_MAIL_QUEUE.
    derived = f"{settings.CELERY_TASK_DEFAULT_QUEUE}.mail"
    assert derived == settings.OPSDECK_MAIL_QUEUE
