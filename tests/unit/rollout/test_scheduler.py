"""The batcher: concurrent calls merge into one engine call; cancelled callers are skipped."""

from __future__ import annotations

import asyncio

import pytest

from rollout_service.core.scheduler import BatchScheduler
from rollout_service.types import GenerationJob, SamplingSpec


def job(rows: int = 1) -> GenerationJob:
    return GenerationJob(prompt_token_ids=[[1]] * rows, n=1, sampling=SamplingSpec())


async def test_calls_within_the_window_share_one_batch():
    batches: list[int] = []

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))
        await asyncio.sleep(0.01)

    scheduler = BatchScheduler(run, window_s=0.05, max_rows=100)
    scheduler.start()
    await asyncio.gather(*(scheduler.submit(job()) for _ in range(5)))
    await scheduler.submit(job())
    await scheduler.close()
    assert batches == [5, 1]


async def test_row_cap_splits_batches_and_errors_reach_every_caller():
    seen: list[int] = []

    async def run(jobs: list[GenerationJob]) -> None:
        seen.append(sum(j.num_rows for j in jobs))
        raise RuntimeError("engine failed")

    scheduler = BatchScheduler(run, window_s=0.05, max_rows=4)
    scheduler.start()
    results = await asyncio.gather(*(scheduler.submit(job(2)) for _ in range(4)), return_exceptions=True)
    await scheduler.close()
    assert seen == [4, 4]
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_a_cancelled_caller_sets_its_token_and_is_skipped():
    started = asyncio.Event()
    release = asyncio.Event()
    ran: list[GenerationJob] = []

    async def run(jobs: list[GenerationJob]) -> None:
        ran.extend(jobs)
        started.set()
        await release.wait()

    scheduler = BatchScheduler(run, window_s=0.0, max_rows=100)
    scheduler.start()
    first, queued = job(), job()
    running = asyncio.create_task(scheduler.submit(first))
    await started.wait()
    waiting = asyncio.create_task(scheduler.submit(queued))
    await asyncio.sleep(0.01)
    waiting.cancel()
    running.cancel()
    for task in (waiting, running):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert first.cancel.cancelled and queued.cancel.cancelled  # the engine polls these
    release.set()
    await asyncio.sleep(0.01)
    await scheduler.close()
    assert ran == [first]
