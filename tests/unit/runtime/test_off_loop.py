"""Small work runs on the event loop, large work in a worker thread."""

from __future__ import annotations

import asyncio
import threading

from grpo_runtime.off_loop import off_loop_unless


def test_small_work_runs_on_the_loop_and_large_work_in_a_thread():
    async def where(small: bool) -> tuple[threading.Thread, str]:
        return await off_loop_unless(small, lambda label: (threading.current_thread(), label), label="x")

    async def both():
        return await where(True), await where(False), threading.current_thread()

    (inline, label), (threaded, _), loop_thread = asyncio.run(both())
    assert inline is loop_thread and label == "x"
    assert threaded is not loop_thread
