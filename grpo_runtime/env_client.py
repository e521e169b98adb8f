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

Concurrent calls are batched: the opens, steps and closes made within one event-loop turn (a rollout's
episodes reach each phase together) go as one OpenEpisodes, StepEpisodes or CloseEpisodes call
(``grpo_runtime.batch_calls.Coalescer``), each caller still getting its own result or error. A lone call
goes as the single RPC; a server without the batch RPCs (UNIMPLEMENTED) gets single calls from then on.
A caller that stops waiting (cancelled, timed out) leaves its entry to run on the server, bounded by the
server's own timeouts; an episode opened for it is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from grpo.env.v1 import env_pb2, env_pb2_grpc

from grpo_runtime import env_codec
from grpo_runtime.batch_calls import Coalescer, finished_groups
from grpo_runtime.call_errors import ServiceCallError, call_error, status_error
from grpo_runtime.client import ChannelConfig, create_channel
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

log = logging.getLogger(__name__)

SERVICE = "environment service"
ResultT = TypeVar("ResultT")


class EnvironmentClient:
    """One channel to an environment server; ``timeout_s`` is the deadline of each call, a batch's included
    (None: none)."""

    def __init__(self, target: ChannelConfig | str, *, timeout_s: float | None = 120.0) -> None:
        self._channel = create_channel(target)
        self._stub = env_pb2_grpc.EnvironmentServiceStub(self._channel)
        self._timeout_s = timeout_s
        self._batches = True  # until the server answers a batch call UNIMPLEMENTED
        max_batch = env_codec.MAX_BATCH_ENTRIES
        self._opens = Coalescer(self._open_batch, max_batch=max_batch, orphan=self._close_orphan)
        self._steps = Coalescer(self._step_batch, max_batch=max_batch)
        self._closes = Coalescer(self._close_batch, max_batch=max_batch)
        self._orphans: set[asyncio.Task[Any]] = set()

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
            raise call_error(error, SERVICE) from error

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
        return await self._opens.call(env_codec.encode_open_episode_request(environment, params, metadata))

    async def step(self, episode_id: str, calls: Sequence[ToolCall]) -> StepOutcome:
        """Runs one turn's tool calls in order; one result per call, in call order."""
        return await self._steps.call(env_codec.encode_step_request(episode_id, calls))

    async def get_reward(self, episode_id: str) -> EpisodeReward:
        response = await self._call(self._stub.GetReward, env_pb2.GetRewardRequest(episode_id=episode_id))
        return env_codec.decode_get_reward_response(response)

    async def close_episode(self, episode_id: str) -> bool:
        """Closes an episode; False when it was already closed or expired (closing is idempotent)."""
        return await self._closes.call(episode_id)

    # ------------------------------------------------------------- single calls
    async def _open_one(self, request: env_pb2.OpenEpisodeRequest) -> Episode:
        return env_codec.decode_open_episode_response(await self._call(self._stub.OpenEpisode, request))

    async def _step_one(self, request: env_pb2.StepRequest) -> StepOutcome:
        return env_codec.decode_step_response(await self._call(self._stub.Step, request))

    async def _close_one(self, episode_id: str) -> bool:
        request = env_pb2.CloseEpisodeRequest(episode_id=episode_id)
        return (await self._call(self._stub.CloseEpisode, request)).closed

    # ------------------------------------------------------------ batch calls
    def _open_batch(self, requests: list[env_pb2.OpenEpisodeRequest]) -> AsyncIterator[tuple[int, Any]]:
        return self._streamed(
            self._stub.OpenEpisodes,
            env_pb2.OpenEpisodesRequest(episodes=requests),
            env_codec.decode_opened_episodes,
            self._open_one,
            requests,
        )

    def _step_batch(self, requests: list[env_pb2.StepRequest]) -> AsyncIterator[tuple[int, Any]]:
        return self._streamed(
            self._stub.StepEpisodes,
            env_pb2.StepEpisodesRequest(steps=requests),
            env_codec.decode_stepped_episodes,
            self._step_one,
            requests,
        )

    async def _streamed(
        self,
        method: Any,
        batch: Any,
        decode: Callable[[Any], list[tuple[int, Any]]],
        single: Callable[[Any], Awaitable[Any]],
        requests: list[Any],
    ) -> AsyncIterator[tuple[int, Any]]:
        """``(index, result or ServiceCallError)`` of each request as it finishes: one batch call whose
        results stream back, or the single calls (one request, or a server without the batch RPCs)."""
        if len(requests) > 1 and self._batches:
            try:
                async for message in method(batch, timeout=self._timeout_s):
                    for index, outcome in decode(message):
                        yield index, _entry_outcome(outcome)
                return
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise call_error(error, SERVICE) from error
                self._batches = False
        async for group in finished_groups(_outcome(single(r)) for r in requests):
            for pair in group:
                yield pair

    async def _close_batch(self, episode_ids: list[str]) -> AsyncIterator[tuple[int, Any]]:
        if len(episode_ids) > 1 and self._batches:
            try:
                request = env_pb2.CloseEpisodesRequest(episode_ids=episode_ids)
                response = await self._stub.CloseEpisodes(request, timeout=self._timeout_s)
                for pair in enumerate(response.closed):
                    yield pair
                return
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise call_error(error, SERVICE) from error
                self._batches = False
        async for group in finished_groups(_outcome(self._close_one(i)) for i in episode_ids):
            for pair in group:
                yield pair

    def _close_orphan(self, episode: Episode) -> None:
        """An episode opened for a caller that stopped waiting: close it rather than leave it to expire."""
        task = asyncio.get_running_loop().create_task(self._close_quietly(episode.episode_id))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def _close_quietly(self, episode_id: str) -> None:
        try:
            await self.close_episode(episode_id)
        except ServiceCallError as exc:
            log.warning("closing episode %s, opened for a caller that gave up, failed: %s", episode_id, exc)


def _entry_outcome(outcome: ResultT | EntryError) -> ResultT | ServiceCallError:
    if isinstance(outcome, EntryError):
        return status_error(outcome.code, outcome.details, SERVICE, retry_after_s=outcome.retry_after_s)
    return outcome


async def _outcome(call: Awaitable[ResultT]) -> ResultT | ServiceCallError:
    try:
        return await call
    except ServiceCallError as exc:
        return exc
