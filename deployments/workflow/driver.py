"""What the engine needs from a cluster, and how a cluster call can fail.

The engine never talks to Kubernetes itself: it calls a `Driver`. The real one
(`deployments/kube.py`) uses the official client; engine unit tests use an
in-memory one. A driver never sleeps or retries.
"""

from __future__ import annotations

from typing import Any, Protocol


class DriverError(Exception):
    """A cluster call that failed; `message` is one readable line.

    `status` and `reason` are the API's HTTP status and Status reason when it answered;
    `retry_after` the seconds it asked to be left alone for (Retry-After, with a 429 or 503).
    `sent` is False only when the request surely was not applied (no connection to the cluster
    was made, it refused the credentials, or it throttled the request with a 429); any other
    failure of a write may have been.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        retry_after: float | None = None,
        sent: bool = True,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.retry_after = retry_after
        self.sent = sent


class TransientError(DriverError):
    """Worth trying again later (429, 5xx, timeouts, lost connections, write conflicts)."""


class PermanentError(DriverError):
    """Trying again will not help (invalid object, forbidden, unknown kind)."""


class Driver(Protocol):
    """Actions on one Kubernetes object, as a resource template names them.

    Objects are plain dicts with apiVersion, kind and metadata (name, namespace).
    """

    def create(self, obj: dict[str, Any], *, owner_label: tuple[str, str]) -> dict[str, Any]:
        """Create `obj`. An existing object carrying `owner_label` counts as created (a
        resumed step); an existing object without it is a PermanentError."""
        ...

    def apply(self, obj: dict[str, Any], *, field_manager: str | None = None) -> dict[str, Any]:
        """Server-side apply `obj` (idempotent), as `field_manager` (Opsdeck's own by default):
        of the fields that manager applied before, those `obj` leaves out are removed."""
        ...

    def patch(
        self, obj: dict[str, Any], *, strategy: str, subresource: str | None
    ) -> dict[str, Any]:
        """Patch the object `obj` names with `obj` itself (merge / strategic) or, for
        `json`, with the JSON-patch list under the key `patch`."""
        ...

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace the object with `obj`."""
        ...

    def delete(self, obj: dict[str, Any]) -> None:
        """Delete the object `obj` names; a missing object is not an error."""
        ...

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Read the object `obj` names; None when it does not exist."""
        ...

    def resolve(self, resource: str) -> tuple[str, str]:
        """The (apiVersion, kind) a kubectl resource argument names (`cluster`, `cm`,
        `widgets.example.io`); a PermanentError when the cluster serves none."""
        ...

    def last_warning(self, obj: dict[str, Any], *, since: float | None) -> str:
        """The newest Warning event about the object `obj` names, last seen at `since` (a Unix
        time) or later, as "Reason: message"; "" without one. What an operator says of a
        failure it does not put in the object's status (a restore finding no backup)."""
        ...
