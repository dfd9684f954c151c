"""Injection-safe rendering of spec templates.

Templates use Omnistrate placeholders (`{{ $var.key }}`, `{{ $sys.id }}`, `{{ $secret.NAME }}`,
`{{ $func.base64encode($var.password) }}`, `{{ $func.random(string, 12) }}`) and Argo ones
(`{{inputs.parameters.ns}}`, `{{workflow.parameters.x}}`, `{{workflow.status}}`,
`{{tasks.a.outputs.parameters.p}}`, and `{{item}}` / `{{item.key}}` in a `withItems` fan-out).
A manifest is rendered in three steps (DESIGN.md, "Injection-safe rendering"):

1. every `{{ … }}` placeholder is parsed and swapped for an opaque token such as
   `opsdeck-tok-3-9f2c51d0a4b7e813` — a plain YAML scalar that is valid unquoted, in flow
   collections and inside quotes — whose nonce does not occur in the template;
2. the tokenized text is parsed with PyYAML's safe loader, so the unquoted
   `name: {{ $sys.id }}` of real Omnistrate specs parses;
3. tokens are replaced inside the parsed scalars. Values are inserted as Python objects and
   are never parsed or scanned again, so no value can add keys, documents, anchors, tags or
   objects, however it is spelled.

Substitution rules:

- A token that is the whole of a *plain* (unquoted) scalar takes the value's type: int, float,
  bool, None, dict or list. A float with an integral value becomes an int (`3`, not `3.0`).
  Strings stay strings: `"3"` or `"yes"` from a String parameter is never re-typed.
- A token that is the whole of a *quoted* or block scalar renders as text, as it would after
  textual substitution on Omnistrate or Argo: quoting is how an author asks for a string
  (annotation and label values must be strings).
- A token inside a longer string is interpolated as text: integral floats as integers, booleans
  as `true`/`false`, None as the empty string, dicts and lists as compact JSON.
- Tokens in mapping keys are interpolated as text; a key that then collides with another key
  of the same mapping is an error.
- A bare `$sys.x` / `$var.x` (no braces) is substituted only when it is the whole value of a
  scalar (never in keys); inside a longer string it stays literal.
- Placeholders in YAML comments disappear with the comment: they must parse, but are never
  resolved.
- An undefined reference is an error naming it, never an empty string; so is a placeholder
  this module does not understand.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from deployments.workflow import safe_yaml

__all__ = [
    "Context",
    "RenderError",
    "references",
    "render_manifest",
    "render_text",
    "render_value",
]


class RenderError(ValueError):
    """A template cannot be rendered; the message names the reference and where it was."""

    def __init__(self, message: str, *, reference: str | None = None) -> None:
        super().__init__(message)
        # The undefined reference, e.g. "$var.foo", so a validator can report it by name.
        self.reference = reference


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


@dataclass
class Context:
    """The values a template may reference.

    `workflow` holds the workflow parameters by name, plus `status` for `{{workflow.status}}`;
    `tasks` maps a task name to its output parameters. `seed` is the value of
    `$sys.deterministicSeedValue` when `sys` does not carry that key itself. `item` is the
    current element of a `withItems` fan-out; `{{item}}` is undefined outside one.
    """

    var: dict[str, Any]
    sys: dict[str, Any]
    secret: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    workflow: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: str = ""
    item: Any = _UNSET


# --- placeholder syntax ---------------------------------------------------------------------

_SEG = r"[A-Za-z0-9_][A-Za-z0-9_-]*"
_PATH = rf"(?:\.{_SEG}|\[(?:\d+|\*)\])+"
_REF = (
    rf"(?:\$(?:var|sys|secret)|(?:inputs|workflow)\.parameters"
    rf"|tasks\.{_SEG}\.outputs\.parameters){_PATH}|workflow\.status|item(?:{_PATH})?"
)
# No braces or newlines inside, so `{{{ $var.x }}}` finds the inner placeholder.
_PLACEHOLDER = re.compile(r"\{\{([^{}\n]*)\}\}")
_BARE = re.compile(rf"\$(?:var|sys){_PATH}")
_REF_ROOT = re.compile(
    rf"\$(?P<dollar>var|sys|secret)|(?P<argo>inputs|workflow)\.parameters"
    rf"|tasks\.(?P<task>{_SEG})\.outputs\.parameters|(?P<item>item)"
)
_PATH_STEP = re.compile(rf"\.({_SEG})|\[(\d+|\*)\]")
_LEXEME = re.compile(
    rf"\s*(?:(?P<ref>{_REF})(?![\w.\[-])|(?P<func>\$func\.[A-Za-z_]\w*)|(?P<punct>[(),])"
    r"|'(?P<squote>[^']*)'|\"(?P<dquote>[^\"]*)\"|(?P<int>\d+)(?![\w.-])"
    r"|(?P<word>[A-Za-z_][\w.-]*))"
)

_SUPPORTED = (
    "a placeholder holds one of $var.*, $sys.*, $secret.*, inputs.parameters.*, "
    "workflow.parameters.*, workflow.status, tasks.<task>.outputs.parameters.*, item "
    "or a $func call"
)
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_MAX_RANDOM_LENGTH = 4096


class _All:
    """The `[*]` step of a path: every element of a list."""

    def __repr__(self) -> str:
        return "[*]"


_ALL = _All()


@dataclass(frozen=True)
class _Ref:
    text: str  # canonical spelling, e.g. "$sys.deploymentCell.publicSubnetIDs[*].id"
    root: str  # "var", "sys", "secret", "inputs", "workflow", "tasks" or "item"
    path: tuple[str | int | _All, ...]


@dataclass(frozen=True)
class _Literal:
    value: str | int


@dataclass(frozen=True)
class _Call:
    name: str
    args: tuple[_Ref | _Literal | _Call, ...]


_Expr = _Ref | _Literal | _Call


@dataclass(frozen=True)
class _Placeholder:
    expr: _Ref | _Call
    display: str  # how messages show it, e.g. "{{ $var.foo }}"


class _Problem(Exception):
    """An error without its location yet; public functions turn it into a RenderError."""

    def __init__(self, message: str, reference: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reference = reference


class _Undefined(Exception):
    def __init__(self, ref: _Ref) -> None:
        super().__init__(ref.text)
        self.ref = ref


def _make_ref(text: str) -> _Ref:
    if text == "workflow.status":
        return _Ref(text, "workflow", ("status",))
    root = _REF_ROOT.match(text)
    if root is None:
        raise _Problem(f"not a reference: {text}")
    prefix: tuple[str | int | _All, ...] = ()
    if root["task"]:
        prefix = (root["task"],)
    steps: list[str | int | _All] = []
    for step in _PATH_STEP.finditer(text, root.end()):
        key, index = step.groups()
        steps.append(key if key is not None else _ALL if index == "*" else int(index))
    name = root["dollar"] or root["argo"] or root["item"] or "tasks"
    return _Ref(text, name, prefix + tuple(steps))


def _lex(body: str) -> list[tuple[str, str]]:
    lexemes: list[tuple[str, str]] = []
    pos = 0
    while body[pos:].strip():
        match = _LEXEME.match(body, pos)
        if match is None or match.end() == pos:
            raise _Problem(f"cannot read {body[pos:].strip()!r}; {_SUPPORTED}")
        kind = match.lastgroup or ""
        lexemes.append((kind, match[kind]))
        pos = match.end()
    return lexemes


# Calls nested in one placeholder: `$func.base64encode($var.x)` nests one; real specs, two.
_MAX_CALL_DEPTH = 16


def _parse_expr(lexemes: list[tuple[str, str]], pos: int, depth: int = 0) -> tuple[_Expr, int]:
    if pos >= len(lexemes):
        raise _Problem("expression ends too early")
    if depth > _MAX_CALL_DEPTH:
        raise _Problem(f"$func calls nest more than {_MAX_CALL_DEPTH} deep")
    kind, text = lexemes[pos]
    if kind == "ref":
        return _make_ref(text), pos + 1
    if kind == "int":
        return _Literal(int(text)), pos + 1
    if kind in ("squote", "dquote", "word"):
        return _Literal(text), pos + 1
    if kind != "func":
        raise _Problem(f"unexpected {text!r}")
    if lexemes[pos + 1 : pos + 2] != [("punct", "(")]:
        raise _Problem(f"{text} must be called with (…)")
    args: list[_Expr] = []
    pos += 2
    if lexemes[pos : pos + 1] == [("punct", ")")]:
        return _check_call(_Call(text.removeprefix("$func."), tuple(args))), pos + 1
    while True:
        arg, pos = _parse_expr(lexemes, pos, depth + 1)
        args.append(arg)
        separator = lexemes[pos : pos + 1]
        if separator == [("punct", ")")]:
            return _check_call(_Call(text.removeprefix("$func."), tuple(args))), pos + 1
        if separator != [("punct", ",")]:
            raise _Problem(f"{text}(…) is missing a ',' or ')'")
        pos += 1


def _check_call(call: _Call) -> _Call:
    if call.name == "base64encode":
        if len(call.args) != 1:
            raise _Problem("$func.base64encode takes exactly one argument")
        return call
    if call.name != "random":
        raise _Problem(f"unknown function $func.{call.name}")
    if len(call.args) not in (2, 3):
        raise _Problem("$func.random takes (string, length[, seed])")
    kind, length = call.args[0], call.args[1]
    if kind != _Literal("string"):
        raise _Problem("the first argument of $func.random must be `string`")
    if not (isinstance(length, _Literal) and isinstance(length.value, int)):
        raise _Problem("the length of $func.random must be a whole number")
    if not 1 <= length.value <= _MAX_RANDOM_LENGTH:
        raise _Problem(f"the length of $func.random must be between 1 and {_MAX_RANDOM_LENGTH}")
    return call


@functools.lru_cache(maxsize=1024)
def _parse_placeholder(body: str) -> _Placeholder:
    """Parse the inside of `{{ … }}`; raises _Problem for anything but a reference or a call."""
    display = f"{{{{ {body.strip()} }}}}"
    try:
        lexemes = _lex(body)
        expr, pos = _parse_expr(lexemes, 0)
        if pos != len(lexemes):
            raise _Problem(f"unexpected {lexemes[pos][1]!r}")
    except _Problem as problem:
        raise _Problem(f"invalid placeholder {display}: {problem.message}") from None
    if isinstance(expr, _Literal):
        raise _Problem(f"invalid placeholder {display}: {_SUPPORTED}")
    return _Placeholder(expr, display)


def _bare_placeholder(text: str) -> _Placeholder:
    return _Placeholder(_make_ref(text), text)


def _refs_in(expr: _Expr) -> list[_Ref]:
    if isinstance(expr, _Ref):
        return [expr]
    if isinstance(expr, _Call):
        return [ref for arg in expr.args for ref in _refs_in(arg)]
    return []


# --- values ---------------------------------------------------------------------------------


def _lookup(ref: _Ref, ctx: Context) -> Any:
    roots: dict[str, Any] = {
        "var": ctx.var,
        "sys": ctx.sys,
        "secret": ctx.secret,
        "inputs": ctx.inputs,
        "workflow": ctx.workflow,
        "tasks": ctx.tasks,
        "item": ctx.item,
    }
    if ref.root == "sys" and "deterministicSeedValue" not in ctx.sys and ctx.seed:
        roots["sys"] = {**ctx.sys, "deterministicSeedValue": ctx.seed}
    if roots[ref.root] is _UNSET:
        raise _Undefined(ref)
    return _walk(roots[ref.root], ref.path, ref)


def _walk(value: Any, path: tuple[str | int | _All, ...], ref: _Ref) -> Any:
    for i, step in enumerate(path):
        if step is _ALL:
            if not isinstance(value, list | tuple):
                raise _Undefined(ref)
            return ",".join(_text(_walk(item, path[i + 1 :], ref)) for item in value)
        if isinstance(step, int):
            if not isinstance(value, list | tuple) or step >= len(value):
                raise _Undefined(ref)
        elif not isinstance(value, dict) or step not in value:
            raise _Undefined(ref)
        value = value[step]
    return value


def _evaluate(expr: _Expr, ctx: Context) -> Any:
    if isinstance(expr, _Literal):
        return expr.value
    if isinstance(expr, _Ref):
        return _lookup(expr, ctx)
    if expr.name == "base64encode":
        raw = _text(_evaluate(expr.args[0], ctx)).encode()
        return base64.b64encode(raw).decode("ascii")
    length = expr.args[1].value
    if len(expr.args) == 2:
        return "".join(secrets.choice(_ALPHABET) for _ in range(length))
    seed = _text(_evaluate(expr.args[2], ctx))
    if not seed:
        raise _Problem("the seed of $func.random is empty")
    return _seeded_random(seed, length)


def _seeded_random(seed: str, length: int) -> str:
    """Lowercase alphanumerics from an HMAC-SHA256 stream keyed by the seed.

    Changing this derivation changes every seeded value already deployed (passwords, names).
    """
    chars: list[str] = []
    counter = 0
    while len(chars) < length:
        message = f"opsdeck-random:{length}:{counter}".encode()
        for byte in hmac.new(seed.encode(), message, hashlib.sha256).digest():
            # 252 = 7 * 36: rejecting the top 4 byte values keeps every character equally likely.
            if byte < 252 and len(chars) < length:
                chars.append(_ALPHABET[byte % len(_ALPHABET)])
        counter += 1
    return "".join(chars)


def _resolve(placeholder: _Placeholder, ctx: Context) -> Any:
    try:
        return _evaluate(placeholder.expr, ctx)
    except _Undefined as missing:
        name = missing.ref.text
        if missing.ref == placeholder.expr:
            raise _Problem(f"undefined reference {placeholder.display}", name) from None
        raise _Problem(f"undefined reference {name} (in {placeholder.display})", name) from None
    except _Problem as problem:
        raise _Problem(f"{problem.message} (in {placeholder.display})") from None


def _text(value: Any) -> str:
    """A value as it reads when interpolated into a longer string."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        # Argo resolves the outputs of skipped tasks to "", and JSON null has no other text.
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise _Problem(f"cannot render a value of type {type(value).__name__}")


