"""The environment contract's protobuf (``grpo.env.v1``) ↔ its plain types (:mod:`grpo_runtime.env_types`):
both directions of each message, used by the servicer (``reward_service.api.environment``) and the client
(:mod:`grpo_runtime.env_client`) alike, so the two cannot drift apart. No logic beyond shape.

``encode_X`` builds message X from plain values, ``decode_X`` reads it back. Requests are read strictly:
params and metadata through :func:`grpo_runtime.struct_codec.struct_dict` (InvalidArgument naming the field
for a NaN, a Struct nested too deep, or metadata past its size). Responses are read as they come. The
messages that carry one id or one flag (GetReward, CloseEpisode) have nothing to map and are built in place;
the batch requests are lists of the single ones. A batch's streamed results are ``(index, outcome)`` pairs,
the outcome the single call's result or the :class:`EntryError` it failed with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format, struct_pb2
from grpo.env.v1 import env_pb2

from grpo_runtime.env_types import (
    EntryError,
    EnvironmentInfo,
    Episode,
    EpisodeReward,
    StepOutcome,
    ToolCall,
    ToolDefinition,
    ToolResult,
)
from grpo_runtime.struct_codec import struct_dict

# Most entries in one OpenEpisodes, StepEpisodes or CloseEpisodes call (the contract's bound): servers refuse
# more, clients split larger batches.
MAX_BATCH_ENTRIES = 256


def _struct(value: Mapping[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    if value:
        out.update(dict(value))
    return out


# --------------------------------------------------------------- OpenEpisode
def encode_open_episode_request(
    environment: str, params: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None
) -> env_pb2.OpenEpisodeRequest:
    return env_pb2.OpenEpisodeRequest(
        environment=environment, params=_struct(params), metadata=_struct(metadata)
    )


def decode_open_episode_request(
    message: env_pb2.OpenEpisodeRequest, max_metadata_chars: int | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, metadata); InvalidArgument naming the field for a NaN or too-deep Struct, or metadata past
    ``max_metadata_chars`` characters (refused as soon as the count passes it). Linear in the request: the
    servicer runs it off the event loop."""
    return (
        struct_dict(message.params, "params"),
        struct_dict(
            message.metadata, "metadata", max_chars=max_metadata_chars, limit_name="max_metadata_chars"
        ),
    )


def encode_open_episode_response(episode: Episode) -> env_pb2.OpenEpisodeResponse:
    return env_pb2.OpenEpisodeResponse(
        episode_id=episode.episode_id,
        tools=[
            env_pb2.ToolDefinition(name=t.name, description=t.description, parameters=_struct(t.parameters))
            for t in episode.tools
        ],
        prompt_suffix=episode.prompt_suffix,
    )


def decode_open_episode_response(message: env_pb2.OpenEpisodeResponse) -> Episode:
    return Episode(
        episode_id=message.episode_id,
        tools=tuple(
            ToolDefinition(
                name=t.name, description=t.description, parameters=json_format.MessageToDict(t.parameters)
            )
            for t in message.tools
        ),
        prompt_suffix=message.prompt_suffix,
    )


# ---------------------------------------------------------------------- Step
def encode_step_request(episode_id: str, calls: Sequence[ToolCall]) -> env_pb2.StepRequest:
    return env_pb2.StepRequest(
        episode_id=episode_id,
        calls=[env_pb2.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json) for c in calls],
    )


def decode_step_request(message: env_pb2.StepRequest) -> list[ToolCall]:
    """The calls, one object each: only their strings are copied (C speed), so this stays cheap once the
    registry has bounded their number."""
    return [ToolCall(name=c.name, arguments_json=c.arguments_json, id=c.id) for c in message.calls]


def encode_step_response(outcome: StepOutcome) -> env_pb2.StepResponse:
    return env_pb2.StepResponse(
        results=[
            env_pb2.ToolResult(
                call_id=r.call_id, name=r.name, content=r.content, error=r.error, truncated=r.truncated
            )
            for r in outcome.results
        ],
        done=outcome.done,
    )


def decode_step_response(message: env_pb2.StepResponse) -> StepOutcome:
    return StepOutcome(
        results=tuple(
            ToolResult(
                call_id=r.call_id, name=r.name, content=r.content, error=r.error, truncated=r.truncated
            )
            for r in message.results
        ),
        done=message.done,
    )


# ----------------------------------------------------------------- GetReward
def encode_get_reward_response(reward: EpisodeReward) -> env_pb2.GetRewardResponse:
    message = env_pb2.GetRewardResponse(error=reward.error)
    if reward.value is not None:
        message.reward = reward.value
    return message


def decode_get_reward_response(message: env_pb2.GetRewardResponse) -> EpisodeReward:
    return EpisodeReward(value=message.reward if message.HasField("reward") else None, error=message.error)


# ---------------------------------------------------------- ListEnvironments
def encode_list_environments_response(
    environments: Sequence[EnvironmentInfo],
) -> env_pb2.ListEnvironmentsResponse:
    return env_pb2.ListEnvironmentsResponse(
        environments=[
            env_pb2.EnvironmentInfo(
                name=e.name, description=e.description, kind=e.kind, available=e.available, status=e.status
            )
            for e in environments
        ]
    )


def decode_list_environments_response(message: env_pb2.ListEnvironmentsResponse) -> list[EnvironmentInfo]:
    """In the server's order."""
    return [
        EnvironmentInfo(
            name=e.name, description=e.description, kind=e.kind, available=e.available, status=e.status
        )
        for e in message.environments
    ]


# ------------------------------------------------------ OpenEpisodes, StepEpisodes
def _decode_entry_error(message: env_pb2.EntryError) -> EntryError:
    retry_after_s = message.retry_after_ms / 1000 if message.retry_after_ms else None
    return EntryError(message.code, message.details, retry_after_s)


def _encode_entry_error(error: EntryError) -> env_pb2.EntryError:
    retry_after_ms = round(error.retry_after_s * 1000) if error.retry_after_s else 0
    return env_pb2.EntryError(code=error.code, details=error.details, retry_after_ms=retry_after_ms)


def encode_opened_episodes(
    outcomes: Sequence[tuple[int, Episode | EntryError]],
) -> env_pb2.OpenEpisodesResponse:
    return env_pb2.OpenEpisodesResponse(
        opened=[
            env_pb2.OpenedEpisode(index=i, error=_encode_entry_error(o))
            if isinstance(o, EntryError)
            else env_pb2.OpenedEpisode(index=i, episode=encode_open_episode_response(o))
            for i, o in outcomes
        ]
    )


def decode_opened_episodes(message: env_pb2.OpenEpisodesResponse) -> list[tuple[int, Episode | EntryError]]:
    return [
        (
            e.index,
            _decode_entry_error(e.error) if e.HasField("error") else decode_open_episode_response(e.episode),
        )
        for e in message.opened
    ]


def encode_stepped_episodes(
    outcomes: Sequence[tuple[int, StepOutcome | EntryError]],
) -> env_pb2.StepEpisodesResponse:
    return env_pb2.StepEpisodesResponse(
        stepped=[
            env_pb2.SteppedEpisode(index=i, error=_encode_entry_error(o))
            if isinstance(o, EntryError)
            else env_pb2.SteppedEpisode(index=i, step=encode_step_response(o))
            for i, o in outcomes
        ]
    )


def decode_stepped_episodes(
    message: env_pb2.StepEpisodesResponse,
) -> list[tuple[int, StepOutcome | EntryError]]:
    return [
        (e.index, _decode_entry_error(e.error) if e.HasField("error") else decode_step_response(e.step))
        for e in message.stepped
    ]
