"""Judges through a real reward server: a local judge loaded with LoadModel (kind JUDGE) and a remote judge
of the server's settings (a chat-completions server on 127.0.0.1), scored with Score; a judge not loaded is
INVALID_ARGUMENT naming ``rewards[i].name``; callers cannot redirect a remote judge."""

from __future__ import annotations

import grpc
import pytest
import pytest_asyncio
from google.protobuf import struct_pb2
from grpo.common.v1 import common_pb2
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_channel
from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from reward_service.server import start_reward_service
from reward_service.settings import RewardSettings
from tests.support.judge_server import JudgeServer, serve_judge
from tiny_models.judge import GROUP_TEMPLATE, POINTWISE_TEMPLATE, VERDICT_PROBABILITY

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "judge-admin-token"
PROMPT = [common_pb2.ChatMessage(role="user", content="What is 3 + 4?")]
COMPLETIONS = ["The answer is \\boxed{7}.", "The answer is 7.", "3 + 4 = \\boxed{9}"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def remote():
    async with serve_judge(JudgeServer(answer="Yes")) as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_models, remote):
    settings = RewardSettings.model_validate(
        {
            "checkers": {"workers": 1},
            "sandbox": {"enabled": False},
            "judges": {"remote": {"base_url": remote.url, "model": "tiny", "retries": 0}},
        }
    )
    service = await start_reward_service(settings)
    config = ServerConfig(host="127.0.0.1", port=0, admin_token=TOKEN, grace_period_s=1, metrics_port=0)
    async with GrpcServer(config, service.bindings(), on_shutdown=service.close) as running:
        yield running


def _channel(server) -> grpc.aio.Channel:
    return create_channel(ChannelConfig(target=server.address, admin_token=TOKEN))


def _request(*names: str, metadata: bool = True, **params) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest()
    for i, completion in enumerate(COMPLETIONS):
        sample = request.samples.add(id=str(i), prompt=PROMPT, completion=completion, group="g")
        if metadata:
            sample.metadata.update({"answer": 7})
    for name in names:
        spec = request.rewards.add(name=name)
        if params:
            spec.params.CopyFrom(struct_pb2.Struct())
            spec.params.update(params)
    return request


async def test_load_and_score_a_local_judge(server, tiny_models):
    async with _channel(server) as channel:
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        reply = await admin.LoadModel(
            reward_pb2.LoadModelRequest(
                name="tiny",
                path=str(tiny_models["judge"]),
                kind=reward_pb2.MODEL_KIND_JUDGE,
                judge_template=POINTWISE_TEMPLATE,
                judge_group_template=GROUP_TEMPLATE,
            )
        )
        assert reply.model.kind == reward_pb2.MODEL_KIND_JUDGE and reply.model.version == 1
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        pointwise = await stub.Score(_request("judge:tiny"))
        group = await stub.Score(_request("judge:tiny", mode="group"))
        missing = await stub.Score(_request("judge:tiny", metadata=False))
        rewards = {r.name: r for r in (await stub.ListRewards(reward_pb2.ListRewardsRequest())).rewards}
    boxed, plain, boxed_wrong = (s.components[0].value for s in pointwise.scores)
    # tiny_models/judge.py guarantees these bounds on every pointwise question (less float noise).
    assert min(boxed, boxed_wrong) >= VERDICT_PROBABILITY - 1e-4 and plain <= 1 - VERDICT_PROBABILITY + 1e-4
    assert all(s.components[0].HasField("value") and s.components[0].error == "" for s in group.scores)
    assert all("metadata 'answer' is required" in s.components[0].error for s in missing.scores)
    assert list(rewards["judge:tiny"].required_metadata) == ["answer"]
    assert [p.name for p in rewards["judge:tiny"].params] == ["mode"]


async def test_remote_judge_from_the_settings(server, remote):
    async with _channel(server) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        reply = await stub.Score(_request("judge:remote"))
        rewards = {r.name for r in (await stub.ListRewards(reward_pb2.ListRewardsRequest())).rewards}
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Score(_request("judge:remote", base_url="http://169.254.169.254/"))
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as shadowed:
            await admin.LoadModel(
                reward_pb2.LoadModelRequest(
                    name="remote", path="/nonexistent", kind=reward_pb2.MODEL_KIND_JUDGE
                )
            )
    assert [s.components[0].value for s in reply.scores] == [1.0, 1.0, 1.0]
    assert "judge:remote" in rewards
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rewards[0].params.base_url" in caught.value.details()
    assert (
        shadowed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "remote judge" in shadowed.value.details()
    )
    assert all(body["model"] == "tiny" for body in remote.bodies)


async def test_judge_not_loaded_names_the_reward(server):
    async with _channel(server) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Score(_request("format", "judge:absent"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("rewards[1].name:")
    assert "judge:absent" in caught.value.details()
