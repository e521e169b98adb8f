"""The keys of a config model as dotted paths, and the nearest valid key to a misspelt one.

Used by the run config's error messages (``training.num_generation: unknown key; did you mean
training.generation.num_generations?``) and by ``scripts/gen_config_docs.py``, so both see the same keys.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo

# difflib similarity a suggestion needs (get_close_matches' default).
SUGGESTION_CUTOFF = 0.6


@dataclass(frozen=True)
class ConfigKey:
    """One key: its dotted path (list entries as ``[]``: ``training.tools.environments[].name``), its field,
    and the block (nested model) it holds, if any."""

    path: str
    field: FieldInfo
    block: type[BaseModel] | None


def nested_block(annotation: object) -> type[BaseModel] | None:
    """The model a field holds, directly, as an optional or as list entries; None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return nested_block(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list):
        blocks = [block for arg in typing.get_args(annotation) if (block := nested_block(arg)) is not None]
        return blocks[0] if blocks else None
    return None


def _entry_path(annotation: object, path: str) -> str:
    """``path[]`` when the field holds a list of blocks (keys inside are per entry), else ``path``."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return f"{path}[]"
    if origin in (typing.Union, types.UnionType):
        return next(
            (_entry_path(arg, path) for arg in typing.get_args(annotation) if arg is not type(None)), path
        )
    return path


def config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[ConfigKey]:
    """Every key of ``model``, depth first: a block's own key, then the keys inside it."""
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        block = nested_block(field.annotation)
        yield ConfigKey(path, field, block)
        if block is not None:
            yield from config_keys(block, _entry_path(field.annotation, path))


def _shared_prefix(a: str, b: str) -> int:
    return len([1 for x, y in zip(a.split("."), b.split("."), strict=False) if x == y])


def nearest_key(path: str, model: type[BaseModel]) -> str | None:
    """The valid key of ``model`` nearest to the unknown dotted ``path``: among its siblings and among the
    last segments of all keys (so a key in the wrong block is found in its own), or None when none is close.

    A sibling wins a tie; of several keys with the same last segment, the one sharing most of ``path``'s
    parents wins.
    """
    parent, _, name = re.sub(r"\[\d+\]", "[]", path).rpartition(".")
    keys = [key.path for key in config_keys(model)]
    candidates: dict[str, str] = {}
    for key in sorted(keys, key=lambda key: _shared_prefix(key, path)):
        candidates[key.rpartition(".")[2]] = key
    siblings = {key.rpartition(".")[2]: key for key in keys if key.rpartition(".")[0] == parent}
    candidates.update(siblings)
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=SUGGESTION_CUTOFF)
    return candidates[matches[0]] if matches else None