def _plain(value: Any) -> Any:
    """A copy of a value as it lands in a rendered object: JSON types, integral floats as ints."""
    if isinstance(value, bool | str | int) or value is None:
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise _Problem(f"cannot render a value of type {type(value).__name__}")


# --- substitution ---------------------------------------------------------------------------


# The most characters of values one manifest's placeholders fill in: the Kubernetes API server
# takes no request larger than 3 MiB.
FILLED_MAX = 3 << 20


def _size(value: Any) -> int:
    """About how many characters `value` adds to a rendered object."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict | list):
        return len(json.dumps(value, ensure_ascii=False, default=str))
    return len(str(value))


@dataclass
class _Source:
    """Where placeholders are in a string, and what each one resolves to."""

    pattern: re.Pattern[str]
    placeholder: Callable[[re.Match[str]], _Placeholder]
    ctx: Context
    # Per token, so a YAML alias of a scalar repeats the same value (even a random one): the
    # value and its size.
    memo: dict[str, tuple[Any, int]] | None = None
    filled: int = 0  # characters of values filled in so far (`FILLED_MAX`)

    def value(self, match: re.Match[str]) -> Any:
        if self.memo is not None and match[0] in self.memo:
            value, size = self.memo[match[0]]
        else:
            value = _resolve(self.placeholder(match), self.ctx)
            size = _size(value)
            if self.memo is not None:
                self.memo[match[0]] = value, size
        return self._spent(value, size)

    def _spent(self, value: Any, size: int) -> Any:
        """`value`, counted against the manifest's `FILLED_MAX`: a placeholder is a token of the
        same few characters whatever it stands for, so the bound on the YAML's text expanded
        by its aliases does not bound what an alias of a placeholder repeats."""
        self.filled += size
        if self.filled > FILLED_MAX:
            raise _Problem(
                f"the values filled in come to more than {FILLED_MAX // (1 << 20)} MiB, more "
                "than the Kubernetes API takes in one object"
            )
        return value

    def render(self, text: str, *, typed: bool, bare: bool) -> Any:
        whole = self.pattern.fullmatch(text)
        if whole is not None:
            value = self.value(whole)
        elif bare and _BARE.fullmatch(text):
            value = _resolve(_bare_placeholder(text), self.ctx)
            value = self._spent(value, _size(value))
        else:
            return self.pattern.sub(lambda match: _text(self.value(match)), text)
        return _plain(value) if typed else _text(value)


@dataclass(frozen=True)
class _Scalar:
    """A parsed template string holding tokens or a bare reference; `plain` if unquoted."""

    text: str
    plain: bool


def _located(message: str, where: str, at: str = "") -> str:
    return " ".join([message, *([f"in {where}"] if where else []), *([f"at {at}"] if at else [])])


def _render_at(source: _Source, text: str, *, typed: bool, bare: bool, where: str, at: str) -> Any:
    try:
        return source.render(text, typed=typed, bare=bare)
    except _Problem as problem:
        message = _located(problem.message, where, at)
        raise RenderError(message, reference=problem.reference) from None


def _fill(node: Any, source: _Source, where: str, at: str) -> Any:
    """A rendered copy of a parsed node: strings and marked scalars substituted, keys as text."""
    if isinstance(node, _Scalar | str):
        text, typed = (node.text, node.plain) if isinstance(node, _Scalar) else (node, True)
        return _render_at(source, text, typed=typed, bare=True, where=where, at=at)
    if isinstance(node, list | tuple):
        return [_fill(item, source, where, f"{at}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    rendered: dict[Any, Any] = {}
    for key, value in node.items():
        if isinstance(key, _Scalar | str):
            text = key.text if isinstance(key, _Scalar) else key
            key = _render_at(source, text, typed=False, bare=False, where=where, at=at)
        child = f"{at}.{key}" if at else str(key)
        if key in rendered:
            # Only a substituted key can collide: the parser already merged literal duplicates.
            raise RenderError(_located(f"key {key!r} appears twice after rendering", where, at))
        rendered[key] = _fill(value, source, where, child)
    return rendered


# --- YAML -----------------------------------------------------------------------------------


class _Marking(safe_yaml.JsonConstructor):
    """The constructor of JSON values (`safe_yaml.JsonConstructor`: Kubernetes reads YAML as
    JSON), marking the string scalars that hold tokens (`token_re`) or a bare reference."""

    token_re: re.Pattern[str]

    def construct_marked_str(self, node: yaml.ScalarNode) -> str | _Scalar:
        text = safe_yaml.json_text(self.construct_scalar(node), node)
        if self.token_re.search(text) or _BARE.fullmatch(text):
            return _Scalar(text, plain=not node.style)  # None, or "" from libyaml
        return text


_Marking.add_constructor("tag:yaml.org,2002:str", _Marking.construct_marked_str)
# A date is text, as JSON has it: `2024-01-01` stays a string (one that may hold a token).
_Marking.add_constructor("tag:yaml.org,2002:timestamp", _Marking.construct_marked_str)


class _Loader(_Marking, yaml.SafeLoader):
    """Read by the Python parser."""


class _CLoader(_Marking, yaml.CSafeLoader):
    """Read by libyaml."""


@dataclass
class _Tokenized:
    text: str
    token_re: re.Pattern[str]
    table: list[_Placeholder]

    def source(self, ctx: Context) -> _Source:
        return _Source(self.token_re, lambda match: self.table[int(match[1])], ctx, memo={})

    def untokenize(self, text: str) -> str:
        return self.token_re.sub(lambda match: self.table[int(match[1])].display, text)


def _tokenize(template: str, where: str) -> _Tokenized:
    nonce = secrets.token_hex(8)
    while nonce in template:
        nonce = secrets.token_hex(8)
    table: list[_Placeholder] = []

    def swap(match: re.Match[str]) -> str:
        table.append(_parse_placeholder(match[1]))
        return f"opsdeck-tok-{len(table) - 1}-{nonce}"

    try:
        text = _PLACEHOLDER.sub(swap, template)
    except _Problem as problem:
        raise RenderError(_located(problem.message, where)) from None
    return _Tokenized(text, re.compile(rf"opsdeck-tok-(\d+)-{nonce}"), table)


def _load_documents(tokenized: _Tokenized, where: str) -> list[Any]:
    def documents(loader: _Marking) -> list[Any]:
        loader.token_re = tokenized.token_re
        return safe_yaml.documents(loader)

    try:
        safe_yaml.check(tokenized.text)
        return safe_yaml.parsed(tokenized.text, _CLoader, _Loader, documents)
    except yaml.MarkedYAMLError as exc:
        line = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        detail = tokenized.untokenize(f"{exc.problem or exc.context}{line}")
        raise RenderError(_located(f"invalid YAML: {detail}", where)) from None
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        # A constructor refusing a tagged token, e.g. `!!int {{ $var.x }}`.
        detail = tokenized.untokenize(str(exc))
        raise RenderError(_located(f"invalid YAML: {detail}", where)) from None


def _describe(node: Any) -> str:
    return "a list" if isinstance(node, list) else "a scalar"


# --- public API -----------------------------------------------------------------------------


def _one_document(template: str, where: str) -> tuple[Any, _Tokenized]:
    if not isinstance(template, str):
        raise RenderError(_located("manifest must be YAML text", where))
    return _parsed(template, where)


@functools.lru_cache(maxsize=1024)
def _parsed(template: str, where: str) -> tuple[Any, _Tokenized]:
    """The template's one document, placeholders tokenized, parsed once per process: it does
    not depend on the values (they are filled in afterwards, into new objects — `_fill` never
    changes what it reads), and a plan's manifests are rendered on every move."""
    tokenized = _tokenize(template, where)
    documents = [doc for doc in _load_documents(tokenized, where) if doc is not None]
    if not documents:
        raise RenderError(_located("manifest is empty", where))
    if len(documents) > 1:
        message = f"manifest must hold exactly one object, found {len(documents)} documents"
        raise RenderError(_located(message, where))
    return documents[0], tokenized


