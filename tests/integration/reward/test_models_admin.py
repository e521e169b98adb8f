"""Reward models through a real reward server: admin RPCs behind the token, PRM/ORM Score, hot swap
under Score load with zero failed calls."""

from __future__ import annotations

import asyncio
import urllib.request

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
from tiny_models.make import make_model

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "models-admin-token"
PROMPT = [common_pb2.ChatMessage(role="user", content="Compute 3 * 4 - 5.")]
COMPLETIONS = ["Step 1: 3 * 4 = 12.\n\nStep 2: 12 - 5 = 7.", "The answer is 7.", ""]


@pytest.fixture(scope="module")
def second_prm(tiny_models, tmp_path_factory):
    """Another token-classification PRM (other seed): its scores tell the versions apart."""
    return make_model("prm-token", tmp_path_factory.mktemp("prm-v2") / "prm-token", seed=1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_models):
    settings = RewardSettings.model_validate(
        {
            "checkers": {"workers": 1},
            "sandbox": {"enabled": False},
            "models": {
                "max_wait_ms": 5,
                "preload": [
                    {"name": "steps", "path": str(tiny_models["prm-token"]), "kind": "prm"},
                    {"name": "judge", "path": str(tiny_models["orm"]), "kind": "orm"},
                ],
            },
        }
    )
    service = await start_reward_service(settings)
    config = ServerConfig(host="127.0.0.1", port=0, admin_token=TOKEN, grace_period_s=1, metrics_port=0)
    async with GrpcServer(config, service.bindings(), on_shutdown=service.close) as running:
        yield running


def _channel(server, token: str | None = TOKEN) -> grpc.aio.Channel:
    return create_channel(ChannelConfig(target=server.address, admin_token=token))


def _score_request(reward: str, **params) -> reward_pb2.ScoreRequest:
    spec = reward_pb2.RewardSpec(name=reward)
    if params:
        spec.params.CopyFrom(struct_pb2.Struct())
        spec.params.update(params)
    samples = [reward_pb2.Sample(id=str(i), prompt=PROMPT, completion=c) for i, c in enumerate(COMPLETIONS)]
    return reward_pb2.ScoreRequest(samples=samples, rewards=[spec])


async def _load(admin, name, path, kind=reward_pb2.MODEL_KIND_PRM) -> reward_pb2.ModelInfo:
    reply = await admin.LoadModel(reward_pb2.LoadModelRequest(name=name, path=str(path), kind=kind))
    return reply.model


async def _list_models(channel) -> list[reward_pb2.ModelInfo]:
    admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
    return list((await admin.ListModels(reward_pb2.ListModelsRequest())).models)


