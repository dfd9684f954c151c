"""Bounded evaluation of the programs a spec author writes: CEL expressions and jq filters.

A CEL expression or jq filter can run forever (`def f: f; f`) or take all memory (`[repeat(1)]`,
where jq aborts the whole process when malloc fails). So they never run in a worker: each
worker process keeps one long-lived child (`python -m deployments.workflow.evaluator`, started
on first use with a fresh interpreter, never a fork of the worker) that compiles and caches the
programs by their text and evaluates them. The child caps its own address space at
MEMORY_LIMIT_MIB; the parent lets it spend at most TIME_LIMIT_SECONDS of CPU time on each answer
(a parse: PARSE_TIME_LIMIT_SECONDS), within WALL_LIMIT_FACTOR times that in elapsed time. A
program that exceeds a bound gets its child killed and reaped (the next call starts a new one)
and raises `ProgramLimitError` with one line that says which bound it exceeded.

The time limit counts the child's CPU time, not the time elapsed, so that a busy host does not
fail a customer's operation for the load: a child the scheduler kept waiting for seconds has
used none of its time (`_Budget`). Where the child's CPU time cannot be read, elapsed time is
counted instead.

The two processes talk over pipes: a frame is a 4-byte big-endian length and that many bytes.
A request is a JSON header (`{"op": "cel", "program": …, "name": …}` or `{"op": "jq", …}`), a
newline and the input as JSON text, sent once and used as it is: jq parses it itself, and the
child keeps the last CEL input converted, since a waiting task polls the same object again.
A reply is JSON: `{"value": …, "shown": …}`, `{"error": …}` or `{"limit": "memory"|"depth"}`.

What a CEL expression is sent is only what it reads of its variable (`CelParsed.reads`): a
condition over `self.status.phase` gets `{"status": {"phase": …}}`, not the whole object.
Conditions over the objects of many instances then send the same few bytes, and the answer to a
request already answered is kept (`_Answers`): the same program over the same input gives the
same answer, so the cell watcher, which tests a status rule on every status change of every
instance, seldom needs the child at all. Not for a program that calls `timestamp()`, which
reads the clock for "now" (celpy parses its text with pendulum), nor for jq, which has `now` and
`env`.

CEL programs may call Kubernetes' quantity library (`quantity("15Gi")`, `compareTo` and the
rest: `quantity.py`), so that a condition compares sizes as sizes.

Parsing is bounded the same way: CEL's lexer backtracks exponentially on some unterminated
strings, and jq folds constants when it compiles (`"x" * 1e9` allocates a gigabyte). So a spec's
programs are parsed by the child too, when the spec is checked (`cel_parse`, `jq_problem`), and
nothing an author wrote is parsed, compiled or run in the worker or web process itself.
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_RESULT_BYTES",
    "MEMORY_LIMIT_MIB",
    "PARSE_TIME_LIMIT_SECONDS",
    "TIME_LIMIT_SECONDS",
    "CelParsed",
    "CelValue",
    "ProgramError",
    "ProgramLimitError",
    "cel_parse",
    "evaluate_cel",
    "evaluate_jq",
    "jq_problem",
]

TIME_LIMIT_SECONDS = 2.0
"""CPU time one evaluation may take: far above what a condition over a Kubernetes object needs
(well under a millisecond), short enough that a runaway program delays its worker only briefly."""
PARSE_TIME_LIMIT_SECONDS = 5.0
"""CPU time one parse may take. A condition parses in well under a millisecond and a parse is
made once per process, so this bound is only for a runaway parser (CEL's lexer backtracks for
hours over some unterminated strings)."""
WALL_LIMIT_FACTOR = 10
"""How many times its CPU time limit an answer may take in elapsed time, however little CPU the
child was given meanwhile: a child stopped or starved for good still ends."""
MEMORY_LIMIT_MIB = 256
"""Address space of the evaluator child: its interpreter with celpy and jq takes about 40 MiB,
evaluating over the largest object Kubernetes stores (~1.5 MB) a few tens more."""
MAX_RESULT_BYTES = 1 << 20
"""Longest answer (as JSON) a program may give: an output is stored with the run's state."""
_START_TIMEOUT_SECONDS = 60.0  # importing celpy and jq on a busy machine; not the program's time
_MEMORY_EXIT = 3  # the child's exit status after a MemoryError in Python
_HEADER = struct.Struct(">I")
_ROOT = Path(__file__).resolve().parents[2]  # where `-m deployments.workflow.evaluator` resolves
_CHILD_ENVIRONMENT = frozenset({"PATH", "PYTHONPATH", "PYTHONHOME", "LANG", "LC_ALL"})
_LANGUAGE = {"cel": ("CEL", "expression"), "jq": ("jq", "filter")}


