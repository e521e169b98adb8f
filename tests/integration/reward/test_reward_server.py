"""RewardService over a real gRPC server: Score, ScoreStream, ListRewards, errors and the sandbox."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.call_errors import pushback_s
from grpo_runtime.client import create_channel, create_sync_channel
from tests.integration.reward.fixtures import SECRET

BUILTINS = [
    "accuracy",
    "format",
    "tag_count",
    "reasoning_steps",
    "length",
    "cosine",
    "repetition_penalty",
    "soft_overlong",
    "code",
    "json_schema",
]


@pytest.fixture(scope="module")
def server(reward_server):
    return reward_server


@pytest.fixture(scope="module")
def stub(server):
    channel = create_sync_channel(server.address)
    yield reward_pb2_grpc.RewardServiceStub(channel)
    channel.close()


def request(samples, rewards) -> reward_pb2.ScoreRequest:
    msg = reward_pb2.ScoreRequest()
    for s in samples:
        sample = msg.samples.add(
            id=s.get("id", ""),
            completion=s.get("completion", ""),
            completion_ids=s.get("completion_ids", []),
            group=s.get("group", ""),
        )
        if "metadata" in s:
            sample.metadata.update(s["metadata"])
    for r in rewards:
        name, weight, params = (r, None, None) if isinstance(r, str) else (*r, None)[:3]
        spec = msg.rewards.add(name=name)
        if weight is not None:
            spec.weight = weight
        if params:
            spec.params.update(params)
    return msg


def _serving(server) -> bool:
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service="grpo.reward.v1.RewardService"), timeout=5)
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_list_rewards_describes_every_builtin(stub):
    reply = stub.ListRewards(reward_pb2.ListRewardsRequest(), timeout=10)
    by_name = {r.name: r for r in reply.rewards}
    assert [r.name for r in reply.rewards][: len(BUILTINS)] == BUILTINS
    accuracy = by_name["accuracy"]
    assert accuracy.required_metadata == ["answer"] and accuracy.available
    assert {p.name: p.default_value.string_value for p in accuracy.params}["mode"] == "math_verify"
    assert accuracy.min_value == 0.0 and accuracy.max_value == 1.0
    assert by_name["length"].group_aware
    cosine = {p.name: p for p in by_name["cosine"].params}
    assert cosine["max_len"].type == "integer" and cosine["max_len"].default_value.number_value == 1000
    assert by_name["code"].available and "namespaces" in by_name["code"].status


def test_score_weights_values_and_errors(stub):
    reply = stub.Score(
        request(
            [
                {
                    "id": "a",
                    "completion": "<think>\nx\n</think>\n<answer>\n\\boxed{\\frac{1}{2}}\n</answer>",
                    "metadata": {"answer": "0.5"},
                },
                {"id": "b", "completion": "\\boxed{3}"},
            ],
            [("accuracy", 2.0), ("format", 0.5), ("tag_count", 0.0)],
        ),
        timeout=30,
    )
    a, b = reply.scores
    assert a.id == "a" and a.reward == pytest.approx(2.0 + 0.5)
    assert [c.name for c in a.components] == ["accuracy", "format", "tag_count"]
    assert a.components[2].value == 1.0  # weight 0 still reports the value
    assert not b.components[0].HasField("value") and "answer" in b.components[0].error
    assert b.HasField("reward") and b.reward == 0.0


def test_reward_is_unset_when_no_component_has_a_value(stub):
    reply = stub.Score(
        request([{"completion": "\\boxed{1}", "metadata": {"answer": "not math"}}], ["accuracy"]), timeout=30
    )
    assert not reply.scores[0].HasField("reward")
    assert reply.scores[0].components[0].error


@pytest.mark.parametrize(
    ("samples", "rewards", "details"),
    [
        ([], ["format"], "samples:"),
        ([{}], [], "rewards:"),
        ([{}], ["format", "tag_count", "nope"], "rewards[2].name:"),
        ([{}], ["format", "format"], "rewards[1].name:"),
        ([{}], [("format", 1.0, {"style": "xml"})], "rewards[0].params.style:"),
        ([{}], [("cosine", 1.0, {"max_len": "long"})], "rewards[0].params.max_len:"),
        ([{}], [("soft_overlong", 1.0, {"bogus": 1})], "rewards[0].params.bogus:"),
        ([{}], ["prm:nothing-loaded"], "rewards[0].name:"),
    ],
)
def test_bad_requests_are_invalid_argument_naming_the_field(stub, samples, rewards, details):
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(request(samples, rewards), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(details), err.value.details()


def _program(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.mark.slow
def test_hostile_programs_through_grpc_and_service_stays_serving(server, stub):
    programs = {
        "infinite_loop": "while True:\n    pass",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory_bomb": "x = [bytearray(2**26) for _ in range(100)]",
        "output_flood": "while True:\n    print('y' * 4096)",
        "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
        "os.kill(-1, signal.SIGKILL)",
        "env_secret": "import os\nprint(os.environ.get('GRPO_TEST_SECRET', 'missing'))",
        "network": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\nprint(42)",
        "segfault": "import ctypes\nctypes.string_at(0)",
    }
    samples = [
        {"id": n, "completion": _program(p), "metadata": {"expected": SECRET}} for n, p in programs.items()
    ]
    start = time.monotonic()
    reply = stub.Score(request(samples[:4], ["code"]), timeout=60)
    reply2 = stub.Score(request(samples[4:], ["code"]), timeout=60)
    assert time.monotonic() - start < 30
    for score in [*reply.scores, *reply2.scores]:
        component = score.components[0]
        assert component.value == 0.0, (score.id, component)
        assert component.error, score.id
        assert SECRET not in component.error
    assert _serving(server)
    ok = stub.Score(
        request([{"completion": _program("print(6 * 7)"), "metadata": {"expected": "42"}}], ["code"]),
        timeout=30,
    )
    assert ok.scores[0].reward == 1.0


def test_score_stream_in_order_and_pipelined(server):
    sleeper = _program("import time\ntime.sleep(0.8)\nprint('ok')")

    async def run():
        async with create_channel(server.address) as channel:
            stream_stub = reward_pb2_grpc.RewardServiceStub(channel)

            async def requests():
                for i in range(3):
                    yield request(
                        [{"id": f"r{i}", "completion": sleeper, "metadata": {"expected": "ok"}}], ["code"]
                    )
                yield request([{"id": "last", "completion": "x"}], ["format"])

            start = time.monotonic()
            replies = [reply async for reply in stream_stub.ScoreStream(requests(), timeout=30)]
            return replies, time.monotonic() - start

    replies, elapsed = asyncio.run(run())
    assert [r.scores[0].id for r in replies] == ["r0", "r1", "r2", "last"]
    assert [r.scores[0].reward for r in replies[:3]] == [1.0, 1.0, 1.0], replies
    assert elapsed < 2.2, elapsed  # sequential would be >= 2.4 s


def test_score_stream_bad_request_ends_with_invalid_argument(server):
    async def run():
        async with create_channel(server.address) as channel:
            stream_stub = reward_pb2_grpc.RewardServiceStub(channel)

            async def requests():
                yield request([{"id": "ok"}], ["format"])
                yield request([{"id": "bad"}], ["unknown"])

            got = []
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for reply in stream_stub.ScoreStream(requests(), timeout=30):
                    got.append(reply.scores[0].id)
            return got, err.value

    got, error = asyncio.run(run())
    assert got == ["ok"]
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "rewards[0].name" in error.details()


def test_more_concurrent_requests_than_the_bound_get_resource_exhausted(server):
    sleeper = _program("import time\ntime.sleep(1.0)\nprint('ok')")
    slow = request([{"completion": sleeper, "metadata": {"expected": "ok"}}], ["code"])

    async def run():
        async with create_channel(server.address) as channel:
            aio_stub = reward_pb2_grpc.RewardServiceStub(channel)
            calls = [aio_stub.Score(slow, timeout=30) for _ in range(5)]
            return await asyncio.gather(*calls, return_exceptions=True)

    start = time.monotonic()
    results = asyncio.run(run())
    codes = [r.code() if isinstance(r, grpc.aio.AioRpcError) else grpc.StatusCode.OK for r in results]
    assert codes.count(grpc.StatusCode.OK) == 3  # max_concurrent_requests
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2
    assert time.monotonic() - start < 10
    refusals = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    # A transient refusal tells clients when to come back (gRPC's retry pushback).
    assert all((pushback_s(r) or 0) > 0 for r in refusals)


def test_a_huge_unknown_reward_name_is_invalid_argument_with_short_details(stub):
    # The details quote the name; cut, they fit gRPC's metadata limit instead of failing the status itself.
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(request([{"completion": "x"}], ["y" * 100_000]), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rewards[0].name" in err.value.details() and len(err.value.details()) < 2000
