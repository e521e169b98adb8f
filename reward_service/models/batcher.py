"""Dynamic batching of reward-model forwards across concurrent requests.

Requests ``submit`` their sequences; a single loop task drains the queue into batches and runs each
batch as one padded forward in a dedicated worker thread (one per model, so forwards of a model never
overlap and the event loop keeps serving). A flush happens when

* the queue's padded size ``B x T_max`` would reach ``max_batch_tokens`` (tokens), or
* the oldest waiting sequence has waited ``max_wait_ms``.

Lengths are the tokens a forward computes for a sequence: ``suffix_tokens``, its whole length unless
it shares a prefix (whose KV cache the engine computes once, see ``prefix.py``). A flush takes every
queued sequence, sorts them by that length and cuts them into consecutive batches (``plan_batches``)
minimising ``sum over batches of (B x T_max + forward_overhead_tokens)`` with each batch within
``max_batch_tokens``; batches run back to back. Among all ways to split a set into batches of given
sizes, giving the longest sequences to one batch, the next longest to the next and so on never
raises a batch's T_max, so this optimum costs no more than any other split of the same sequences,
one forward per request included. While forwards run, new sequences queue up for the next flush, so
under load batches grow by themselves and the wait costs nothing. Each sequence's result is routed
to its own future; a request that is cancelled simply has its futures dropped.

With ``dynamic_batching=False`` each ``submit`` is flushed on its own (one forward per request, split
only where ``max_batch_tokens`` requires): the baseline the benchmark compares against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo_runtime.compute_thread import ComputeThread
from grpo_runtime.errors import Unavailable
from reward_service.models.planning import padded_cost, plan_batches, split_by_cost
from reward_service.models.sequences import Encoded

__all__ = ["DynamicBatcher", "padded_cost", "plan_batches", "split_by_cost"]

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    item: Encoded
    future: asyncio.Future
    enqueued: float  # loop.time(), seconds


class DynamicBatcher:
    """Merges the sequences of concurrent requests into padded forwards of one model.

    ``forward(batch) -> outputs`` (one output per item, same order) runs in the worker thread.
    Counters for metrics and tests: ``forward_calls`` (forwards run), ``sequences`` (sequences
    scored), ``largest_batch`` (most sequences in one forward), ``padded_tokens`` (sum of B x T).
    """

    def __init__(
        self,
        forward: Callable[[list[Encoded]], list[Any]],
        *,
        max_batch_tokens: int,
        max_wait_ms: float,
        dynamic: bool = True,
        forward_overhead_tokens: int = 64,
        name: str = "model",
        compute: ComputeThread | None = None,
    ) -> None:
        self._forward = forward
        self._max_batch_tokens = max_batch_tokens
        self._max_wait_s = max_wait_ms / 1000.0
        self._dynamic = dynamic
        self._overhead_tokens = forward_overhead_tokens
        # The forwards' thread: shared by the registry's models (grpo_runtime.compute_thread), or its own.
        self._owns_compute = compute is None
        self._compute = compute or ComputeThread(f"reward-model-{name}")
        self._queue: list[_Pending] = []
        self._flushing: list[_Pending] = []  # taken off the queue by the flush in progress
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self.forward_calls = 0
        self.sequences = 0
        self.largest_batch = 0
        self.padded_tokens = 0

    async def submit(self, items: list[Encoded]) -> list[Any]:
        """Outputs of ``items``, in order, once the batches holding them have run."""
        if self._closed:
            raise Unavailable("the model was unloaded")
        if not items:
            return []
        if not self._dynamic:
            outputs: list[Any] = []
            for chunk in split_by_cost(items, self._max_batch_tokens):
                outputs.extend(await self._run_forward(chunk))
            return outputs
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = [_Pending(item, loop.create_future(), now) for item in items]
        self._queue.extend(pending)
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="reward-model-batcher")
        self._wakeup.set()
        return list(await asyncio.gather(*(p.future for p in pending)))

    async def close(self) -> None:
        """Stop the loop, fail what still waits, release the worker thread."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pending in [*self._flushing, *self._queue]:
            if not pending.future.done():
                pending.future.set_exception(Unavailable("the model was unloaded"))
        self._queue, self._flushing = [], []
        if self._owns_compute:
            self._compute.close(wait=False)

    async def _run_forward(self, batch: list[Encoded]) -> list[Any]:
        outputs = await self._compute.run(self._forward, batch)
        self.forward_calls += 1
        self.sequences += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        self.padded_tokens += padded_cost(batch)
        return outputs

    def _queue_full(self) -> bool:
        return padded_cost([p.item for p in self._queue]) >= self._max_batch_tokens

    def _drop_cancelled(self) -> None:
        # Requests cancelled while waiting (client deadline) leave their futures behind.
        self._queue = [p for p in self._queue if not p.future.done()]

    async def _take_due(self) -> list[list[_Pending]]:
        """Everything queued, sorted by length and cut by ``plan_batches``.

        Sorting puts sequences of similar length together, so a flush of many requests pays for
        little padding: each batch's width is close to the length of every sequence in it. The
        plan is computed in the worker thread (it is O(n x batch size) Python).
        """
        self._drop_cancelled()
        due = sorted(self._queue, key=lambda p: p.item.suffix_tokens)
        self._queue, self._flushing = [], due
        sizes = await self._compute.run(
            plan_batches,
            [p.item.suffix_tokens for p in due],
            self._max_batch_tokens,
            self._overhead_tokens,
        )
        batches, start = [], 0
        for size in sizes:
            batches.append(due[start : start + size])
            start += size
        return batches

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline = self._queue[0].enqueued + self._max_wait_s
            while not self._queue_full() and (remaining := deadline - loop.time()) > 0:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
            for batch in await self._take_due():
                await self._run_batch(batch)

    async def _run_batch(self, batch: list[_Pending]) -> None:
        """One forward; each output goes to its own future, a failure to the futures of this batch."""
        batch = [p for p in batch if not p.future.done()]
        if not batch:
            return
        try:
            outputs = await self._run_forward([p.item for p in batch])
        except Exception as exc:
            log.exception("reward model forward failed")
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        for pending, output in zip(batch, outputs, strict=True):
            if not pending.future.done():
                pending.future.set_result(output)
