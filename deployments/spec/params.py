"""Typed validation of customer input against a plan's `apiParameters`.

One validator for the web forms, the services and the future JSON API. Input may arrive as
form strings ("3", "on", '{"a": 1}') or as already-typed JSON values; the result is always
typed: String and Password as `str`, Float64 as `int` when integral (so it renders as `3`, not
`3.0`) else `float`, Boolean as `bool`, JSON as the parsed value.

An empty string counts as "not given", as an empty form field does. A Password that is not
given is generated with `secrets`; encrypting it at rest is the caller's job.
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
import secrets
import string
from decimal import Decimal, localcontext
from typing import Any

import re2

from deployments.spec.model import Parameter

PASSWORD_LENGTH = 24
# The longest password Opsdeck generates: a Password parameter whose limits ask for longer
# ones is given a default or refused (at load, before any is drawn).
PASSWORD_LENGTH_MAX = 1024
_PASSWORD_ALPHABET = string.ascii_letters + string.digits
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)
# The largest whole number a double holds exactly, as CEL, JSON readers and Kubernetes'
# quantities read a value: a larger one (1e30 servers) would be priced, compared and rendered
# as some other number, or overflow a rule's arithmetic.
NUMBER_MAX = 2**53
_TRUE = frozenset({"true", "on", "1", "yes", "y", "t"})
_FALSE = frozenset({"false", "off", "0", "no", "n", "f"})

REQUIRED = "This field is required."
UNKNOWN = "Unknown parameter."
IMMUTABLE = "Cannot be changed after creation."


class ParameterErrors(ValueError):
    """Customer input that does not fit the parameters; `errors` maps a key to a sentence."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{key}: {message}" for key, message in self.errors.items()))


def number_text(value: float | int) -> str:
    """A number as a person writes it: `3` for 3.0, `2.5` for 2.5."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def format_value(parameter: Parameter, value: Any) -> str:
    """A typed value as the text a form field shows (the inverse of `coerce`)."""
    if value is None:
        return ""
    if parameter.type == "Boolean":
        return "true" if value else "false"
    if parameter.type == "JSON":
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if parameter.type == "Float64" and isinstance(value, int | float):
        return number_text(value)
    return str(value)


def generate_password(length: int = PASSWORD_LENGTH, alphabet: str = _PASSWORD_ALPHABET) -> str:
    """A random password of letters and digits (or of `alphabet`), drawn from `secrets`."""
    return "".join(secrets.choice(alphabet) for _ in range(length))


# A plan whose password rules want more than letters and digits (a symbol) gets URI's
# unreserved marks too: a connection string holds them unescaped.
_PASSWORD_ALPHABETS = (_PASSWORD_ALPHABET, _PASSWORD_ALPHABET + "-_.~")
# Draws a spec's check makes (`password_generable`), and a create at most: a rule met by one
# draw in 256 fails 4,096 draws once in 9 million creates, and a draw costs microseconds.
PASSWORD_CHECK_DRAWS = 256
PASSWORD_TRIES = 4096


def _password_drawn(parameter: Parameter, draws: int, choice) -> str | None:
    length = password_length(parameter)
    if length > PASSWORD_LENGTH_MAX:
        return None
    for attempt in range(draws):
        alphabet = _PASSWORD_ALPHABETS[attempt % 2]
        candidate = "".join(choice(alphabet) for _ in range(length))
        try:
            check(parameter, candidate)
        except ValueError:
            continue
        return candidate
    return None


def generated_password(parameter: Parameter) -> str | None:
    """A password, drawn from `secrets`, for a Password parameter nobody gave that meets its
    own rules (length, regex); None when none of `PASSWORD_TRIES` draws does."""
    return _password_drawn(parameter, PASSWORD_TRIES, secrets.choice)


def password_generable(parameter: Parameter) -> bool:
    """Whether generated passwords meet the parameter's own rules, judged alike at every load
    of its spec: draws from a generator seeded with the parameter's key and rules."""
    # Seeded, for one verdict per spec text: these draws are judged, never handed out.
    seeded = random.Random(f"{parameter.key}\0{parameter.regex}\0{parameter.limits}")  # noqa: S311
    return _password_drawn(parameter, PASSWORD_CHECK_DRAWS, seeded.choice) is not None


def password_length(parameter: Parameter) -> int:
    """How long the passwords generated for a Password parameter are: `PASSWORD_LENGTH`, within
    its limits."""
    limits = parameter.limits or {}
    length = PASSWORD_LENGTH
    if isinstance(limits.get("max"), int | float):
        length = min(length, int(limits["max"]))
    if isinstance(limits.get("min"), int | float):
        length = max(length, math.ceil(limits["min"]))
    return max(length, 1)


