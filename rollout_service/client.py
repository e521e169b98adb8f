"""Synchronous client of the rollout service, used by the trainer (TRL's ``rollout_func`` is sync).

    from rollout_service.client import RolloutClient

    with RolloutClient("127.0.0.1:50052", admin_token=None) as rollout:
        rollout.wait_ready(timeout_s=60)
        results = rollout.generate(
            ["plain text prompt", [{"role": "user", "content": "What is 2 + 2?"}], [1, 405, 202]],
            n=8,
            sampling={"temperature": 1.0, "max_tokens": 64, "top_p": 1.0, "seed": 0},
        )
        # len(results) == 3 * 8, prompt-major: results[i * 8 + j] is sample j of prompt i.
        r = results[0]
        r.prompt_id, r.prompt_token_ids, r.token_ids, r.text, r.logprobs, r.finish_reason, r.policy_version

        rollout.push_lora("out/adapter", version=1)          # a PEFT save_pretrained directory, or
        rollout.push_lora(lora_state_dict, version=2, adapter_config=peft_config.to_dict())
        rollout.push_state_dict(model.state_dict(), version=3)  # full or partial
        payload = encode(model.state_dict())                    # rollout_service.payload
        for replica in replicas:                                # one encoding and SHA-256 for all
            replica.push_weights(payload, version=4, format="state_dict")
        rollout.load_weights("/shared/ckpt-5", version=5)       # a directory the server can read
        rollout.sleep(level=1); rollout.wake_up(); rollout.status()

Prompts: a ``str`` is plain text, a list of ``{"role", "content"}`` dicts is a chat (the server
applies the chat template with the generation prompt), a list of ints is token ids.
``sampling`` keys are the fields of ``SamplingParams``: temperature, top_p, top_k, min_p,
max_tokens, stop, seed, repetition_penalty, min_tokens.
``logprobs[i]`` = log_softmax(logits / T)[token_ids[i]], what TRL recomputes.

Weights are streamed from the tensors' own memory (no serialized copy of the file is built), so
they must not change while a push runs.

A failed call raises the :class:`~grpo_runtime.call_errors.ServiceCallError` of its status:
InvalidArgumentError (``field`` names the field), FailedPreconditionError (asleep, or weights
discarded by a level-2 sleep), UnauthenticatedError (admin RPCs without the token),
UnavailableError, DeadlineExceededError. The channel opens at the first call; calls are retried
only by the channel (UNAVAILABLE) unless ``retry_budget_s`` is set, because the trainer redoes a
whole generation step instead (:mod:`trainer_service.rollout.service_rollout`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from grpo.common.v1 import common_pb2
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.client import ChannelConfig, ServiceClient
from rollout_service.core.weight_channel import (
    DEFAULT_BUCKET_BYTES,
    BucketFiles,
    BucketPlan,
    ChannelApplied,
    fill_bucket,
    plan_buckets,
    shares_directory,
)
from rollout_service.engines.torch_group import BroadcastGroup, GroupSpec
from rollout_service.payload import EncodedPayload, encode
from rollout_service.types import (
    CompletionResult,
    EpisodeSpec,
    FinishReason,
    MemoryUsage,
    SleepResult,
    StatusInfo,
    TurnSpan,
    WakeResult,
    WeightFormat,
    WeightsApplied,
    WeightTransport,
)
from rollout_service.weights import adapter_dir_payload

# Measured on loopback with grpcio 1.85 (bare bytes between two processes, no Python work per
# message): 256 KiB-2 MiB messages stream at ~1.0-1.1 GB/s, 4-16 MiB ones at 0.5-0.8 GB/s.
CHUNK_BYTES = 2 * 1024 * 1024
UPDATE_WEIGHTS = "/grpo.rollout.v1.RolloutService/UpdateWeights"
# WeightChunk.data is field 6, wire type 2 (length-delimited): tag byte (6 << 3) | 2.
DATA_TAG = b"\x32"
SAMPLING_FIELDS = frozenset(rollout_pb2.SamplingParams.DESCRIPTOR.fields_by_name)
Prompt = str | Sequence[Mapping[str, str]] | Sequence[int]

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BroadcastGroup",
    "BucketFiles",
    "BucketPlan",
    "ChannelApplied",
    "CompletionResult",
    "EncodedPayload",
    "EpisodeSpec",
    "FinishReason",
    "GroupSpec",
    "RolloutClient",
    "StatusInfo",
    "WeightFormat",
    "WeightTransport",
    "WeightsApplied",
    "encode",
    "fill_bucket",
    "plan_buckets",
    "shares_directory",
]


class RolloutClient(ServiceClient):
    """Blocking client of ``grpo.rollout.v1.RolloutService`` (:class:`ServiceClient`).

    ``target``: "host:port" or a :class:`ChannelConfig` (TLS, retries, message limits).
    ``admin_token``: bearer token for the admin RPCs (weights, sleep, wake) when the server
    requires one. ``timeout_s``: default deadline per call (None = none).
    """

    service_name = "rollout service"
    stub_class = rollout_pb2_grpc.RolloutServiceStub

    def __init__(
        self,
        target: str | ChannelConfig,
        *,
        admin_token: str | None = None,
        timeout_s: float | None = None,
        retry_budget_s: float = 0.0,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        super().__init__(target, admin_token=admin_token, timeout_s=timeout_s, retry_budget_s=retry_budget_s)
        self._chunk_bytes = chunk_bytes

    def _update_weights(self, chunks: Iterator[bytes], timeout: float | None) -> Any:
        """UpdateWeights with chunks encoded here (see _encoded_chunks): the generated stub would
        copy every chunk into a message and again when serializing it."""
        rpc = self.channel.stream_unary(
            UPDATE_WEIGHTS,
            request_serializer=None,
            response_deserializer=rollout_pb2.UpdateWeightsResponse.FromString,
        )
        return rpc(chunks, timeout=timeout)

    # -------------------------------------------------------------- generate
    def generate(
        self,
        prompts: Sequence[Prompt],
        n: int = 1,
        sampling: Mapping[str, Any] | None = None,
        *,
        prompt_ids: Sequence[str] | None = None,
        episodes: Sequence[EpisodeSpec] | None = None,
        continue_across_updates: bool = False,
        timeout_s: float | None = None,
    ) -> list[CompletionResult]:
        """``n`` completions per prompt, prompt-major (``len(prompts) * n`` results).

        ``prompt_ids`` (optional) are echoed in ``CompletionResult.prompt_id``; default "0", "1", ...
        ``episodes`` (optional, one per prompt): each completion is a multi-turn tool episode; the
        results then carry ``tool_mask``, ``turns``, tool counts and ``env_reward``.
        ``continue_across_updates``: a weight update during the call pauses it at a token boundary
        instead of waiting for it (``CompletionResult.token_versions`` says which version sampled what).
        """
        request = rollout_pb2.GenerateRequest(
            prompts=[
                _prompt(p, prompt_ids[i] if prompt_ids else str(i), episodes[i] if episodes else None)
                for i, p in enumerate(prompts)
            ],
            n=n,
            sampling=_sampling(sampling or {}),
            continue_across_updates=continue_across_updates,
        )
        response = self._call("Generate", request, timeout_s=timeout_s)
        return [_completion(c) for c in response.completions]

    # --------------------------------------------------------------- weights
    def push_weights(
        self,
        payload: bytes | EncodedPayload,
        version: int,
        format: WeightFormat | str,
        adapter_config: Mapping[str, Any] | str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> WeightsApplied:
        """Stream one safetensors payload in chunks (header on the first chunk, SHA-256 included).

        ``payload``: the file's bytes, or an :class:`EncodedPayload` (views of tensors, from
        ``rollout_service.payload.encode``), streamed without building the file.
        ``format``: WeightFormat or "lora" / "state_dict"; ``adapter_config`` is required for LoRA
        (a dict or the adapter_config.json text).
        """
        if not isinstance(payload, EncodedPayload):
            view = memoryview(payload).cast("B")
            payload = EncodedPayload((view,), len(view), 0)
        fmt = _weight_format(format)
        config_json = (
            json.dumps(adapter_config) if isinstance(adapter_config, Mapping) else adapter_config or ""
        )
        header = rollout_pb2.WeightChunk(
            version=version,
            format=int(fmt),
            adapter_config_json=config_json,
            total_bytes=payload.nbytes,
            sha256=payload.sha256,  # the header goes first, so the whole payload is hashed first
        )
        header_bytes = header.SerializeToString()
        response = self._call(
            self._update_weights,
            lambda: self._encoded_chunks(payload, header_bytes),
            timeout_s=timeout_s,
            what="UpdateWeights",
        )
        return WeightsApplied(
            response.policy_version, response.tensors_loaded, response.apply_seconds, response.bytes_received
        )

    def push_lora(
        self,
        adapter: str | Path | Mapping[str, torch.Tensor],
        adapter_config: Mapping[str, Any] | str | None = None,
        version: int | None = None,
        *,
        timeout_s: float | None = None,
    ) -> WeightsApplied:
        """Push a LoRA adapter: a PEFT ``save_pretrained`` directory (``adapter_config`` then
        optional), or its tensors (PEFT names, e.g. from ``peft.get_peft_model_state_dict``) with
        ``adapter_config`` (a dict such as ``peft_config.to_dict()``, or JSON text).
        ``version`` is required and must exceed the serving version."""
        if version is None:
            raise ValueError("version is required")
        if isinstance(adapter, str | Path):
            payload, config_json = adapter_dir_payload(adapter)
            return self.push_weights(
                payload,
                version,
                WeightFormat.LORA_ADAPTER,
                adapter_config or config_json,
                timeout_s=timeout_s,
            )
        if adapter_config is None:
            raise ValueError("adapter_config is required when pushing LoRA tensors")
        payload = encode(dict(adapter))
        return self.push_weights(
            payload, version, WeightFormat.LORA_ADAPTER, _jsonable(adapter_config), timeout_s=timeout_s
        )

    def push_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], version: int, *, timeout_s: float | None = None
    ) -> WeightsApplied:
        """Push a full or partial state dict (names as in the base model's ``state_dict()``).

        The tensors are streamed from their own memory (no serialized copy is built); they must
        not change until this returns."""
        payload = encode(dict(state_dict))
        return self.push_weights(payload, version, WeightFormat.STATE_DICT, timeout_s=timeout_s)

    def load_weights(
        self,
        path: str | Path,
        version: int,
        format: WeightFormat | str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> WeightsApplied:
        """Load weights from a directory the server can read (format detected when None)."""
        fmt = WeightFormat.UNSPECIFIED if format is None else _weight_format(format)
        response = self._call(
            "LoadWeights",
            rollout_pb2.LoadWeightsRequest(path=str(path), version=version, format=int(fmt)),
            timeout_s=timeout_s,
        )
        return WeightsApplied(response.policy_version, response.tensors_loaded, response.apply_seconds)

    # ------------------------------------------------------- weight channel
    def open_weight_channel(
        self,
        transport: WeightTransport,
        *,
        init_method: str = "",
        rank: int = 0,
        world_size: int = 0,
        backend: str = "gloo",
        join_timeout_s: float = 60.0,
        timeout_s: float | None = None,
    ) -> WeightTransport:
        """Have the replica join a data plane: SHARED_MEMORY (its ``weight_shm_dir``), or the
        torch.distributed group the caller (rank 0) hosts at ``init_method`` (``tcp://host:port``),
        which this call waits for while the caller joins it too (up to ``join_timeout_s``; then
        DeadlineExceededError naming ``timeout_seconds``)."""
        request = rollout_pb2.OpenWeightChannelRequest(
            transport=int(transport),
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            backend=backend,
            timeout_seconds=join_timeout_s,
        )
        response = self._call("OpenWeightChannel", request, timeout_s=timeout_s)
        return WeightTransport(response.transport)

    def push_from_channel(
        self,
        plan: BucketPlan,
        version: int,
        format: WeightFormat | str,
        adapter_config: Mapping[str, Any] | str | None = None,
        *,
        bucket_files: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> ChannelApplied:
        """UpdateWeightsFromChannel: the manifest of ``plan``, whose bytes are in the shared-memory
        ``bucket_files`` or broadcast on the open group while this call waits."""
        fmt = _weight_format(format)
        request = rollout_pb2.UpdateWeightsFromChannelRequest(
            version=version,
            format=int(fmt),
            adapter_config_json=_jsonable(adapter_config) if adapter_config is not None else "",
            tensors=[
                rollout_pb2.TensorLayout(
                    name=t.name,
                    dtype=t.dtype,
                    shape=t.shape,
                    bucket=t.bucket,
                    offset=t.offset,
                    nbytes=t.nbytes,
                )
                for t in plan.layouts
            ],
            bucket_bytes=plan.bucket_bytes,
            bucket_files=list(bucket_files),
        )
        r = self._call("UpdateWeightsFromChannel", request, timeout_s=timeout_s)
        return ChannelApplied(
            r.policy_version,
            r.tensors_loaded,
            r.bytes_received,
            r.transfer_seconds,
            r.apply_seconds,
            _transport(r.transport),
        )

    def close_weight_channel(self, *, timeout_s: float | None = None) -> None:
        """Leave the data plane; later pushes use the stream."""
        self._call("CloseWeightChannel", rollout_pb2.CloseWeightChannelRequest(), timeout_s=timeout_s)

    # ---------------------------------------------------------- sleep/status
    def sleep(self, level: int = 1, *, timeout_s: float | None = None) -> SleepResult:
        r = self._call("Sleep", rollout_pb2.SleepRequest(level=level), timeout_s=timeout_s)
        return SleepResult(r.level, _memory(r.memory_before), _memory(r.memory_after))

    def wake_up(self, tags: Sequence[str] = (), *, timeout_s: float | None = None) -> WakeResult:
        """Wake ``tags`` ("weights", "kv_cache"); empty = everything."""
        r = self._call("WakeUp", rollout_pb2.WakeUpRequest(tags=list(tags)), timeout_s=timeout_s)
        return WakeResult(r.weights_valid, _memory(r.memory), r.wake_seconds)

    def status(self, *, timeout_s: float | None = None) -> StatusInfo:
        r = self._call("GetStatus", rollout_pb2.GetStatusRequest(), timeout_s=timeout_s)
        return StatusInfo(
            engine=r.engine,
            device=r.device,
            model=r.model,
            policy_version=r.policy_version,
            sleep_level=r.sleep_level,
            sleeping_tags=tuple(r.sleeping_tags),
            weights_valid=r.weights_valid,
            memory=_memory(r.memory),
            max_model_len=r.max_model_len,
            weight_format=WeightFormat(r.weight_format),
            weight_transport=_transport(r.weight_transport),
            weight_transports=tuple(_transport(t) for t in r.weight_transports),
            weight_shm_dir=r.weight_shm_dir,
            weight_shm_token=r.weight_shm_token,
        )

    def _encoded_chunks(self, payload: EncodedPayload, header: bytes) -> Iterator[bytes]:
        """Serialized WeightChunk messages: the header fields on the first, ``data`` on each.

        Protobuf's wire format is a sequence of fields, so a message is its serialized header
        fields followed by the ``data`` field written by hand: tag, varint length, the bytes
        (one copy of each chunk, into the message gRPC sends)."""
        prefix = header
        for piece in payload.chunks(self._chunk_bytes):
            yield b"".join((prefix, DATA_TAG, _varint(len(piece)), piece))
            prefix = b""
        if prefix:  # an empty payload: the header alone, for the server to refuse
            yield prefix


def _transport(value: int) -> WeightTransport:
    """A transport a newer server reports and this client does not know reads as UNSPECIFIED."""
    try:
        return WeightTransport(value)
    except ValueError:
        return WeightTransport.UNSPECIFIED


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint: 7 bits per byte, least significant first, high bit = more."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _prompt(prompt: Prompt, prompt_id: str, episode: EpisodeSpec | None = None) -> rollout_pb2.Prompt:
    message = rollout_pb2.Prompt(id=prompt_id)
    if episode is not None:
        message.episode.CopyFrom(_episode(episode))
    if isinstance(prompt, str):
        message.text = prompt
        return message
    items = list(prompt)
    if items and all(isinstance(x, int) for x in items):
        message.token_ids.extend(items)
        return message
    message.messages.extend(
        common_pb2.ChatMessage(role=m["role"], content=m.get("content") or "") for m in items
    )
    return message


def _episode(spec: EpisodeSpec) -> rollout_pb2.Episode:
    message = rollout_pb2.Episode(
        environment=spec.environment,
        max_turns=spec.max_turns,
        max_tool_calls=spec.max_tool_calls,
        target=spec.target,
    )
    message.params.update(spec.params)
    message.metadata.update(spec.metadata)
    return message


def _sampling(sampling: Mapping[str, Any]) -> rollout_pb2.SamplingParams:
    unknown = set(sampling) - SAMPLING_FIELDS
    if unknown:
        raise ValueError(f"unknown sampling keys {sorted(unknown)}; known: {sorted(SAMPLING_FIELDS)}")
    values = {k: v for k, v in sampling.items() if v is not None}
    if "stop" in values and isinstance(values["stop"], str):
        values["stop"] = [values["stop"]]
    return rollout_pb2.SamplingParams(**values)


def _completion(c: rollout_pb2.Completion) -> CompletionResult:
    return CompletionResult(
        prompt_id=c.prompt_id,
        prompt_token_ids=list(c.prompt_token_ids),
        token_ids=list(c.token_ids),
        text=c.text,
        logprobs=list(c.logprobs),
        finish_reason=FinishReason(c.finish_reason),
        policy_version=c.policy_version,
        tool_mask=list(c.tool_mask),
        turns=[TurnSpan(t.start, t.end, t.policy_version, t.tool_calls) for t in c.turns],
        tool_call_count=c.tool_call_count,
        tool_failure_count=c.tool_failure_count,
        env_reward=c.env_reward if c.HasField("env_reward") else None,
        error=c.error,
        token_versions=list(c.token_versions),
    )


def _memory(m: rollout_pb2.MemoryUsage) -> MemoryUsage:
    return MemoryUsage(m.rss_bytes, m.cuda_allocated_bytes, m.cuda_reserved_bytes)


def _weight_format(fmt: WeightFormat | str) -> WeightFormat:
    if isinstance(fmt, WeightFormat):
        return fmt
    names = {
        "lora": WeightFormat.LORA_ADAPTER,
        "lora_adapter": WeightFormat.LORA_ADAPTER,
        "state_dict": WeightFormat.STATE_DICT,
    }
    try:
        return names[fmt.lower()]
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}; use 'lora' or 'state_dict'") from None


def _jsonable(config: Mapping[str, Any] | str) -> str:
    """adapter_config as JSON text; sets (PEFT's target_modules) become sorted lists."""
    if isinstance(config, str):
        return config
    return json.dumps(dict(config), default=lambda v: sorted(v) if isinstance(v, set) else str(v))
