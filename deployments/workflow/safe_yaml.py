"""Bounded YAML parsing: every parse of spec text (and of objects read from files) is checked
here first.

PyYAML composes documents recursively and constructs an alias as a shared reference to its
anchor's value, so a few lines of aliases (the "billion laughs") stand for a document that only
blows up later, when it is stored as JSON or walked; a recursive alias (`&r [*r]`) builds a
cycle; and deep nesting overflows the interpreter's stack. `check` walks the event stream,
which PyYAML produces without recursion, and refuses such text before anything is built,
counting every alias as the whole value its anchor names.

The refusal is a `BoundsError`, a `yaml.MarkedYAMLError`, so callers that already report YAML
syntax errors with a line and column report these the same way.

Text is read with libyaml (PyYAML's C parser, ten to twenty times faster than its Python one:
a spec's load parses every manifest in it) and, when libyaml refuses it, read again with the
Python parser, whose error is the one raised: it quotes the line, and its words are PyYAML's
whichever parser is installed (`parsed`).

`JsonLoader` builds what JSON can hold, as Kubernetes reads YAML and as PostgreSQL stores a
spec: a timestamp stays text; a set, binary data, an infinite or not-a-number float, an integer
beyond 64 bits, text holding a NUL or a lone surrogate, and a key written twice in one mapping
are refused where they are written (a `yaml.constructor.ConstructorError`, marked as syntax
errors are).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import yaml
from yaml.constructor import ConstructorError

# The specs we know nest at most 15 levels and Kubernetes objects at most 26 (the deepest
# custom resource definition we know); 64 leaves room for any real one and keeps recursive
# walkers of the parsed value (JSON encoding, rendering, CEL) far from Python's limit of 1000
# frames.
MAX_DEPTH = 64
# The largest spec we know holds about 1,000 values; 200,000 is far beyond any hand-written
# spec, yet small enough that the expanded document costs tens of MB at most.
MAX_VALUES = 200_000
# Characters of all scalars, aliases expanded: bounds the JSON copy of a spec stored with each
# plan version, while leaving room for large embedded manifests and scripts.
MAX_TEXT = 20_000_000


class BoundsError(yaml.MarkedYAMLError):
    """YAML refused for its size, depth or a recursive alias; `problem` says which."""


@dataclass
class _Size:
    """What a node stands for once its aliases are expanded."""

    values: int = 1
    text: int = 0
    depth: int = 0  # levels of collections: 0 for a scalar, 1 for a list of scalars

    def add(self, child: _Size) -> None:
        self.values += child.values
        self.text += child.text
        # a collection adds its own level when it ends
        self.depth = max(self.depth, child.depth)


def check(text: str) -> None:
    """Raise BoundsError when `text` is longer than MAX_TEXT characters, nests deeper than
    MAX_DEPTH collections, stands for more than MAX_VALUES values or MAX_TEXT characters of
    scalars with every alias expanded, or has an alias inside its own anchor. YAML syntax
    errors are raised as the parser raises them.
    """
    if len(text) > MAX_TEXT:
        # Longer than any document it may stand for: refused before the parser, which would
        # take most of a minute to read it.
        line = text.count("\n", 0, MAX_TEXT)
        column = MAX_TEXT - (text.rfind("\n", 0, MAX_TEXT) + 1)
        raise BoundsError(
            problem=f"the text is longer than {MAX_TEXT // 1_000_000} MB",
            problem_mark=yaml.Mark("<text>", MAX_TEXT, line, column, None, None),
        )
    try:
        _walk(yaml.parse(text, Loader=yaml.CSafeLoader))
    except yaml.YAMLError:
        # Said as the Python parser says it, quoting the line: its refusal, or none.
        _walk(yaml.parse(text, Loader=yaml.SafeLoader))


def _walk(events) -> None:
    """`check`'s walk of a document's events (yaml.parse's, from either parser)."""
    anchors: dict[str, _Size] = {}
    opened: list[tuple[str | None, _Size]] = []  # collections being read, outermost first
    total = _Size(values=0)

    def done(anchor: str | None, size: _Size) -> None:
        """A node is complete: its anchor now names it, and its parent holds it."""
        if anchor is not None:
            anchors[anchor] = size
        if opened:
            opened[-1][1].add(size)

    for event in events:
        if isinstance(event, yaml.DocumentStartEvent):
            anchors = {}  # an anchor is defined for the rest of its document only
        elif isinstance(event, yaml.CollectionStartEvent):
            opened.append((event.anchor, _Size()))
            if len(opened) > MAX_DEPTH:
                _refuse(f"the document nests deeper than {MAX_DEPTH} levels", event)
            _count(total, _Size(), event)
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = opened.pop()
            size.depth += 1
            done(anchor, size)
        elif isinstance(event, yaml.ScalarEvent):
            size = _Size(text=len(event.value))
            _count(total, size, event)
            done(event.anchor, size)
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in opened):
                message = f"alias *{event.anchor} is inside its own anchor &{event.anchor}"
                _refuse(f"{message} (recursive aliases are not allowed)", event)
            size = anchors.get(event.anchor)
            if size is None:
                continue  # undefined: composing reports it where it is
            if len(opened) + size.depth > MAX_DEPTH:
                message = f"alias *{event.anchor} makes the document nest deeper than"
                _refuse(f"{message} {MAX_DEPTH} levels", event)
            _count(total, size, event)
            done(None, size)


