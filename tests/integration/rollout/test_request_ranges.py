"""Every number a rollout request carries is range-checked before use (real server, HF engine, 127.0.0.1).

Each request below holds one field at the edge of its protobuf type (2**32 - 1, 2**64 - 1, NaN, inf, a
NaN inside a Struct): the answer names that field with INVALID_ARGUMENT or RESOURCE_EXHAUSTED, never
INTERNAL from a TypeError, OverflowError or ValueError deep inside. And a weight-group join whose
rendezvous accepts the connection and never answers ends at its timeout with DEADLINE_EXCEEDED, leaving
nothing that holds up the server's shutdown.
"""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from google.protobuf import struct_pb2
from grpo.common.v1 import common_pb2
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from rollout_service.server import binding, build_core
from rollout_service.settings import EpisodeSettings, RolloutSettings
from tests.integration.rollout.fixtures import rollout_server_thread
from tests.support.silent_peer import silent_peer

U32 = 2**32 - 1
U64 = 2**64 - 1
INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
GROUP = rollout_pb2.WEIGHT_TRANSPORT_TORCH_DISTRIBUTED
STATE_DICT = rollout_pb2.WEIGHT_FORMAT_STATE_DICT
# A bound only a hang reaches.
HANG_S = 120


@pytest.fixture(scope="module")
def shm_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ranges-shm").resolve()


@pytest.fixture(scope="module")
def server(tiny_models, shm_dir, tmp_path_factory):
    settings = RolloutSettings(
        model=str(tiny_models["policy"]),
        engine="hf",
        weight_shm_dir=str(shm_dir),
        weights_root=str(tmp_path_factory.mktemp("ranges-root")),
        # Validation refuses every request below before the target is ever dialled.
        episodes=EpisodeSettings(targets={"default": "127.0.0.1:9"}),
    )
    with rollout_server_thread(settings) as running:
        yield running


def _group(**fields) -> rollout_pb2.OpenWeightChannelRequest:
    values = {"transport": GROUP, "init_method": "tcp://127.0.0.1:9", "rank": 1, "world_size": 2}
    return rollout_pb2.OpenWeightChannelRequest(**(values | fields))


def _layout(**fields) -> rollout_pb2.TensorLayout:
    values = {"name": "model.norm.weight", "dtype": "float32", "shape": [128], "nbytes": 512}
    return rollout_pb2.TensorLayout(**(values | fields))


def _manifest(**fields) -> rollout_pb2.UpdateWeightsFromChannelRequest:
    values = {
        "version": 1,
        "format": STATE_DICT,
        "tensors": [_layout()],
        "bucket_bytes": [512],
        "bucket_files": ["w.bucket"],
    }
    return rollout_pb2.UpdateWeightsFromChannelRequest(**(values | fields))


def _struct(value: float) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.fields["x"].list_value.values.add().number_value = value
    return out


def _generate(sampling=None, n: int = 1, episode: rollout_pb2.Episode | None = None):
    prompt = rollout_pb2.Prompt(messages=[common_pb2.ChatMessage(role="user", content="hi")], episode=episode)
    return rollout_pb2.GenerateRequest(
        prompts=[prompt], n=n, sampling=sampling or rollout_pb2.SamplingParams(max_tokens=2)
    )


def _sampling(**fields) -> rollout_pb2.SamplingParams:
    return rollout_pb2.SamplingParams(**({"max_tokens": 2} | fields))