class ProgramError(ValueError):
    """The program failed on this input (a missing field, a bad operand); the library's text."""


class ProgramLimitError(ValueError):
    """The program exceeded a bound (time, memory, nesting, result size); one readable line."""


@dataclass(frozen=True)
class CelValue:
    """A CEL result as plain data (bool, int, float, str, None, list, dict; a timestamp,
    duration or bytes as text), and how CEL shows it (`BoolType(False)`) for messages."""

    value: Any
    shown: str


def evaluate_cel(expression: str, name: str, value: Any) -> CelValue:
    """Evaluate a CEL expression with one variable, `name`, bound to a JSON value.

    Raises ProgramError when CEL reports an error, ProgramLimitError when a bound is exceeded.
    """
    reads = cel_parse(expression, name).reads
    if reads is not None:
        value = _pruned(value, reads)
    header = {"op": "cel", "program": expression, "name": name}
    reply = _shared.call(header, value, keep="timestamp" not in expression)
    return CelValue(reply["value"], reply["shown"])


def evaluate_jq(program: str, value: Any) -> list[Any]:
    """Every result of a jq program over `value`, as plain data.

    Raises ProgramError with jq's message when the program fails on this input, and
    ProgramLimitError when a bound is exceeded.
    """
    return _shared.call({"op": "jq", "program": program}, value)["value"]


@dataclass(frozen=True)
class CelParsed:
    """What the child found when it parsed a CEL expression with one variable, `name`.

    When it does not parse: `problem` (what is wrong: `unexpected "}"`), `context` (the
    expression's line with a caret under the place, when known), `line` and `column`. Else
    `reads`, the paths of fields of the variable it reads, each the longest chain of field
    selections that starts at the variable (`self.status.conditions.exists(…)` reads
    `("status", "conditions")`, whole), none when it does not use the variable, None when it
    may read the whole value (the variable used bare, the name found anywhere else: a macro's
    own variable, a field so named); and `fields`, every name selected right on the variable
    (`var.size` and `has(var.tier)` select `size` and `tier`)."""

    problem: str | None = None
    context: str = ""
    line: int | None = None
    column: int | None = None
    reads: frozenset[tuple[str, ...]] | None = None
    fields: frozenset[str] = frozenset()

    @property
    def where(self) -> str:
        """` at line L, column C`, or nothing when the place is not known."""
        return f" at line {self.line}, column {self.column}" if self.line else ""


def cel_parse(expression: str, name: str) -> CelParsed:
    """Parse a CEL expression in the child (see CelParsed), once per process; raises
    ProgramLimitError when the parse exceeds a bound."""
    return _parsed("cel_parse", expression, name)


def jq_problem(program: str) -> str | None:
    """Why jq cannot compile `program` (jq's own message), None when it compiles; compiled in
    the child. Raises ProgramLimitError when compiling exceeds a bound (as `cel_parse`)."""
    return _parsed("jq_parse", program, "")


