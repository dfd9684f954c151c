"""Logging filters named in settings.LOGGING."""

import logging

from django.core.exceptions import PermissionDenied


class ExpectedDenialFilter(logging.Filter):
    """Django's `django.request` logs every PermissionDenied (a 403) with its traceback. A
    refusal is the product working as meant: keep one line, with the reason, and no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PermissionDenied) and isinstance(record.args, tuple):
            record.msg = f"{record.msg} (%s)"
            record.args = (*record.args, str(exc) or "no reason given")
            record.exc_info = None
            record.exc_text = None
        return True
