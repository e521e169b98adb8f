"""Reading a protobuf Struct (request metadata, params) as plain JSON values, strictly and within limits.

Shared by every codec that reads a caller's Struct (``reward_service.codec``, ``grpo_runtime.env_codec``), so
the same NaN, nesting and size checks apply wherever one arrives. Reading costs time linear in the Struct
and refuses early: it stops converting once the Struct is past the size it may have, and a field path is
only spelt out for the error that names it (building one per value would cost the path's length for every
value under it).
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import struct_pb2

from grpo_runtime.errors import InvalidArgument

# Nesting allowed in metadata and params (objects and lists together). protobuf's decoder already refuses
# about 48 Struct levels; this keeps what parses within what rewards and JSON tools handle comfortably.
MAX_STRUCT_DEPTH = 32
# Characters of one caller-chosen key shown in a field path; the whole details are cut anyway.
PATH_KEY_CHARS = 64


class _Refused(Exception):
    """A value a Struct may not hold; ``steps`` is its path inside the Struct, innermost first, filled in
    while the exception travels up (so a path is built once, for the error, not for every value)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.steps: list[str] = []


class _OverBudget(Exception):
    """The Struct holds more than its budget; the error names the whole Struct."""


class _Budget:
    """The characters a Struct may still hold, counted as the reward scorer's ``json_chars``
    counts them (every string, keys included, plus one per other value); None = no limit."""

    def __init__(self, max_chars: int | None) -> None:
        self.left = max_chars if max_chars is not None else math.inf

    def spend(self, chars: int) -> None:
        self.left -= chars
        if self.left < 0:
            raise _OverBudget()


def _path(steps: list[str]) -> str:
    return "".join(reversed(steps))


def _key_step(key: str) -> str:
    return f".{key[:PATH_KEY_CHARS]}..." if len(key) > PATH_KEY_CHARS else f".{key}"


def struct_dict(
    value: struct_pb2.Struct, field: str, *, max_chars: int | None = None, limit_name: str = ""
) -> dict[str, Any]:
    """A Struct as plain JSON values. InvalidArgument naming ``field.<path>`` for a NaN/inf number or
    nesting past MAX_STRUCT_DEPTH (no JSON value is either), and naming ``field`` as soon as the Struct is
    past ``max_chars`` characters (``limit_name`` is the setting that says so): the rest is never read."""
    budget = _Budget(max_chars)
    try:
        return _fields(value, budget, 1)
    except _Refused as refused:
        raise InvalidArgument(refused.message, field=field + _path(refused.steps)) from None
    except _OverBudget:
        raise InvalidArgument(f"more than {limit_name}={max_chars} characters", field=field) from None


def _fields(value: struct_pb2.Struct, budget: _Budget, depth: int) -> dict[str, Any]:
    budget.spend(1)
    out = {}
    for key, item in value.fields.items():
        budget.spend(len(key))
        try:
            out[key] = _plain(item, budget, depth)
        except _Refused as refused:
            refused.steps.append(_key_step(key))
            raise
    return out


def _plain(value: struct_pb2.Value, budget: _Budget, depth: int) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        text = value.string_value
        budget.spend(len(text))
        return text
    if kind in ("struct_value", "list_value") and depth >= MAX_STRUCT_DEPTH:
        raise _Refused(f"nested deeper than {MAX_STRUCT_DEPTH} levels")
    if kind == "struct_value":
        return _fields(value.struct_value, budget, depth + 1)
    budget.spend(1)
    if kind == "list_value":
        return _items(value.list_value, budget, depth + 1)
    if kind == "number_value":
        if not math.isfinite(value.number_value):
            raise _Refused(f"must be a finite number, got {value.number_value}")
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    return None  # null_value, or no kind set (JSON null, as json_format reads it)


def _items(value: struct_pb2.ListValue, budget: _Budget, depth: int) -> list[Any]:
    items = []
    for i, item in enumerate(value.values):
        try:
            items.append(_plain(item, budget, depth))
        except _Refused as refused:
            refused.steps.append(f"[{i}]")
            raise
    return items
