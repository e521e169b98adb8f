"""ComputeThread: every call on one thread, in order; errors and cancellation as an executor's; and the point
of it, one OpenMP pool for the process however many callers there are."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import Future

import pytest

from grpo_runtime.compute_thread import ComputeThread, run_in_own_thread


async def test_calls_run_in_submission_order_on_one_thread():
    compute = ComputeThread("compute")
    seen: list[tuple[int, int]] = []
    calls = (compute.run(lambda k=k: seen.append((k, threading.get_ident()))) for k in range(20))
    await asyncio.gather(*calls)
    compute.close()
    assert [k for k, _ in seen] == list(range(20))
    assert {ident for _, ident in seen} == {compute.ident} and compute.ident != threading.get_ident()


async def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    compute = ComputeThread("compute")
    with pytest.raises(ZeroDivisionError):
        await compute.run(lambda: 1 / 0)
    assert await compute.run(sum, [1, 2, 3]) == 6
    compute.close()


async def test_a_call_cancelled_before_it_starts_never_runs():
    compute = ComputeThread("compute")
    gate, ran = threading.Event(), []
    blocker = asyncio.ensure_future(compute.run(gate.wait, 30))
    queued = asyncio.ensure_future(compute.run(ran.append, "queued"))
    await asyncio.sleep(0.05)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    await asyncio.sleep(0.05)  # the cancel reaches the queued call through a loop callback
    gate.set()
    assert await blocker
    assert await compute.run(lambda: "after") == "after" and ran == []
    compute.close()
    with pytest.raises(RuntimeError, match="closed"):
        compute.submit(print)


def test_serve_until_runs_the_work_queued_behind_a_waiting_call():
    compute = ComputeThread("compute")
    order: list[str] = []

    def waiting() -> None:
        behind = compute.submit(order.append, "behind")  # would deadlock if the waiting call only blocked
        compute.serve_until(behind, 0.1, keep_waiting=lambda: True)
        order.append("waiting done")

    compute.submit(waiting).result(timeout=30)
    compute.close()
    assert order == ["behind", "waiting done"]


def test_serve_until_gives_up_when_told_to():
    compute = ComputeThread("compute")
    pending: Future[None] = Future()  # nobody completes it
    with pytest.raises(RuntimeError, match="stopped waiting"):
        compute.submit(compute.serve_until, pending, 0.01, lambda: False).result(timeout=30)
    compute.close()


POOLS = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import torch
    from grpo_runtime.compute_thread import ComputeThread

    torch.set_num_threads(2)
    a = torch.randn(512, 512)

    def matmul():
        (a @ a).sum()

    def os_threads():
        return len(os.listdir("/proc/self/task"))

    async def main(mode):
        before = os_threads()
        compute = ComputeThread("compute")
        for _ in range(8):
            # Concurrent callers: asyncio.to_thread spreads them over its workers.
            if mode == "to_thread":
                await asyncio.gather(*(asyncio.to_thread(matmul) for _ in range(4)))
            else:
                await asyncio.gather(*(compute.run(matmul) for _ in range(4)))
        return os_threads() - before

    print(json.dumps(asyncio.run(main(sys.argv[1]))))
    """
)


@pytest.mark.parametrize("mode", ["compute", "to_thread"])
def test_one_thread_keeps_one_openmp_pool(mode):
    """Each thread that runs a parallel region gets its own pool of OpenMP workers (here: one each, two
    threads per pool); through ComputeThread the process gains its thread and one pool's worker only."""
    out = subprocess.run(
        [sys.executable, "-c", POOLS, mode], capture_output=True, text=True, timeout=120, check=True
    )
    added = json.loads(out.stdout.strip().splitlines()[-1])
    if mode == "compute":
        assert added == 2  # the compute thread + its pool's one worker
    else:
        assert added > 2  # more workers of to_thread, each with a pool of its own


def test_a_second_pause_skips_the_wake_up_the_first_left_behind():
    compute = ComputeThread("compute")
    order: list[str] = []

    def batch() -> None:
        for k in range(2):  # two pauses in one batch, as a partial rollout takes two updates
            update = compute.submit(order.append, f"update {k}")
            compute.serve_until(update, 0.1, keep_waiting=lambda: True)
            compute.run_queued()
        order.append("batch done")

    compute.submit(batch).result(timeout=30)
    compute.close()
    assert order == ["update 0", "update 1", "batch done"]


async def test_run_in_own_thread_returns_from_a_thread_that_is_gone_afterwards():
    ran_on: list[threading.Thread] = []

    def work(x: int) -> int:
        ran_on.append(threading.current_thread())
        return x * 2

    assert await run_in_own_thread(work, 21, name="own") == 42
    ran_on[0].join(timeout=30)
    assert ran_on[0].name == "own" and ran_on[0] is not threading.current_thread()
    assert not ran_on[0].is_alive()  # its OpenMP pool, if it made one, went with it
    with pytest.raises(ZeroDivisionError):
        await run_in_own_thread(lambda: 1 / 0, name="own")
