"""The agent contract's protobuf (``grpo.agent.v1``) ↔ its plain types, both directions in one module: the
serving helper (:mod:`grpo_runtime.agent_server`) and the trainer's client (:mod:`grpo_runtime.agent_client`)
map through here, so the two cannot drift apart. No logic beyond shape.

Requests are read strictly (the task through :func:`grpo_runtime.struct_codec.struct_dict`: InvalidArgument
naming ``task.<path>`` for a NaN or a Struct nested too deep; an empty ``base_url`` names ``base_url``).
Responses are read as they come: whether a reward is usable (finite) is the caller's judgement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2
from grpo.agent.v1 import agent_pb2

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.struct_codec import struct_dict


@dataclass(frozen=True)
class EpisodeTask:
    """One RunEpisode call: the data row ``task`` (JSON values), the session's OpenAI ``base_url``, the
    deadline in milliseconds since the Unix epoch (0 = none) and the trainer's ``episode_id``."""

    task: dict[str, Any]
    base_url: str
    deadline_unix_ms: int = 0
    episode_id: str = ""

    @property
    def deadline_unix_s(self) -> float | None:
        """The deadline in seconds since the Unix epoch; None without one."""
        return self.deadline_unix_ms / 1000.0 if self.deadline_unix_ms else None

    def seconds_left(self, now_unix_s: float) -> float | None:
        """Seconds from ``now_unix_s`` to the deadline (≤ 0 once past); None without a deadline."""
        deadline = self.deadline_unix_s
        return None if deadline is None else deadline - now_unix_s


@dataclass(frozen=True)
class EpisodeReport:
    """What the agent says about its episode: its own ``reward`` (None = it does not judge) and
    ``metadata`` (JSON values, logged)."""

    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def _struct(value: Mapping[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    if value:
        out.update(dict(value))
    return out


def _plain_json(value: Any) -> Any:
    """A Struct value read back loosely (numbers as floats, as protobuf stores them)."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: _plain_json(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain_json(item) for item in value.list_value.values]
    if kind == "null_value" or kind is None:
        return None
    return getattr(value, kind)


# --------------------------------------------------------------- RunEpisode
def encode_run_episode_request(task: EpisodeTask) -> agent_pb2.RunEpisodeRequest:
    return agent_pb2.RunEpisodeRequest(
        task=_struct(task.task),
        base_url=task.base_url,
        deadline_unix_ms=task.deadline_unix_ms,
        episode_id=task.episode_id,
    )


def decode_run_episode_request(message: agent_pb2.RunEpisodeRequest) -> EpisodeTask:
    """The request as an EpisodeTask; InvalidArgument naming the field for a bad task or no base_url."""
    if not message.base_url:
        raise InvalidArgument("the session's OpenAI base URL is required", field="base_url")
    if message.deadline_unix_ms < 0:
        raise InvalidArgument("must be ≥ 0 (0 = no deadline)", field="deadline_unix_ms")
    return EpisodeTask(
        task=struct_dict(message.task, "task"),
        base_url=message.base_url,
        deadline_unix_ms=message.deadline_unix_ms,
        episode_id=message.episode_id,
    )


def encode_run_episode_response(report: EpisodeReport) -> agent_pb2.RunEpisodeResponse:
    """The agent's report; a reward that is not a finite number is InvalidArgument naming ``reward``."""
    if report.reward is not None and not math.isfinite(report.reward):
        raise InvalidArgument(f"must be a finite number, got {report.reward!r}", field="reward")
    response = agent_pb2.RunEpisodeResponse(metadata=_struct(report.metadata))
    if report.reward is not None:
        response.reward = float(report.reward)
    return response


def decode_run_episode_response(message: agent_pb2.RunEpisodeResponse) -> EpisodeReport:
    """The report as sent: a NaN reward stays NaN (the trainer fails such an episode, naming it)."""
    reward = message.reward if message.HasField("reward") else None
    metadata = {key: _plain_json(value) for key, value in message.metadata.fields.items()}
    return EpisodeReport(reward=reward, metadata=metadata)