def _count(total: _Size, size: _Size, event: yaml.Event) -> None:
    """Add a node to the document's running total (a collection counts one value when it
    starts, its items as they come); refuse past a bound."""
    total.values += size.values
    total.text += size.text
    if total.values > MAX_VALUES:
        _refuse(_beyond(event, f"{MAX_VALUES} values"), event)
    if total.text > MAX_TEXT:
        _refuse(_beyond(event, f"{MAX_TEXT // 1_000_000} MB of text"), event)


def _beyond(event: yaml.Event, limit: str) -> str:
    if isinstance(event, yaml.AliasEvent):
        return f"alias *{event.anchor} expands the document to more than {limit}"
    return f"the document holds more than {limit}"


def _refuse(problem: str, event: yaml.Event) -> NoReturn:
    raise BoundsError(problem=problem, problem_mark=event.start_mark)


T = TypeVar("T")

# Kubernetes' integers are 64-bit, and a spec's numbers are read as floats too.
_INT_BOUND = 2**63


class JsonConstructor(yaml.constructor.SafeConstructor):
    """PyYAML's safe constructor, building only what JSON holds (the module docstring)."""

    def construct_json_str(self, node: yaml.ScalarNode) -> str:
        return json_text(self.construct_scalar(node), node)

    def construct_json_int(self, node: yaml.ScalarNode) -> int:
        try:
            number = self.construct_yaml_int(node)
        except ValueError as exc:  # beyond the digits Python converts (4,300)
            _not_json(node, f"the integer {node.value[:20]}… is too long ({exc})")
        if not -_INT_BOUND <= number < _INT_BOUND:
            _not_json(node, f"the integer {node.value} does not fit in 64 bits")
        return number

    def construct_json_float(self, node: yaml.ScalarNode) -> float:
        number = self.construct_yaml_float(node)
        if not math.isfinite(number):
            _not_json(node, f"{node.value} is not a finite number")
        return number

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """As PyYAML's, refusing a key written twice in one mapping (PyYAML keeps the last,
        silently dropping the first); a merged mapping's keys (`<<: *base`) may be written
        again, which is what merging is for."""
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise ConstructorError(
                        problem=f'the key "{key_node.value}" is written twice in one mapping',
                        problem_mark=key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_not_json(self, node: yaml.Node) -> NoReturn:
        kind = node.tag.rsplit(":", 1)[-1]
        _not_json(node, f"a !!{kind} value is not JSON; write it as text or a list")


def json_text(text: str, node: yaml.Node) -> str:
    """`text` of a scalar `node`, refused when JSON text (and PostgreSQL) cannot hold it."""
    if "\x00" in text:
        _not_json(node, "text may not hold a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _not_json(node, "text may not hold a lone surrogate (\\ud800 to \\udfff)")
    return text


def _not_json(node: yaml.Node, problem: str) -> NoReturn:
    raise ConstructorError(problem=problem, problem_mark=node.start_mark)


JsonConstructor.add_constructor("tag:yaml.org,2002:str", JsonConstructor.construct_json_str)
JsonConstructor.add_constructor("tag:yaml.org,2002:timestamp", JsonConstructor.construct_json_str)
JsonConstructor.add_constructor("tag:yaml.org,2002:int", JsonConstructor.construct_json_int)
JsonConstructor.add_constructor("tag:yaml.org,2002:float", JsonConstructor.construct_json_float)
for _tag in ("binary", "set", "omap", "pairs"):
    JsonConstructor.add_constructor(f"tag:yaml.org,2002:{_tag}", JsonConstructor.construct_not_json)


class JsonLoader(JsonConstructor, yaml.SafeLoader):
    """The JSON values of YAML text, read by the Python parser."""


class CJsonLoader(JsonConstructor, yaml.CSafeLoader):
    """The JSON values of YAML text, read by libyaml."""


def parsed(text: str, fast: type, slow: type, read: Callable[[Any], T]) -> T:
    """What `read` makes of a loader of `text`: libyaml's (`fast`) and, should it refuse the
    text, the Python parser's (`slow`, the same constructor), whose error is the one raised."""
    try:
        return _read(fast(text), read)
    except yaml.YAMLError:
        pass  # refused: read again below, to say why as the Python parser says it
    return _read(slow(text), read)


def _read(loader, read: Callable[[Any], T]) -> T:
    try:
        return read(loader)
    finally:
        loader.dispose()


def load(text: str) -> Any:
    """The one document in `text`, checked first."""
    check(text)
    return parsed(text, CJsonLoader, JsonLoader, lambda loader: loader.get_single_data())


def load_all(text: str) -> list[Any]:
    """Every document in `text`, checked first."""
    check(text)
    return parsed(text, CJsonLoader, JsonLoader, documents)


def documents(loader) -> list[Any]:
    """Every document a loader reads."""
    found = []
    while loader.check_data():
        found.append(loader.get_data())
    return found


def depth(value: Any) -> int:
    """How many lists and mappings nest in a parsed value (e.g. from JSON), without recursion."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level + 1)
            pending.extend((child, level + 1) for child in item)
    return deepest
