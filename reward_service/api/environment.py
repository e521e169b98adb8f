"""EnvironmentService servicer: protobuf in, one call into the episode registry, protobuf out.

The registry's checks that need only counts and names run on the request message before it is converted;
converting the metadata of a large request (a walk of every value) runs off the event loop, a small one
(the usual few answer columns) inline, where a thread hop would cost more than the walk.
"""

from __future__ import annotations

import asyncio

import grpc
from grpo.env.v1 import env_pb2, env_pb2_grpc

from grpo_runtime import env_codec
from reward_service.environments.episodes import EpisodeRegistry

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
        self._episodes.check_open(request.environment, request.params.fields)
        limit = self._episodes.max_metadata_chars
        if request.ByteSize() <= INLINE_OPEN_BYTES:
            params, metadata = env_codec.decode_open_episode_request(request, limit)
        else:
            params, metadata = await asyncio.to_thread(env_codec.decode_open_episode_request, request, limit)
        episode = await self._episodes.open(request.environment, params, metadata)
        return env_codec.encode_open_episode_response(episode)

    async def Step(
        self, request: env_pb2.StepRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.StepResponse:
        self._episodes.check_step(request.episode_id, len(request.calls))
        calls = env_codec.decode_step_request(request)
        return env_codec.encode_step_response(await self._episodes.step(request.episode_id, calls))

    async def GetReward(
        self, request: env_pb2.GetRewardRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.GetRewardResponse:
        return env_codec.encode_get_reward_response(await self._episodes.reward(request.episode_id))

    async def CloseEpisode(
        self, request: env_pb2.CloseEpisodeRequest, context: grpc.aio.ServicerContext
    ) -> env_pb2.CloseEpisodeResponse:
        return env_pb2.CloseEpisodeResponse(closed=await self._episodes.close(request.episode_id))