def coerce(parameter: Parameter, value: Any) -> Any:
    """Convert one given (non-empty) value to the parameter's type.

    Raises ValueError with a sentence for the customer when the value is not of the type.
    """
    kind = parameter.type
    if kind in ("String", "Password"):
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError("Must be text.")
        return _text(value) if isinstance(value, str) else number_text(value)
    if kind == "Float64":
        if isinstance(value, bool):
            raise ValueError("Must be a number.")
        if isinstance(value, str):
            # Written as people write numbers: not Python's float syntax too (1_0, ٢٠).
            if not _NUMBER.fullmatch(value.strip()):
                raise ValueError("Must be a number.")
            value = float(value.strip())
        try:
            number = float(value)
        except (TypeError, OverflowError):  # an int too large for a float, e.g. 10**400
            raise ValueError("Must be a number.") from None
        if not math.isfinite(number):
            raise ValueError("Must be a number.")
        if abs(number) > NUMBER_MAX:
            raise ValueError(f"Must be between -{NUMBER_MAX} and {NUMBER_MAX}.")
        return int(number) if number.is_integer() else number
    if kind == "Boolean":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("Must be true or false.")
    if kind == "JSON":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"Must be valid JSON ({exc.msg} at line {exc.lineno}).") from None
            except ValueError:  # a number of more digits than Python reads (4,300)
                raise ValueError("Must not hold numbers so long.") from None
            except RecursionError:
                raise ValueError("Must not nest so deeply.") from None
        try:
            _json_text(value)
        except RecursionError:
            raise ValueError("Must not nest so deeply.") from None
        return value
    raise ValueError(f"Unsupported parameter type {kind}.")


