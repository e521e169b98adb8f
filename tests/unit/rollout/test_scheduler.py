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


async def test_a_batch_waits_past_its_window_for_a_registered_caller():
    batches: list[int] = []

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))

    scheduler = BatchScheduler(run, window_s=0.001, gather_s=60.0, max_rows=100)
    scheduler.start()

    async def between_turns(caller) -> None:
        await asyncio.sleep(0.05)  # its environment call: 50 windows
        await scheduler.submit(job(), caller)

    with scheduler.caller() as caller:
        await asyncio.gather(scheduler.submit(job()), between_turns(caller))
    await scheduler.close()
    assert batches == [2]


async def test_callers_whose_jobs_ran_are_waited_for_before_the_next_batch():
    """The episodes of one batch come back after their environment calls, while a straggler's job is
    queued: the straggler's batch waits for them, from the moment their batch ends."""
    batches: list[int] = []
    first_batch_running = asyncio.Event()

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))
        first_batch_running.set()
        await asyncio.sleep(0.01)

    scheduler = BatchScheduler(run, window_s=0.001, gather_s=60.0, max_rows=100)
    scheduler.start()

    async def episode(late: bool) -> None:
        if late:
            await first_batch_running.wait()
        with scheduler.caller() as caller:
            await scheduler.submit(job(), caller)  # turn 1
            await asyncio.sleep(0.02)  # its environment call
            await scheduler.submit(job(), caller)  # turn 2

    # Three episodes start together; a fourth starts while their first batch runs, and its first turn
    # waits for their second.
    await asyncio.wait_for(asyncio.gather(*(episode(late) for late in (False, False, False, True))), 30)
    await scheduler.close()
    assert batches == [3, 4, 1]


@pytest.mark.parametrize("release", ["close", "idle"])
async def test_a_caller_that_leaves_or_idles_releases_the_batch(release):
    batches: list[int] = []

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))

    # A gather of an hour: only the caller's leaving (or saying it is idle) can end the wait.
    scheduler = BatchScheduler(run, window_s=0.001, gather_s=3600.0, max_rows=100)
    scheduler.start()
    caller = scheduler.caller()
    waiting = asyncio.create_task(scheduler.submit(job()))
    await asyncio.sleep(0.05)
    assert batches == []  # held for the registered caller
    getattr(caller, release)()
    await asyncio.wait_for(waiting, 30)
    if release == "idle":  # waited for again only after its next job
        await asyncio.wait_for(scheduler.submit(job(), caller), 30)
        assert batches == [1, 1]
        caller.close()
    await scheduler.close()
    assert batches[0] == 1


async def test_the_wait_for_registered_callers_is_bounded_by_gather_s():
    batches: list[int] = []
    ran = asyncio.Event()

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))
        ran.set()

    scheduler = BatchScheduler(run, window_s=0.001, gather_s=0.02, max_rows=100)
    scheduler.start()

    async def slow_environment(caller) -> None:
        await ran.wait()  # returns only once a batch ran without it
        await scheduler.submit(job(), caller)

    with scheduler.caller() as caller:
        await asyncio.wait_for(asyncio.gather(scheduler.submit(job()), slow_environment(caller)), 30)
    await scheduler.close()
    assert batches == [1, 1]


async def test_the_batch_runs_once_every_registered_caller_is_in():
    """A window of an hour: once the last caller it waited for has submitted, the batch runs at once."""
    batches: list[int] = []

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))

    scheduler = BatchScheduler(run, window_s=3600.0, gather_s=3600.0, max_rows=100)
    scheduler.start()
    callers = [scheduler.caller() for _ in range(3)]

    async def turn(caller, delay_s: float) -> None:
        await asyncio.sleep(delay_s)  # the environment calls of the episodes end at different times
        await scheduler.submit(job(), caller)
        caller.close()

    await asyncio.wait_for(asyncio.gather(*(turn(c, 0.01 * k) for k, c in enumerate(callers))), 30)
    await scheduler.close()
    assert batches == [3]
