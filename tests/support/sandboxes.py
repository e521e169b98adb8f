"""Counting the sandboxes a test's in-process code runner has started."""

from __future__ import annotations

import contextlib

import psutil


def running_sandboxes() -> int:
    """Sandboxes this process has started and not reaped (as root, setpriv execs bwrap in place). A child
    reaped between being listed and being read is not counted."""
    count = 0
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            count += child.name() in ("bwrap", "setpriv")
    return count