# Characters a stored or rendered value may not hold: C0 controls but tab and newlines.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _text(value: str) -> str:
    """Text as the database and the Kubernetes API take it: UTF-8 (no lone surrogate, which
    an API server would replace with another character) and no control character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("Must be valid text (it holds a broken character).") from None
    if _CONTROL.search(value):
        raise ValueError("Must not hold control characters.")
    return value


def _json_text(value: Any) -> None:
    """Every string inside a JSON value, keys included, passes `_text`."""
    if isinstance(value, str):
        _text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _text(str(key))
            _json_text(item)
    elif isinstance(value, list):
        for item in value:
            _json_text(item)
    elif isinstance(value, float) and not math.isfinite(value):  # JSON has no Infinity
        raise ValueError("Must hold finite numbers only.")


def _range_message(low: Any, high: Any, unit: str = "") -> str:
    if low is not None and high is not None:
        return f"Must be between {number_text(low)} and {number_text(high)}{unit}."
    if low is not None:
        return f"Must be at least {number_text(low)}{unit}."
    return f"Must be at most {number_text(high)}{unit}."


# What a String or Password value a customer gives may not hold besides (`_CONTROL`): it is one
# line, as the form's field gives it. A line break or a tab pasted into a password or a name
# breaks the connection strings and files it ends up in. Only what is given is held to it: a
# spec's default, and a value an instance already holds, stay as they were accepted.
_TAB_OR_BREAK = re.compile(r"[\t\n\r]")


def _one_line(parameter: Parameter, value: Any) -> None:
    if parameter.type in ("String", "Password") and _TAB_OR_BREAK.search(value):
        raise ValueError("Must be on one line, without tabs.")


def check(parameter: Parameter, value: Any) -> None:
    """Check a typed value against the parameter's options, limits, regex and reserved words.

    Limits bound a Float64's value and a String's or Password's length. Raises ValueError.
    """
    limits = parameter.limits or {}
    low, high = limits.get("min"), limits.get("max")
    if parameter.options and format_value(parameter, value) not in parameter.options:
        raise ValueError(f"Must be one of: {', '.join(parameter.options)}.")
    if parameter.type == "Float64" and (
        (low is not None and value < low) or (high is not None and value > high)
    ):
        raise ValueError(_range_message(low, high))
    if parameter.type == "Float64" and parameter.step is not None:
        _check_step(parameter.step, low, value)
    if parameter.type in ("String", "Password"):
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            raise ValueError(_range_message(low, high, " characters long"))
        if parameter.regex and pattern_compiled(parameter.regex).fullmatch(value) is None:
            raise ValueError(
                parameter.regex_message or f"Must match the pattern {parameter.regex}."
            )
        for word in parameter.reserved:
            if value == word or (word.endswith("*") and value.startswith(word[:-1])):
                taken = f"names starting with “{word[:-1]}”" if word.endswith("*") else f"“{word}”"
                raise ValueError(f"The service keeps {taken} for itself: choose another.")


@functools.lru_cache(maxsize=256)
def pattern_compiled(text: str) -> Any:
    """A String parameter's `regex`, compiled as Omnistrate (Go) compiles it: RE2's syntax, so
    matching takes time linear in the value whatever the pattern (Python's `re` backtracks:
    `(a+)+$` over thirty letters and a digit would hold a web process for minutes), and memory
    within RE2's bound. Raises ValueError, saying why, for a pattern RE2 does not take (a
    backreference, a lookaround)."""
    options = re2.Options()
    options.log_errors = False  # the spec check reports it
    options.never_capture = True  # only whether it matches: groups cost RE2 its fastest engine
    try:
        return re2.compile(text, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else b"invalid pattern"
        raise ValueError(why.decode() if isinstance(why, bytes) else str(why)) from None


_STEP_DIGITS = 1000


def _check_step(step: int | float, low: Any, value: int | float) -> None:
    """A value on the parameter's steps, counted from its minimum (or 0), as an HTML number
    input counts them; in decimals, so 0.1 steps are exact."""
    base = Decimal(str(low)) if low is not None else Decimal(0)
    # Room for every digit of a value over a step far below it (the default 28 digits refuse
    # to divide 2**53 by 1e-20).
    with localcontext(prec=_STEP_DIGITS):
        if (Decimal(str(value)) - base) % Decimal(str(step)) == 0:
            return
    if Decimal(str(step)) == 1 and base % 1 == 0:
        raise ValueError("Must be a whole number.")
    raise ValueError(f"Must go in steps of {number_text(step)} from {number_text(base)}.")


def _given(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and value.strip() == "")


def initial_value(parameter: Parameter) -> tuple[bool, Any]:
    """The value of a parameter nobody gave: (found, value)."""
    if parameter.default is not None:
        return True, parameter.default
    if parameter.type == "Password":
        value = generated_password(parameter)
        return value is not None, value
    return False, None


def validate_parameters(
    parameters: list[Parameter],
    values: dict[str, Any],
    *,
    current: dict[str, Any] | None = None,
    current_is: str = "it is {} now",
) -> dict[str, Any]:
    """Validate customer input and return every parameter's typed value.

    Without `current` this is a create: a missing required parameter is an error, a missing
    optional one takes its default, a missing Password is generated. With `current` (the
    instance's typed values) this is a modify: a missing key keeps its current value, and a
    non-modifiable parameter whose value changes, or a grow-only one whose value falls, is an
    error (`current_is` says where a grow-only value stands: "it is 10 now"). Keys that are
    not parameters are errors in both cases. Raises ParameterErrors mapping each bad key to a
    sentence.
    """
    known = {p.key: p for p in parameters}
    errors: dict[str, str] = {key: UNKNOWN for key in values if key not in known}
    result: dict[str, Any] = {}
    for parameter in parameters:
        key = parameter.key
        raw = values.get(key)
        if not _given(raw):
            if current is not None and key in current:
                result[key] = current[key]
                continue
            found, value = initial_value(parameter)
            if not found:
                errors[key] = REQUIRED
            else:
                result[key] = value
            continue
        try:
            value = coerce(parameter, raw)
            check(parameter, value)
            if current is None or current.get(key) != value:
                _one_line(parameter, value)
        except ValueError as exc:
            errors[key] = str(exc)
            continue
        if (
            current is not None
            and not parameter.modifiable
            and key in current
            and value != current[key]
        ):
            errors[key] = IMMUTABLE
            continue
        if current is not None and parameter.grow_only and key in current and value < current[key]:
            errors[key] = f"Can grow, not shrink: {current_is.format(number_text(current[key]))}."
            continue
        result[key] = value
    if errors:
        raise ParameterErrors(errors)
    return result


def cel_values(parameters: list[Parameter], values: dict[str, Any]) -> dict[str, Any]:
    """`values` as a CEL expression over `var` reads them: never a Password's, and a Float64
    as a double even when it holds a whole number (`coerce` keeps 2 as an int, and CEL compares
    no int with a double: `var.cpu >= 0.5` would fail on a cpu of 1)."""
    doubles = {p.key for p in parameters if p.type == "Float64"}
    secret = {p.key for p in parameters if p.type == "Password"}
    return {
        key: float(value)
        if key in doubles and isinstance(value, int) and not isinstance(value, bool)
        else value
        for key, value in values.items()
        if key not in secret
    }