def render_manifest(template: str, ctx: Context, *, where: str = "") -> dict:
    """Render YAML text holding exactly one Kubernetes object (a mapping) into a dict.

    `where` (e.g. "templates[2].resource.manifest") names the template in error messages.
    Raises RenderError for invalid YAML, several or no documents, a top level that is not a
    mapping, duplicate keys after substitution, and undefined or unsupported placeholders.
    Empty documents (a stray `---`) are ignored.
    """
    document, tokenized = _one_document(template, where)
    # Checked before substitution, so a value can never become the whole object.
    if not isinstance(document, dict):
        message = f"manifest must be a mapping (one Kubernetes object), not {_describe(document)}"
        raise RenderError(_located(message, where))
    return _fill(document, tokenized.source(ctx), where, "")


def is_patch_list(template: str) -> bool:
    """Whether a manifest is a list (Argo's form of a JSON patch) rather than an object."""
    try:
        document, _ = _one_document(template, "")
    except RenderError:
        return False
    return isinstance(document, list)


def patch_problems(template: str) -> list[tuple[str, str]]:
    """What keeps a manifest that is a list from being a JSON patch: (where in the list,
    message) pairs, empty when it is one."""
    document, _ = _one_document(template, "")
    return _patch_problems(document)


def _patch_problems(document: Any) -> list[tuple[str, str]]:
    # Checked before substitution, so a value can never become an operation.
    if not isinstance(document, list) or not document:
        return [("", "a JSON patch needs at least one operation")]
    return [
        (f"[{i}]", "a JSON patch operation is a mapping with op and path")
        for i, operation in enumerate(document)
        if not (isinstance(operation, dict) and "op" in operation and "path" in operation)
    ]


