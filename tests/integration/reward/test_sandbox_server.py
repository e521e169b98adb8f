"""Hostile programs through Score on a real reward server: contained, and the service stays SERVING and
fair (a small request is scored while a big one runs)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import create_channel
from grpo_runtime.server import GrpcServer
from tests.integration.reward.fixtures import reward_server_thread

TOKEN = f"grpo-admin-token-{os.getpid()}"
SETTINGS = {
    "checkers": {"workers": 1},
    "models": {"preload": []},
    "sandbox": {"wall_timeout_s": 5, "cpu_time_s": 2, "memory_mb": 512, "concurrency": 2},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[GrpcServer, str]]:
    """A reward server whose environment and a file readable by anyone hold the admin token."""
    token_file = tmp_path_factory.mktemp("secrets") / "admin_token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)
    os.environ["GRPO_ADMIN_TOKEN"] = TOKEN
    try:
        with reward_server_thread(SETTINGS) as running:
            yield running, str(token_file)
    finally:
        os.environ.pop("GRPO_ADMIN_TOKEN", None)


def _request(programs: dict[str, str], expected: str = "42") -> reward_pb2.ScoreRequest:
    msg = reward_pb2.ScoreRequest()
    for name, program in programs.items():
        sample = msg.samples.add(id=name, completion=f"```python\n{program}\n```")
        sample.metadata.update({"expected": expected})
    msg.rewards.add(name="code")
    return msg


async def _serving(channel: grpc.aio.Channel) -> bool:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(
        health_pb2.HealthCheckRequest(service="grpo.reward.v1.RewardService"), timeout=5
    )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_hostile_programs_through_score_leave_the_service_serving(server):
    running, token_file = server
    hostile = {
        "read_token_file": f"print(open({token_file!r}).read())",
        "env_token": "import os\nprint(os.environ.get('GRPO_ADMIN_TOKEN'))",
        "token_in_stderr": f"import sys\nsys.exit(open({token_file!r}).read())",
        "proc_scan": "import os\nfor p in os.listdir('/proc'):\n    try:\n"
        "        print(open(f'/proc/{p}/environ').read())\n    except OSError:\n        pass",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "kill_all": "import os, signal\nos.kill(-1, signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGKILL)",
        "memory_bomb": "x = [bytearray(2**26) for _ in range(100)]",
        "output_flood": "while True:\n    print('y' * 4096)",
    }

    async def run():
        async with create_channel(running.address) as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            items = list(hostile.items())
            calls = [stub.Score(_request(dict(items[i::2])), timeout=60) for i in range(2)]
            replies = await asyncio.gather(*calls)
            serving = await _serving(channel)
            ok = await stub.Score(_request({"ok": "print(6 * 7)"}), timeout=30)
            return replies, serving, ok

    replies, serving, ok = asyncio.run(run())
    scores = [s for reply in replies for s in reply.scores]
    assert sorted(s.id for s in scores) == sorted(hostile)
    for score in scores:
        (component,) = score.components
        assert component.value == 0.0, (score.id, component)
        assert TOKEN not in component.error and len(component.error) < 400, (score.id, component.error)
    assert serving
    assert ok.scores[0].reward == 1.0


def test_a_small_request_is_scored_while_a_big_one_runs(server):
    running, _ = server
    big = reward_pb2.ScoreRequest()
    for i in range(8):
        sample = big.samples.add(
            id=f"b{i}", completion="```python\nimport time\ntime.sleep(1)\nprint(1)\n```"
        )
        sample.metadata.update({"expected": "1"})
    big.rewards.add(name="code")

    async def run():
        async with create_channel(running.address) as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            start = time.monotonic()
            big_call = asyncio.ensure_future(stub.Score(big, timeout=60))
            await asyncio.sleep(0.3)
            small = await stub.Score(_request({"small": "print(42)"}), timeout=30)
            small_s = time.monotonic() - start
            big_reply = await big_call
            return small, small_s, big_reply, time.monotonic() - start

    small, small_s, big_reply, big_s = asyncio.run(run())
    assert small.scores[0].reward == 1.0
    assert [s.reward for s in big_reply.scores] == [1.0] * 8, [
        s.components[0].error for s in big_reply.scores
    ]
    # 8 one-second runs on 2 slots take 4 s or more; the small request waits for one run, not for all.
    assert big_s >= 4
    assert small_s < big_s / 2, (small_s, big_s)
