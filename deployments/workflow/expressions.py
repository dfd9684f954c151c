"""Argo's `when` and `depends` expressions, read by small recursive-descent parsers (never eval).

`when` is evaluated after `{{…}}` substitution, so its text holds only literals. Argo evaluates
it with govaluate after turning every bare word into a string (`workflow/common/dag`,
`ShouldExecute`); this parser keeps govaluate's rules for what it accepts: numbers compare as
numbers, quoted or bare words as strings, `true`/`false` as booleans; `==`/`!=` are false/true
across types; `<`, `>`, `<=`, `>=` need two numbers or two strings; `&&`, `||` and `!` need
booleans; the result must be a boolean. Precedence: `!` over comparisons over `&&` over `||`.

`depends` is Argo's enhanced depends logic (`workflow/common/ancestry.go`, `dag.go`): operands
`task` or `task.Result`, combined with `&&`, `||`, `!` and parentheses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TASK_RESULTS",
    "DependsExpression",
    "ExpressionError",
    "WhenExpression",
    "check_when_syntax",
    "depends_from_dependencies",
    "parse_depends",
    "parse_when",
    "when_is_true",
]


class ExpressionError(ValueError):
    """A `when` or `depends` expression that cannot be parsed or evaluated."""


Value = bool | float | str


def _show(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return f'"{value}"'


# --- when: tokens ------------------------------------------------------------------------------

_WHEN_OPERATORS = ("==", "!=", "<=", ">=", "&&", "||", "<", ">", "!")
_COMPARISONS = ("==", "!=", "<=", ">=", "<", ">")
_WORD_END = frozenset(" \t\r\n()=!<>&|'\"")
_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_PLACEHOLDER_STANDIN = "{{…}}"


DEEPEST = 200  # levels of a `when` or `depends` tree: each is a frame of Python's stack


def _shallow(root: Any) -> Any:
    """`root`, a parsed `when` or `depends`, once checked to nest at most DEEPEST levels (a
    chain of `&&` nests one level per operator): evaluating a deeper one would exhaust the
    interpreter's stack. Walked without recursion."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > DEEPEST:
            raise ExpressionError(f"nested more than {DEEPEST} levels deep")
        for name in ("operand", "left", "right"):
            child = getattr(node, name, None)
            if child is not None:
                stack.append((child, depth + 1))
    return root


def _parsed(parser: Any) -> Any:
    """What `parser` parses, no deeper than DEEPEST (`_shallow`)."""
    try:
        return _shallow(parser.parse())
    except RecursionError:  # parentheses nested beyond the parser's stack
        raise ExpressionError(f"nested more than {DEEPEST} levels deep") from None


def placeholders_replaced(text: str, replace: Callable[[str], str]) -> tuple[str, bool]:
    """`text` with each `{{ … }}` placeholder (from a `{{` to the first `}}` after it) replaced
    by `replace(placeholder)`, and whether a `{{` is left without its `}}`. One pass over the
    text: a regular expression would scan to the end again from each unclosed `{{`, minutes
    over a spec of many."""
    parts: list[str] = []
    done = 0
    while (start := text.find("{{", done)) != -1:
        end = text.find("}}", start + 2)
        if end == -1:
            parts.append(text[done:])
            return "".join(parts), True
        parts += [text[done:start], replace(text[start : end + 2])]
        done = end + 2
    parts.append(text[done:])
    return "".join(parts), False


@dataclass(frozen=True)
class _Token:
    kind: str  # "value", "op", "(", ")", "end"
    text: str
    value: Value = ""

    def shown(self) -> str:
        return "the end of the expression" if self.kind == "end" else f'"{self.text}"'


def _word_value(word: str) -> Value:
    if word in ("true", "false"):
        return word == "true"
    if _NUMBER.fullmatch(word):
        return float(word)
    return word


def _quoted(text: str, start: int) -> tuple[str, int]:
    """The string of the quoted literal starting at start, and the index after its closing quote."""
    quote, chars, i = text[start], [], start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            chars.append(text[i + 1])
            i += 2
            continue
        if ch == quote:
            return "".join(chars), i + 1
        chars.append(ch)
        i += 1
    raise ExpressionError(f"unterminated string {text[start:]}")