@functools.lru_cache(maxsize=512)
def _parsed(op: str, program: str, name: str) -> CelParsed | str | None:
    # A bound exceeded is not kept: a parse timed out on a busy machine, or a child killed
    # from outside, must not fail the program for the rest of the process's life.
    reply = _shared.call({"op": op, "program": program, "name": name}, None)
    if op == "jq_parse":
        return reply.get("problem")
    if "problem" in reply:
        return CelParsed(reply["problem"], reply["context"], reply["line"], reply["column"])
    reads = reply["reads"]
    return CelParsed(
        reads=None if reads is None else frozenset(tuple(path) for path in reads),
        fields=frozenset(reply["fields"]),
    )


def _pruned(value: Any, paths: Collection[tuple[str, ...]]) -> Any:
    """`value` with only the fields on `paths` (`CelParsed.reads`), in their order: what is
    not a JSON object where a path goes on is kept whole, and a field it lacks stays missing, so
    every selection, `has()` and comparison along the paths reads what it read in `value`."""
    if () in paths or not isinstance(value, dict):
        return value
    wanted: dict[str, set[tuple[str, ...]]] = {}
    for path in paths:
        wanted.setdefault(path[0], set()).add(path[1:])
    return {key: _pruned(value[key], wanted[key]) for key in value if key in wanted}


class _Answers:
    """The child's answers to the CEL requests it was sent last, by request: the same program
    over the same input answers the same. Only short requests and answers are kept (a pruned
    condition's: at most 2 * SIZE * LONGEST bytes in all), and not an answer that says a bound
    was reached."""

    SIZE = 512
    LONGEST = 4096  # bytes of a request, and of its answer

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[bytes, bytes] = OrderedDict()

    def get(self, request: bytes) -> bytes | None:
        with self._lock:
            frame = self._kept.get(request)
            if frame is not None:
                self._kept.move_to_end(request)
            return frame

    def keep(self, request: bytes, frame: bytes) -> None:
        if len(request) > self.LONGEST or len(frame) > self.LONGEST:
            return
        with self._lock:
            self._kept[request] = frame
            if len(self._kept) > self.SIZE:
                self._kept.popitem(last=False)


# --- the parent side ---------------------------------------------------------------------------


class _ChildGone(Exception):
    """The child died for a reason of its own bounds do not explain; `status` as Popen has it."""

    def __init__(self, status: int | None) -> None:
        super().__init__(status)
        self.status = status


