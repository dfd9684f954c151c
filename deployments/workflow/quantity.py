"""Kubernetes quantities ("15Gi", "500m", "1e3") in CEL, as Kubernetes' own CEL library offers
them (`quantity()`, `isQuantity()`, and the methods below; see
https://kubernetes.io/docs/reference/using-api/cel/#kubernetes-quantity-library).

A condition compares a size as a quantity, not as text: a volume of "15Gi" may be reported as
"16106127360", or rounded up by its provisioner to "16Gi", and both hold 15Gi.

    cel: quantity(self.status.capacity.storage).compareTo(quantity("15Gi")) >= 0

Values are exact (Decimal). A quantity's text is at most MAX_TEXT characters and its exponent
at most MAX_EXPONENT, so that no spec can make one that takes unbounded time or memory.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal

MAX_TEXT = 64
MAX_EXPONENT = 40  # 10**40: beyond any size a cluster reports (an exabyte is 10**18)
_EXACT = Context(prec=120)  # wide enough for MAX_TEXT digits times any suffix, exactly
_FORM = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE])?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}  # powers of 1024
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_INT64 = 2**63


class QuantityError(ValueError):
    """Text that is not a quantity, or an operation a quantity cannot make."""


class Quantity:
    """A Kubernetes quantity: its exact value, and the text it was written as."""

    __slots__ = ("text", "value")

    def __init__(self, value: Decimal, text: str) -> None:
        self.value = value
        self.text = text

    @classmethod
    def parse(cls, text: str) -> Quantity:
        found = _FORM.fullmatch(text) if len(text) <= MAX_TEXT else None
        if found is None:
            raise QuantityError(f"{text[:MAX_TEXT]!r} is not a quantity (like 15Gi, 500m or 1e3)")
        number, suffix = Decimal(found.group(1)), found.group(2) or ""
        if suffix in _BINARY:
            value = _EXACT.multiply(number, Decimal(1024) ** _BINARY[suffix])
        else:
            exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
            if abs(exponent) > MAX_EXPONENT:
                raise QuantityError(f"{text!r}: an exponent beyond {MAX_EXPONENT}")
            value = number.scaleb(exponent, _EXACT)
        return cls(value, text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __str__(self) -> str:
        return self.text


def _other(value: object) -> Decimal:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    raise QuantityError(f"a quantity is compared or added with a quantity or an int, not {value!r}")


def _made(value: Decimal) -> Quantity:
    return Quantity(value, format(value.normalize(_EXACT), "f"))


def is_quantity(text: object) -> bool:
    try:
        Quantity.parse(str(text))
    except QuantityError:
        return False
    return True


def as_integer(q: Quantity) -> int:
    if q.value != q.value.to_integral_value():
        raise QuantityError(f"{q.text} is not a whole number")
    whole = int(q.value)
    if not -_INT64 <= whole < _INT64:
        raise QuantityError(f"{q.text} does not fit in a 64-bit integer")
    return whole


def functions() -> dict:
    """The functions a CEL program may call, by name (a method `q.f(x)` is `f(q, x)`), made
    with celpy's types. Imported by the evaluator child only: celpy is not imported here at
    module level. A QuantityError comes back as CEL's error value, with its message (celpy
    would call a ValueError an overflow)."""
    import celpy
    from celpy import celtypes

    def compare(q: Quantity, other: object) -> int:
        theirs = _other(other)
        return (q.value > theirs) - (q.value < theirs)

    def erring(function):
        def call(*args):
            try:
                return function(*args)
            except QuantityError as exc:
                return celpy.CELEvalError(str(exc))

        return call

    table = {
        "quantity": lambda text: Quantity.parse(str(text)),
        "isQuantity": lambda text: celtypes.BoolType(is_quantity(text)),
        "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
        "isInteger": lambda q: celtypes.BoolType(q.value == q.value.to_integral_value()),
        "asInteger": lambda q: celtypes.IntType(as_integer(q)),
        "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
        "add": lambda q, other: _made(_EXACT.add(q.value, _other(other))),
        "sub": lambda q, other: _made(_EXACT.subtract(q.value, _other(other))),
        "compareTo": lambda q, other: celtypes.IntType(compare(q, other)),
        "isGreaterThan": lambda q, other: celtypes.BoolType(compare(q, other) > 0),
        "isLessThan": lambda q, other: celtypes.BoolType(compare(q, other) < 0),
    }
    return {name: erring(function) for name, function in table.items()}
