"""Hostile inputs more than one test layer sends: an alias-bomb YAML, a deeply nested Struct value, a deeply
nested JSON Schema, and a process that holds a run's output directory lock as a live worker left by another
service process would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from google.protobuf import struct_pb2

_HOLD_LOCK = """
import sys, time
from pathlib import Path
from trainer_service.core.output_dir import hold_lock
hold_lock(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs" YAML: each level lists the previous one 9 times, 9**levels scalars in all, from
    9 × (levels - 1) aliases."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def nested_value(levels: int) -> struct_pb2.Value:
    """``[[...[1]...]]`` with ``levels`` lists around the number."""
    value = struct_pb2.Value()
    leaf = value
    for _ in range(levels):
        leaf = leaf.list_value.values.add()
    leaf.number_value = 1
    return value


def nested_schema(objects: int) -> dict:
    """An object schema whose one property nests ``objects`` object schemas deep: 2 × objects - 1 levels of
    JSON objects (each ``properties`` is one)."""
    schema: dict = {"type": "object"}
    for _ in range(objects - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@contextmanager
def output_lock_holder(output_dir: Path) -> Iterator[int]:
    """A separate process holding ``output_dir``'s run lock until the block ends; yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(output_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()