class _Evaluator:
    """One child process and the lock that lets one thread at a time talk to it.

    Evaluations of one worker process go one at a time: a Celery prefork worker runs one task
    at a time anyway; in a thread pool, a runaway program delays the others by its time limit.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.answers = _Answers()

    def call(self, header: dict[str, Any], value: Any, *, keep: bool = False) -> dict[str, Any]:
        """The child's reply to the program in `header` over `value`; with `keep`, the answer is
        kept for the same request again (`_Answers`): only for a program that reads nothing but
        its input."""
        program = header["op"].removesuffix("_parse")  # a parse speaks of what it parses
        language, what = _LANGUAGE[program]
        limit = TIME_LIMIT_SECONDS if program == header["op"] else PARSE_TIME_LIMIT_SECONDS
        try:
            # A YAML parameter default may be a date: CEL sees it as text, as JSON carries it.
            payload = json.dumps(value, separators=(",", ":"), default=str)
        except RecursionError:
            raise ProgramLimitError(f"{language}: the input is nested too deeply") from None
        request = json.dumps(header).encode() + b"\n" + payload.encode()
        frame = self.answers.get(request) if keep else None
        if frame is None:
            frame = self._answer(request, language, what, limit)
        reply = json.loads(frame)
        if keep and "limit" not in reply:
            self.answers.keep(request, frame)
        if "error" in reply:
            raise ProgramError(reply["error"])
        if reply.get("limit") == "depth":
            raise ProgramLimitError(f"{language}: the {what} or its input is nested too deeply")
        return reply

    def _answer(self, request: bytes, language: str, what: str, limit: float) -> bytes:
        """The child's answer to `request` within `limit` seconds, tried once more in a new
        child if it was killed."""
        with self.lock:
            try:
                frame = self._exchange(request, language, what, limit)
            except _ChildGone:
                # Killed from outside (the kernel's OOM killer, an operator): not the program's
                # doing, so it gets one more try in a new child.
                try:
                    frame = self._exchange(request, language, what, limit)
                except _ChildGone as gone:
                    raise ProgramLimitError(
                        f"{language}: the evaluator process stopped (status {gone.status}) "
                        f"while running the {what}"
                    ) from None
        return frame

    def _exchange(self, request: bytes, language: str, what: str, limit: float) -> bytes:
        """Send one request to the child and read its answer, within `limit` seconds of its CPU
        time (`_Budget`)."""
        process = self.running()
        budget = _Budget(process.pid, limit)
        answers = process.stdout.fileno()
        try:
            _write_frame(process.stdin.fileno(), request)
            (size,) = _HEADER.unpack(_read_exactly(answers, _HEADER.size, budget))
            if size > MAX_RESULT_BYTES:
                self.stop()
                raise ProgramLimitError(
                    f"{language}: the {what}'s result exceeded its size limit of "
                    f"{MAX_RESULT_BYTES >> 20} MiB"
                )
            return _read_exactly(answers, size, budget)
        except TimeoutError:
            self.stop()
            if budget.starved:  # not the program's doing: the host gave it no time
                raise ProgramLimitError(
                    f"{language}: the evaluator process was given too little CPU time to "
                    f"finish the {what} within {budget.ceiling:g} s; the host is overloaded"
                ) from None
            raise ProgramLimitError(
                f"{language}: the {what} exceeded its time limit of {limit:g} s"
            ) from None
        except (EOFError, BrokenPipeError):
            status = self.stop()
            # jq aborts (SIGABRT) when malloc fails; Python exits with _MEMORY_EXIT.
            if status in (-signal.SIGABRT, _MEMORY_EXIT):
                raise ProgramLimitError(
                    f"{language}: the {what} exceeded its memory limit of {MEMORY_LIMIT_MIB} MiB"
                ) from None
            raise _ChildGone(status) from None
        except ProgramLimitError:
            raise
        except BaseException:
            # Interrupted (a Celery time limit, say): its answer must not be read as the next.
            self.stop()
            raise

    def running(self) -> subprocess.Popen[bytes]:
        """The child, started (and waited for) when there is none or it has gone."""
        if self.process is not None and self.process.poll() is None:
            return self.process
        self.stop()
        process = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=_ROOT,
            # Only what finds the interpreter's packages: no program sees the worker's secrets.
            env={k: v for k, v in os.environ.items() if k in _CHILD_ENVIRONMENT},
        )
        self.process = process
        try:
            _read_frame(process.stdout.fileno(), _Deadline(_START_TIMEOUT_SECONDS))
        except (TimeoutError, EOFError):
            status = self.stop()
            # Not the program's fault: the install is broken, so no task is failed for it.
            raise RuntimeError(f"the evaluator process did not start (status {status})") from None
        return process

    def stop(self) -> int | None:
        """Kill and reap the child, if any; its exit status (negative: the signal)."""
        process, self.process = self.process, None
        if process is None:
            return None
        process.kill()
        process.stdin.close()
        process.stdout.close()
        return process.wait()

    def forget(self) -> None:
        """In a forked copy of the worker: the child is the parent's, leave it running."""
        if self.process is not None:
            self.process.stdin.close()
            self.process.stdout.close()
            # The parent reaps it; Popen must not try to in this process.
            self.process.returncode = 0
        self.process = None
        self.lock = threading.Lock()
        self.answers = _Answers()  # its lock may have been held by another thread


