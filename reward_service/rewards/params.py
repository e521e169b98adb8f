"""Checks ``RewardSpec.params`` against a reward's declared parameters and fills in the defaults."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import ParamInfo

# Bounds of an array param (delimiters, names): rewards loop over its items for every sample.
MAX_ARRAY_ITEMS = 32
MAX_ITEM_CHARS = 1024


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list | tuple)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if not math.isfinite(value):
        return False
    # JSON/Struct carries every number as a double: 3.0 is a valid integer.
    return kind == "number" or float(value).is_integer()


def resolve_params(declared: Sequence[ParamInfo], given: Mapping[str, Any], field: str) -> dict[str, Any]:
    """Defaults overridden by ``given``; InvalidArgument naming ``<field>.<key>`` for an unknown key or bad
    value.

    ``field`` is the path of the params struct in the request, e.g. ``rewards[2].params``. An ``array`` is a
    non-empty list of at most MAX_ARRAY_ITEMS distinct non-empty strings of at most MAX_ITEM_CHARS, each
    one of ``choices`` when the param has choices; it is resolved to a tuple.
    """
    by_name = {p.name: p for p in declared}
    for key in given:
        if key not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise InvalidArgument(f"unknown parameter (accepted: {known})", field=f"{field}.{key}")
    resolved = {p.name: p.default for p in declared}
    for key, value in given.items():
        info = by_name[key]
        where = f"{field}.{key}"
        if not _type_ok(info.type, value):
            raise InvalidArgument(f"must be of type {info.type}, got {value!r}", field=where)
        if info.type == "integer":
            value = int(value)
        if info.type == "array":
            value = _string_list(value, info.choices, where)
        elif info.choices and value not in info.choices:
            raise InvalidArgument(f"must be one of {list(info.choices)}, got {value!r}", field=where)
        if info.minimum is not None and value < info.minimum:
            raise InvalidArgument(f"must be >= {info.minimum:g}, got {value!r}", field=where)
        if info.maximum is not None and value > info.maximum:
            raise InvalidArgument(f"must be <= {info.maximum:g}, got {value!r}", field=where)
        resolved[key] = value
    return resolved


def _string_list(value: Sequence[Any], choices: Sequence[Any], where: str) -> tuple[str, ...]:
    if not value:
        raise InvalidArgument("must list at least one value", field=where)
    if len(value) > MAX_ARRAY_ITEMS:
        raise InvalidArgument(f"{len(value)} values, at most {MAX_ARRAY_ITEMS}", field=where)
    seen: set[str] = set()
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise InvalidArgument(f"must be a non-empty string, got {item!r:.80}", field=f"{where}[{i}]")
        if len(item) > MAX_ITEM_CHARS:
            raise InvalidArgument(f"{len(item)} characters, at most {MAX_ITEM_CHARS}", field=f"{where}[{i}]")
        if choices and item not in choices:
            raise InvalidArgument(f"must be one of {list(choices)}, got {item!r}", field=f"{where}[{i}]")
        if item in seen:
            raise InvalidArgument(f"{item[:80]!r} is listed twice", field=f"{where}[{i}]")
        seen.add(item)
    return tuple(value)
