"""One thread for all of a process's torch work.

libgomp, torch's OpenMP runtime on CPU, gives every thread that runs a parallel region a pool of worker
threads of its own, kept until that thread exits. Once a process's pools hold more threads than it has
CPUs, libgomp shortens every idle thread's spin to 100 iterations (its ``GOMP_SPINCOUNT`` documentation:
"if there are more OpenMP threads than available CPUs, 1000 and 100 spins are used"), so the workers sleep
between the thousands of small parallel regions of a decode loop and each region wakes them through the
kernel. A service that calls torch from whichever ``asyncio.to_thread`` worker is free ends up there:
measured on 2 cores, one policy-large generation (32 sequences × 32 tokens) took 1.45 s with about 6
voluntary context switches while its thread's pool was the only one, and 1.86 s with about 6,200 while a
second thread that had run one matmul was still alive.

:class:`ComputeThread` runs every call it is given on one long-lived thread, in submission order, so the
process keeps one pool. Work that must wait on this thread for other queued work (a partial-rollout batch
paused for a weight update that applies on this thread) calls :meth:`ComputeThread.serve_until`. Long work
that must not hold it runs in :func:`run_in_own_thread`, whose pool goes when the thread exits.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_STOP = object()


class ComputeThread:
    """A single worker thread with a FIFO queue; ``run`` awaits a call on it from the event loop."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError(f"{self._thread.name} is closed")
        future: Future[T] = Future()
        self._queue.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on this thread. Cancelled before it starts, the call never runs; once
        started it runs to the end (like ``asyncio.to_thread``)."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    @property
    def queued(self) -> bool:
        """Whether calls are waiting for this thread."""
        return not self._queue.empty()

    @property
    def ident(self) -> int | None:
        """The thread's identifier (``threading.get_ident()`` on it)."""
        return self._thread.ident

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run_queued(self) -> None:
        """Run the calls waiting now (from this thread only: work that waits for them)."""
        self._check_on_thread()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is _STOP:
                self._queue.put(_STOP)  # the outer loop stops after the waiting work returns
                return
            _execute(item)

    def serve_until(self, done: Future[Any], poll_s: float, keep_waiting: Callable[[], bool]) -> None:
        """Run queued calls on this thread until ``done`` completes; every ``poll_s`` without a call,
        ``keep_waiting()`` may end the wait (it raises or returns False: then RuntimeError)."""
        self._check_on_thread()
        wake = object()
        done.add_done_callback(lambda _: self._queue.put(wake))
        while not done.done():
            try:
                item = self._queue.get(timeout=poll_s)
            except queue.Empty:
                if not keep_waiting():
                    raise RuntimeError("stopped waiting on the compute thread") from None
                continue
            if item is _STOP:
                self._queue.put(_STOP)
                raise RuntimeError(f"{self._thread.name} closed while work waited on it")
            _execute(item)

    def close(self, wait: bool = True) -> None:
        """Stop after the calls queued so far; ``wait``: until the thread has."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        if wait and not self.on_thread():
            self._thread.join()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            _execute(item)

    def _check_on_thread(self) -> None:
        if not self.on_thread():
            raise RuntimeError(f"only {self._thread.name} may serve its queue")


async def run_in_own_thread(fn: Callable[..., T], *args: Any, name: str) -> T:
    """``fn(*args)`` on a new thread that exits when it returns, taking its OpenMP pool with it: for long
    torch work that must not hold a :class:`ComputeThread` (loading a model while another keeps serving)."""
    future: Future[T] = Future()

    threading.Thread(
        target=_execute, args=((future, functools.partial(fn, *args)),), name=name, daemon=True
    ).start()
    return await asyncio.wrap_future(future)


def _execute(item: Any) -> None:
    """Run a queued ``(future, call)`` into its future; anything else (a stale wake-up left by
    :meth:`ComputeThread.serve_until`) is skipped."""
    if not isinstance(item, tuple):
        return
    future, call = item
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = call()
    except BaseException as error:  # handed to the caller, as an executor does
        future.set_exception(error)
    else:
        future.set_result(result)
