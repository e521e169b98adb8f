"""Many small calls as one RPC: the client side gathers concurrent calls into a batch, the server side
streams the batch's results back as they finish.

A unary RPC between two Python processes costs about half a millisecond of CPU on each side, however small
its message; a rollout that opens, steps and closes the episodes of one generation step makes dozens at
the same moment. ``Coalescer`` turns the calls made within one event-loop turn into one batch call;
``finished_groups`` runs a batch's entries concurrently on the server and yields them in groups, those
that finished together, so one streamed message carries them and a slow entry holds back only itself.

    opens = Coalescer(send=client.open_batch, orphan=client.close_opened)
    episode = await opens.call(request)        # joins the batch of this loop turn
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

# A batch sender: runs the items and yields ``(index, outcome)`` as entries finish, the outcome the entry's
# result or the exception its caller gets.
BatchSender = Callable[[list[ItemT]], AsyncIterator[tuple[int, "ResultT | BaseException"]]]


class Coalescer(Generic[ItemT, ResultT]):
    """Sends the calls made within one event-loop turn as one batch (``send``), at most ``max_batch`` per
    batch.

    Each caller gets its own entry's outcome; an exception ``send`` raises fails every entry still without
    one. A caller that stops waiting (cancelled, timed out) does not stop the batch; ``orphan`` receives
    its result when it arrives (to release what it holds, e.g. close an opened episode).
    """

    def __init__(
        self,
        send: BatchSender[ItemT, ResultT],
        *,
        max_batch: int,
        orphan: Callable[[ResultT], None] = lambda result: None,
    ) -> None:
        self._send = send
        self._max_batch = max_batch
        self._orphan = orphan
        self._pending: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def call(self, item: ItemT) -> ResultT:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultT] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((item, future))
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self._max_batch):
            task = asyncio.get_running_loop().create_task(self._run(pending[start : start + self._max_batch]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _run(self, batch: list[tuple[ItemT, asyncio.Future[ResultT]]]) -> None:
        failure: BaseException | None = None
        try:
            async for index, outcome in self._send([item for item, _ in batch]):
                if not 0 <= index < len(batch):
                    raise ValueError(f"the batch call answered entry {index} of a batch of {len(batch)}")
                self._deliver(batch[index][1], outcome)
        except Exception as exc:
            failure = exc
        finally:
            for _, future in batch:
                if not future.done():
                    future.set_exception(
                        failure or RuntimeError("the batch call ended without a result for it")
                    )

    def _deliver(self, future: asyncio.Future[ResultT], outcome: ResultT | BaseException) -> None:
        if future.done():  # its caller stopped waiting
            if not isinstance(outcome, BaseException):
                self._orphan(outcome)
        elif isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    async def drain(self) -> None:
        """Waits for the batches in flight (at shutdown)."""
        if self._sending:
            await asyncio.wait(self._sending)


async def finished_groups(entries: Iterable[Awaitable[ResultT]]) -> AsyncIterator[list[tuple[int, ResultT]]]:
    """Runs ``entries`` concurrently; yields ``(index, result)`` of those finished since the last group.

    An entry that raises fails the whole iteration (entries report their own failures as results); closing
    the iterator early, or its consumer being cancelled, cancels the entries still running.
    """
    tasks = {asyncio.ensure_future(entry): i for i, entry in enumerate(entries)}
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            yield [(tasks[task], task.result()) for task in done]
    finally:
        for task in tasks:
            task.cancel()
