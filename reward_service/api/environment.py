"""EnvironmentService servicer: protobuf in, one call into the episode registry, protobuf out.

The registry's checks that need only counts and names run on the request message before it is converted;
converting the metadata of a large request (a walk of every value) runs off the event loop, a small one
(the usual few answer columns) inline, where a thread hop would cost more than the walk.

The batch forms run each entry as its single call and stream the results back in groups as they finish
(``grpo_runtime.batch_calls.finished_groups``); an entry's domain error becomes its ``EntryError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc
from grpo.env.v1 import env_pb2, env_pb2_grpc

from grpo_runtime import env_codec
from grpo_runtime.batch_calls import finished_groups
from grpo_runtime.env_types import EntryError, Episode, StepOutcome
from grpo_runtime.errors import InvalidArgument, ResourceExhausted, ServiceError
from reward_service.environments.episodes import EpisodeRegistry

ResultT = TypeVar("ResultT")

# OpenEpisode requests up to this many bytes on the wire are converted on the event loop (a few microseconds).
INLINE_OPEN_BYTES = 4096


class EnvironmentServicer(env_pb2_grpc.EnvironmentServiceServicer):
    def __init__(self, episodes: EpisodeRegistry):
        self._episodes = episodes

    async def ListEnvironments(
        self, request: env_pb2.ListEnvironmentsRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.ListEnvironmentsResponse:
        return env_codec.encode_list_environments_response(self._episodes.list())

    async def OpenEpisode(
        self, request: env_pb2.OpenEpisodeRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.OpenEpisodeResponse:
        return env_codec.encode_open_episode_response(await self._open(request))

    async def Step(
        self, request: env_pb2.StepRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.StepResponse:
        return env_codec.encode_step_response(await self._step(request))

    async def GetReward(
        self, request: env_pb2.GetRewardRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.GetRewardResponse:
        return env_codec.encode_get_reward_response(await self._episodes.reward(request.episode_id))

    async def CloseEpisode(
        self, request: env_pb2.CloseEpisodeRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.CloseEpisodeResponse:
        return env_pb2.CloseEpisodeResponse(closed=await self._episodes.close(request.episode_id))

    async def OpenEpisodes(
        self, request: env_pb2.OpenEpisodesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[env_pb2.OpenEpisodesResponse]:
        _check_batch(len(request.episodes), "episodes")
        async for group in finished_groups(_entry(self._open(r)) for r in request.episodes):
            yield env_codec.encode_opened_episodes(group)

    async def StepEpisodes(
        self, request: env_pb2.StepEpisodesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[env_pb2.StepEpisodesResponse]:
        _check_batch(len(request.steps), "steps")
        async for group in finished_groups(_entry(self._step(r)) for r in request.steps):
            yield env_codec.encode_stepped_episodes(group)

    async def CloseEpisodes(
        self, request: env_pb2.CloseEpisodesRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.CloseEpisodesResponse:
        _check_batch(len(request.episode_ids), "episode_ids")
        closed = await asyncio.gather(*(self._episodes.close(i) for i in request.episode_ids))
        return env_pb2.CloseEpisodesResponse(closed=closed)

    async def _open(self, request: env_pb2.OpenEpisodeRequest) -> Episode:
        self._episodes.check_open(request.environment, request.params.fields)
        limit = self._episodes.max_metadata_chars
        if request.ByteSize() <= INLINE_OPEN_BYTES:
            params, metadata = env_codec.decode_open_episode_request(request, limit)
        else:
            params, metadata = await asyncio.to_thread(env_codec.decode_open_episode_request, request, limit)
        return await self._episodes.open(request.environment, params, metadata)

    async def _step(self, request: env_pb2.StepRequest) -> StepOutcome:
        self._episodes.check_step(request.episode_id, len(request.calls))
        calls = env_codec.decode_step_request(request)
        return await self._episodes.step(request.episode_id, calls)


def _check_batch(entries: int, field: str) -> None:
    if entries > env_codec.MAX_BATCH_ENTRIES:
        raise InvalidArgument(f"{entries} entries, at most {env_codec.MAX_BATCH_ENTRIES}", field=field)


async def _entry(call: Awaitable[ResultT]) -> ResultT | EntryError:
    """One entry of a batch: its result, or the status its single call would have failed with."""
    try:
        return await call
    except ServiceError as exc:
        retry_after_s = exc.retry_after_s if isinstance(exc, ResourceExhausted) else None
        return EntryError(exc.code.value[0], exc.details, retry_after_s)
