from django.core.exceptions import PermissionDenied


class ActionDenied(PermissionDenied):
    """A refused action, with a one-sentence reason the user can read."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class InvitationInvalid(Exception):
    """An invitation link that cannot be used, with the reason why."""
