"""Fault injection: API errors, latency, conflicts, dropped watches, and operator faults."""

from __future__ import annotations

import copy
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Faults:
    """What to break, switchable at run time (rates are probabilities per request)."""

    error_500: float = 0.0
    error_503: float = 0.0
    error_429: float = 0.0
    latency_ms: int = 0
    conflict: float = 0.0
    drop_watch: float = 0.0
    # Operator faults: clusters ("ns/name") failing bootstrap, backups to fail, and frozen
    # controllers: "cnpg" (all of it), "clusters", "backups", "scheduledbackups",
    # "statefulsets", "volumes" (claim binding and expansion), "garbage-collector" (also
    # namespace cleanup).
    fail_bootstrap: list[str] = field(default_factory=list)
    fail_backups: int = 0
    frozen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # Pods failed on purpose: (namespace, name) -> monotonic end (inf: until cleared).
    failed_pods: dict[tuple[str, str], float] = field(
        default_factory=dict, repr=False, compare=False
    )

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values."""
        return {
            name: copy.copy(getattr(self, name))
            for name in self.__dataclass_fields__
            if name not in _INTERNAL
        }

    def update(self, data: dict[str, Any]) -> None:
        """Change some settings; unknown names raise ValueError."""
        with self.lock:
            for key, value in data.items():
                key = _ALIASES.get(key, key)
                if key not in self.__dataclass_fields__ or key in _INTERNAL:
                    raise ValueError(f"unknown fault {key!r}")
                current = getattr(self, key)
                if isinstance(current, list):
                    value = (
                        list(value)
                        if isinstance(value, list)
                        else [v for v in str(value).split("|") if v]
                    )
                elif isinstance(current, float):
                    value = float(value)
                else:
                    value = int(str(value).removesuffix("ms"))
                setattr(self, key, value)

    def roll(self, rate: float) -> bool:
        """True with probability rate."""
        return rate > 0 and random.random() < rate  # noqa: S311 - chance, not secrecy

    def fail_pod(self, ns: str, name: str, seconds: float | None = None) -> None:
        """Make a pod's containers crash for `seconds` of real time (None: until cleared)."""
        if seconds is not None and not seconds > 0:
            raise ValueError("seconds must be a positive number")
        until = math.inf if seconds is None else time.monotonic() + seconds
        with self.lock:
            self.failed_pods[(ns, name)] = until

    def clear_pod(self, ns: str, name: str) -> bool:
        """End a pod failure early; False if the pod was not failing."""
        with self.lock:
            return self.failed_pods.pop((ns, name), None) is not None

    def pod_failures(self) -> dict[tuple[str, str], float]:
        """The pod failures in force (ended ones are forgotten), with their monotonic end."""
        now = time.monotonic()
        with self.lock:
            for key in [k for k, until in self.failed_pods.items() if until <= now]:
                del self.failed_pods[key]
            return dict(self.failed_pods)

    def take_backup_failure(self) -> bool:
        """Consume one of the 'next N backups fail' tokens."""
        with self.lock:
            if self.fail_backups > 0:
                self.fail_backups -= 1
                return True
            return False


_INTERNAL = {"lock", "failed_pods"}

_ALIASES = {
    "500": "error_500",
    "503": "error_503",
    "429": "error_429",
    "latency": "latency_ms",
    "conflicts": "conflict",
    "409": "conflict",
    "dropwatch": "drop_watch",
    "drop-watch": "drop_watch",
}


def parse_spec(spec: str | None) -> dict[str, Any]:
    """Parse `--faults "500=0.1,503=0.05,429=0.1,latency=50ms,conflict=0.2,dropwatch=0.5"`."""
    out: dict[str, Any] = {}
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"fault {part!r} must be name=value")
        out[key.strip()] = value.strip()
    return out
