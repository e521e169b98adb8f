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
        payload = encode(model.state_dict())                    # rollout_service.weight_plane.payload
        for replica in replicas:                                # one encoding and SHA-256 for all
            replica.push_weights(payload, version=4, format="state_dict")
        rollout.load_weights("/shared/ckpt-5", version=5)       # a directory the server can read
        rollout.sleep(level=1); rollout.wake_up(); rollout.status()
        ticket = rollout.open_agent_session()                   # an agent calls .../sessions/<id>/v1
        trajectory = rollout.agent_trajectory(ticket.session_id, close=True)

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

import importlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.client import ChannelConfig, ServiceClient
from rollout_service import codec
from rollout_service.codec import Prompt
from rollout_service.gateway.types import AgentTrajectory, SessionTicket
from rollout_service.types import (
    CompletionResult,
    EpisodeSpec,
    FinishReason,
    SleepResult,
    StatusInfo,
    WakeResult,
    WeightFormat,
    WeightsApplied,
    WeightTransport,
)

if TYPE_CHECKING:  # at run time, the module __getattr__ below
    import torch

    from rollout_service.weight_plane.buckets import (
        DEFAULT_BUCKET_BYTES,
        BucketPlan,
        fill_bucket,
        plan_buckets,
    )
    from rollout_service.weight_plane.distributed import BroadcastGroup, GroupSpec
    from rollout_service.weight_plane.manifest import ChannelApplied
    from rollout_service.weight_plane.payload import EncodedPayload, encode
    from rollout_service.weight_plane.shared_memory import BucketFiles, shares_directory

# Measured on loopback with grpcio 1.85 (bare bytes between two processes, no Python work per
# message): 256 KiB-2 MiB messages stream at ~1.0-1.1 GB/s, 4-16 MiB ones at 0.5-0.8 GB/s.
CHUNK_BYTES = 2 * 1024 * 1024
UPDATE_WEIGHTS = "/grpo.rollout.v1.RolloutService/UpdateWeights"

# What a weight push needs from the weight data plane (rollout_service.weight_plane), which this module
# re-exports for the trainer, by the module defining it. Each of those modules imports torch (seconds, and
# a CUDA context's worth of memory on a GPU machine), so they are imported at the first weight push or the
# first use of the name (module ``__getattr__``), never by importing this module: a client that only
# generates or reads the status loads no torch.
TORCH_SIDE = {
    "DEFAULT_BUCKET_BYTES": "rollout_service.weight_plane.buckets",
    "BucketPlan": "rollout_service.weight_plane.buckets",
    "fill_bucket": "rollout_service.weight_plane.buckets",
    "plan_buckets": "rollout_service.weight_plane.buckets",
    "ChannelApplied": "rollout_service.weight_plane.manifest",
    "ChannelManifest": "rollout_service.weight_plane.manifest",
    "BucketFiles": "rollout_service.weight_plane.shared_memory",
    "shares_directory": "rollout_service.weight_plane.shared_memory",
    "BroadcastGroup": "rollout_service.weight_plane.distributed",
    "GroupSpec": "rollout_service.weight_plane.distributed",
    "EncodedPayload": "rollout_service.weight_plane.payload",
    "encode": "rollout_service.weight_plane.payload",
    "adapter_dir_payload": "rollout_service.weight_plane.payload",
}
WEIGHT_CODEC = "rollout_service.weight_codec"

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "AgentTrajectory",
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