def render_patch(template: str, ctx: Context, *, where: str = "") -> list[dict]:
    """Render a JSON patch written as a YAML list of operations (`- op: replace` …)."""
    document, tokenized = _one_document(template, where)
    problems = _patch_problems(document)
    if problems:
        at, message = problems[0]
        raise RenderError(_located(message, where, at))
    return _fill(document, tokenized.source(ctx), where, "")


def render_value(value: Any, ctx: Context, *, where: str = "") -> Any:
    """Render a value already parsed from the spec (an argument value, a `when` string, …).

    Strings follow the whole-scalar rule: a string that is exactly one placeholder (or one bare
    `$sys.x`/`$var.x`) becomes the value with its type; other strings are interpolated as text.
    Dicts and lists are rendered recursively (keys as text) into new objects; other values are
    returned unchanged. Nothing is parsed as YAML.
    """
    source = _Source(_PLACEHOLDER, lambda match: _parse_placeholder(match[1]), ctx)
    return _fill(value, source, where, "")


def render_text(text: str, ctx: Context, *, where: str = "") -> str:
    """Interpolate every placeholder of `text` as text (for `when` and condition strings).

    A value that is not a string (an unquoted `when: true` parsed by YAML) reads as its text.
    """
    if not isinstance(text, str):
        try:
            return _text(render_value(text, ctx, where=where))
        except _Problem as problem:
            raise RenderError(_located(problem.message, where)) from None
    source = _Source(_PLACEHOLDER, lambda match: _parse_placeholder(match[1]), ctx)
    return _render_at(source, text, typed=False, bare=True, where=where, at="")