CASES = [
    # OpenWeightChannel
    ("OpenWeightChannel", _group(world_size=2**31), INVALID, "world_size"),
    ("OpenWeightChannel", _group(world_size=U32), INVALID, "world_size"),
    ("OpenWeightChannel", _group(rank=U32), INVALID, "rank"),
    ("OpenWeightChannel", _group(timeout_seconds=math.nan), INVALID, "timeout_seconds"),
    ("OpenWeightChannel", _group(timeout_seconds=math.inf), INVALID, "timeout_seconds"),
    ("OpenWeightChannel", _group(timeout_seconds=-1.0), INVALID, "timeout_seconds"),
    ("OpenWeightChannel", _group(timeout_seconds=1e308), INVALID, "timeout_seconds"),
    ("OpenWeightChannel", _group(init_method="tcp://127.0.0.1:65536"), INVALID, "init_method"),
    ("OpenWeightChannel", _group(init_method="tcp://local\x00host:9"), INVALID, "init_method"),
    ("OpenWeightChannel", _group(transport=2**31 - 1), INVALID, "transport"),
    # UpdateWeightsFromChannel (the shared-memory channel is open)
    ("UpdateWeightsFromChannel", _manifest(version=U64), INVALID, "version"),
    ("UpdateWeightsFromChannel", _manifest(version=2**63), INVALID, "version"),
    ("UpdateWeightsFromChannel", _manifest(format=2**31 - 1), INVALID, "format"),
    ("UpdateWeightsFromChannel", _manifest(bucket_bytes=[U64]), EXHAUSTED, "bucket_bytes"),
    ("UpdateWeightsFromChannel", _manifest(bucket_bytes=[U64] * 4), EXHAUSTED, "bucket_bytes"),
    ("UpdateWeightsFromChannel", _manifest(tensors=[_layout(shape=[U64] * 8)]), INVALID, "tensors[0].nbytes"),
    ("UpdateWeightsFromChannel", _manifest(tensors=[_layout(bucket=U32)]), INVALID, "tensors[0].bucket"),
    ("UpdateWeightsFromChannel", _manifest(tensors=[_layout(offset=U64)]), INVALID, "tensors[0].offset"),
    ("UpdateWeightsFromChannel", _manifest(tensors=[_layout(nbytes=U64)]), INVALID, "tensors[0].nbytes"),
    # UpdateWeights, LoadWeights, Sleep
    (
        "UpdateWeights",
        [rollout_pb2.WeightChunk(version=U64, format=STATE_DICT, data=b"x")],
        INVALID,
        "version",
    ),
    (
        "UpdateWeights",
        [rollout_pb2.WeightChunk(version=1, format=STATE_DICT, total_bytes=U64, data=b"x")],
        EXHAUSTED,
        "total_bytes",
    ),
    ("UpdateWeights", [rollout_pb2.WeightChunk(version=1, format=2**31 - 1)], INVALID, "format"),
    ("LoadWeights", rollout_pb2.LoadWeightsRequest(path=".", version=U64), INVALID, "version"),
    ("LoadWeights", rollout_pb2.LoadWeightsRequest(path=".", version=1, format=-1), INVALID, "format"),
    ("Sleep", rollout_pb2.SleepRequest(level=U32), INVALID, "level"),
    # Generate
    ("Generate", _generate(n=U32), INVALID, "n"),
    ("Generate", _generate(_sampling(max_tokens=U32)), EXHAUSTED, "sampling.max_tokens"),
    ("Generate", _generate(_sampling(min_tokens=U32)), INVALID, "sampling.min_tokens"),
    ("Generate", _generate(_sampling(seed=U64)), INVALID, "sampling.seed"),
    ("Generate", _generate(_sampling(top_k=-(2**31))), INVALID, "sampling.top_k"),
    ("Generate", _generate(_sampling(temperature=math.nan)), INVALID, "sampling.temperature"),
    ("Generate", _generate(_sampling(repetition_penalty=math.inf)), INVALID, "sampling.repetition_penalty"),
    (
        "Generate",
        _generate(episode=rollout_pb2.Episode(environment="e", params=_struct(math.nan))),
        INVALID,
        "prompts[0].episode.params.x[0]",
    ),
    (
        "Generate",
        _generate(episode=rollout_pb2.Episode(environment="e", metadata=_struct(-math.inf))),
        INVALID,
        "prompts[0].episode.metadata.x[0]",
    ),
    (
        "Generate",
        _generate(episode=rollout_pb2.Episode(environment="e", max_turns=U32)),
        INVALID,
        "prompts[0].episode.max_turns",
    ),
    (
        "Generate",
        _generate(episode=rollout_pb2.Episode(environment="e", max_tool_calls=U32)),
        INVALID,
        "prompts[0].episode.max_tool_calls",
    ),
]


@pytest.mark.parametrize(("method", "request_", "code", "field"), CASES)
def test_a_number_at_the_edge_of_its_type_is_refused_naming_its_field(server, method, request_, code, field):
    with grpc.insecure_channel(server.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        if method == "UpdateWeightsFromChannel":
            stub.OpenWeightChannel(
                rollout_pb2.OpenWeightChannelRequest(transport=rollout_pb2.WEIGHT_TRANSPORT_SHARED_MEMORY),
                timeout=HANG_S,
            )
        call = getattr(stub, method)
        with pytest.raises(grpc.RpcError) as info:
            call(iter(request_) if isinstance(request_, list) else request_, timeout=HANG_S)
        assert (info.value.code(), info.value.details().partition(":")[0]) == (code, field), (
            info.value.details()
        )
        status = stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=HANG_S)
        assert status.policy_version == 0 and status.weights_valid


async def test_a_join_whose_rendezvous_never_answers_ends_at_its_timeout_and_the_server_stops(tiny_models):
    core = await build_core(RolloutSettings(model=str(tiny_models["policy"]), engine="hf"))
    server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_period_s=1), [binding(core)], core.close)
    await server.start()
    try:
        with silent_peer() as port:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = rollout_pb2_grpc.RolloutServiceStub(channel)
                join = _group(init_method=f"tcp://127.0.0.1:{port}", timeout_seconds=1.0)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.OpenWeightChannel(join, timeout=HANG_S)
                # The server's answer (the client's own deadline would read "Deadline Exceeded").
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert info.value.details().startswith("timeout_seconds: ")
                assert "did not form within 1 s" in info.value.details()
                status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=HANG_S)
                assert status.weight_transport == rollout_pb2.WEIGHT_TRANSPORT_GRPC_STREAM
            # The join's thread still waits on the silent peer, and nothing waits for it.
            assert core.channel.joiner.abandoned == 1
            await asyncio.wait_for(server.stop(), HANG_S)
            # What asyncio.run does at the end: before, it joined the thread stuck in torch's receive.
            await asyncio.wait_for(asyncio.get_running_loop().shutdown_default_executor(), HANG_S)
    finally:
        await server.stop(0)
