"""Plain data between the two processes of a sandboxed test run: tagged JSON that keeps exact builtin types.

The code team's test harness (:mod:`unimas_workflows.code_harness`) judges values that the candidate's
process returns. They cross a pipe as text and are rebuilt here from scratch, so what the judge compares is
always a real ``int``, ``str``, ``list``, ... and never an object of the candidate's making (no ``__eq__``
that says yes to everything, no ``int`` subclass). No pickle: unpickling runs code chosen by the sender.

The encoding is JSON in which ``None``, ``bool`` and ``str`` are themselves and every other value is an
object with one type tag: ``{"int": "-1f"}`` (hexadecimal: no digit limit to trip on, exact),
``{"float": "0x1.8p+0"}`` (``float.hex``: exact, with ``nan``, ``inf`` and ``-0.0``),
``{"complex": [re, im]}``, ``{"bytes": "00ff"}``, ``{"list" | "tuple" | "set" | "frozenset": [...]}`` and
``{"dict": [[key, value], ...]}`` (so keys of any plain type, ``{1: 2}`` keeps its ``int`` key). Only these
exact types are accepted; subclasses, custom objects, generators, functions and ``bytearray`` are refused.

Size is bounded both ways: at most :data:`MAX_DEPTH` levels of nesting, :data:`MAX_ITEMS` values in all,
:data:`MAX_INT_HEX_DIGITS` hexadecimal digits per integer and :data:`MAX_MESSAGE_BYTES` of text.

This module runs in the unimas process (tests) and, as a copy of its source, inside the sandbox on both
sides of the pipe, so it imports only the standard library.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 100
MAX_ITEMS = 100_000
MAX_INT_HEX_DIGITS = 10_000
MAX_FLOAT_TEXT = 40
MAX_MESSAGE_BYTES = 8 << 20
HEX_INT = re.compile(r"-?[0-9a-f]+")
HEX_BYTES = re.compile(r"(?:[0-9a-f]{2})*")
SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class NotPlainData(ValueError):
    """A value (or a text) that is not plain data within the limits."""


def dumps(value: Any) -> str:
    """``value`` as one line of tagged JSON; :class:`NotPlainData` when it is not plain data or too large."""
    text = json.dumps(_Encoder().tagged(value, 0), ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_MESSAGE_BYTES:
        raise NotPlainData(f"the value takes more than {MAX_MESSAGE_BYTES} bytes")
    return text


def loads(text: str | bytes) -> Any:
    """The value :func:`dumps` wrote, rebuilt with exact builtin types; :class:`NotPlainData` for anything else."""
    if len(text) > MAX_MESSAGE_BYTES:
        raise NotPlainData(f"the message is longer than {MAX_MESSAGE_BYTES} bytes")
    try:
        tree = json.loads(text)
    except RecursionError:
        raise NotPlainData("the message is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or a bare integer past Python's digit limit
        raise NotPlainData(f"the message is not JSON: {exc}") from None
    return _Decoder().value(tree, 0)


class _Walk:
    """One walk over a value (encoding) or a message (decoding): the same item and depth limits both ways."""

    def __init__(self, what: str):
        self.items = 0
        self.what = what

    def visit(self, depth: int) -> None:
        """Count one more item at ``depth``; past a limit, :class:`NotPlainData`."""
        self.items += 1
        if self.items > MAX_ITEMS:
            raise NotPlainData(f"the {self.what} holds more than {MAX_ITEMS} items")
        if depth > MAX_DEPTH:
            raise NotPlainData(f"the {self.what} is nested deeper than {MAX_DEPTH} levels")


class _Encoder(_Walk):
    """One value's walk: counts items across the whole value."""

    def __init__(self):
        super().__init__("value")

    def tagged(self, value: Any, depth: int) -> Any:
        self.visit(depth)
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            digits = format(value, "x")
            if len(digits.lstrip("-")) > MAX_INT_HEX_DIGITS:
                raise NotPlainData(f"the integer has more than {MAX_INT_HEX_DIGITS} hexadecimal digits")
            return {"int": digits}
        if kind is float:
            return {"float": value.hex()}
        if kind is complex:
            return {"complex": [value.real.hex(), value.imag.hex()]}
        if kind is bytes:
            if 2 * len(value) > MAX_MESSAGE_BYTES:
                raise NotPlainData(f"the bytes are longer than {MAX_MESSAGE_BYTES // 2}")
            return {"bytes": value.hex()}
        for tag, sequence in SEQUENCES.items():
            if kind is sequence:
                return {tag: [self.tagged(item, depth + 1) for item in value]}
        if kind is dict:
            return {"dict": [[self.tagged(key, depth + 1), self.tagged(item, depth + 1)]
                             for key, item in value.items()]}
        raise NotPlainData(f"a {kind.__name__} is not plain data")


