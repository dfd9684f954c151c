from django.core.exceptions import PermissionDenied
from django.db import InterfaceError, OperationalError


class ActionDenied(PermissionDenied):
    """A refused action, with a one-sentence reason the user can read."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class InvitationInvalid(Exception):
    """An invitation link that cannot be used, with the reason why."""


# PostgreSQL's error codes (SQLSTATE) of trouble that passes: a connection's (class 08), a
# transaction rolled back by a deadlock or a serialization failure (class 40), too many
# connections, a server shutting down or starting.
_PASSING_CLASSES = ("08", "40")
_PASSING = ("53300", "57P01", "57P02", "57P03")


def database_trouble(exc: BaseException) -> bool:
    """Whether `exc` is the database's passing trouble, which the same work may not meet
    again (a connection lost, a deadlock, a server restarting): work that loops over many
    items stops and is done again later. Not an error a statement makes whatever the moment
    (a value too long, a limit, a full disk): the item that made it is left, and the rest go
    on."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    state = getattr(exc.__cause__, "sqlstate", None)
    return state is None or state[:2] in _PASSING_CLASSES or state in _PASSING
