"""The dynamic batcher's fast paths through real reward servers: concurrent Score calls of GRPO groups
scored with shared-prompt KV caching and length buckets equal those of a server running one plain
forward per request."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import pytest_asyncio
from grpo.common.v1 import common_pb2
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_channel
from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from reward_service.server import start_reward_service
from reward_service.settings import RewardSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

QUESTIONS = [
    "A baker makes 40 loaves every morning and sells 25 before noon. How many are left?",
    "Each box holds 12 apples and a crate holds 9 boxes. How many apples are in 3 crates?",
    "Tom saves 15 dollars a week and spends 4 of them on lunch. What does he keep in 6 weeks?",
]
REWARDS = ("prm:token", "prm:tag", "orm:judge")


def _settings(tiny_models, fast: bool) -> RewardSettings:
    models = {"max_wait_ms": 10, "min_shared_prefix_tokens": 4}
    if not fast:
        models.update(dynamic_batching=False, share_prefixes=False)
    models["preload"] = [
        {"name": "token", "path": str(tiny_models["prm-token"]), "kind": "prm"},
        {"name": "tag", "path": str(tiny_models["prm-steptag"]), "kind": "prm"},
        {"name": "judge", "path": str(tiny_models["orm"]), "kind": "orm"},
    ]
    return RewardSettings.model_validate(
        {"checkers": {"workers": 1}, "sandbox": {"enabled": False}, "models": models}
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tiny_models):
    """(fast, plain): the default batcher, and one forward per request without prefix sharing."""
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for fast in (True, False):
            service = await start_reward_service(_settings(tiny_models, fast))
            config = ServerConfig(host="127.0.0.1", port=0, grace_period_s=1)
            server = GrpcServer(config, service.bindings(), on_shutdown=service.close)
            running.append(await stack.enter_async_context(server))
        yield running


def _group_request(index: int) -> reward_pb2.ScoreRequest:
    """One GRPO group: 6 completions of one question, of different lengths."""
    prompt = [common_pb2.ChatMessage(role="user", content=QUESTIONS[index % len(QUESTIONS)])]
    samples = []
    for s in range(6):
        steps = [f"Step {k}: {index + 2} * {k + s} = {(index + 2) * (k + s)}." for k in range(1, 2 + s % 4)]
        completion = "\n\n".join([*steps, f"The answer is \\boxed{{{index * 7 + s}}}."])
        samples.append(reward_pb2.Sample(id=f"{index}-{s}", prompt=prompt, completion=completion))
    return reward_pb2.ScoreRequest(samples=samples, rewards=[reward_pb2.RewardSpec(name=r) for r in REWARDS])


async def _score_concurrently(server, requests: int) -> list[reward_pb2.ScoreResponse]:
    async with create_channel(ChannelConfig(target=server.address)) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        return list(await asyncio.gather(*(stub.Score(_group_request(i)) for i in range(requests))))


async def test_concurrent_groups_score_as_one_forward_per_request(servers):
    fast, plain = servers
    got = await _score_concurrently(fast, 12)
    want = await _score_concurrently(plain, 12)
    compared = 0
    for got_reply, want_reply in zip(got, want, strict=True):
        for got_result, want_result in zip(got_reply.scores, want_reply.scores, strict=True):
            for got_component, want_component in zip(
                got_result.components, want_result.components, strict=True
            ):
                assert got_component.name == want_component.name
                assert got_component.error == want_component.error == ""
                assert got_component.HasField("value")
                assert got_component.value == pytest.approx(want_component.value, abs=1e-5)
                assert list(got_component.step_scores) == pytest.approx(
                    list(want_component.step_scores), abs=1e-5
                )
                compared += 1
    assert compared == 12 * 6 * len(REWARDS)
