"""successCondition / failureCondition of a resource task: Argo's label-selector rules, or CEL.

Argo parses a condition with apimachinery's `labels.Parse` and reads each key from the object's
JSON with gjson (`workflow/executor/resource.go`). This module follows both exactly (see
shared/reference/argo-workflows.md), with one difference on purpose: where apimachinery says
"found 'in', expected: ',' or 'end of string'", the error here names the real problem
(`value "Cluster in healthy state" is not a valid label value; use a cel: condition`).

A condition that starts with `cel:` is an Opsdeck extension: a CEL expression over the object
bound as `self`, parsed when the spec is loaded and true only when it evaluates to `true`. It is
evaluated by the bounded evaluator (`evaluator.py`): one that exceeds its time or memory bound
raises ConditionError, which errors the task, rather than reading as "false" and being tried
again on every poll.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from deployments.workflow import evaluator
from deployments.workflow.outputs import MISSING, dotted_get, go_float, go_json

__all__ = [
    "FAILED",
    "PENDING",
    "SUCCEEDED",
    "CelCondition",
    "Condition",
    "ConditionError",
    "Requirement",
    "SelectorCondition",
    "evaluate",
    "field_text",
    "parse_condition",
]

SUCCEEDED = "succeeded"
FAILED = "failed"
PENDING = "pending"

CEL_PREFIX = "cel:"
_WHITESPACE = " \t\r\n"  # apimachinery's lexer knows only these as blanks
_SPECIAL = "=!(),<>"
_OPERATORS = ("=", "==", "!=", ">", "<")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64) syntax
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BRACKET_INDEX = re.compile(r"\[([0-9]+)\]")


class ConditionError(ValueError):
    """A condition that cannot be parsed, or whose evaluation exceeded a bound; the message
    names the problem."""


# --- value lookup ----------------------------------------------------------------------------


def field_text(obj: dict, key: str) -> str | None:
    """The text Argo compares for a dotted key of obj, or None when the key does not exist.

    As gjson's `Result.String()`: a string raw, an integer as its digits, another number in
    `strconv.FormatFloat(f, 'f', -1, 64)` form, a boolean as `true`/`false`, null as "" (the key
    still exists), an object or list as its compact JSON text.
    """
    value = dotted_get(obj, key)
    if value is MISSING:
        return None
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value, "f")
    if isinstance(value, str):
        return value
    return go_json(value)


def _int64(text: str) -> int | None:
    if not _INTEGER.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


# --- requirements ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One comma-separated requirement: key, operator and values.

    operator is one of `=`, `==`, `!=`, `in`, `notin`, `>`, `<`, `exists` (a bare `key`) and
    `!` (`!key`).
    """

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, obj: dict) -> bool:
        """Whether obj satisfies this requirement, by apimachinery's `Requirement.Matches`."""
        text = field_text(obj, self.key)
        if self.operator in ("=", "==", "in"):
            return text is not None and text in self.values
        if self.operator in ("!=", "notin"):
            return text is None or text not in self.values
        if self.operator == "exists":
            return text is not None
        if self.operator == "!":
            return text is None
        actual = None if text is None else _int64(text)
        if actual is None:
            return False
        expected = int(self.values[0])
        return actual > expected if self.operator == ">" else actual < expected

    def __str__(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator in ("in", "notin"):
            return f"{self.key} {self.operator} ({','.join(self.values)})"
        return f"{self.key}{self.operator}{self.values[0]}"


class Condition:
    """A parsed condition; the text it came from is `text`."""

    text: str

    def all_match(self, obj: dict) -> bool:
        """True when every requirement matches obj (a successCondition is met)."""
        raise NotImplementedError

    def any_match(self, obj: dict) -> bool:
        """True when at least one requirement matches obj (a failureCondition is met)."""
        raise NotImplementedError


@dataclass(frozen=True)
class SelectorCondition(Condition):
    """A condition in Argo's label-selector syntax."""

    text: str
    requirements: tuple[Requirement, ...]

    def all_match(self, obj: dict) -> bool:
        """True when every requirement matches obj (also when there are none, as in Argo)."""
        return all(r.matches(obj) for r in self.requirements)

    def any_match(self, obj: dict) -> bool:
        """True when at least one requirement matches obj."""
        return any(r.matches(obj) for r in self.requirements)


class CelCondition(Condition):
    """A `cel:` condition: one CEL expression over the object bound as `self`."""

    def __init__(self, text: str, expression: str) -> None:
        self.text = text
        self.expression = expression

    def is_true(self, obj: dict) -> bool:
        """True only when the expression evaluates to `true`; an error or missing field is false.

        Raises ProgramLimitError when the evaluation exceeds its time or memory bound.
        """
        try:
            result = evaluator.evaluate_cel(self.expression, "self", obj)
        except evaluator.ProgramError:
            return False
        return result.value is True

    def all_match(self, obj: dict) -> bool:
        """True when the expression is true for obj."""
        return self.is_true(obj)

    def any_match(self, obj: dict) -> bool:
        """True when the expression is true for obj."""
        return self.is_true(obj)

    def __repr__(self) -> str:
        return f"CelCondition({self.text!r})"


# --- label-selector parser ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "word", "op", "(", ")", ",", "end"
    text: str
    start: int
    end: int

    def shown(self) -> str:
        return "the end of the condition" if self.kind == "end" else f'"{self.text}"'


def _tokens(text: str) -> list[_Token]:
    tokens, i, n = [], 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(_Token("end", "", n, n))
            return tokens
        j = i + 1
        if text[i] in "(),":
            kind = text[i]
        elif text[i] in "=!<>":
            # A whole run of operator characters is one token, so "<=" is reported as itself.
            while j < n and text[j] in "=!<>":
                j += 1
            kind = "op"
        else:
            while j < n and text[j] not in _WHITESPACE and text[j] not in _SPECIAL:
                j += 1
            kind = "word"
        tokens.append(_Token(kind, text[i:j], i, j))
        i = j


def _key_problem(key: str) -> str | None:
    """Why key is not a qualified name (apimachinery's IsQualifiedName), or None."""
    parts = key.split("/")
    if len(parts) > 2:
        return "a key may contain at most one '/'"
    if len(parts) == 2 and (len(parts[0]) > 253 or not _DNS_SUBDOMAIN.fullmatch(parts[0])):
        return "the part before '/' must be a lowercase DNS subdomain"
    name = parts[-1]
    if len(name) > 63:
        return "the key is longer than 63 characters"
    if not _QUALIFIED_NAME.fullmatch(name):
        return (
            "a key is a dotted path of letters, digits, '-', '_' and '.' "
            "that starts and ends with a letter or digit"
        )
    return None


def _is_label_value(text: str) -> bool:
    return len(text) <= 63 and _LABEL_VALUE.fullmatch(text) is not None


class _SelectorParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def next(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "end":
            self.pos += 1
        return token

    def parse(self) -> tuple[Requirement, ...]:
        requirements: list[Requirement] = []
        if self.peek().kind == "end":
            return ()
        while True:
            requirements.append(self.requirement())
            token = self.next()
            if token.kind == "end":
                return tuple(requirements)
            if token.kind != ",":
                raise ConditionError(
                    f'unexpected {token.shown()} after "{requirements[-1]}"; '
                    'separate requirements with ","'
                )
            if self.peek().kind == "end":
                raise ConditionError('expected a requirement after the last ","')

    def requirement(self) -> Requirement:
        token = self.next()
        if token.kind == "op" and token.text == "!":
            key = self.key(self.next(), after='"!"')
            if self.peek().kind not in (",", "end"):
                raise ConditionError(
                    f'"!{key}" takes no operator or value; found {self.peek().shown()}'
                )
            return Requirement(key, "!")
        key = self.key(token)
        if self.peek().kind in (",", "end"):
            return Requirement(key, "exists")
        op_token = self.next()
        operator = op_token.text
        if not (
            (op_token.kind == "op" and operator in _OPERATORS)
            or (op_token.kind == "word" and operator in ("in", "notin"))
        ):
            raise ConditionError(
                f'unknown operator "{operator}" after key "{key}"; label selectors have '
                "=, ==, !=, in, notin, > and <; use a cel: condition for anything else"
            )
        if operator in ("in", "notin"):
            return Requirement(key, operator, self.value_list(key, operator))
        value = self.exact_value(operator)
        if operator in (">", "<") and _int64(value) is None:
            raise ConditionError(f"'{operator}' needs an integer, got \"{value}\"")
        return Requirement(key, operator, (value,))

    def key(self, token: _Token, after: str = "") -> str:
        if token.kind != "word":
            where = f" after {after}" if after else ""
            raise ConditionError(f"expected a key{where}, found {token.shown()}")
        key = token.text
        problem = _key_problem(key)
        if problem is None:
            return key
        dotted = _BRACKET_INDEX.sub(r".\1", key)
        if dotted != key and _key_problem(dotted) is None:
            raise ConditionError(
                f'key "{key}" is not a valid condition key: a list item is addressed '
                f'with a numeric segment, write "{dotted}"'
            )
        raise ConditionError(
            f'key "{key}" is not a valid condition key: {problem}; use a cel: condition'
        )

    def value(self) -> str:
        """The value that starts at the next word, including any words that follow it."""
        first = last = self.next()
        while self.peek().kind == "word":
            last = self.next()
        raw = self.text[first.start : last.end]
        if _is_label_value(raw):
            return raw
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
            inner = raw[1:-1]
            if _is_label_value(inner):
                bare = inner or "nothing (an empty value)"
                raise ConditionError(f"value {raw} must not be quoted; write {bare}")
            raw = inner
        raise ConditionError(f'value "{raw}" is not a valid label value; use a cel: condition')

    def exact_value(self, operator: str) -> str:
        token = self.peek()
        if token.kind in (",", "end"):
            return ""  # apimachinery reads "key=" as the empty value
        if token.kind != "word":
            raise ConditionError(f'expected a value after "{operator}", found {token.shown()}')
        return self.value()

    def value_list(self, key: str, operator: str) -> tuple[str, ...]:
        token = self.next()
        if token.kind != "(":
            raise ConditionError(
                f"'{operator}' needs a list in parentheses, e.g. {key} {operator} (v1,v2); "
                f"found {token.shown()}"
            )
        values: list[str] = []
        # As apimachinery: "()" is the empty value, and so is an empty slot in "(a,,b)".
        expect_value = True
        while True:
            token = self.peek()
            if token.kind == ")":
                self.next()
                if expect_value:
                    values.append("")
                return tuple(dict.fromkeys(values))
            if token.kind == ",":
                self.next()
                if expect_value:
                    values.append("")
                expect_value = True
            elif token.kind == "word" and expect_value:
                values.append(self.value())
                expect_value = False
            elif token.kind == "end":
                raise ConditionError(f'missing ")" to close the values of "{key} {operator}"')
            else:
                raise ConditionError(
                    f'unexpected {token.shown()} in the values of "{key} {operator}"'
                )


# --- CEL ---------------------------------------------------------------------------------------


def _parse_cel(text: str, body: str) -> CelCondition:
    try:  # in the bounded evaluator, for its syntax errors: CEL's lexer can backtrack for ages
        parsed = evaluator.cel_parse(body, "self")
    except evaluator.ProgramLimitError as exc:
        raise ConditionError(f"invalid CEL expression: {exc}") from None
    if parsed.problem is not None:
        raise ConditionError(
            f"invalid CEL expression{parsed.where}: {parsed.problem}\n{parsed.context}".rstrip()
        )
    return CelCondition(text, body)


# --- public API --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def parse_condition(text: str) -> Condition:
    """Parse a successCondition / failureCondition; raise ConditionError when it is invalid.

    `cel: <expr>` is compiled as CEL over `self`; anything else is Argo's label-selector syntax,
    `req(,req)*` with `=`, `==`, `!=`, `in (…)`, `notin (…)`, `key`, `!key`, `>` and `<`.
    """
    stripped = text.lstrip()
    if stripped.startswith(CEL_PREFIX):
        body = stripped[len(CEL_PREFIX) :].strip()
        if not body:
            raise ConditionError("a cel: condition needs an expression after 'cel:'")
        return _parse_cel(text, body)
    return SelectorCondition(text, _SelectorParser(text).parse())


def evaluate(obj: dict, success: str | None, failure: str | None) -> str:
    """Decide a resource task from the object it watches: "succeeded", "failed" or "pending".

    As Argo: both conditions empty → succeeded; the failure condition is checked first and
    fails the task if ANY of its requirements matches; the success condition succeeds only if
    ALL of its requirements match; with only a failure condition that does not match, the task
    succeeds. Raises ConditionError if either condition cannot be parsed, or a `cel:` condition
    exceeds its time or memory bound (`failureCondition: CEL: the expression exceeded …`).
    """
    success_condition = parse_condition(success) if success else None
    failure_condition = parse_condition(failure) if failure else None
    which = "failureCondition"
    try:
        if failure_condition is not None and failure_condition.any_match(obj):
            return FAILED
        which = "successCondition"
        if success_condition is None or success_condition.all_match(obj):
            return SUCCEEDED
    except evaluator.ProgramLimitError as exc:
        raise ConditionError(f"{which}: {exc}") from None
    return PENDING
