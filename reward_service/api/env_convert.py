"""protobuf ↔ the environment contract's plain types (``grpo_runtime.env_types``); no logic beyond shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import struct_pb2
from grpo.env.v1 import env_pb2

from grpo_runtime.env_types import EnvironmentInfo, Episode, EpisodeReward, StepOutcome, ToolCall

# The reward codec's Struct reader: the same NaN and nesting checks, naming the field.
from reward_service.codec import struct_dict


def open_request(
    message: env_pb2.OpenEpisodeRequest, max_metadata_chars: int | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, metadata); InvalidArgument naming the field for a NaN or too-deep Struct, or metadata past
    ``max_metadata_chars`` (refused as soon as the count passes it). Linear in the request: the servicer
    runs it off the event loop."""
    return (
        struct_dict(message.params, "params"),
        struct_dict(
            message.metadata, "metadata", max_chars=max_metadata_chars, limit_name="max_metadata_chars"
        ),
    )


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def open_response(episode: Episode) -> env_pb2.OpenEpisodeResponse:
    return env_pb2.OpenEpisodeResponse(
        episode_id=episode.episode_id,
        tools=[
            env_pb2.ToolDefinition(name=t.name, description=t.description, parameters=_struct(t.parameters))
            for t in episode.tools
        ],
        prompt_suffix=episode.prompt_suffix,
    )


def tool_calls(message: env_pb2.StepRequest) -> list[ToolCall]:
    """The calls, one object each: only their strings are copied (C speed), so this stays cheap once the
    registry has bounded their number."""
    return [ToolCall(name=c.name, arguments_json=c.arguments_json, id=c.id) for c in message.calls]


def step_response(outcome: StepOutcome) -> env_pb2.StepResponse:
    return env_pb2.StepResponse(
        results=[
            env_pb2.ToolResult(
                call_id=r.call_id, name=r.name, content=r.content, error=r.error, truncated=r.truncated
            )
            for r in outcome.results
        ],
        done=outcome.done,
    )


def reward_response(reward: EpisodeReward) -> env_pb2.GetRewardResponse:
    response = env_pb2.GetRewardResponse(error=reward.error)
    if reward.value is not None:
        response.reward = reward.value
    return response


def list_response(environments: Sequence[EnvironmentInfo]) -> env_pb2.ListEnvironmentsResponse:
    return env_pb2.ListEnvironmentsResponse(
        environments=[
            env_pb2.EnvironmentInfo(
                name=e.name, description=e.description, kind=e.kind, available=e.available, status=e.status
            )
            for e in environments
        ]
    )
