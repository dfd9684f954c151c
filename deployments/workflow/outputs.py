"""Output extraction: kubectl-style JSONPath, Omnistrate resource paths, and Go-style value text.

Argo reads `outputs.parameters[].valueFrom.jsonPath` with `kubectl get -o jsonpath=…`, so a
result renders as kubectl prints it: a string raw, an integer as its digits, a boolean as a word,
an object or list as compact JSON (Go's `json.Marshal`), several matches joined by one space.
A missing path gives "" (kubectl's printer allows missing keys). Omnistrate's
`$tasks.<task>.resource.<dotted path>` outputs and its legacy `$var._crd.<JSONPath>` form render
the same way. A `jqFilter` runs in the bounded evaluator (`evaluator.py`), never in the worker.

The Go text helpers here (`go_json`, `go_float`) are shared with `conditions.py`, whose value
lookup follows gjson, the JSON library Argo evaluates conditions with.
"""

from __future__ import annotations

import functools
import json
import math
import re
from decimal import Decimal
from typing import Any

from jsonpath_ng.ext import parse as _jsonpath_parse

from deployments.workflow import evaluator

__all__ = [
    "MISSING",
    "OutputError",
    "check_json_path",
    "crd_path",
    "dotted_get",
    "go_float",
    "go_json",
    "json_path",
    "render_value",
    "resource_path",
]

MISSING: Any = object()
"""What `dotted_get` returns for a path that leads nowhere."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# kubectl ends a field name at these characters (client-go util/jsonpath parser, isTerminator).
_NAME_TERMINATORS = frozenset(" \t\r\n.,[]$@{}")
_CRD_PREFIX = "$var._crd"


class OutputError(ValueError):
    """A JSONPath or output expression that cannot be parsed."""


# --- Go's text for values -------------------------------------------------------------------


def _shortest_digits(f: float) -> tuple[str, int]:
    """The shortest round-trip digits of abs(f) (finite, non-zero) and where the point goes."""
    # repr() gives the shortest digits that round-trip, exactly like Go's strconv shortest mode.
    _sign, digits, exponent = Decimal(repr(abs(f))).normalize().as_tuple()
    text = "".join(str(d) for d in digits)
    return text, len(text) + int(exponent)


def _fixed(digits: str, point: int) -> str:
    if point <= 0:
        return "0." + "0" * -point + digits
    if point >= len(digits):
        return digits + "0" * (point - len(digits))
    return digits[:point] + "." + digits[point:]


def _exponent(digits: str, point: int) -> str:
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    exp = point - 1
    return f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def go_float(f: float, fmt: str) -> str:
    """Format f as Go's `strconv.FormatFloat(f, fmt, -1, 64)` does, for fmt `f`, `e` or `g`.

    `g` is also what `fmt.Print` uses for a float64 (`%v`): exponent form when the decimal
    exponent is below -4 or at least 6 (e.g. 1234567.0 → "1.234567e+06").
    """
    if fmt not in ("e", "f", "g"):
        raise ValueError(f"unsupported float format {fmt!r}")
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, f) < 0 else ""
    if f == 0:
        return sign + ("0e+00" if fmt == "e" else "0")
    digits, point = _shortest_digits(f)
    if fmt == "g":
        fmt = "e" if point - 1 < -4 or point - 1 >= 6 else "f"
    if fmt == "e":
        return sign + _exponent(digits, point)
    return sign + _fixed(digits, point)


def _go_json_float(f: float) -> str:
    # encoding/json: 'f' format unless the magnitude needs an exponent; "e-07" is cleaned to "e-7".
    if f != 0 and math.isfinite(f) and (abs(f) < 1e-6 or abs(f) >= 1e21):
        text = go_float(f, "e")
        mantissa, _, exp = text.partition("e")
        return f"{mantissa}e{exp[0]}{exp[1:].lstrip('0') or '0'}"
    return go_float(f, "f")


_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _go_json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif code < 0x20 or ch in "<>&" or code in (0x2028, 0x2029):
            # Go escapes control characters and, by default, HTML-sensitive characters.
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            # A lone surrogate is invalid UTF-8, which Go replaces.
            out.append("\\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def go_json(value: Any) -> str:
    """Compact JSON text as Go's `json.Marshal` writes it (sorted keys, HTML characters escaped)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_json_float(value)
    if isinstance(value, str):
        return _go_json_string(value)
    if isinstance(value, dict):
        items = sorted((str(k), v) for k, v in value.items())
        return "{" + ",".join(f"{_go_json_string(k)}:{go_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    return _go_json_string(str(value))


def render_value(value: Any) -> str:
    """The text kubectl's JSONPath printer gives one result (JSON null renders as "")."""
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # The API server sends a whole float as digits and kubectl decodes those to int64.
        if value.is_integer() and _INT64_MIN <= value <= _INT64_MAX:
            return str(int(value))
        return go_float(value, "g")
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple):
        return go_json(value)
    return str(value)


