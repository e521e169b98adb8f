"""Reading caller-named files only inside one allowed root (LoadWeights' ``path``).

A path a caller names is hostile: it may point outside the root (absolute, ``..``, a symlink),
at a FIFO (``open()`` blocks until a writer appears: forever), at a device (``/dev/zero``
reads forever), at a directory, or be swapped for one of those between a check and the
open. So every file is

1. resolved (symlinks and ``..`` followed) and refused with PERMISSION_DENIED unless the result
   lies under the root;
2. opened with ``O_NONBLOCK`` (a FIFO then opens at once instead of blocking) and
   ``O_NOFOLLOW`` (a symlink swapped in after step 1 fails to open);
3. checked on the open descriptor: a regular file (``fstat``), still under the root (the
   descriptor's own path, ``/proc/self/fd``), no larger than the size cap; then read whole.

Callers run these functions in a worker thread: reading a large file takes a while.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from grpo_runtime.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from grpo_runtime.paths import is_within, resolve_path

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def resolve_under(root: Path, path: str | Path, field: str) -> Path:
    """``path`` (relative paths are taken relative to ``root``) with every symlink and ``..``
    resolved; PERMISSION_DENIED unless it lies under ``root`` (itself already resolved)."""
    text = str(path)
    if not text:
        raise InvalidArgument("must be a non-empty path", field=field)
    try:
        resolved = resolve_path(text, root)
    except ValueError as exc:
        raise InvalidArgument(f"{text!r} {exc}", field=field) from exc
    if not is_within(resolved, (root,)):
        raise PermissionDenied(f"{text!r} is outside the server's weights_root {str(root)!r}", field=field)
    return resolved


def confined_directory(root: Path, path: str | Path, field: str) -> Path:
    """A directory under ``root`` (see :func:`resolve_under`); INVALID_ARGUMENT if it is none."""
    directory = resolve_under(root, path, field)
    if not directory.is_dir():
        raise InvalidArgument(f"{str(path)!r} is not a directory", field=field)
    return directory


def open_confined(root: Path, path: Path, field: str) -> tuple[int, os.stat_result]:
    """(descriptor, its ``fstat``) of the regular file ``path`` under ``root``, opened read-only as the
    module docstring says (steps 1-3, without the size cap); the caller closes it."""
    resolved = resolve_under(root, path, field)
    try:
        fd = os.open(resolved, _OPEN_FLAGS)
    except OSError as exc:
        raise InvalidArgument(f"cannot open {path.name!r} ({exc.strerror})", field=field) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgument(f"{path.name!r} is not a regular file", field=field)
        opened = _descriptor_path(fd)
        if opened is not None and not is_within(opened, (root,)):
            raise PermissionDenied(f"{path.name!r} is outside the server's weights_root", field=field)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_confined(root: Path, path: Path, max_bytes: int, field: str) -> memoryview:
    """The bytes of the regular file ``path`` under ``root`` (a writable view, so the payload
    parser takes tensors from it without a copy), at most ``max_bytes`` of them
    (RESOURCE_EXHAUSTED beyond, before anything is read)."""
    fd, info = open_confined(root, path, field)
    try:
        if info.st_size > max_bytes:
            raise ResourceExhausted(
                f"{path.name!r} has {info.st_size} bytes, more than the {max_bytes} the server's "
                "limit max_weight_bytes leaves",
                field=field,
            )
        # np.empty, not bytearray: zero-filling hundreds of MB holds the GIL (and so the event
        # loop); the pages are first touched by the read, which releases it.
        view = np.empty(info.st_size, dtype=np.uint8).data
        done = 0
        while done < len(view):
            got = os.readv(fd, [view[done:]])
            if got == 0:
                raise InvalidArgument(f"{path.name!r} shrank while it was read", field=field)
            done += got
        return view
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path.name!r} ({exc.strerror})", field=field) from exc
    finally:
        os.close(fd)


def _descriptor_path(fd: int) -> Path | None:
    """The path the kernel has for an open descriptor (None where /proc is not mounted)."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None
