"""An event loop in a thread of its own, for synchronous code that makes async calls again and again.

``asyncio.run`` per call builds a loop, and whatever lives on a loop (a ``grpc.aio`` channel and its
connection) with it, every time; a :class:`LoopThread` keeps one loop, so those are made once. Calls from
several threads at once run concurrently on it.

    loop = LoopThread("agent-episodes")
    result = loop.run(coroutine())   # blocks this thread until the coroutine is done
    loop.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A daemon thread running one event loop, started on the first :meth:`run`; :meth:`close` stops it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs ``coroutine`` on the loop and returns its result (or raises its exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._started()).result()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
            return self._loop

    def close(self, cleanup: Coroutine[Any, Any, Any] | None = None) -> None:
        """Runs ``cleanup`` on the loop (closing what lives there), then stops the thread; a loop never
        started only discards ``cleanup``."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            if cleanup is not None:
                cleanup.close()
            return
        if cleanup is not None:
            asyncio.run_coroutine_threadsafe(cleanup, loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
