"""Batches concurrent Generate calls into one engine call.

Calls arriving within ``window_s`` of the first queued one (up to ``max_rows`` sequences) form
one batch; the engine samples them together. A caller that goes away (cancelled RPC, exceeded
deadline) sets its job's cancel token: a queued job is skipped, a running one stops at the next
decode step.

A caller that submits job after job (an episode between its turns, a gateway session whose agent
runs a tool between model calls) registers a :class:`Caller`. While some registered caller has no
job queued or running, the batch being formed waits for it up to ``gather_s`` after its first job
instead of ``window_s``: the episodes that left one batch together come back as one batch, not one
per environment reply. Once the last of them is in, the batch runs without waiting out the window.
An engine batch runs to its end, so a straggler that misses the batch would wait for all of it and
then run alone. A caller counts as waited for again the moment its job's batch ends, before the
next batch forms.

Jobs that may continue across weight updates (partial rollouts) and jobs that must come from one
version never share a batch: a job of the other kind ends the window and starts the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rollout_service.types import GenerationJob

BatchRunner = Callable[[list[GenerationJob]], Awaitable[None]]
# Put on the queue when no caller is waited for any more, so that a forming batch stops waiting.
_WAKE = None


class Caller:
    """A registered caller of :meth:`BatchScheduler.submit` (:meth:`BatchScheduler.caller`); :meth:`close`
    it (or leave its ``with`` block) when it will submit no more. Batches wait for it while it is open, has
    no job queued or running and is not :meth:`idle`."""

    def __init__(self, scheduler: BatchScheduler) -> None:
        self._scheduler = scheduler
        self._jobs = 0  # queued or running
        self._open = True
        self._idle = False
        self._waited_for = False
        self._recount()

    def __enter__(self) -> Caller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._open = False
        self._recount()

    def idle(self) -> None:
        """Not waited for until its next job: it may submit again, but not soon (an agent that got a final
        answer rather than tool calls)."""
        self._idle = True
        self._recount()

    def _submitted(self) -> None:
        self._jobs += 1
        self._idle = False
        self._recount()

    def _returned(self) -> None:
        self._jobs -= 1
        self._recount()

    def _recount(self) -> None:
        waited_for = self._open and not self._jobs and not self._idle
        if waited_for != self._waited_for:
            self._waited_for = waited_for
            self._scheduler._count_waited_for(1 if waited_for else -1)


@dataclass(eq=False)
class _Entry:
    job: GenerationJob
    future: asyncio.Future[None]
    caller: Caller | None
    settled: bool = False  # its caller was told the job is over

    def settle(self) -> None:
        if not self.settled:
            self.settled = True
            if self.caller is not None:
                self.caller._returned()


class BatchScheduler:
    def __init__(
        self,
        run_batch: BatchRunner,
        *,
        window_s: float = 0.005,
        gather_s: float = 0.05,
        max_rows: int = 256,
    ) -> None:
        self._run_batch = run_batch
        self._window_s = window_s
        self._gather_s = max(gather_s, window_s)
        self._max_rows = max_rows
        self._queue: asyncio.Queue[_Entry | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # A job taken from the queue that did not fit the batch being formed (the other kind): it
        # starts the next one.
        self._held: _Entry | None = None
        self._waiting_for = 0  # callers the batch being formed waits for (Caller)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="rollout-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        waiting = [entry for _ in range(self._queue.qsize()) if (entry := self._queue.get_nowait())]
        if self._held is not None:
            waiting.append(self._held)
            self._held = None
        for entry in waiting:
            entry.job.cancel.cancel()
            entry.settle()
            if not entry.future.done():
                entry.future.cancel()

    def caller(self) -> Caller:
        """Register a caller that will submit jobs one after another (module docstring)."""
        return Caller(self)

    async def submit(self, job: GenerationJob, caller: Caller | None = None) -> None:
        """Queue a job and wait until the engine filled ``job.results``."""
        entry = _Entry(job, asyncio.get_running_loop().create_future(), caller)
        if caller is not None:
            caller._submitted()
        self._queue.put_nowait(entry)
        try:
            await entry.future
        except asyncio.CancelledError:
            job.cancel.cancel()  # stops the engine at its next decode step
            entry.settle()
            raise

    def _count_waited_for(self, change: int) -> None:
        self._waiting_for += change
        if not self._waiting_for:
            self._queue.put_nowait(_WAKE)

    async def _loop(self) -> None:
        while True:
            batch = [await self._first()]
            rows = batch[0].job.num_rows
            started = time.monotonic()
            while rows < self._max_rows:
                wait = self._gather_s if self._waiting_for else self._window_s
                remaining = started + wait - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    entry = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
                if entry is _WAKE:
                    if not self._waiting_for:
                        break  # every caller it waited for is in: the window would only delay them
                    continue
                if not self._admit(entry, batch):
                    break
                rows += entry.job.num_rows
            # What is queued by now joins too (a job submitted in the same tick as the last wake-up).
            while rows < self._max_rows and not self._queue.empty() and self._held is None:
                entry = self._queue.get_nowait()
                if entry is not _WAKE and self._admit(entry, batch):
                    rows += entry.job.num_rows
            await self._run(batch)

    async def _first(self) -> _Entry:
        """The job that opens the next batch: the held one, else the next queued."""
        first, self._held = self._held, None
        while first is None:
            first = await self._queue.get()
        return first

    def _admit(self, entry: _Entry, batch: list[_Entry]) -> bool:
        """Add ``entry`` to ``batch`` if of the batch's kind; otherwise hold it for the next batch."""
        if entry.job.continue_across_updates != batch[0].job.continue_across_updates:
            self._held = entry
            return False
        batch.append(entry)
        return True

    async def _run(self, batch: list[_Entry]) -> None:
        live = [e for e in batch if not e.future.done() and not e.job.cancel.cancelled]
        error: Exception | None = None
        if live:
            try:
                await self._run_batch([e.job for e in live])
            except Exception as exc:  # every caller of the batch gets the error
                error = exc
        for entry in batch:
            entry.settle()
        for entry in live:
            if entry.future.done():
                continue
            if error is None:
                entry.future.set_result(None)
            else:
                entry.future.set_exception(error)