# --- dotted paths ----------------------------------------------------------------------------


def dotted_get(obj: Any, path: str) -> Any:
    """The value at a dotted path (`status.conditions.0.status`), or MISSING.

    A segment selects a key of an object; on a list, a segment of digits selects an index.
    """
    current = obj
    for segment in path.split("."):
        if isinstance(current, dict):
            if segment not in current:
                return MISSING
            current = current[segment]
        elif isinstance(current, list) and segment.isascii() and segment.isdigit():
            index = int(segment)
            if index >= len(current):
                return MISSING
            current = current[index]
        else:
            return MISSING
    return current


def resource_path(obj: dict, dotted: str) -> str:
    """Render the value at an Omnistrate `$tasks.<task>.resource.<dotted>` path; missing → "".

    `status.conditions.0.status` and `status.conditions[0].status` are the same path.
    """
    path = dotted.strip().replace("[", ".").replace("]", "")
    value = dotted_get(obj, path)
    return "" if value is MISSING else render_value(value)


# --- JSONPath ------------------------------------------------------------------------------


def _after_quote(text: str, i: int) -> int:
    """Index just past the quoted text that opens at text[i] (len(text) + 1 if it never closes)."""
    quote, i = text[i], i + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _bracket_end(expr: str, start: int, whole: str) -> int:
    """Index just past the `]` matching the `[` at start, skipping quoted text and nesting."""
    depth, i = 0, start
    while i < len(expr):
        ch = expr[i]
        if ch in "'\"":
            i = _after_quote(expr, i)
            continue
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise OutputError(f'invalid JSONPath "{whole}": missing "]"')


def _read_name(expr: str, i: int) -> tuple[str, int]:
    name = []
    while i < len(expr) and expr[i] not in _NAME_TERMINATORS:
        if expr[i] == "\\" and i + 1 < len(expr):
            i += 1  # kubectl escapes a dot inside a key as "\."
        name.append(expr[i])
        i += 1
    return "".join(name), i


def _quoted(name: str) -> str:
    return "['" + name.replace("\\", "\\\\").replace("'", "\\'") + "']"


def _translate(path: str, whole: str) -> str:
    """Rewrite one kubectl path as jsonpath-ng syntax: every field as a quoted `['name']`."""
    text = path.strip()
    if text.startswith("$"):
        text = text[1:]
    if text and text[0] not in ".[":
        text = "." + text  # kubectl also accepts a path without its leading dot
    out, i = ["$"], 0
    while i < len(text):
        ch = text[i]
        if ch == "[":
            end = _bracket_end(text, i, whole)
            out.append(text[i:end])
            i = end
        elif ch == ".":
            if text.startswith("..", i):
                out.append("..")
                i += 2
            else:
                i += 1
            if i < len(text) and text[i] == "*":
                out.append("[*]" if out[-1] != ".." else "*")
                i += 1
            elif i < len(text) and text[i] == "[":
                continue
            else:
                name, i = _read_name(text, i)
                if not name:
                    raise OutputError(f'invalid JSONPath "{whole}": a field name is missing')
                out.append(_quoted(name))
        else:
            raise OutputError(f'invalid JSONPath "{whole}": unexpected "{ch}"')
    return "".join(out)


def _template_parts(expr: str) -> list[tuple[str, str]]:
    """Split a kubectl template into ("text", …) and ("path", …) parts."""
    text = expr.strip()
    if not text:
        raise OutputError("empty JSONPath")
    if "{" not in text:
        if "}" in text:
            raise OutputError(f'invalid JSONPath "{expr}": unmatched "}}"')
        return [("path", text)]
    parts: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        start = text.find("{", i)
        if start < 0:
            parts.append(("text", text[i:]))
            break
        if start > i:
            parts.append(("text", text[i:start]))
        end = start + 1
        while end < len(text) and text[end] != "}":
            end = _after_quote(text, end) if text[end] in "'\"" else end + 1
        if end >= len(text):
            raise OutputError(f'invalid JSONPath "{expr}": missing "}}"')
        body = text[start + 1 : end].strip()
        if body.startswith('"') and body.endswith('"') and len(body) >= 2:
            try:
                parts.append(("text", json.loads(body)))
            except ValueError as exc:
                raise OutputError(f'invalid JSONPath "{expr}": bad quoted text {body}') from exc
        elif body in ("range", "end") or body.startswith("range "):
            raise OutputError(f'invalid JSONPath "{expr}": range templates are not supported')
        elif not body:
            raise OutputError(f'invalid JSONPath "{expr}": empty "{{}}"')
        else:
            parts.append(("path", body))
        i = end + 1
    return parts


