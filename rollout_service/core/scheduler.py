"""Batches concurrent Generate calls into one engine call.

Calls arriving within ``window_s`` of the first queued one (up to ``max_rows`` sequences) form
one batch; the engine samples them together. A caller that goes away (cancelled RPC, exceeded
deadline) sets its job's cancel token: a queued job is skipped, a running one stops at the next
decode step.

Jobs that may continue across weight updates (partial rollouts) and jobs that must come from one
version never share a batch: a job of the other kind ends the window and starts the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from rollout_service.types import GenerationJob

BatchRunner = Callable[[list[GenerationJob]], Awaitable[None]]


class BatchScheduler:
    def __init__(self, run_batch: BatchRunner, *, window_s: float = 0.005, max_rows: int = 256) -> None:
        self._run_batch = run_batch
        self._window_s = window_s
        self._max_rows = max_rows
        self._queue: asyncio.Queue[tuple[GenerationJob, asyncio.Future[None]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # A job taken from the queue that did not fit the batch being formed (the other kind): it
        # starts the next one.
        self._held: tuple[GenerationJob, asyncio.Future[None]] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="rollout-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        waiting = [self._queue.get_nowait() for _ in range(self._queue.qsize())]
        if self._held is not None:
            waiting.append(self._held)
            self._held = None
        for job, future in waiting:
            job.cancel.cancel()
            if not future.done():
                future.cancel()

    async def submit(self, job: GenerationJob) -> None:
        """Queue a job and wait until the engine filled ``job.results``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((job, future))
        try:
            await future
        except asyncio.CancelledError:
            job.cancel.cancel()  # stops the engine at its next decode step
            raise

    async def _loop(self) -> None:
        while True:
            first, self._held = self._held, None
            batch = [first if first is not None else await self._queue.get()]
            partial = batch[0][0].continue_across_updates
            rows = batch[0][0].num_rows
            deadline = time.monotonic() + self._window_s
            while rows < self._max_rows:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
                if item[0].continue_across_updates != partial:
                    self._held = item
                    break
                batch.append(item)
                rows += item[0].num_rows
            live = [(job, fut) for job, fut in batch if not fut.done() and not job.cancel.cancelled]
            if not live:
                continue
            try:
                await self._run_batch([job for job, _ in live])
            except Exception as exc:  # every caller of the batch gets the error
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for _, fut in live:
                if not fut.done():
                    fut.set_result(None)
