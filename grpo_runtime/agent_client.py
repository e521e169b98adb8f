"""Async client of ``grpo.agent.v1.AgentService`` (any server that implements the contract).

    async with AgentClient("127.0.0.1:50060") as agent:
        task = EpisodeTask(task=row, base_url=url, deadline_unix_ms=ms)
        report = await agent.run_episode(task, timeout_s=60)

A failed call raises the :class:`~grpo_runtime.call_errors.ServiceCallError` of its status (DEADLINE_EXCEEDED
past ``timeout_s``, INTERNAL when the agent failed, ...). RunEpisode is never retried here: an episode has
effects (a session's recorded calls), so a retry is a new episode, the caller's decision.
"""

from __future__ import annotations

import grpc
from grpo.agent.v1 import agent_pb2_grpc

from grpo_runtime import agent_codec
from grpo_runtime.agent_codec import EpisodeReport, EpisodeTask
from grpo_runtime.call_errors import call_error
from grpo_runtime.client import ChannelConfig, create_channel

__all__ = ["AgentClient", "EpisodeReport", "EpisodeTask"]


class AgentClient:
    """One channel to an agent server."""

    def __init__(self, target: ChannelConfig | str) -> None:
        self._channel = create_channel(target)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def run_episode(self, task: EpisodeTask, *, timeout_s: float | None) -> EpisodeReport:
        """Plays one episode; ``timeout_s`` is the call's deadline (None: none)."""
        request = agent_codec.encode_run_episode_request(task)
        try:
            response = await self._stub.RunEpisode(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise call_error(error, "agent service") from error
        return agent_codec.decode_run_episode_response(response)
