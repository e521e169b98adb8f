"""One event loop kept across calls, shared by calling threads, closed with its cleanup."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_runtime.loop_thread import LoopThread


async def running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_calls_share_one_loop_and_run_concurrently_from_several_threads():
    loop_thread = LoopThread("test-loop")
    try:
        first, second = loop_thread.run(running_loop()), loop_thread.run(running_loop())
        assert first is second
        both_in = asyncio.Event()
        arrived = []

        async def meet() -> str:
            arrived.append(threading.current_thread().name)
            if len(arrived) == 2:
                both_in.set()
            await asyncio.wait_for(both_in.wait(), 10)  # only returns if the other call runs meanwhile
            return "met"

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: loop_thread.run(meet()), range(2)))
        assert results == ["met", "met"] and arrived == ["test-loop", "test-loop"]

        async def fail() -> None:
            raise ValueError("from the loop")

        with pytest.raises(ValueError, match="from the loop"):
            loop_thread.run(fail())
    finally:
        closed = []

        async def cleanup() -> None:
            closed.append(asyncio.get_running_loop())

        loop_thread.close(cleanup())
    assert closed == [first] and first.is_closed()


def test_closing_a_loop_never_started_discards_the_cleanup():
    async def cleanup() -> None:
        raise AssertionError("not run")

    LoopThread("unused").close(cleanup())  # no "never awaited" warning: the coroutine is closed