def __getattr__(name: str) -> Any:
    """The torch-side names of ``__all__`` (:data:`TORCH_SIDE`), imported at their first use."""
    if name in TORCH_SIDE:
        return _torch_side(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_side(name: str) -> Any:
    return getattr(importlib.import_module(TORCH_SIDE[name]), name)


def _weight_codec() -> ModuleType:
    """:mod:`rollout_service.weight_codec`, imported at the first weight push (it imports torch)."""
    return importlib.import_module(WEIGHT_CODEC)


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
        """UpdateWeights with chunks serialized by the codec (``encode_weight_chunks``): the generated
        stub would copy every chunk into a message and again when serializing it."""
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
        min_policy_version: int | None = None,
        timeout_s: float | None = None,
    ) -> list[CompletionResult]:
        """``n`` completions per prompt, prompt-major (``len(prompts) * n`` results).

        ``prompt_ids`` (optional) are echoed in ``CompletionResult.prompt_id``; default "0", "1", ...
        ``episodes`` (optional, one per prompt): each completion is a multi-turn tool episode; the
        results then carry ``tool_mask``, ``turns``, tool counts and ``env_reward``.
        ``continue_across_updates``: a weight update during the call pauses it at a token boundary
        instead of waiting for it (``CompletionResult.token_versions`` says which version sampled what).
        ``min_policy_version``: generation waits until the replica serves at least that version (a push of
        it in flight).
        """
        request = codec.encode_generate_request(
            prompts,
            n,
            sampling or {},
            prompt_ids=prompt_ids,
            episodes=episodes,
            continue_across_updates=continue_across_updates,
            min_policy_version=min_policy_version,
        )
        return codec.decode_generate_response(self._call("Generate", request, timeout_s=timeout_s))

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
        ``rollout_service.weight_plane.payload.encode``), streamed without building the file.
        ``format``: WeightFormat or "lora" / "state_dict"; ``adapter_config`` is required for LoRA
        (a dict or the adapter_config.json text).
        """
        encoded_payload: type[EncodedPayload] = _torch_side("EncodedPayload")
        if not isinstance(payload, encoded_payload):
            view = memoryview(payload).cast("B")
            payload = encoded_payload((view,), len(view), 0)
        config_json = (
            json.dumps(adapter_config) if isinstance(adapter_config, Mapping) else adapter_config or ""
        )
        weight_codec = _weight_codec()
        header = weight_codec.encode_weight_header(payload, version, _weight_format(format), config_json)
        response = self._call(
            self._update_weights,
            lambda: weight_codec.encode_weight_chunks(payload, header, self._chunk_bytes),
            timeout_s=timeout_s,
            what="UpdateWeights",
        )
        return codec.decode_update_weights_response(response)

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
            payload, config_json = _torch_side("adapter_dir_payload")(adapter)
            return self.push_weights(
                payload,
                version,
                WeightFormat.LORA_ADAPTER,
                adapter_config or config_json,
                timeout_s=timeout_s,
            )
        if adapter_config is None:
            raise ValueError("adapter_config is required when pushing LoRA tensors")
        payload = _torch_side("encode")(dict(adapter))
        return self.push_weights(
            payload, version, WeightFormat.LORA_ADAPTER, _jsonable(adapter_config), timeout_s=timeout_s
        )

    def push_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], version: int, *, timeout_s: float | None = None
    ) -> WeightsApplied:
        """Push a full or partial state dict (names as in the base model's ``state_dict()``).

        The tensors are streamed from their own memory (no serialized copy is built); they must
        not change until this returns."""
        payload = _torch_side("encode")(dict(state_dict))
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
        request = codec.encode_load_weights_request(str(path), version, fmt)
        return codec.decode_load_weights_response(self._call("LoadWeights", request, timeout_s=timeout_s))

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
        group = _torch_side("GroupSpec")(init_method, rank, world_size, backend, join_timeout_s)
        request = _weight_codec().encode_open_weight_channel(transport, group)
        response = self._call("OpenWeightChannel", request, timeout_s=timeout_s)
        return codec.decode_open_weight_channel_response(response)

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
        manifest = _torch_side("ChannelManifest")(
            version=version,
            format=_weight_format(format),
            tensors=tuple(plan.layouts),
            bucket_bytes=tuple(plan.bucket_bytes),
            adapter_config_json=_jsonable(adapter_config) if adapter_config is not None else "",
            bucket_files=tuple(bucket_files),
        )
        weight_codec = _weight_codec()
        request = weight_codec.encode_channel_manifest(manifest)
        return weight_codec.decode_channel_applied(
            self._call("UpdateWeightsFromChannel", request, timeout_s=timeout_s)
        )

    def close_weight_channel(self, *, timeout_s: float | None = None) -> None:
        """Leave the data plane; later pushes use the stream."""
        self._call("CloseWeightChannel", rollout_pb2.CloseWeightChannelRequest(), timeout_s=timeout_s)

    # ---------------------------------------------------------- sleep/status
    def sleep(self, level: int = 1, *, timeout_s: float | None = None) -> SleepResult:
        response = self._call("Sleep", rollout_pb2.SleepRequest(level=level), timeout_s=timeout_s)
        return codec.decode_sleep_response(response)

    def wake_up(self, tags: Sequence[str] = (), *, timeout_s: float | None = None) -> WakeResult:
        """Wake ``tags`` ("weights", "kv_cache"); empty = everything."""
        response = self._call("WakeUp", rollout_pb2.WakeUpRequest(tags=list(tags)), timeout_s=timeout_s)
        return codec.decode_wake_up_response(response)

    def status(self, *, timeout_s: float | None = None) -> StatusInfo:
        response = self._call("GetStatus", rollout_pb2.GetStatusRequest(), timeout_s=timeout_s)
        return codec.decode_status_response(response)

    # ------------------------------------------------- agent sessions (gateway)
    def open_agent_session(
        self,
        ttl_s: float = 0.0,
        *,
        sampling: Mapping[str, Any] | None = None,
        min_policy_version: int | None = None,
        max_completion_tokens: int | None = None,
        timeout_s: float | None = None,
    ) -> SessionTicket:
        """A session of the OpenAI-compatible gateway: point an agent's SDK at
        ``http://HOST:OPENAI_PORT/sessions/<session_id>/v1``. ``ttl_s`` 0: the server's lifetime.
        ``sampling`` (SamplingParams fields): the distribution every call of the session samples from,
        whatever the agent asks; its ``max_tokens`` caps a call's. ``min_policy_version``: its calls generate
        once the replica serves at least that version (a push of it in flight). ``max_completion_tokens``:
        the tokens a branch's completion may hold, each call capped at what is left."""
        request = codec.encode_open_agent_session_request(
            ttl_s, sampling, min_policy_version, max_completion_tokens
        )
        return codec.decode_open_agent_session_response(
            self._call("OpenAgentSession", request, timeout_s=timeout_s)
        )

    def open_agent_sessions(
        self,
        count: int,
        ttl_s: float = 0.0,
        *,
        sampling: Mapping[str, Any] | None = None,
        min_policy_version: int | None = None,
        max_completion_tokens: int | None = None,
        timeout_s: float | None = None,
    ) -> list[SessionTicket]:
        """``count`` sessions as :meth:`open_agent_session` opens one, in one call: all or none."""
        request = codec.encode_open_agent_sessions_request(
            count, ttl_s, sampling, min_policy_version, max_completion_tokens
        )
        return codec.decode_open_agent_sessions_response(
            self._call("OpenAgentSessions", request, timeout_s=timeout_s)
        )

    def agent_trajectory(
        self, session_id: str, *, close: bool = False, timeout_s: float | None = None
    ) -> AgentTrajectory:
        """The session's calls as training sequences (one per branch); ``close`` ends the session."""
        request = codec.encode_get_agent_trajectory_request(session_id, close)
        return codec.decode_agent_trajectory(self._call("GetAgentTrajectory", request, timeout_s=timeout_s))

    def close_agent_session(self, session_id: str, *, timeout_s: float | None = None) -> bool:
        request = codec.encode_close_agent_session_request(session_id)
        return self._call("CloseAgentSession", request, timeout_s=timeout_s).closed


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