def _when_tokens(text: str) -> list[_Token]:
    tokens, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in "()":
            tokens.append(_Token(ch, ch))
            i += 1
        elif ch in "'\"":
            value, end = _quoted(text, i)
            tokens.append(_Token("value", text[i:end], value))
            i = end
        elif op := next((op for op in _WHEN_OPERATORS if text.startswith(op, i)), None):
            tokens.append(_Token("op", op))
            i += len(op)
        elif ch in "=&|":
            raise ExpressionError(f'unknown operator "{ch}"; did you mean "{ch * 2}"?')
        else:
            end = i
            while end < len(text) and text[end] not in _WORD_END:
                end += 1
            word = text[i:end]
            tokens.append(_Token("value", word, _word_value(word)))
            i = end
    tokens.append(_Token("end", ""))
    return tokens


# --- when: syntax tree -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Literal:
    value: Value

    def eval(self) -> Value:
        return self.value


@dataclass(frozen=True)
class _Not:
    operand: Any

    def eval(self) -> Value:
        value = self.operand.eval()
        if not isinstance(value, bool):
            raise ExpressionError(f'"!" needs a boolean, got {_show(value)}')
        return not value


@dataclass(frozen=True)
class _Compare:
    operator: str
    left: Any
    right: Any

    def eval(self) -> Value:
        left, right = self.left.eval(), self.right.eval()
        if self.operator in ("==", "!="):
            # govaluate compares with reflect.DeepEqual: values of different types are unequal.
            equal = type(left) is type(right) and left == right
            return equal if self.operator == "==" else not equal
        comparable = (isinstance(left, float) and isinstance(right, float)) or (
            isinstance(left, str) and isinstance(right, str)
        )
        if not comparable:
            raise ExpressionError(
                f"cannot compare {_show(left)} {self.operator} {_show(right)}: "
                "both sides must be numbers or both strings"
            )
        if self.operator == "<":
            return left < right  # type: ignore[operator]
        if self.operator == ">":
            return left > right  # type: ignore[operator]
        if self.operator == "<=":
            return left <= right  # type: ignore[operator]
        return left >= right  # type: ignore[operator]


@dataclass(frozen=True)
class _Logic:
    operator: str  # "&&" or "||"
    left: Any
    right: Any

    def eval(self) -> Value:
        left = self.left.eval()
        # govaluate short-circuits only on the deciding boolean; anything else must be a boolean.
        deciding = self.operator == "||"
        if left is deciding:
            return left
        right = self.right.eval()
        if not (isinstance(left, bool) and isinstance(right, bool)):
            bad = right if isinstance(left, bool) else left
            raise ExpressionError(f'"{self.operator}" needs booleans, got {_show(bad)}')
        return right


