"""The weights lock with partial rollouts: a batch that pauses lets a waiting update through and takes the
lock back before any other writer; a sleep never preempts a batch; the batcher keeps partial-rollout jobs
apart from single-version ones."""

from __future__ import annotations

import asyncio
import threading
import time

from grpo_runtime.compute_thread import ComputeThread
from rollout_service.core.scheduler import BatchScheduler
from rollout_service.core.versioning import ReadWriteLock, UpdatePause
from rollout_service.types import GenerationJob, SamplingSpec


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def write(lock: ReadWriteLock, name: str, order: list[str], *, preempts_partial: bool) -> None:
    async with lock.write(preempts_partial=preempts_partial):
        order.append(name)


async def test_a_paused_batch_lets_the_update_through_and_resumes_before_a_sleep():
    lock, order = ReadWriteLock(), []
    async with lock.read():
        sleep = asyncio.create_task(write(lock, "sleep", order, preempts_partial=False))
        await settle()
        assert not lock.updates_waiting  # a sleep is no reason to pause
        update = asyncio.create_task(write(lock, "update", order, preempts_partial=True))
        await settle()
        assert lock.updates_waiting and order == []  # the batch holds the lock until it pauses
        await lock.yield_to_updates()
        order.append("resumed")
        await settle()
        assert order == ["update", "resumed"]  # the sleep still waits for the batch's end
    await asyncio.gather(sleep, update)
    assert order == ["update", "resumed", "sleep"]


async def test_the_engine_thread_pauses_through_update_pause():
    lock, order, version = ReadWriteLock(), [], [3]

    async def update() -> None:
        async with lock.write(preempts_partial=True):
            version[0] = 4
            order.append("update")

    async with lock.read():
        compute = ComputeThread("engine")
        pause = UpdatePause(lock, asyncio.get_running_loop(), compute, lambda: version[0], segment_tokens=8)
        assert pause.version == 3 and not pause.requested
        task = asyncio.create_task(update())
        await settle()
        assert pause.requested
        assert await asyncio.wait_for(compute.run(pause.pause), 30) == 4  # generous: "did not hang"
        assert pause.version == 4 and pause.pauses == 1 and order == ["update"]
    await task
    compute.close()


async def test_a_pause_runs_the_compute_work_queued_behind_the_batch():
    """An update's apply (and its validation before it) run on the compute thread the paused batch holds:
    the pause serves them there, so the update lands mid-batch instead of after it."""
    lock, order, version = ReadWriteLock(), [], [3]
    compute = ComputeThread("engine")
    loop = asyncio.get_running_loop()

    async def update() -> None:
        await compute.run(order.append, "validated")  # queued behind the batch: only a pause runs it
        async with lock.write(preempts_partial=True):
            await compute.run(order.append, "applied")
            version[0] = 4

    started = threading.Event()

    def batch(pause: UpdatePause) -> list[int]:
        seen = [pause.version]
        started.set()
        while not pause.requested:  # the engine's segment boundaries
            time.sleep(0.001)
        seen.append(pause.pause())
        if pause.version != 4:  # the update's write lock came after this pause returned: the next one
            while not pause.requested:
                time.sleep(0.001)
            seen.append(pause.pause())
        order.append("batch done")
        return seen

    async with lock.read():
        pause = UpdatePause(lock, loop, compute, lambda: version[0], segment_tokens=8)
        running = asyncio.ensure_future(compute.run(batch, pause))
        assert await asyncio.to_thread(started.wait, 30)
        task = asyncio.create_task(update())
        seen = await asyncio.wait_for(running, 30)
    await task
    compute.close()
    assert seen[0] == 3 and seen[-1] == 4
    assert order == ["validated", "applied", "batch done"]


async def test_partial_and_single_version_jobs_never_share_a_batch():
    batches: list[list[bool]] = []

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append([j.continue_across_updates for j in jobs])

    scheduler = BatchScheduler(run, window_s=0.05, max_rows=100)
    scheduler.start()
    flags = [False, False, True, True, False]
    jobs = [GenerationJob([[1]], 1, SamplingSpec(), continue_across_updates=f) for f in flags]
    await asyncio.wait_for(asyncio.gather(*(scheduler.submit(j) for j in jobs)), 30)
    await scheduler.close()
    assert batches == [[False, False], [True, True], [False]]  # in arrival order, each of one kind
