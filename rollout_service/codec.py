"""The rollout service's protobuf ↔ domain codec: both directions of each message, used by the servicer
(:mod:`rollout_service.api`) and the client (:mod:`rollout_service.client`) alike, so the two cannot drift
apart. No logic beyond field mapping.

``encode_X`` builds message X from domain values, ``decode_X`` reads it back. Requests are read strictly (a
field the server cannot take is INVALID_ARGUMENT naming it); responses leniently where a newer server may
report a value this client does not know. The weight stream, channel manifests and torch.distributed groups
are :mod:`rollout_service.weight_codec`: those types import torch, which this module never does, so a client
that only generates loads no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grpo.rollout.v1 import rollout_pb2

from grpo_runtime.chat_codec import decode_chat_message, encode_chat_message
from grpo_runtime.errors import InvalidArgument
from grpo_runtime.struct_codec import struct_dict
from rollout_service.gateway.types import AgentSequence, AgentTrajectory, PinnedSampling, SessionTicket
from rollout_service.types import (
    CompletionResult,
    EpisodeSpec,
    FinishReason,
    GenerateRequest,
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

if TYPE_CHECKING:
    from typing_extensions import TypeIs

# protoc's .pyi types an enum field as its enum class or label only, but protobuf also takes the number,
# which is what the domain IntEnums carry; hence "type: ignore ... protoc .pyi: no int" where one is set.
SAMPLING_FIELDS = frozenset(rollout_pb2.SamplingParams.DESCRIPTOR.fields_by_name)
# A prompt as the client takes it: plain text, a chat ({"role", "content"} dicts) or token ids.
Prompt = str | Sequence[Mapping[str, Any]] | Sequence[int]


# ------------------------------------------------------------ SamplingParams
def encode_sampling(sampling: Mapping[str, Any]) -> rollout_pb2.SamplingParams:
    """``sampling``: SamplingParams field names; a None value is left unset (the server's default).
    ValueError for a key SamplingParams does not have."""
    unknown = set(sampling) - SAMPLING_FIELDS
    if unknown:
        raise ValueError(f"unknown sampling keys {sorted(unknown)}; known: {sorted(SAMPLING_FIELDS)}")
    values = {k: v for k, v in sampling.items() if v is not None}
    if "stop" in values and isinstance(values["stop"], str):
        values["stop"] = [values["stop"]]
    return rollout_pb2.SamplingParams(**values)


def decode_sampling(msg: rollout_pb2.SamplingParams) -> SamplingSpec:
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


# ------------------------------------------------------------------- Episode
def encode_episode(spec: EpisodeSpec) -> rollout_pb2.Episode:
    message = rollout_pb2.Episode(
        environment=spec.environment,
        max_turns=spec.max_turns,
        max_tool_calls=spec.max_tool_calls,
        target=spec.target,
        skip_reward=spec.skip_reward,
    )
    message.params.update(spec.params)
    message.metadata.update(spec.metadata)
    return message


def decode_episode(msg: rollout_pb2.Episode, field: str = "episode") -> EpisodeSpec:
    """``field``: where the episode is in the request (``prompts[2].episode``), for errors."""
    return EpisodeSpec(
        environment=msg.environment,
        params=struct_dict(msg.params, f"{field}.params"),
        metadata=struct_dict(msg.metadata, f"{field}.metadata"),
        max_turns=msg.max_turns if msg.HasField("max_turns") else None,
        max_tool_calls=msg.max_tool_calls if msg.HasField("max_tool_calls") else None,
        target=msg.target,
        skip_reward=msg.skip_reward,
    )


# -------------------------------------------------------------------- Prompt
def encode_prompt(prompt: Prompt, prompt_id: str, episode: EpisodeSpec | None = None) -> rollout_pb2.Prompt:
    """A ``str`` is plain text, a non-empty list of ints token ids, anything else a chat."""
    message = rollout_pb2.Prompt(id=prompt_id)
    if episode is not None:
        message.episode.CopyFrom(encode_episode(episode))
    if isinstance(prompt, str):
        message.text = prompt
        return message
    if _is_token_ids(prompt):
        message.token_ids.extend(prompt)
        return message
    message.messages.extend(encode_chat_message(m) for m in prompt)
    return message


def _is_token_ids(prompt: Sequence[Mapping[str, Any]] | Sequence[int]) -> TypeIs[Sequence[int]]:
    """A non-empty sequence of ints is token ids; any other sequence is a chat."""
    return bool(prompt) and all(isinstance(x, int) for x in prompt)


def decode_prompt(msg: rollout_pb2.Prompt, index: int) -> PromptInput:
    """``index``: the prompt's place in the request, for errors."""
    return PromptInput(
        id=msg.id,
        messages=tuple(
            decode_chat_message(m, f"prompts[{index}].messages[{j}]") for j, m in enumerate(msg.messages)
        ),
        text=msg.text,
        token_ids=tuple(msg.token_ids),
        episode=decode_episode(msg.episode, f"prompts[{index}].episode") if msg.HasField("episode") else None,
    )


# ----------------------------------------------------------- GenerateRequest
def encode_generate_request(
    prompts: Sequence[Prompt],
    n: int,
    sampling: Mapping[str, Any],
    *,
    prompt_ids: Sequence[str] | None = None,
    episodes: Sequence[EpisodeSpec] | None = None,
    continue_across_updates: bool = False,
    min_policy_version: int | None = None,
) -> rollout_pb2.GenerateRequest:
    """``prompt_ids`` default to "0", "1", ...; ``episodes``, when given, one per prompt."""
    return rollout_pb2.GenerateRequest(
        prompts=[
            encode_prompt(p, prompt_ids[i] if prompt_ids else str(i), episodes[i] if episodes else None)
            for i, p in enumerate(prompts)
        ],
        n=n,
        sampling=encode_sampling(sampling),
        continue_across_updates=continue_across_updates,
        min_policy_version=min_policy_version,
    )


def decode_generate_request(msg: rollout_pb2.GenerateRequest) -> GenerateRequest:
    return GenerateRequest(
        prompts=tuple(decode_prompt(p, i) for i, p in enumerate(msg.prompts)),
        n=msg.n,
        sampling=decode_sampling(msg.sampling),
        continue_across_updates=msg.continue_across_updates,
        min_policy_version=msg.min_policy_version if msg.HasField("min_policy_version") else None,
    )


# ------------------------------------------------- Completion, GenerateResponse
def encode_completion(result: CompletionResult) -> rollout_pb2.Completion:
    return rollout_pb2.Completion(
        prompt_id=result.prompt_id,
        prompt_token_ids=result.prompt_token_ids,
        token_ids=result.token_ids,
        text=result.text,
        logprobs=result.logprobs,
        finish_reason=int(result.finish_reason),  # type: ignore[arg-type]  # protoc .pyi: no int
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


def decode_completion(msg: rollout_pb2.Completion) -> CompletionResult:
    return CompletionResult(
        prompt_id=msg.prompt_id,
        prompt_token_ids=list(msg.prompt_token_ids),
        token_ids=list(msg.token_ids),
        text=msg.text,
        logprobs=list(msg.logprobs),
        finish_reason=FinishReason(msg.finish_reason),
        policy_version=msg.policy_version,
        tool_mask=list(msg.tool_mask),
        turns=[TurnSpan(t.start, t.end, t.policy_version, t.tool_calls) for t in msg.turns],
        tool_call_count=msg.tool_call_count,
        tool_failure_count=msg.tool_failure_count,
        env_reward=msg.env_reward if msg.HasField("env_reward") else None,
        error=msg.error,
        token_versions=list(msg.token_versions),
    )


def encode_generate_response(results: Iterable[CompletionResult]) -> rollout_pb2.GenerateResponse:
    return rollout_pb2.GenerateResponse(completions=[encode_completion(r) for r in results])


def decode_generate_response(msg: rollout_pb2.GenerateResponse) -> list[CompletionResult]:
    """Prompt-major, as the server sent them."""
    return [decode_completion(c) for c in msg.completions]


# -------------------------------------------------- WeightFormat, WeightTransport
def decode_weight_format(value: int) -> WeightFormat:
    """A request's format. Proto3 enums are open: a value this server does not know is refused, not a
    crash."""
    try:
        return WeightFormat(value)
    except ValueError as exc:
        raise InvalidArgument(f"unknown weight format {value}", field="format") from exc


def decode_weight_transport(value: int) -> WeightTransport:
    """A request's transport, refused like :func:`decode_weight_format`."""
    try:
        return WeightTransport(value)
    except ValueError as exc:
        raise InvalidArgument(f"unknown weight transport {value}", field="transport") from exc


def decode_reported_transport(value: int) -> WeightTransport:
    """A transport a server reports: one a newer server has and this client does not know reads as
    UNSPECIFIED."""
    try:
        return WeightTransport(value)
    except ValueError:
        return WeightTransport.UNSPECIFIED


# ------------------------------------------------- OpenWeightChannelResponse
# (Its request carries a torch.distributed group: rollout_service.weight_codec.)
def encode_open_weight_channel_response(transport: WeightTransport) -> rollout_pb2.OpenWeightChannelResponse:
    return rollout_pb2.OpenWeightChannelResponse(
        transport=int(transport)  # type: ignore[arg-type]  # protoc .pyi: no int
    )


def decode_open_weight_channel_response(msg: rollout_pb2.OpenWeightChannelResponse) -> WeightTransport:
    return WeightTransport(msg.transport)


# ------------------------------------------------------------- LoadWeights
def encode_load_weights_request(path: str, version: int, fmt: WeightFormat) -> rollout_pb2.LoadWeightsRequest:
    return rollout_pb2.LoadWeightsRequest(
        path=path,
        version=version,
        format=int(fmt),  # type: ignore[arg-type]  # protoc .pyi: no int
    )


def decode_load_weights_request(msg: rollout_pb2.LoadWeightsRequest) -> tuple[str, int, WeightFormat]:
    """(path, version, format)."""
    return msg.path, msg.version, decode_weight_format(msg.format)


def encode_load_weights_response(applied: WeightsApplied) -> rollout_pb2.LoadWeightsResponse:
    return rollout_pb2.LoadWeightsResponse(
        policy_version=applied.policy_version,
        tensors_loaded=applied.tensors_loaded,
        apply_seconds=applied.apply_seconds,
    )


def decode_load_weights_response(msg: rollout_pb2.LoadWeightsResponse) -> WeightsApplied:
    return WeightsApplied(msg.policy_version, msg.tensors_loaded, msg.apply_seconds)


# ----------------------------------------------------- UpdateWeightsResponse
def encode_update_weights_response(applied: WeightsApplied) -> rollout_pb2.UpdateWeightsResponse:
    return rollout_pb2.UpdateWeightsResponse(
        policy_version=applied.policy_version,
        bytes_received=applied.bytes_received,
        tensors_loaded=applied.tensors_loaded,
        apply_seconds=applied.apply_seconds,
    )


def decode_update_weights_response(msg: rollout_pb2.UpdateWeightsResponse) -> WeightsApplied:
    return WeightsApplied(msg.policy_version, msg.tensors_loaded, msg.apply_seconds, msg.bytes_received)


# ----------------------------------------------------- MemoryUsage, Sleep, WakeUp
def encode_memory(mem: MemoryUsage) -> rollout_pb2.MemoryUsage:
    return rollout_pb2.MemoryUsage(
        rss_bytes=mem.rss_bytes,
        cuda_allocated_bytes=mem.cuda_allocated_bytes,
        cuda_reserved_bytes=mem.cuda_reserved_bytes,
    )


def decode_memory(msg: rollout_pb2.MemoryUsage) -> MemoryUsage:
    return MemoryUsage(msg.rss_bytes, msg.cuda_allocated_bytes, msg.cuda_reserved_bytes)


def encode_sleep_response(result: SleepResult) -> rollout_pb2.SleepResponse:
    return rollout_pb2.SleepResponse(
        level=result.level,
        memory_before=encode_memory(result.memory_before),
        memory_after=encode_memory(result.memory_after),
    )


def decode_sleep_response(msg: rollout_pb2.SleepResponse) -> SleepResult:
    return SleepResult(msg.level, decode_memory(msg.memory_before), decode_memory(msg.memory_after))


def encode_wake_up_response(result: WakeResult) -> rollout_pb2.WakeUpResponse:
    return rollout_pb2.WakeUpResponse(
        weights_valid=result.weights_valid,
        memory=encode_memory(result.memory),
        wake_seconds=result.wake_seconds,
    )


def decode_wake_up_response(msg: rollout_pb2.WakeUpResponse) -> WakeResult:
    return WakeResult(msg.weights_valid, decode_memory(msg.memory), msg.wake_seconds)


# ---------------------------------------------------------- GetStatusResponse
def encode_status_response(status: StatusInfo, *, admin: bool) -> rollout_pb2.GetStatusResponse:
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
        memory=encode_memory(status.memory),
        max_model_len=status.max_model_len,
        weight_format=int(status.weight_format),  # type: ignore[arg-type]  # protoc .pyi: no int
        weight_transport=int(status.weight_transport),  # type: ignore[arg-type]  # protoc .pyi: no int
        weight_transports=[int(t) for t in status.weight_transports],  # type: ignore[misc]  # protoc .pyi: no int
        weight_shm_dir=status.weight_shm_dir if admin else "",
        weight_shm_token=status.weight_shm_token if admin else "",
        openai_port=status.openai_port,
    )


def decode_status_response(msg: rollout_pb2.GetStatusResponse) -> StatusInfo:
    return StatusInfo(
        engine=msg.engine,
        device=msg.device,
        model=msg.model,
        policy_version=msg.policy_version,
        sleep_level=msg.sleep_level,
        sleeping_tags=tuple(msg.sleeping_tags),
        weights_valid=msg.weights_valid,
        memory=decode_memory(msg.memory),
        max_model_len=msg.max_model_len,
        weight_format=WeightFormat(msg.weight_format),
        weight_transport=decode_reported_transport(msg.weight_transport),
        weight_transports=tuple(decode_reported_transport(t) for t in msg.weight_transports),
        weight_shm_dir=msg.weight_shm_dir,
        weight_shm_token=msg.weight_shm_token,
        openai_port=msg.openai_port,
    )


# ------------------------------------------------------ agent sessions (gateway)
def encode_open_agent_session_request(
    ttl_s: float = 0.0,
    sampling: Mapping[str, Any] | None = None,
    min_policy_version: int | None = None,
    max_completion_tokens: int | None = None,
) -> rollout_pb2.OpenAgentSessionRequest:
    """``sampling``: SamplingParams fields the session imposes on its calls (None: each call's own);
    ``min_policy_version``: its calls generate once that version serves (None: at once);
    ``max_completion_tokens``: a branch's completion budget (None: none)."""
    message = rollout_pb2.OpenAgentSessionRequest(
        ttl_seconds=ttl_s,
        min_policy_version=min_policy_version,
        max_completion_tokens=max_completion_tokens,
    )
    if sampling is not None:
        message.sampling.CopyFrom(encode_sampling(sampling))
    return message


def decode_open_agent_session_request(
    msg: rollout_pb2.OpenAgentSessionRequest,
) -> tuple[float, PinnedSampling | None, int | None, int | None]:
    """The requested lifetime in seconds (0: the server's default), the session's sampling (ranges are
    checked by the gateway), the policy version its calls wait for and its completion budget (None:
    none)."""
    if not msg.ttl_seconds >= 0 or msg.ttl_seconds == float("inf"):
        raise InvalidArgument(f"must be a finite number >= 0, got {msg.ttl_seconds}", field="ttl_seconds")
    min_version = msg.min_policy_version if msg.HasField("min_policy_version") else None
    budget = msg.max_completion_tokens if msg.HasField("max_completion_tokens") else None
    if not msg.HasField("sampling"):
        return msg.ttl_seconds, None, min_version, budget
    cap = msg.sampling.max_tokens if msg.sampling.HasField("max_tokens") else None
    return msg.ttl_seconds, PinnedSampling(decode_sampling(msg.sampling), cap), min_version, budget


def encode_open_agent_session_response(ticket: SessionTicket) -> rollout_pb2.OpenAgentSessionResponse:
    return rollout_pb2.OpenAgentSessionResponse(
        session_id=ticket.session_id, expires_unix_ms=ticket.expires_unix_ms, openai_port=ticket.openai_port
    )


def decode_open_agent_session_response(msg: rollout_pb2.OpenAgentSessionResponse) -> SessionTicket:
    return SessionTicket(msg.session_id, msg.expires_unix_ms, msg.openai_port)


def encode_open_agent_sessions_request(
    count: int,
    ttl_s: float = 0.0,
    sampling: Mapping[str, Any] | None = None,
    min_policy_version: int | None = None,
    max_completion_tokens: int | None = None,
) -> rollout_pb2.OpenAgentSessionsRequest:
    """``count`` sessions, each as :func:`encode_open_agent_session_request` describes one."""
    session = encode_open_agent_session_request(ttl_s, sampling, min_policy_version, max_completion_tokens)
    return rollout_pb2.OpenAgentSessionsRequest(session=session, count=count)


def decode_open_agent_sessions_request(
    msg: rollout_pb2.OpenAgentSessionsRequest,
) -> tuple[int, float, PinnedSampling | None, int | None, int | None]:
    """How many sessions, then what :func:`decode_open_agent_session_request` gives for each."""
    return (msg.count, *decode_open_agent_session_request(msg.session))


def encode_open_agent_sessions_response(
    tickets: Sequence[SessionTicket],
) -> rollout_pb2.OpenAgentSessionsResponse:
    return rollout_pb2.OpenAgentSessionsResponse(
        sessions=[encode_open_agent_session_response(ticket) for ticket in tickets]
    )


def decode_open_agent_sessions_response(msg: rollout_pb2.OpenAgentSessionsResponse) -> list[SessionTicket]:
    return [decode_open_agent_session_response(session) for session in msg.sessions]


def encode_get_agent_trajectory_request(
    session_id: str, close: bool = False
) -> rollout_pb2.GetAgentTrajectoryRequest:
    return rollout_pb2.GetAgentTrajectoryRequest(session_id=session_id, close=close)


def decode_get_agent_trajectory_request(msg: rollout_pb2.GetAgentTrajectoryRequest) -> tuple[str, bool]:
    return msg.session_id, msg.close


def encode_agent_trajectory(trajectory: AgentTrajectory) -> rollout_pb2.GetAgentTrajectoryResponse:
    return rollout_pb2.GetAgentTrajectoryResponse(
        sequences=[
            rollout_pb2.AgentSequence(
                token_ids=s.token_ids,
                loss_mask=s.loss_mask,
                logprobs=s.logprobs,
                policy_versions=s.policy_versions,
            )
            for s in trajectory.sequences
        ],
        calls=trajectory.calls,
        retokenized_tokens=trajectory.retokenized_tokens,
        prefix_mismatches=trajectory.prefix_mismatches,
    )


def decode_agent_trajectory(msg: rollout_pb2.GetAgentTrajectoryResponse) -> AgentTrajectory:
    return AgentTrajectory(
        sequences=[
            AgentSequence(list(s.token_ids), list(s.loss_mask), list(s.logprobs), list(s.policy_versions))
            for s in msg.sequences
        ],
        calls=msg.calls,
        retokenized_tokens=msg.retokenized_tokens,
        prefix_mismatches=msg.prefix_mismatches,
    )


def encode_close_agent_session_request(session_id: str) -> rollout_pb2.CloseAgentSessionRequest:
    return rollout_pb2.CloseAgentSessionRequest(session_id=session_id)


def decode_close_agent_session_request(msg: rollout_pb2.CloseAgentSessionRequest) -> str:
    return msg.session_id