async def test_admin_rpcs_need_the_token(server, tiny_models):
    async with _channel(server, token=None) as channel:
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        calls = [
            admin.ListModels(reward_pb2.ListModelsRequest()),
            admin.UnloadModel(reward_pb2.UnloadModelRequest(name="steps")),
            admin.LoadModel(reward_pb2.LoadModelRequest(name="x", path=str(tiny_models["orm"]), kind=2)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await call
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Score is not an admin RPC.
        reply = await reward_pb2_grpc.RewardServiceStub(channel).Score(_score_request("orm:judge"))
        assert len(reply.scores) == 3
    async with _channel(server) as channel:
        models = (
            await reward_pb2_grpc.RewardAdminServiceStub(channel).ListModels(reward_pb2.ListModelsRequest())
        ).models
    assert {m.name for m in models} >= {"steps", "judge"}  # the unauthenticated calls changed nothing


async def test_list_models_and_rewards_show_preloaded_models(server, tiny_models):
    async with _channel(server) as channel:
        models = (
            await reward_pb2_grpc.RewardAdminServiceStub(channel).ListModels(reward_pb2.ListModelsRequest())
        ).models
        rewards = (
            await reward_pb2_grpc.RewardServiceStub(channel).ListRewards(reward_pb2.ListRewardsRequest())
        ).rewards
    by_name = {m.name: m for m in models}
    steps = by_name["steps"]
    assert steps.path == str(tiny_models["prm-token"]) and steps.kind == reward_pb2.MODEL_KIND_PRM
    assert steps.prm_format == reward_pb2.PRM_FORMAT_TOKEN_CLASSIFICATION
    assert (steps.device, steps.dtype) == ("cpu", "float32") and steps.version >= 1
    assert steps.loaded_at.seconds > 0
    assert by_name["judge"].kind == reward_pb2.MODEL_KIND_ORM
    described = {r.name: r for r in rewards}
    assert [p.name for p in described["prm:steps"].params] == ["aggregate"]
    assert described["prm:steps"].params[0].default_value.string_value == "min"
    assert "orm:judge" in described


async def test_score_with_prm_and_orm(server):
    async with _channel(server) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        prm = await stub.Score(_score_request("prm:steps", aggregate="prod"))
        orm = await stub.Score(_score_request("orm:judge"))
    two_steps, one_step, empty = (s.components[0] for s in prm.scores)
    assert len(two_steps.step_scores) == 2 and len(one_step.step_scores) == 1
    assert two_steps.value == pytest.approx(two_steps.step_scores[0] * two_steps.step_scores[1])
    assert not empty.HasField("value") and "no reasoning steps" in empty.error
    assert not prm.scores[2].HasField("reward")
    assert all(s.components[0].HasField("value") for s in orm.scores)


async def test_admin_errors_name_the_field(server, tiny_models, tmp_path):
    async with _channel(server) as channel:
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        orm = str(tiny_models["orm"])
        cases = [
            (reward_pb2.LoadModelRequest(name="x", path=str(tmp_path / "nope"), kind=1), "path"),
            (reward_pb2.LoadModelRequest(name="x", path=orm, kind=0), "kind"),
            (reward_pb2.LoadModelRequest(name="x", path=orm, kind=1), "kind"),
            (
                reward_pb2.LoadModelRequest(name="x", path=orm, kind=2, device="cuda"),
                "device",
            ),
            (
                reward_pb2.LoadModelRequest(name="x", path=orm, kind=2, dtype="fp8"),
                "dtype",
            ),
            (
                reward_pb2.LoadModelRequest(name="x", path=orm, kind=2, trust_remote_code=True),
                "trust_remote_code",
            ),
            (reward_pb2.LoadModelRequest(name="Bad Name", path=orm, kind=2), "name"),
        ]
        for request, field in cases:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await admin.LoadModel(request)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details().startswith(f"{field}:"), error.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await admin.UnloadModel(reward_pb2.UnloadModelRequest(name="never-loaded"))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        # Unloading a model turns its reward name into an unknown reward for Score.
        await _load(admin, "short-lived", tiny_models["orm"], kind=reward_pb2.MODEL_KIND_ORM)
        await admin.UnloadModel(reward_pb2.UnloadModelRequest(name="short-lived"))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await reward_pb2_grpc.RewardServiceStub(channel).Score(_score_request("orm:short-lived"))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.slow
async def test_hot_swap_under_score_load(server, tiny_models, second_prm):
    """24 clients call Score non-stop while LoadModel swaps `prm:swap` between two PRMs four times:
    no call fails, each response comes wholly from one model, and a call made after LoadModel returns
    sees the new model."""
    paths = [tiny_models["prm-token"], second_prm]
    request = _score_request("prm:swap")

    def scores_of(reply) -> list[list[float]]:
        return [list(s.components[0].step_scores) for s in reply.scores]

    async with _channel(server) as channel:
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        references = []
        for path in paths:
            await _load(admin, "swap", path)
            references.append(scores_of(await stub.Score(request)))
        assert references[0] != references[1]

        def which(reply) -> int:
            got = scores_of(reply)
            for index, reference in enumerate(references):
                if all(g == pytest.approx(r, abs=1e-6) for g, r in zip(got, reference, strict=True)):
                    return index
            raise AssertionError(f"{got} matches no model")

        stop = asyncio.Event()
        seen: list[int] = []
        failures: list[BaseException] = []

        async def client() -> None:
            while not stop.is_set():
                try:
                    seen.append(which(await stub.Score(request, timeout=30)))
                except Exception as exc:
                    failures.append(exc)

        clients = [asyncio.create_task(client()) for _ in range(24)]
        versions = []
        for swap in range(4):
            await asyncio.sleep(0.15)
            info = await _load(admin, "swap", paths[swap % 2])
            versions.append(info.version)
            assert which(await stub.Score(request)) == swap % 2
        stop.set()
        await asyncio.gather(*clients)
        listed = {m.name: m for m in (await admin.ListModels(reward_pb2.ListModelsRequest())).models}
    assert failures == []
    assert versions == [3, 4, 5, 6] and listed["swap"].version == 6
    assert len(seen) >= 24 and set(seen) == {0, 1}


async def test_model_metrics_are_exported_beside_the_rpc_metrics(server):
    async with _channel(server) as channel:
        await reward_pb2_grpc.RewardServiceStub(channel).Score(_score_request("prm:steps"))
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    forwards = [
        line
        for line in text.splitlines()
        if line.startswith('grpo_reward_model_forwards_total{model="prm:steps"}')
    ]
    assert forwards and float(forwards[0].split()[-1]) >= 1
    assert 'grpo_rpc_requests_total{code="OK",method="Score"' in text
