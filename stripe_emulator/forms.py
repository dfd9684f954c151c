"""Stripe's form encoding (`a[b][0][c]=v`) decoded into nested values, read with their types.

The SDK sends every parameter as a string, lists with explicit indices (`lookup_keys[0]=a`);
other clients send `lookup_keys[]=a`. Both decode to lists.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import parse_qsl

from .errors import invalid, missing, unknown

_KEY = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
MAX_METADATA_KEYS = 50


def parse_form(text: str) -> dict[str, Any]:
    """Decode a form body or query string into dicts, lists and strings."""
    root: dict[str, Any] = {}
    for key, value in parse_qsl(text, keep_blank_values=True):
        match = _KEY.match(key)
        if not match:
            raise invalid(f"Invalid parameter name: {key}")
        path = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))]
        _assign(root, path, value, key)
    return _lists(root)


def _assign(node: dict[str, Any], path: list[str], value: str, key: str) -> None:
    for i, part in enumerate(path):
        if part == "":
            part = str(len(node))  # `a[]=x`: the next index
        if i == len(path) - 1:
            if isinstance(node.get(part), dict):
                raise invalid(f"Invalid parameter: {key} is both a value and a hash")
            node[part] = value
            return
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise invalid(f"Invalid parameter: {key} is both a value and a hash")
        node = child


def _lists(node: Any) -> Any:
    # A hash whose keys are all indices is an array, in index order.
    if not isinstance(node, dict):
        return node
    values = {k: _lists(v) for k, v in node.items()}
    if values and all(k.isdigit() for k in values):
        return [values[k] for k in sorted(values, key=int)]
    return values


class Params:
    """The parameters of one request (or one nested hash of them), read at the edge with types.

    Every reader raises Stripe's 400 for a missing or malformed value, so handlers only see
    valid ones; `only()` refuses parameters the endpoint does not take, as Stripe does.
    """

    def __init__(self, data: dict[str, Any], prefix: str = "") -> None:
        self.data = data
        self.prefix = prefix

    def name(self, key: str) -> str:
        """The parameter's full name as Stripe reports it (`recurring[meter]`)."""
        return f"{self.prefix}[{key}]" if self.prefix else key

    def only(self, *keys: str) -> None:
        """Refuse any parameter not listed (`expand` is always accepted and ignored)."""
        for key in self.data:
            if key not in keys and not (key == "expand" and not self.prefix):
                raise unknown(self.name(key))

    def has(self, key: str) -> bool:
        """True when the parameter was sent."""
        return key in self.data

    def text(self, key: str, *, required: bool = False, max_length: int = 5000) -> str | None:
        """A string; None when absent."""
        value = self.data.get(key)
        if value is None:
            if required:
                raise missing(self.name(key))
            return None
        if not isinstance(value, str):
            raise invalid(f"Invalid string: {self.name(key)}", param=self.name(key))
        if required and value == "":
            raise missing(self.name(key))
        if len(value) > max_length:
            raise invalid(
                f"Invalid {self.name(key)}: must be at most {max_length} characters",
                param=self.name(key),
            )
        return value

    def choice(self, key: str, choices: tuple[str, ...], *, required: bool = False) -> str | None:
        """One of a few strings."""
        value = self.text(key, required=required)
        if value is not None and value not in choices:
            raise invalid(
                f"Invalid {self.name(key)}: must be one of {', '.join(choices)}",
                param=self.name(key),
            )
        return value

    def integer(
        self, key: str, *, required: bool = False, minimum: int | None = None
    ) -> int | None:
        """An integer (Stripe's ints and timestamps)."""
        text = self.text(key, required=required)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            raise invalid(f"Invalid integer: {text}", param=self.name(key)) from None
        if minimum is not None and value < minimum:
            raise invalid(
                f"Invalid {self.name(key)}: must be greater than or equal to {minimum}",
                param=self.name(key),
            )
        return value

    def flag(self, key: str) -> bool | None:
        """`true`/`false`, as the SDK encodes booleans."""
        text = self.text(key)
        if text is None:
            return None
        if text not in ("true", "false"):
            raise invalid(f"Invalid boolean: {text}", param=self.name(key))
        return text == "true"

    def decimal(self, key: str, *, required: bool = False) -> Decimal | None:
        """A decimal string (`unit_amount_decimal`, meter values)."""
        text = self.text(key, required=required)
        if text is None:
            return None
        try:
            value = Decimal(text)
        except InvalidOperation:
            raise invalid(f"Invalid decimal: {text}", param=self.name(key)) from None
        if not value.is_finite():
            raise invalid(f"Invalid decimal: {text}", param=self.name(key))
        return value

    def hash(self, key: str, *, required: bool = False) -> Params | None:
        """A nested hash (`recurring[...]`)."""
        value = self.data.get(key)
        if value is None:
            if required:
                raise missing(self.name(key))
            return None
        if not isinstance(value, dict):
            raise invalid(f"Invalid hash: {self.name(key)}", param=self.name(key))
        return Params(value, self.name(key))

    def hashes(self, key: str, *, required: bool = False) -> list[Params]:
        """An array of hashes (`line_items[0][price]`)."""
        value = self.data.get(key)
        if value is None:
            if required:
                raise missing(self.name(key))
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise invalid(f"Invalid array: {self.name(key)}", param=self.name(key))
        return [Params(v, f"{self.name(key)}[{i}]") for i, v in enumerate(value)]

    def strings(self, key: str) -> list[str]:
        """An array of strings (`lookup_keys[0]`)."""
        value = self.data.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise invalid(f"Invalid array: {self.name(key)}", param=self.name(key))
        return value

    def metadata(self) -> dict[str, str] | None:
        """`metadata[k]=v` pairs; an empty value means "remove this key" on update."""
        value = self.data.get("metadata")
        if value is None:
            return None
        if value == "":
            return {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise invalid("Invalid metadata: must be a hash of strings", param="metadata")
        if len(value) > MAX_METADATA_KEYS:
            raise invalid("Invalid metadata: at most 50 keys", param="metadata")
        return value


def merge_metadata(current: dict[str, str], update: dict[str, str] | None) -> dict[str, str]:
    """Stripe's update semantics: keys merge, an empty value unsets, `metadata=""` clears."""
    if update is None:
        return current
    if not update:
        return {}
    merged = {**current, **update}
    return {k: v for k, v in merged.items() if v != ""}