def _write_frame(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


class _Deadline:
    """A wait that ends `seconds` from now."""

    def __init__(self, seconds: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + seconds

    def extended(self) -> bool:
        """Whether the wait goes on past `deadline` (moved on): not a plain deadline's."""
        return False


class _Budget(_Deadline):
    """The time the child may take over one answer: `limit` seconds of its own CPU time, and at
    most WALL_LIMIT_FACTOR times that elapsed.

    `deadline` is when it may have used its limit, were it running all along; when it comes,
    `extended()` reads what it did use and moves the deadline on by what is left."""

    def __init__(self, pid: int, limit: float) -> None:
        super().__init__(limit)
        self.pid = pid
        self.limit = limit
        self.cpu_before = _cpu_seconds(pid)
        self.starved = False  # the elapsed ceiling came before the CPU time limit

    @property
    def ceiling(self) -> float:
        """The longest the answer may take in elapsed time, in seconds."""
        return self.limit * WALL_LIMIT_FACTOR

    def extended(self) -> bool:
        """Whether the child has CPU time left (the deadline moved on by it): not when it has
        used its limit, nor when the elapsed ceiling has come (`starved`), nor when its CPU
        time cannot be read."""
        now = time.monotonic()
        cpu = _cpu_seconds(self.pid)
        if self.cpu_before is None or cpu is None:
            return False
        left = self.limit - (cpu - self.cpu_before)
        ceiling = self.started + self.ceiling
        if left <= 0:
            return False
        if now >= ceiling:
            self.starved = True
            return False
        # Not less than a clock tick: CPU time is counted in ticks.
        self.deadline = min(now + max(left, _TICK_SECONDS), ceiling)
        return True


_TICK_SECONDS = 1 / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) process `pid` has used, from Linux's /proc; None where
    that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    # After the command's name: state is field 3, utime 14 and stime 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) * _TICK_SECONDS


def _read_exactly(fd: int, size: int, wait: _Deadline | None) -> bytes:
    """`size` bytes from `fd`, within `wait` (forever if None); TimeoutError after it."""
    chunks, left = [], size
    poller = select.poll()  # not select(): a worker's descriptors may pass FD_SETSIZE
    poller.register(fd, select.POLLIN)
    while left:
        while wait is not None:
            remaining = wait.deadline - time.monotonic()
            if remaining > 0 and poller.poll(remaining * 1000):
                break
            if not wait.extended():
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, wait: _Deadline | None) -> bytes:
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, wait))
    return _read_exactly(fd, size, wait)


_shared = _Evaluator()
os.register_at_fork(after_in_child=_shared.forget)


# --- the child side ----------------------------------------------------------------------------


_READS_DEEPEST = 64  # fields in one chain: a longer one reads the variable whole


def _cel_facts(tree: Any, name: str) -> dict[str, Any]:
    """`reads` and `fields` of CelParsed, from the parsed expression (a lark tree)."""
    import lark

    parent: dict[int, lark.Tree] = {}
    names = 0  # every token that is the name, an identifier's or not
    for node in tree.iter_subtrees():  # iterative: a deeply nested expression is no risk
        for child in node.children:
            if isinstance(child, lark.Tree):
                parent[id(child)] = node
            elif child == name:
                names += 1
    paths: set[tuple[str, ...]] = set()
    fields: set[str] = set()
    uses, whole = 0, False
    for node in tree.iter_subtrees():
        if node.data != "ident" or node.children != [name]:
            continue
        uses += 1
        path = _chain(node, parent)
        if path:
            fields.add(path[0])
        whole = whole or not path or len(path) > _READS_DEEPEST
        paths.add(path)
    reads = None if whole or names != uses else sorted(paths)
    return {"reads": reads, "fields": sorted(fields)}


def _chain(ident: Any, parent: dict[int, Any]) -> tuple[str, ...]:
    """The names of the field selections that follow the variable's identifier, in order;
    none when it is used bare."""
    primary = parent.get(id(ident))
    member = parent.get(id(primary)) if primary is not None else None
    if primary is None or primary.data != "primary" or member is None:
        return ()
    path: list[str] = []
    while True:
        up = parent.get(id(member))
        if up is None or up.data != "member_dot" or up.children[0] is not member:
            break
        path.append(str(up.children[1]))
        member = parent.get(id(up))
        if member is None:
            break
    return tuple(path)


