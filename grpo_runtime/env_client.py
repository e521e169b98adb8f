"""Async client of ``grpo.env.v1.EnvironmentService`` (any server that implements the contract).

    async with EnvironmentClient("127.0.0.1:50051") as env:
        episode = await env.open_episode("calculator", metadata={"answer": "42"})
        outcome = await env.step(episode.episode_id, [ToolCall("calculator", '{"expression": "6*7"}')])
        reward = await env.get_reward(episode.episode_id)
        await env.close_episode(episode.episode_id)

Tool failures (bad arguments, unknown tool, a tool that raised or timed out) are data: they come back as
``ToolResult(error=True)``. Only a failed RPC raises, the :class:`~grpo_runtime.call_errors.ServiceCallError`
of its status (``NotFoundError`` for an unknown episode, ``InvalidArgumentError`` naming the field, ...).
UNAVAILABLE is retried by the channel's retry policy (``grpo_runtime.client``); Step is not retried beyond it,
because tool calls may have effects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from grpo.env.v1 import env_pb2, env_pb2_grpc

from grpo_runtime import env_codec
from grpo_runtime.call_errors import call_error
from grpo_runtime.client import ChannelConfig, create_channel
from grpo_runtime.env_types import (
    EnvironmentInfo,
    Episode,
    EpisodeReward,
    StepOutcome,
    ToolCall,
    ToolDefinition,
    ToolResult,
)

__all__ = [
    "EnvironmentClient",
    "EnvironmentInfo",
    "Episode",
    "EpisodeReward",
    "StepOutcome",
    "ToolCall",
    "ToolDefinition",
    "ToolResult",
]


class EnvironmentClient:
    """One channel to an environment server; ``timeout_s`` is the deadline of each call (None: none)."""

    def __init__(self, target: ChannelConfig | str, *, timeout_s: float | None = 120.0) -> None:
        self._channel = create_channel(target)
        self._stub = env_pb2_grpc.EnvironmentServiceStub(self._channel)
        self._timeout_s = timeout_s

    async def __aenter__(self) -> EnvironmentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            raise call_error(error, "environment service") from error

    async def list_environments(self) -> list[EnvironmentInfo]:
        response = await self._call(self._stub.ListEnvironments, env_pb2.ListEnvironmentsRequest())
        return env_codec.decode_list_environments_response(response)

    async def open_episode(
        self,
        environment: str,
        *,
        params: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode:
        """Opens an episode of ``environment``; ``metadata`` (JSON values) is the sample's dataset columns."""
        request = env_codec.encode_open_episode_request(environment, params, metadata)
        return env_codec.decode_open_episode_response(await self._call(self._stub.OpenEpisode, request))

    async def step(self, episode_id: str, calls: Sequence[ToolCall]) -> StepOutcome:
        """Runs one turn's tool calls in order; one result per call, in call order."""
        request = env_codec.encode_step_request(episode_id, calls)
        return env_codec.decode_step_response(await self._call(self._stub.Step, request))

    async def get_reward(self, episode_id: str) -> EpisodeReward:
        response = await self._call(self._stub.GetReward, env_pb2.GetRewardRequest(episode_id=episode_id))
        return env_codec.decode_get_reward_response(response)

    async def close_episode(self, episode_id: str) -> bool:
        """Closes an episode; False when it was already closed or expired (closing is idempotent)."""
        request = env_pb2.CloseEpisodeRequest(episode_id=episode_id)
        return (await self._call(self._stub.CloseEpisode, request)).closed
