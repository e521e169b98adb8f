"""Protobuf ↔ domain conversion for the rollout service (no logic beyond field mapping)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from google.protobuf import json_format, struct_pb2
from grpo.rollout.v1 import rollout_pb2

from grpo_runtime.errors import InvalidArgument
from rollout_service.core.weight_channel import ChannelApplied, ChannelManifest, TensorLayout
from rollout_service.engines.torch_group import GroupSpec
from rollout_service.payload import PayloadReceiver
from rollout_service.types import (
    CompletionResult,
    EpisodeSpec,
    GenerateRequest,
    MemoryUsage,
    PromptInput,
    SamplingSpec,
    SleepResult,
    StatusInfo,
    WakeResult,
    WeightFormat,
    WeightPayload,
    WeightsApplied,
    WeightTransport,
)

# OpenWeightChannel's default wait for the group to form, in seconds.
DEFAULT_JOIN_TIMEOUT_S = 60.0


def sampling_spec(msg: rollout_pb2.SamplingParams) -> SamplingSpec:
    """Unset optional fields take the contract's defaults."""
    return SamplingSpec(
        temperature=msg.temperature if msg.HasField("temperature") else 1.0,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0,
        top_k=msg.top_k if msg.HasField("top_k") else 0,
        min_p=msg.min_p if msg.HasField("min_p") else 0.0,
        max_tokens=msg.max_tokens if msg.HasField("max_tokens") else 16,
        stop=tuple(msg.stop),
        seed=msg.seed if msg.HasField("seed") else None,
        repetition_penalty=msg.repetition_penalty if msg.HasField("repetition_penalty") else 1.0,
        min_tokens=msg.min_tokens if msg.HasField("min_tokens") else 0,
    )


def struct_dict(msg: struct_pb2.Struct, field: str) -> dict[str, Any]:
    """A Struct as JSON values; INVALID_ARGUMENT(``field``) for what JSON cannot hold (a NaN or infinite
    number)."""
    try:
        return json_format.MessageToDict(msg)
    except ValueError as exc:
        raise InvalidArgument(f"is not JSON: {exc}", field=field) from exc


def episode_spec(msg: rollout_pb2.Episode, field: str = "episode") -> EpisodeSpec:
    """``field``: where the episode is in the request (``prompts[2].episode``), for errors."""
    return EpisodeSpec(
        environment=msg.environment,
        params=struct_dict(msg.params, f"{field}.params"),
        metadata=struct_dict(msg.metadata, f"{field}.metadata"),
        max_turns=msg.max_turns if msg.HasField("max_turns") else None,
        max_tool_calls=msg.max_tool_calls if msg.HasField("max_tool_calls") else None,
        target=msg.target,
    )


def generate_request(msg: rollout_pb2.GenerateRequest) -> GenerateRequest:
    prompts = tuple(
        PromptInput(
            id=p.id,
            messages=tuple((m.role, m.content) for m in p.messages),
            text=p.text,
            token_ids=tuple(p.token_ids),
            episode=episode_spec(p.episode, f"prompts[{i}].episode") if p.HasField("episode") else None,
        )
        for i, p in enumerate(msg.prompts)
    )
    return GenerateRequest(
        prompts=prompts,
        n=msg.n,
        sampling=sampling_spec(msg.sampling),
        continue_across_updates=msg.continue_across_updates,
    )


def completion(result: CompletionResult) -> rollout_pb2.Completion:
    return rollout_pb2.Completion(
        prompt_id=result.prompt_id,
        prompt_token_ids=result.prompt_token_ids,
        token_ids=result.token_ids,
        text=result.text,
        logprobs=result.logprobs,
        finish_reason=int(result.finish_reason),
        policy_version=result.policy_version,
        tool_mask=result.tool_mask,
        turns=[
            rollout_pb2.Turn(
                start=t.start, end=t.end, policy_version=t.policy_version, tool_calls=t.tool_calls
            )
            for t in result.turns
        ],
        tool_call_count=result.tool_call_count,
        tool_failure_count=result.tool_failure_count,
        env_reward=result.env_reward,
        error=result.error,
        token_versions=result.token_versions,
    )


def weight_format(value: int) -> WeightFormat:
    """Proto3 enums are open: a value this server does not know is refused, not a crash."""
    try:
        return WeightFormat(value)
    except ValueError as exc:
        raise InvalidArgument(f"unknown weight format {value}", field="format") from exc


def weight_transport(value: int) -> WeightTransport:
    try:
        return WeightTransport(value)
    except ValueError as exc:
        raise InvalidArgument(f"unknown weight transport {value}", field="transport") from exc


def open_weight_channel(
    msg: rollout_pb2.OpenWeightChannelRequest,
) -> tuple[WeightTransport, GroupSpec | None]:
    """(transport, the group to join for TORCH_DISTRIBUTED, else None)."""
    transport = weight_transport(msg.transport)
    if transport != WeightTransport.TORCH_DISTRIBUTED:
        return transport, None
    spec = GroupSpec(
        init_method=msg.init_method,
        rank=msg.rank,
        world_size=msg.world_size,
        backend=msg.backend or "gloo",
        timeout_s=msg.timeout_seconds or DEFAULT_JOIN_TIMEOUT_S,
    )
    return transport, spec