def _cel_problem(exc: Exception) -> dict[str, Any]:
    """What a CEL parse error says, as CelParsed has it."""
    cause = exc.__context__
    token = getattr(cause, "token", None)
    char = getattr(cause, "char", None)
    if token is not None:
        what = (
            "unexpected end of expression"
            if token.type == "$END"
            else f'unexpected "{token.value}"'
        )
    elif char is not None:
        what = f"unexpected character {char!r}"
    else:
        what = "syntax error"
    context = str(exc.args[0]).rstrip() if exc.args else ""
    line, column = getattr(exc, "line", None), getattr(exc, "column", None)
    return {"problem": what, "context": context, "line": line, "column": column}


def _serve() -> None:
    """The child's loop: answer requests on stdin until it closes."""
    import functools
    import resource

    import celpy
    import jq
    import lark
    from celpy import celtypes

    from deployments.workflow import quantity

    # Ctrl-C in a worker's terminal reaches its whole process group; the worker decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit = MEMORY_LIMIT_MIB << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    environment = celpy.Environment()
    functions = quantity.functions()  # Kubernetes' CEL quantity library
    source, destination = sys.stdin.fileno(), sys.stdout.fileno()
    last: tuple[bytes, Any] = (b"", None)

    @functools.lru_cache(maxsize=512)
    def cel_tree(text: str) -> Any:
        return environment.compile(text)

    @functools.lru_cache(maxsize=512)
    def cel_program(text: str) -> celpy.Runner:
        return environment.program(cel_tree(text), functions=functions)

    @functools.lru_cache(maxsize=256)
    def jq_program(text: str) -> Any:
        return jq.compile(text)

    def plain(value: Any) -> Any:
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, celtypes.BoolType):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, dict):
            return {str(plain(k)): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return str(value)

    def answer(header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        nonlocal last
        if header["op"] == "cel_parse":
            try:
                return _cel_facts(cel_tree(header["program"]), header["name"])
            except celpy.CELParseError as exc:
                return _cel_problem(exc)
            except lark.exceptions.LarkError:
                return _cel_problem(ValueError())
        if header["op"] == "jq_parse":
            try:
                jq_program(header["program"])
            except ValueError as exc:
                return {"problem": str(exc)}
            return {}
        if header["op"] == "jq":
            try:
                return {"value": jq_program(header["program"]).input_text(payload.decode()).all()}
            except ValueError as exc:
                return {"error": str(exc)}
        try:
            program = cel_program(header["program"])
        except celpy.CELParseError as exc:
            return {"error": str(exc)}
        if payload != last[0]:
            try:
                last = (payload, celpy.json_to_cel(json.loads(payload)))
            except ValueError as exc:  # an integer beyond CEL's 64 bits
                return {"error": f"the input holds a value CEL cannot take ({exc})"}
        try:
            result = program.evaluate({header["name"]: last[1]})
        except celpy.CELEvalError as exc:
            return {"error": str(exc.args[0]) if exc.args else str(exc)}
        except (MemoryError, RecursionError):
            raise
        except Exception as exc:  # celpy raises plain errors for odd operands
            return {"error": str(exc) or type(exc).__name__}
        if isinstance(result, celpy.CELEvalError):
            return {"error": str(result.args[0]) if result.args else str(result)}
        return {"value": plain(result), "shown": repr(result)[:200]}

    _write_frame(destination, b"ready")
    while True:
        try:
            request = _read_frame(source, None)
        except EOFError:
            return  # the worker has gone
        head, _, payload = request.partition(b"\n")
        try:
            reply = json.dumps(answer(json.loads(head), payload), default=str)
        except RecursionError:
            reply = json.dumps({"limit": "depth"})
        except MemoryError:
            # The heap may be left in a bad state: stop, and the parent reports the limit.
            os._exit(_MEMORY_EXIT)
        _write_frame(destination, reply.encode())


if __name__ == "__main__":
    _serve()
