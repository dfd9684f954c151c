"""`Idempotency-Key`: Stripe answers a repeated key with the first response for 24 hours, and
refuses the key with other parameters or on another endpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import StripeError, invalid
from .state import DAY

MAX_KEY = 255


@dataclass
class Saved:
    """The first response for a key, replayed byte for byte."""

    fingerprint: str
    status: int
    body: bytes
    created: int


class IdempotencyKeys:
    """Saved responses by (API key, idempotency key); used under the emulator's state lock.

    Only successful responses are saved: Stripe saves a result once the endpoint started
    executing, and every error the emulator answers is raised before anything was written.
    """

    def __init__(self) -> None:
        self._saved: dict[tuple[str, str], Saved] = {}

    def clear(self) -> None:
        """Forget every key."""
        self._saved.clear()

    @staticmethod
    def fingerprint(method: str, path: str, params: dict[str, Any]) -> str:
        """What must match for a replay: the endpoint and every parameter."""
        return json.dumps([method, path, params], sort_keys=True)

    def lookup(self, api_key: str, key: str, fingerprint: str, now: int) -> Saved | None:
        """The saved response to replay, None for a new key, or Stripe's idempotency_error."""
        if len(key) > MAX_KEY:
            raise invalid(
                f"Idempotency-Key must be at most {MAX_KEY} characters.", param="Idempotency-Key"
            )
        saved = self._saved.get((api_key, key))
        if saved is None or saved.created <= now - DAY:
            return None
        if saved.fingerprint != fingerprint:
            raise StripeError(
                400,
                "Keys for idempotent requests can only be used with the same parameters they "
                f"were first used with. Try using a key other than '{key}' if you meant to "
                "execute a different request.",
                type="idempotency_error",
            )
        return saved

    def save(self, api_key: str, key: str, saved: Saved) -> None:
        """Remember a successful response."""
        self._saved[(api_key, key)] = saved

    def to_list(self, now: int) -> list[dict[str, Any]]:
        """The responses still replayable at `now`, JSON-ready (for the state file)."""
        return [
            {
                "api_key": api_key,
                "key": key,
                "fingerprint": saved.fingerprint,
                "status": saved.status,
                "body": saved.body.decode("utf-8"),
                "created": saved.created,
            }
            for (api_key, key), saved in self._saved.items()
            if saved.created > now - DAY
        ]

    def load_list(self, saved: list[dict[str, Any]]) -> None:
        """Replace every key by what `to_list` returned."""
        loaded = {
            (s["api_key"], s["key"]): Saved(
                s["fingerprint"], int(s["status"]), s["body"].encode("utf-8"), int(s["created"])
            )
            for s in saved
        }
        self._saved = loaded