def channel_manifest(msg: rollout_pb2.UpdateWeightsFromChannelRequest) -> ChannelManifest:
    return ChannelManifest(
        version=msg.version,
        format=weight_format(msg.format),
        tensors=tuple(
            TensorLayout(t.name, t.dtype, tuple(t.shape), t.bucket, t.offset, t.nbytes) for t in msg.tensors
        ),
        bucket_bytes=tuple(msg.bucket_bytes),
        adapter_config_json=msg.adapter_config_json,
        bucket_files=tuple(msg.bucket_files),
    )


def update_weights_from_channel_response(
    applied: ChannelApplied,
) -> rollout_pb2.UpdateWeightsFromChannelResponse:
    return rollout_pb2.UpdateWeightsFromChannelResponse(
        policy_version=applied.policy_version,
        bytes_received=applied.bytes_received,
        tensors_loaded=applied.tensors_loaded,
        transfer_seconds=applied.transfer_seconds,
        apply_seconds=applied.apply_seconds,
        transport=int(applied.transport),
    )


def generate_response(results: Iterable[CompletionResult]) -> rollout_pb2.GenerateResponse:
    return rollout_pb2.GenerateResponse(completions=[completion(r) for r in results])


async def weight_payload(chunks: AsyncIterator[rollout_pb2.WeightChunk], max_bytes: int) -> WeightPayload:
    """Header from the first chunk; the payload is the concatenation of every chunk's data,
    at most ``max_bytes`` (RESOURCE_EXHAUSTED past it, at the chunk that overruns).

    Each chunk is copied into the receive buffer and hashed in a worker thread while the
    event loop takes the next one off the stream, so the SHA-256 is ready at the last chunk.
    """
    loop = asyncio.get_running_loop()
    header: rollout_pb2.WeightChunk | None = None
    receiver: PayloadReceiver | None = None
    pending: asyncio.Future[None] | None = None
    async for chunk in chunks:
        if receiver is None:
            header = chunk
            fmt = weight_format(chunk.format)
            receiver = PayloadReceiver(chunk.total_bytes, max_bytes)
        if pending is not None:
            await pending
        pending = loop.run_in_executor(None, receiver.add, chunk.data)
    if header is None or receiver is None:
        raise InvalidArgument("the stream carried no chunk", field="chunks")
    if pending is not None:
        await pending
    data, digest = receiver.finish()
    return WeightPayload(
        version=header.version,
        format=fmt,
        data=data,
        sha256=header.sha256,
        total_bytes=header.total_bytes,
        adapter_config_json=header.adapter_config_json,
        received_sha256=digest,
    )


def update_weights_response(applied: WeightsApplied) -> rollout_pb2.UpdateWeightsResponse:
    return rollout_pb2.UpdateWeightsResponse(
        policy_version=applied.policy_version,
        bytes_received=applied.bytes_received,
        tensors_loaded=applied.tensors_loaded,
        apply_seconds=applied.apply_seconds,
    )


def load_weights_response(applied: WeightsApplied) -> rollout_pb2.LoadWeightsResponse:
    return rollout_pb2.LoadWeightsResponse(
        policy_version=applied.policy_version,
        tensors_loaded=applied.tensors_loaded,
        apply_seconds=applied.apply_seconds,
    )


def memory_usage(mem: MemoryUsage) -> rollout_pb2.MemoryUsage:
    return rollout_pb2.MemoryUsage(
        rss_bytes=mem.rss_bytes,
        cuda_allocated_bytes=mem.cuda_allocated_bytes,
        cuda_reserved_bytes=mem.cuda_reserved_bytes,
    )


def sleep_response(result: SleepResult) -> rollout_pb2.SleepResponse:
    return rollout_pb2.SleepResponse(
        level=result.level,
        memory_before=memory_usage(result.memory_before),
        memory_after=memory_usage(result.memory_after),
    )


def wake_up_response(result: WakeResult) -> rollout_pb2.WakeUpResponse:
    return rollout_pb2.WakeUpResponse(
        weights_valid=result.weights_valid,
        memory=memory_usage(result.memory),
        wake_seconds=result.wake_seconds,
    )


def status_response(status: StatusInfo, *, admin: bool) -> rollout_pb2.GetStatusResponse:
    """``admin``: whether the caller holds the admin token. The shared-memory directory and its token
    are only for a trainer that pushes weights (an admin); anyone else gets them empty."""
    return rollout_pb2.GetStatusResponse(
        engine=status.engine,
        device=status.device,
        model=status.model,
        policy_version=status.policy_version,
        sleep_level=status.sleep_level,
        sleeping_tags=list(status.sleeping_tags),
        weights_valid=status.weights_valid,
        memory=memory_usage(status.memory),
        max_model_len=status.max_model_len,
        weight_format=int(status.weight_format),
        weight_transport=int(status.weight_transport),
        weight_transports=[int(t) for t in status.weight_transports],
        weight_shm_dir=status.weight_shm_dir if admin else "",
        weight_shm_token=status.weight_shm_token if admin else "",
    )
