"""Paths a caller names, checked against the directories a server allows (weights, runs, data, secrets).

A hostile path may hold a NUL byte, loop through symlinks, or leave an allowed directory through ``..`` or
a symlink; each check here works on the path with all of that resolved, so only where it really leads counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def resolve_path(path: str | Path, base: Path | None = None) -> Path:
    """``path`` (relative paths taken relative to ``base``, else the working directory) with every symlink
    and ``..`` resolved. ValueError saying why when it cannot be: a NUL byte, a symlink loop, a long name."""
    text = str(path)
    if "\x00" in text:
        raise ValueError("contains a NUL byte")
    try:
        return ((base / text) if base is not None else Path(text)).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop
        raise ValueError(f"cannot be resolved: {exc}") from exc


def is_within(path: Path, roots: Iterable[Path]) -> bool:
    """Whether the resolved ``path`` lies in one of the (resolved) ``roots``."""
    return any(path.is_relative_to(root) for root in roots)