@functools.lru_cache(maxsize=512)
def _compile(expr: str) -> tuple[tuple[str, Any], ...]:
    compiled: list[tuple[str, Any]] = []
    for kind, body in _template_parts(expr):
        if kind == "text":
            compiled.append(("text", body))
            continue
        translated = _translate(body, expr)
        try:
            compiled.append(("path", _jsonpath_parse(translated)))
        except Exception as exc:  # jsonpath-ng raises plain Exception subclasses of its own
            raise OutputError(f'invalid JSONPath "{expr}": {exc}') from exc
    return tuple(compiled)


def check_json_path(expr: str) -> None:
    """Raise OutputError if expr is not a JSONPath that `json_path` can evaluate."""
    _compile(expr)


def json_path(obj: dict, expr: str) -> str:
    """Evaluate a kubectl-style JSONPath (`{.status.phase}`, `.status.phase`, `$.status.phase`,
    `{.status.conditions[?(@.type=="Ready")].status}`) and render the result as kubectl does.

    Several matches are joined by one space; a missing path renders as "".
    """
    out = []
    for kind, part in _compile(expr):
        if kind == "text":
            out.append(part)
            continue
        try:
            values = [match.value for match in part.find(obj)]
        except Exception:  # a filter over a non-list and the like: kubectl finds nothing there
            values = []
        out.append(" ".join(render_value(v) for v in values))
    return "".join(out)


def crd_path(obj: dict, expr: str) -> str:
    """Evaluate an Omnistrate legacy `$var._crd.<JSONPath>` against the custom resource obj."""
    text = expr.strip()
    rest = text[len(_CRD_PREFIX) :]
    if text.startswith(_CRD_PREFIX) and (not rest or rest[0] in ".["):
        text = rest or "$"
    return json_path(obj, text)


# jq builtins that read outside the object: the worker's environment, further inputs.
_JQ_OUTSIDE = re.compile(r"\$ENV\b|(?<![.\w$])(?:env|input|inputs|input_filename)\b")


def _strings_blanked(program: str) -> str:
    """`program` with the text of each string literal left out (`"env"` becomes `""`), so a
    word inside one is not taken for a builtin, but with the code of its interpolations kept
    (`"\\(env.HOME)"` becomes `"(env.HOME)"`): that runs. One pass, character by character: a
    regular expression scanned to the end again from every quote of an unterminated string,
    minutes over a long filter."""
    kept: list[str] = []
    depths: list[int] = []  # per interpolation open around this point: its parentheses open
    in_string, i, size = False, 0, len(program)
    while i < size:
        ch = program[i]
        if in_string:
            if ch == "\\" and program.startswith("(", i + 1):
                depths.append(0)
                in_string = False
                kept.append("(")
            elif ch == '"':
                in_string = False
                kept.append(ch)
            i += 2 if ch == "\\" else 1
            continue
        if ch == '"':
            in_string = True
        elif depths and ch == "(":
            depths[-1] += 1
        elif depths and ch == ")":
            if depths[-1] == 0:  # the interpolation ends: back in its string
                depths.pop()
                in_string = True
            else:
                depths[-1] -= 1
        kept.append(ch)
        i += 1
    return "".join(kept)


def check_jq_filter(program: str) -> None:
    """Raise OutputError when `program` is not a valid jq program, or reads anything but the
    object (`env`, `$ENV`, `input`, `inputs`): outputs may reach tenants; or when compiling it
    exceeds a bound."""
    try:
        _check_jq(program)
    except evaluator.ProgramLimitError as exc:
        raise OutputError(str(exc)) from None


@functools.lru_cache(maxsize=256)
def _check_jq(program: str) -> None:
    outside = _JQ_OUTSIDE.search(_strings_blanked(program))
    if outside:
        raise OutputError(f"jq: {outside.group(0)} is not allowed; a filter reads the object only")
    # Compiled by the bounded evaluator, for its syntax errors: jq folds constants as it compiles.
    problem = evaluator.jq_problem(program)
    if problem is not None:
        raise OutputError(_jq_message(problem))


def jq_filter(obj: dict, program: str) -> str:
    """Run a jq program over the object as `jq -rc` does: strings raw, other values as
    compact JSON, one line per result (no trailing newline).

    Raises OutputError when the program fails on this object (e.g. indexes a number), and
    `evaluator.ProgramLimitError` when it exceeds its time or memory bound (see evaluator.py).
    """
    _check_jq(program)
    try:
        results = evaluator.evaluate_jq(program, obj)
    except evaluator.ProgramError as exc:
        raise OutputError(_jq_message(exc)) from None
    return "\n".join(
        r if isinstance(r, str) else json.dumps(r, separators=(",", ":"), ensure_ascii=False)
        for r in results
    )


def _jq_message(exc: ValueError | str) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"jq: {lines[0].removeprefix('jq: error: ')}" if lines else "jq: invalid program"