class _WhenParser:
    def __init__(self, text: str) -> None:
        self.tokens = _when_tokens(text)
        self.pos = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def next(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "end":
            self.pos += 1
        return token

    def parse(self) -> Any:
        if self.peek().kind == "end":
            return _Literal(True)  # Argo runs a task whose when is empty
        node = self.disjunction()
        token = self.peek()
        if token.kind != "end":
            hint = "; quote a value that has spaces" if token.kind == "value" else ""
            raise ExpressionError(f"unexpected {token.shown()}{hint}")
        return node

    def disjunction(self) -> Any:
        node = self.conjunction()
        while self.peek().text == "||" and self.peek().kind == "op":
            self.next()
            node = _Logic("||", node, self.conjunction())
        return node

    def conjunction(self) -> Any:
        node = self.comparison()
        while self.peek().text == "&&" and self.peek().kind == "op":
            self.next()
            node = _Logic("&&", node, self.comparison())
        return node

    def comparison(self) -> Any:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in _COMPARISONS:
            operator = self.next().text
            node = _Compare(operator, node, self.unary())
        return node

    def unary(self) -> Any:
        if self.peek().kind == "op" and self.peek().text == "!":
            self.next()
            return _Not(self.unary())
        return self.primary()

    def primary(self) -> Any:
        token = self.next()
        if token.kind == "value":
            return _Literal(token.value)
        if token.kind == "(":
            node = self.disjunction()
            closing = self.next()
            if closing.kind != ")":
                raise ExpressionError(f'missing ")", found {closing.shown()}')
            return node
        raise ExpressionError(f"expected a value, found {token.shown()}")


@dataclass(frozen=True)
class WhenExpression:
    """A parsed `when` expression over literals."""

    text: str
    root: Any

    def evaluate(self) -> bool:
        """The expression's value; ExpressionError if types do not fit or it is not a boolean."""
        try:
            value = self.root.eval()
        except ExpressionError as exc:
            raise ExpressionError(f"cannot evaluate when {_cited(self.text)}: {exc}") from None
        if not isinstance(value, bool):
            raise ExpressionError(
                f"when {_cited(self.text)} must be true or false, but it is {_show(value)}"
            )
        return value


QUOTED = 200  # characters of an expression an error quotes


def _cited(text: str) -> str:
    """The expression in quotes for an error, its first QUOTED characters when it is longer."""
    if len(text) <= QUOTED:
        return f'"{text}"'
    return f'"{text[:QUOTED]}…" ({len(text):,} characters)'


def parse_when(text: str) -> WhenExpression:
    """Parse a substituted `when` expression; raise ExpressionError on bad syntax.

    An empty expression is true, as in Argo.
    """
    try:
        return WhenExpression(text, _parsed(_WhenParser(text)))
    except ExpressionError as exc:
        raise ExpressionError(f"invalid when {_cited(text)}: {exc}") from None


def when_is_true(text: str) -> bool:
    """Parse and evaluate a substituted `when` expression."""
    return parse_when(text).evaluate()


def check_when_syntax(text: str) -> None:
    """Check a `when` expression before substitution: each `{{…}}` stands for one word."""
    standing, unclosed = placeholders_replaced(text, lambda _: _PLACEHOLDER_STANDIN)
    if unclosed:
        raise ExpressionError(f'invalid when {_cited(text)}: a "{{{{" placeholder is not closed')
    try:
        _parsed(_WhenParser(standing))
    except ExpressionError as exc:
        raise ExpressionError(f"invalid when {_cited(text)}: {exc}") from None


# --- depends -----------------------------------------------------------------------------------

TASK_RESULTS = (
    "Succeeded",
    "Failed",
    "Errored",
    "Skipped",
    "Omitted",
    "Daemoned",
    "AnySucceeded",
    "AllFailed",
)
_GROUP_RESULTS = ("AnySucceeded", "AllFailed")
_TASK_NAME = re.compile(r"[A-Za-z0-9_][-A-Za-z0-9_]*")


def is_task_name(name: str) -> bool:
    """Whether a depends expression can name the task `name` (a dot or a space in it would
    read as a result or an operator)."""
    return _TASK_NAME.fullmatch(name) is not None


_RESULT_WORD = re.compile(r"[A-Za-z]*")


def _bare_results(name: str, continue_on: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The results a bare dependency on name accepts (Argo's expandDependency)."""
    results = ["Succeeded", "Skipped", "Daemoned"]
    flags = continue_on.get(name) or {}
    if flags.get("error"):
        results.append("Errored")
    if flags.get("failed"):
        results.append("Failed")
    return tuple(results)


@dataclass(frozen=True)
class _ResultIs:
    name: str
    results: tuple[str, ...]

    def names(self) -> set[str]:
        return {self.name}

    def eval(self, results: Mapping[str, str], groups: Mapping[str, list[str]]) -> bool:
        if self.name not in results:
            raise ExpressionError(f'task "{self.name}" has no result yet')
        return results[self.name] in self.results


@dataclass(frozen=True)
class _GroupIs:
    name: str
    result: str  # "AnySucceeded" or "AllFailed"

    def names(self) -> set[str]:
        return {self.name}

    def eval(self, results: Mapping[str, str], groups: Mapping[str, list[str]]) -> bool:
        # A task that did not fan out has no children: neither AnySucceeded nor AllFailed.
        children = groups.get(self.name) or []
        if self.result == "AnySucceeded":
            return any(child == "Succeeded" for child in children)
        return bool(children) and all(child == "Failed" for child in children)


@dataclass(frozen=True)
class _DependsNot:
    operand: Any

    def names(self) -> set[str]:
        return self.operand.names()

    def eval(self, results: Mapping[str, str], groups: Mapping[str, list[str]]) -> bool:
        return not self.operand.eval(results, groups)


@dataclass(frozen=True)
class _DependsLogic:
    operator: str
    left: Any
    right: Any

    def names(self) -> set[str]:
        return self.left.names() | self.right.names()

    def eval(self, results: Mapping[str, str], groups: Mapping[str, list[str]]) -> bool:
        if self.operator == "&&":
            return self.left.eval(results, groups) and self.right.eval(results, groups)
        return self.left.eval(results, groups) or self.right.eval(results, groups)


def _depends_tokens(text: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in "()!":
            tokens.append((ch, ch))
            i += 1
        elif text.startswith(("&&", "||"), i):
            tokens.append((text[i : i + 2], text[i : i + 2]))
            i += 2
        elif match := _TASK_NAME.match(text, i):
            name, i = match.group(), match.end()
            result = None
            if i < len(text) and text[i] == ".":
                result = _RESULT_WORD.match(text, i + 1).group()  # type: ignore[union-attr]
                if not result:
                    raise ExpressionError(f'expected a task result after "{name}."')
                if result not in TASK_RESULTS:
                    raise ExpressionError(
                        f'unknown task result "{result}" of task "{name}"; '
                        f"use one of {', '.join(TASK_RESULTS)}"
                    )
                i += 1 + len(result)
            tokens.append(("task", (name, result)))
        else:
            raise ExpressionError(f'unexpected "{ch}"')
    tokens.append(("end", None))
    return tokens


class _DependsParser:
    def __init__(self, text: str, continue_on: Mapping[str, Mapping[str, Any]]) -> None:
        self.tokens = _depends_tokens(text)
        self.pos = 0
        self.continue_on = continue_on

    def next(self) -> tuple[str, Any]:
        token = self.tokens[self.pos]
        if token[0] != "end":
            self.pos += 1
        return token

    def parse(self) -> Any:
        node = self.disjunction()
        kind, _ = self.tokens[self.pos]
        if kind != "end":
            raise ExpressionError(f"unexpected {_shown(self.tokens[self.pos])}")
        return node

    def disjunction(self) -> Any:
        node = self.conjunction()
        while self.tokens[self.pos][0] == "||":
            self.next()
            node = _DependsLogic("||", node, self.conjunction())
        return node

    def conjunction(self) -> Any:
        node = self.unary()
        while self.tokens[self.pos][0] == "&&":
            self.next()
            node = _DependsLogic("&&", node, self.unary())
        return node

    def unary(self) -> Any:
        if self.tokens[self.pos][0] == "!":
            self.next()
            return _DependsNot(self.unary())
        return self.primary()

    def primary(self) -> Any:
        token = self.next()
        kind, value = token
        if kind == "task":
            name, result = value
            if result is None:
                return _ResultIs(name, _bare_results(name, self.continue_on))
            if result in _GROUP_RESULTS:
                return _GroupIs(name, result)
            return _ResultIs(name, (result,))
        if kind == "(":
            node = self.disjunction()
            closing = self.next()
            if closing[0] != ")":
                raise ExpressionError(f'missing ")", found {_shown(closing)}')
            return node
        raise ExpressionError(f"expected a task, found {_shown(token)}")


def _shown(token: tuple[str, Any]) -> str:
    kind, value = token
    if kind == "end":
        return "the end of the expression"
    if kind == "task":
        name, result = value
        return f'"{name}.{result}"' if result else f'"{name}"'
    return f'"{value}"'


@dataclass(frozen=True)
class DependsExpression:
    """A parsed `depends` expression."""

    text: str
    root: Any

    def task_names(self) -> set[str]:
        """The names of the tasks this expression depends on."""
        return set() if self.root is None else self.root.names()

    def evaluate(
        self,
        results: Mapping[str, str],
        group_results: Mapping[str, list[str]] | None = None,
    ) -> bool:
        """Whether the task may run, given each finished dependency's result.

        results maps a task name to `Succeeded`, `Failed`, `Errored`, `Skipped`, `Omitted` or
        `Daemoned`; group_results maps a withItems/withParam task to its children's results,
        for `AnySucceeded` (some child succeeded) and `AllFailed` (it has children and all
        failed). An empty expression is true.
        """
        if self.root is None:
            return True
        try:
            return self.root.eval(results, group_results or {})
        except ExpressionError as exc:
            raise ExpressionError(f'cannot evaluate depends "{self.text}": {exc}') from None


def parse_depends(
    text: str, continue_on: Mapping[str, Mapping[str, Any]] | None = None
) -> DependsExpression:
    """Parse an Argo `depends` expression; raise ExpressionError on bad syntax.

    A bare task name `A` means `(A.Succeeded || A.Skipped || A.Daemoned)`, plus `A.Errored` /
    `A.Failed` when continue_on (task name → its `continueOn`) says `error` / `failed`, as Argo
    expands it.
    """
    if not text.strip():
        return DependsExpression(text, None)
    try:
        return DependsExpression(text, _parsed(_DependsParser(text, continue_on or {})))
    except ExpressionError as exc:
        raise ExpressionError(f'invalid depends "{text}": {exc}') from None


def depends_from_dependencies(
    names: list[str], continue_on: Mapping[str, Mapping[str, Any]]
) -> str:
    """The `depends` text equivalent to `dependencies: names`, as Argo builds it.

    Each name becomes `(A.Succeeded || A.Skipped || A.Daemoned)`, with `|| A.Errored` and
    `|| A.Failed` added when `continue_on[A]` has `error` / `failed` true; joined by ` && `.
    """
    return " && ".join(
        "(" + " || ".join(f"{name}.{result}" for result in _bare_results(name, continue_on)) + ")"
        for name in names
    )