def references(text: str) -> list[str]:
    """The references a template uses, in order of first appearance, each once.

    E.g. `["$var.instances", "inputs.parameters.ns", "tasks.a.outputs.parameters.p"]`;
    references inside `$func` calls are included, function names and literals are not. Bare
    `$sys.x`/`$var.x` are included where they are a whole scalar value (or the whole text).
    The scan is textual, so placeholders in YAML comments count too. Raises RenderError for a
    malformed placeholder, so a spec is refused at load time rather than at run time.
    """
    return list(_references(text))


@functools.lru_cache(maxsize=1024)
def _references(text: str) -> tuple[str, ...]:
    """`references`, found once per process: a spec's validation asks again for each verb
    and each check of the same manifest, and a plan's next version repeats most of them."""
    found: dict[str, None] = {}
    for match in _PLACEHOLDER.finditer(text):
        try:
            placeholder = _parse_placeholder(match[1])
        except _Problem as problem:
            raise RenderError(problem.message) from None
        for ref in _refs_in(placeholder.expr):
            found.setdefault(ref.text)
    for bare in _bare_values(text):
        found.setdefault(bare)
    return tuple(found)


def _bare_values(text: str) -> list[str]:
    try:
        documents = _load_documents(_tokenize(text, ""), "")
    except RenderError:
        # Not YAML (e.g. a `when` expression): only the whole text can be a bare reference.
        return [text.strip()] if _BARE.fullmatch(text.strip()) else []
    bare: list[str] = []

    def collect(node: Any) -> None:
        if isinstance(node, _Scalar) and _BARE.fullmatch(node.text):
            bare.append(node.text)
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for item in node:
                collect(item)

    for document in documents:
        collect(document)
    return bare
