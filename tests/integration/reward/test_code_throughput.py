"""The code reward's throughput rules through Score on a real reward server: a small request is scored
before a big batch of looping programs finishes, ``on_timeout`` ends a looping sample at its first
timeout, and a bad ``on_timeout`` is INVALID_ARGUMENT naming the param."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import create_channel
from grpo_runtime.server import GrpcServer
from tests.integration.reward.fixtures import reward_server_thread
from tests.support.sandboxes import running_sandboxes

# One slot, so that the big request would hold it for every one of its runs if turns were not fair.
SETTINGS = {
    "models": {"preload": []},
    "sandbox": {"wall_timeout_s": 1, "cpu_time_s": 1, "memory_mb": 512, "concurrency": 1},
}
LOOP = "while True:\n    pass"


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with reward_server_thread(SETTINGS) as running:
        yield running


def _request(
    programs: dict[str, tuple[str, int]], params: dict[str, Any] | None = None
) -> reward_pb2.ScoreRequest:
    """One sample per name: (program, number of tests, each expecting "1")."""
    msg = reward_pb2.ScoreRequest()
    for name, (program, tests) in programs.items():
        sample = msg.samples.add(id=name, completion=f"```python\n{program}\n```")
        sample.metadata.update({"tests": [{"input": "", "output": "1"}] * tests})
    spec = msg.rewards.add(name="code")
    if params:
        spec.params.update(params)
    return msg


def test_a_small_request_is_scored_before_a_big_looping_batch_finishes(server):
    """4 samples × 8 tests of a program that loops: 32 runs of one time limit each on the one slot. A
    one-test request sent while it runs is answered first; cancelling the big call kills its runs."""
    big = _request({f"b{i}": (LOOP, 8) for i in range(4)})
    small = _request({"small": ("print(1)", 1)})

    async def run() -> tuple[bool, float | None, int]:
        async with create_channel(server.address) as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            big_call = stub.Score(big, timeout=120)
            big_task = asyncio.ensure_future(big_call)
            async with asyncio.timeout(30):
                while running_sandboxes() == 0:  # the big request holds the slot
                    await asyncio.sleep(0.05)
            small_task = asyncio.ensure_future(stub.Score(small, timeout=60))
            done, _ = await asyncio.wait({big_task, small_task}, return_when=asyncio.FIRST_COMPLETED)
            small_first = done == {small_task}
            small_reward = small_task.result().scores[0].reward if small_task.done() else None
            big_call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await big_task
            # The big batch would run for 32 s more; a cancelled one ends at its current run.
            async with asyncio.timeout(20):
                while running_sandboxes():
                    await asyncio.sleep(0.1)
            return small_first, small_reward, running_sandboxes()

    small_first, small_reward, left = asyncio.run(run())
    assert small_first
    assert small_reward == 1.0
    assert left == 0


def test_fail_rest_ends_a_looping_sample_at_its_first_timeout(server):
    request = _request({"loop": (LOOP, 6), "ok": ("print(1)", 6)}, {"on_timeout": "fail_rest"})

    async def run() -> reward_pb2.ScoreResponse:
        async with create_channel(server.address) as channel:
            return await reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=60)

    reply = asyncio.run(run())
    loop, ok = (score.components[0] for score in reply.scores)
    assert loop.value == 0.0 and loop.error.startswith("test 0: ")
    assert "5 later tests not run and counted as failed (on_timeout=fail_rest)" in loop.error
    assert ok.value == 1.0 and ok.error == ""


def test_an_unknown_on_timeout_is_invalid_argument_naming_it(server):
    request = _request({"ok": ("print(1)", 1)}, {"on_timeout": "skip"})

    async def run() -> grpc.aio.AioRpcError:
        async with create_channel(server.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=30)
            return refused.value

    error = asyncio.run(run())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rewards[0].params.on_timeout" in error.details()
