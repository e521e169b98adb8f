"""Coalescing concurrent calls into batch calls, and streaming a batch's results in finished groups."""

from __future__ import annotations

import asyncio

import pytest

from grpo_runtime.batch_calls import Coalescer, finished_groups


class Batches:
    """A batch sender that records its batches; an item ``"fail"`` is an error for its caller, ``"slow"``
    finishes after the others, ``"boom"`` fails the whole batch."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.release_slow = asyncio.Event()

    async def send(self, items: list[str]):
        self.sent.append(items)
        if "boom" in items:
            raise ConnectionError("the batch call failed")
        if "stray" in items:
            yield len(items), "an entry that was never asked for"
        for i, item in enumerate(items):
            if item not in ("slow", "fail"):
                yield i, item.upper()
        for i, item in enumerate(items):
            if item == "fail":
                yield i, ValueError(f"bad {item}")
        await self.release_slow.wait()
        for i, item in enumerate(items):
            if item == "slow":
                yield i, "SLOW"


async def test_calls_of_one_loop_turn_are_one_batch_each_with_its_own_outcome():
    batches = Batches()
    batches.release_slow.set()
    coalescer = Coalescer(batches.send, max_batch=8)
    outcomes = await asyncio.gather(*(coalescer.call(i) for i in ("a", "fail", "b")), return_exceptions=True)
    assert outcomes[0] == "A" and outcomes[2] == "B" and str(outcomes[1]) == "bad fail"
    assert batches.sent == [["a", "fail", "b"]]
    assert await coalescer.call("c") == "C"  # a later call: a batch of its own
    assert batches.sent[-1] == ["c"]


async def test_batches_are_split_at_max_batch_and_a_failed_batch_fails_its_callers():
    batches = Batches()
    batches.release_slow.set()
    coalescer = Coalescer(batches.send, max_batch=2)
    outcomes = await asyncio.gather(
        *(coalescer.call(i) for i in ("a", "b", "boom", "c")), return_exceptions=True
    )
    assert batches.sent == [["a", "b"], ["boom", "c"]]
    assert outcomes[:2] == ["A", "B"]
    assert all(isinstance(o, ConnectionError) for o in outcomes[2:])
    with pytest.raises(ValueError, match="answered entry 1 of a batch of 1"):
        await coalescer.call("stray")  # a server's answer out of range fails the batch's callers


async def test_a_caller_that_stops_waiting_leaves_its_result_to_orphan():
    batches = Batches()
    orphans: list[str] = []
    coalescer = Coalescer(batches.send, max_batch=8, orphan=orphans.append)
    slow = asyncio.ensure_future(coalescer.call("slow"))
    fast = await asyncio.gather(coalescer.call("a"), asyncio.sleep(0))
    assert fast[0] == "A" and not slow.done()  # the slow entry holds back only itself
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    batches.release_slow.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert orphans == ["SLOW"]


async def test_finished_groups_yield_what_finished_together_and_cancel_the_rest_on_exit():
    gate = asyncio.Event()
    cancelled = asyncio.Event()

    async def entry(value: int) -> int:
        if value == 2:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return value

    groups = finished_groups(entry(v) for v in (0, 1, 2))
    assert sorted(await anext(groups)) == [(0, 0), (1, 1)]
    await groups.aclose()  # the consumer stops early: entry 2 is cancelled
    await asyncio.wait_for(cancelled.wait(), 10)
