"""Where a benchmark's CPU goes: user and system time, per group of processes, over a span.

Both sides of a comparison share two cores with the services they use, so a rate alone does not
say what to make cheaper. `CpuMeter` reads the CPU time of named groups of processes (workers,
the watcher, submitters, a sandbox, PostgreSQL's backends for a database, Redis) at the start
and end of each span it is given, each with its children (the process each worker, watcher and
client starts to evaluate CEL and jq); a process that started during a span counts from zero,
one that ended is lost (every process measured here lives through the benchmark).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import psutil

Pids = Callable[[], Iterable[int]]


def postgres_backends(dbname: str) -> Pids:
    """The PostgreSQL server processes serving connections to `dbname` (their titles name it)."""

    def pids() -> list[int]:
        found = []
        for proc in psutil.process_iter(["name", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if cmdline.startswith("postgres:") and f" {dbname} " in f"{cmdline} ":
                found.append(proc.pid)
        return found

    return pids


def named(name: str) -> Pids:
    """Processes called `name` (e.g. redis-server)."""

    def pids() -> list[int]:
        return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == name]

    return pids


def _with_children(pids: Iterable[int]) -> list[int]:
    """`pids` and every process they started (and those started, down the tree), each once."""
    found = []
    for pid in pids:
        found.append(pid)
        try:
            found += [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return list(dict.fromkeys(found))


def _cpu(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0
    return times.user + times.system


class CpuMeter:
    """CPU seconds per group, summed over the spans between `begin()` and `end()`."""

    def __init__(self, groups: dict[str, Pids]) -> None:
        self.groups = groups
        self.seconds: dict[str, float] = defaultdict(float)
        self._start: dict[str, dict[int, float]] = {}

    def begin(self) -> None:
        self._start = {
            name: {pid: _cpu(pid) for pid in _with_children(pids())}
            for name, pids in self.groups.items()
        }

    def end(self) -> None:
        for name, pids in self.groups.items():
            before = self._start.get(name, {})
            for pid in _with_children(pids()):
                self.seconds[name] += max(0.0, _cpu(pid) - before.get(pid, 0.0))
        self._start = {}

    def per(self, count: int) -> dict[str, float]:
        """Milliseconds per one of `count` things done in the spans, per group."""
        return {name: self.seconds[name] * 1000 / max(count, 1) for name in self.groups}