class _Decoder(_Walk):
    """One message's walk over the parsed JSON: exact types, and the same limits as the encoder."""

    def __init__(self):
        super().__init__("message")

    def value(self, tree: Any, depth: int) -> Any:
        self.visit(depth)
        if tree is None or type(tree) is bool or type(tree) is str:
            return tree
        if type(tree) is not dict or len(tree) != 1:
            raise NotPlainData(f"a bare JSON {type(tree).__name__} is not a tagged value")
        [(tag, payload)] = tree.items()
        if tag == "int":
            return self.integer(payload)
        if tag == "float":
            return self.real(payload)
        if tag == "complex":
            if type(payload) is not list or len(payload) != 2:
                raise NotPlainData("a complex is a list of two floats")
            return complex(self.real(payload[0]), self.real(payload[1]))
        if tag == "bytes":
            if type(payload) is not str or not HEX_BYTES.fullmatch(payload):
                raise NotPlainData("bytes are an even-length lowercase hexadecimal string")
            return bytes.fromhex(payload)
        if tag in SEQUENCES:
            if type(payload) is not list:
                raise NotPlainData(f"a {tag} is a JSON list")
            items = [self.value(item, depth + 1) for item in payload]
            return items if tag == "list" else self.collection(SEQUENCES[tag], items)
        if tag == "dict":
            return self.mapping(payload, depth)
        raise NotPlainData(f"unknown type tag {tag[:40]!r}")

    @staticmethod
    def integer(payload: Any) -> int:
        if (type(payload) is not str or len(payload.lstrip("-")) > MAX_INT_HEX_DIGITS
                or not HEX_INT.fullmatch(payload)):
            raise NotPlainData(f"an int is at most {MAX_INT_HEX_DIGITS} lowercase hexadecimal digits")
        return int(payload, 16)

    @staticmethod
    def real(payload: Any) -> float:
        if type(payload) is not str or len(payload) > MAX_FLOAT_TEXT:
            raise NotPlainData("a float is the short text of float.hex")
        try:
            return float.fromhex(payload)
        except (ValueError, OverflowError):
            raise NotPlainData(f"{payload!r} is not a float.hex text") from None

    @staticmethod
    def collection(kind: type, items: list) -> Any:
        try:
            return kind(items)
        except TypeError:  # a set's items must be hashable
            raise NotPlainData(f"a {kind.__name__} item is not hashable") from None

    def mapping(self, payload: Any, depth: int) -> dict:
        if type(payload) is not list:
            raise NotPlainData("a dict is a JSON list of [key, value] pairs")
        result = {}
        for pair in payload:
            if type(pair) is not list or len(pair) != 2:
                raise NotPlainData("a dict is a JSON list of [key, value] pairs")
            key = self.value(pair[0], depth + 1)
            try:
                hash(key)
            except TypeError:
                raise NotPlainData(f"a dict key of type {type(key).__name__} is not hashable") from None
            result[key] = self.value(pair[1], depth + 1)
        return result
