"""The rollout codec both ways: what one side encodes, the other decodes to the same domain values, through
the bytes gRPC sends; a request's fields the server cannot take are refused naming the field."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from grpo.rollout.v1 import rollout_pb2

from grpo_runtime.errors import InvalidArgument
from rollout_service import codec, weight_codec
from rollout_service.types import (
    CompletionResult,
    EpisodeSpec,
    FinishReason,
    MemoryUsage,
    PromptInput,
    SamplingSpec,
    SleepResult,
    StatusInfo,
    TurnSpan,
    WakeResult,
    WeightFormat,
    WeightsApplied,
    WeightTransport,
)
from rollout_service.weight_plane.buckets import plan_buckets
from rollout_service.weight_plane.distributed import GroupSpec
from rollout_service.weight_plane.manifest import ChannelApplied, ChannelManifest
from rollout_service.weight_plane.payload import encode


def wire(message):
    """``message`` as the other side reads it: serialized and parsed again."""
    return type(message).FromString(message.SerializeToString())


def test_a_generate_request_decodes_to_what_the_client_sent():
    episode = EpisodeSpec(
        "calculator",
        params={"digits": 3},
        metadata={"answer": "7"},
        max_turns=4,
        target="tools",
        skip_reward=True,
    )
    request = codec.encode_generate_request(
        ["plain", [{"role": "system", "content": "be brief"}, {"role": "user", "content": None}], [5, 6, 7]],
        4,
        {"temperature": 0.5, "max_tokens": 9, "stop": "###", "seed": 3, "top_k": None},
        prompt_ids=["a", "b", "c"],
        episodes=[episode, episode, episode],
        continue_across_updates=True,
        min_policy_version=7,
    )
    decoded = codec.decode_generate_request(wire(request))
    assert decoded.prompts == (
        PromptInput(id="a", text="plain", episode=episode),
        PromptInput(id="b", messages=(("system", "be brief"), ("user", "")), episode=episode),
        PromptInput(id="c", token_ids=(5, 6, 7), episode=episode),
    )
    assert decoded.n == 4 and decoded.continue_across_updates and decoded.min_policy_version == 7
    unset = codec.decode_generate_request(wire(codec.encode_generate_request(["x"], 1, {})))
    assert unset.min_policy_version is None
    assert decoded.sampling == SamplingSpec(temperature=0.5, max_tokens=9, stop=("###",), seed=3)


def test_unset_sampling_fields_take_the_contracts_defaults_and_unknown_keys_are_refused():
    assert codec.decode_sampling(wire(codec.encode_sampling({}))) == SamplingSpec()
    with pytest.raises(ValueError, match="unknown sampling keys \\['temprature'\\]"):
        codec.encode_sampling({"temprature": 1.0})


def test_prompt_ids_default_to_their_positions():
    request = codec.encode_generate_request(["x", "y"], 1, {})
    assert [p.id for p in codec.decode_generate_request(request).prompts] == ["0", "1"]


def test_an_episode_with_a_non_finite_number_is_refused_naming_the_field():
    request = codec.encode_generate_request(["x"], 1, {}, episodes=[EpisodeSpec("calculator")])
    request.prompts[0].episode.metadata["bad"] = math.nan
    with pytest.raises(InvalidArgument) as error:
        codec.decode_generate_request(request)
    assert error.value.field == "prompts[0].episode.metadata.bad"


@pytest.mark.parametrize("env_reward", [None, 0.25])
def test_completions_decode_to_what_the_server_encoded(env_reward):
    result = CompletionResult(
        prompt_id="p",
        prompt_token_ids=[1, 2],
        token_ids=[3, 4, 5],
        text="abc",
        logprobs=[-0.5, -0.25, -1.0],
        finish_reason=FinishReason.TURN_LIMIT,
        policy_version=7,
        tool_mask=[1, 0, 1],
        turns=[TurnSpan(0, 1, 7, 1), TurnSpan(2, 3, 8)],
        tool_call_count=1,
        tool_failure_count=1,
        env_reward=env_reward,
        error="",
        token_versions=[7, 7, 8],
    )
    response = codec.encode_generate_response([result, result])
    assert codec.decode_generate_response(wire(response)) == [result, result]


def test_sleep_wake_and_weight_replies_decode_to_what_the_server_encoded():
    before, after = MemoryUsage(100, 20, 30), MemoryUsage(50)
    sleep = SleepResult(2, before, after)
    assert codec.decode_sleep_response(wire(codec.encode_sleep_response(sleep))) == sleep
    wake = WakeResult(True, before, 0.5)
    assert codec.decode_wake_up_response(wire(codec.encode_wake_up_response(wake))) == wake
    pushed = WeightsApplied(3, 10, 0.25, 4096)
    assert codec.decode_update_weights_response(wire(codec.encode_update_weights_response(pushed))) == pushed
    loaded = WeightsApplied(4, 11, 0.5)
    assert codec.decode_load_weights_response(wire(codec.encode_load_weights_response(loaded))) == loaded
    request = codec.encode_load_weights_request("/shared/ckpt", 4, WeightFormat.LORA_ADAPTER)
    assert codec.decode_load_weights_request(wire(request)) == ("/shared/ckpt", 4, WeightFormat.LORA_ADAPTER)


def test_the_status_shows_the_shared_memory_directory_to_admins_only():
    status = StatusInfo(
        engine="hf",
        device="cpu",
        model="tiny",
        policy_version=2,
        sleep_level=0,
        sleeping_tags=("kv_cache",),
        weights_valid=True,
        memory=MemoryUsage(1, 2, 3),
        max_model_len=512,
        weight_format=WeightFormat.STATE_DICT,
        weight_transport=WeightTransport.SHARED_MEMORY,
        weight_transports=(WeightTransport.GRPC_STREAM, WeightTransport.SHARED_MEMORY),
        weight_shm_dir="/dev/shm/replica",
        weight_shm_token="secret",
    )
    assert codec.decode_status_response(wire(codec.encode_status_response(status, admin=True))) == status
    seen = codec.decode_status_response(wire(codec.encode_status_response(status, admin=False)))
    assert (seen.weight_shm_dir, seen.weight_shm_token) == ("", "")


def test_a_transport_a_newer_server_reports_reads_as_unspecified_but_a_request_naming_one_is_refused():
    assert codec.decode_reported_transport(99) == WeightTransport.UNSPECIFIED
    with pytest.raises(InvalidArgument) as error:
        codec.decode_weight_transport(99)
    assert error.value.field == "transport"
    with pytest.raises(InvalidArgument) as error:
        codec.decode_weight_format(99)
    assert error.value.field == "format"


def test_a_group_is_read_for_torch_distributed_only():
    group = GroupSpec("tcp://127.0.0.1:29500", 1, 2, "gloo", 30.0)
    request = weight_codec.encode_open_weight_channel(WeightTransport.TORCH_DISTRIBUTED, group)
    assert weight_codec.decode_open_weight_channel(wire(request)) == (
        WeightTransport.TORCH_DISTRIBUTED,
        group,
    )
    request = weight_codec.encode_open_weight_channel(WeightTransport.SHARED_MEMORY, group)
    assert weight_codec.decode_open_weight_channel(wire(request)) == (WeightTransport.SHARED_MEMORY, None)
    unset = rollout_pb2.OpenWeightChannelRequest(transport=int(WeightTransport.TORCH_DISTRIBUTED))
    _, defaults = weight_codec.decode_open_weight_channel(unset)
    assert (defaults.backend, defaults.timeout_s) == ("gloo", weight_codec.DEFAULT_JOIN_TIMEOUT_S)


def test_a_channel_manifest_and_its_reply_decode_to_what_was_encoded():
    plan = plan_buckets({"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)}, bucket_bytes=64)
    manifest = ChannelManifest(
        version=5,
        format=WeightFormat.LORA_ADAPTER,
        tensors=plan.layouts,
        bucket_bytes=plan.bucket_bytes,
        adapter_config_json='{"r": 8}',
        bucket_files=("bucket-0", "bucket-1"),
    )
    assert (
        weight_codec.decode_channel_manifest(wire(weight_codec.encode_channel_manifest(manifest))) == manifest
    )
    applied = ChannelApplied(5, 2, 58, 0.1, 0.2, WeightTransport.SHARED_MEMORY)
    assert weight_codec.decode_channel_applied(wire(weight_codec.encode_channel_applied(applied))) == applied


async def _messages(chunks):
    for chunk in chunks:
        yield rollout_pb2.WeightChunk.FromString(chunk)


async def test_weight_chunks_written_by_hand_decode_to_the_payload_and_its_digest():
    payload = encode({"w": torch.arange(1000, dtype=torch.float32)})
    header = weight_codec.encode_weight_header(payload, 6, WeightFormat.STATE_DICT, "")
    chunks = list(weight_codec.encode_weight_chunks(payload, header, chunk_bytes=1000))
    assert len(chunks) == math.ceil(payload.nbytes / 1000) > 1
    received = await weight_codec.decode_weight_chunks(_messages(chunks), max_bytes=payload.nbytes)
    data = b"".join(bytes(part) for part in payload.parts)
    assert bytes(received.data) == data
    assert received.sha256 == received.received_sha256 == payload.sha256 == hashlib.sha256(data).hexdigest()
    assert (received.version, received.format, received.total_bytes) == (
        6,
        WeightFormat.STATE_DICT,
        len(data),
    )


async def test_an_empty_stream_is_refused_naming_the_chunks():
    with pytest.raises(InvalidArgument) as error:
        await weight_codec.decode_weight_chunks(_messages([]), max_bytes=10)
    assert error.value.field == "chunks"
