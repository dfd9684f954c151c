"""Container logs of the simulated pods: what the kubelet would serve at `pods/{name}/log`.

The simulated controllers write lines where they act (a pod starts, a backup runs, a switchover
happens); periodic lines (PostgreSQL's checkpoints) are produced when someone reads, so an idle
pod costs nothing per controller round. Each container keeps its last `limit` lines; a pod's
logs are dropped with the pod.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_LIMIT = 2000

# Periodic lines: given the moment they are due, the lines to write then.
Periodic = Callable[[float], list[str]]


@dataclass(frozen=True)
class LogLine:
    """One line as the kubelet stores it: when it was written, and its text (no newline)."""

    seq: int
    time_ns: int
    text: str

    def render(self, timestamps: bool) -> str:
        """The line as served, with the kubelet's RFC 3339 (nanosecond) prefix if asked."""
        return f"{rfc3339_nano(self.time_ns)} {self.text}\n" if timestamps else f"{self.text}\n"


@dataclass
class ContainerLog:
    """The kept lines of one container; `dropped` once its pod is gone (followers then end)."""

    lines: deque[LogLine]
    # (period in seconds, next due wall time, line factory)
    periodic: tuple[float, float, Periodic] | None = None
    dropped: bool = False


@dataclass
class _Pod:
    uid: str
    containers: dict[str, ContainerLog] = field(default_factory=dict)


def rfc3339_nano(time_ns: int) -> str:
    """Go's time.RFC3339Nano in UTC: nanoseconds with trailing zeros trimmed."""
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    base = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


class PodLogs:
    """Log lines of every simulated container, bounded per container; followers can wait."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.cond = threading.Condition(threading.Lock())
        self.pods: dict[tuple[str, str], _Pod] = {}
        self._seq = itertools.count(1)
        self._last_ns = 0

    def _now_ns(self) -> int:
        # Strictly increasing, so lines written in one step keep their order on every client.
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def _container(self, ns: str, pod: str, uid: str, container: str) -> ContainerLog:
        entry = self.pods.get((ns, pod))
        if entry is None or (uid and entry.uid != uid):
            # A pod created again under the same name starts with empty logs.
            entry = self.pods[(ns, pod)] = _Pod(uid)
        found = entry.containers.get(container)
        if found is None:
            found = entry.containers[container] = ContainerLog(deque(maxlen=self.limit))
        return found

    def write(self, ns: str, pod: str, uid: str, container: str, *lines: str) -> None:
        """Append lines to a container's log (uid: the pod's, so a new pod starts afresh)."""
        with self.cond:
            target = self._container(ns, pod, uid, container)
            self._catch_up(target)
            for text in lines:
                target.lines.append(LogLine(next(self._seq), self._now_ns(), text))
            self.cond.notify_all()

    def every(
        self, ns: str, pod: str, uid: str, container: str, seconds: float, make: Periodic | None
    ) -> None:
        """Write make(due time) every `seconds` from now on (None stops it)."""
        with self.cond:
            target = self._container(ns, pod, uid, container)
            self._catch_up(target)
            target.periodic = None if make is None else (seconds, time.time() + seconds, make)

    def drop(self, ns: str, pod: str) -> None:
        """Forget a pod's logs (it was deleted); its followers read what is left, then end."""
        with self.cond:
            entry = self.pods.pop((ns, pod), None)
            if entry is not None:
                for container in entry.containers.values():
                    container.dropped = True
                self.cond.notify_all()

    def open(self, ns: str, pod: str, uid: str, container: str) -> ContainerLog:
        """The log a follower reads from, kept until it lets go even if the pod goes."""
        with self.cond:
            return self._container(ns, pod, uid, container)

    def after(self, log: ContainerLog, seq: int) -> list[LogLine]:
        """Lines of an opened log with a sequence number above seq."""
        with self.cond:
            self._catch_up(log)
            return [line for line in log.lines if line.seq > seq]

    def read(
        self,
        ns: str,
        pod: str,
        container: str,
        *,
        after: int = 0,
    ) -> list[LogLine]:
        """The container's kept lines with a sequence number above `after`, oldest first."""
        with self.cond:
            entry = self.pods.get((ns, pod))
            target = entry.containers.get(container) if entry else None
            if target is None:
                return []
            self._catch_up(target)
            return [line for line in target.lines if line.seq > after]

    def wait(self, timeout: float) -> None:
        """Block until a line is written anywhere or a pod's logs are dropped (or timeout)."""
        with self.cond:
            self.cond.wait(timeout)

    def _catch_up(self, target: ContainerLog) -> None:
        """Write the periodic lines that fell due since the container was last touched."""
        if target.periodic is None:
            return
        seconds, due, make = target.periodic
        now = time.time()
        if due > now:
            return
        missed = int((now - due) // seconds)
        # Only the occurrences that can still be in the buffer are written.
        skip = max(missed + 1 - self.limit, 0)
        due += skip * seconds
        while due <= now:
            stamp = max(int(due * 1e9), self._last_ns + 1)
            for text in make(due):
                self._last_ns = stamp
                target.lines.append(LogLine(next(self._seq), stamp, text))
                stamp += 1
            due += seconds
        target.periodic = (seconds, due, make)
