"""Fault injection: the next N requests under a path prefix, or a fraction of them, answer an
error (after hanging S seconds, so a client timeout fires). A faulted request changes nothing:
it is answered before the emulator looks at its parameters."""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass
from typing import Any

from .errors import StripeError


@dataclass
class Fault:
    """One rule; the first rule matching a request decides its fate."""

    path: str  # a path prefix, e.g. "/v1/billing/meter_events"
    method: str | None = None  # only this HTTP method (any when None)
    status: int = 500
    count: int | None = None  # the next N matching requests; every one when None
    rate: float | None = None  # this fraction of matching requests; all when None
    hang: float = 0.0  # seconds to wait before answering

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError("a fault's path must start with /")
        if not 400 <= self.status <= 599:
            raise ValueError("a fault's status must be an HTTP error (400..599)")
        if self.count is not None and self.count < 1:
            raise ValueError("a fault's count must be at least 1")
        if self.rate is not None and not 0 < self.rate <= 1:
            raise ValueError("a fault's rate must be in (0, 1]")
        if self.hang < 0:
            raise ValueError("a fault's hang must not be negative")
        if self.method is not None:
            self.method = self.method.upper()

    def matches(self, method: str, path: str) -> bool:
        """True when the rule covers this request (before its rate is rolled)."""
        return path.startswith(self.path) and self.method in (None, method)

    def error(self) -> StripeError:
        """The error answered: Stripe's rate-limit shape for 429, its api_error otherwise."""
        if self.status == 429:
            return StripeError(
                429, "Too many requests (fault injected by the emulator).", code="rate_limit"
            )
        return StripeError(
            self.status,
            "An unknown error occurred while processing your request "
            "(fault injected by the emulator).",
            type="api_error",
        )


class Faults:
    """The rules in force, consumed thread-safely as requests arrive."""

    def __init__(self) -> None:
        self._rules: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, **settings: Any) -> Fault:
        """Add a rule (the names of `Fault`'s fields); ValueError for a bad one."""
        fault = Fault(**settings)
        with self._lock:
            self._rules.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self._rules.clear()

    def to_list(self) -> list[dict[str, Any]]:
        """The rules as JSON-ready values (a counted rule shows what is left)."""
        with self._lock:
            return [asdict(f) for f in self._rules]

    def take(self, method: str, path: str) -> Fault | None:
        """The fault this request gets, if any; a counted rule is used up by it."""
        with self._lock:
            for fault in self._rules:
                if not fault.matches(method, path):
                    continue
                if fault.rate is not None and random.random() >= fault.rate:  # noqa: S311 - chance, not secrecy
                    continue
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count == 0:
                        self._rules.remove(fault)
                return fault
        return None
