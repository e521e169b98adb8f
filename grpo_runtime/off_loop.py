"""Work on a request's data: on the event loop when it is small, else in a worker thread.

A hop to a worker thread and back costs little alone, but under load the event loop and the workers take
turns on the GIL (a holder keeps it up to ``sys.getswitchinterval()``, 5 ms), so a call that makes several
hops waits milliseconds at each when a batch's calls arrive together. Work bounded to about a millisecond
costs less inline; work that grows with an input of any size goes to a thread, so it never holds the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def off_loop_unless(small: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``: called here when ``small`` (its cost bounded by the caller's size check),
    else in a worker thread (``asyncio.to_thread``)."""
    if small:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)
