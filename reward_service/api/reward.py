"""RewardService servicer: protobuf in, one call into the Scorer, protobuf out.

Each request's counts are checked on the message itself (lengths of repeated fields, no conversion) before
anything else; conversion both ways (the service's codec, :mod:`reward_service.codec`) then runs off the event
loop, since near the limits it takes seconds of
Python and the loop also answers health checks and every other caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from reward_service import codec
from reward_service.core.scorer import Scorer
from reward_service.core.stress import StressLimits, check_stress_counts, stress
from reward_service.core.types import RewardRequest, Sample


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, scorer: Scorer, stream_window: int, stress_limits: StressLimits):
        self._scorer = scorer
        self._window = stream_window
        self._stress_limits = stress_limits

    async def _score_request(
        self, request: reward_pb2.ScoreRequest
    ) -> tuple[list[Sample], list[RewardRequest]]:
        self._scorer.check_counts(len(request.samples), len(request.rewards))
        return await asyncio.to_thread(codec.decode_score_request, request, self._scorer.limits)

    async def Score(self, request: reward_pb2.ScoreRequest, context: grpc.aio.ServicerContext):
        samples, rewards = await self._score_request(request)
        results = await self._scorer.score(samples, rewards)
        return await asyncio.to_thread(codec.encode_score_response, results)

    async def ScoreStream(
        self, request_iterator: AsyncIterator[reward_pb2.ScoreRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[reward_pb2.ScoreResponse]:
        async def requests() -> AsyncIterator[tuple[list[Sample], list[RewardRequest]]]:
            async for request in request_iterator:
                yield await self._score_request(request)

        async for results in self._scorer.score_stream(requests(), self._window):
            yield await asyncio.to_thread(codec.encode_score_response, results)

    async def ListRewards(self, request: reward_pb2.ListRewardsRequest, context: grpc.aio.ServicerContext):
        return codec.encode_list_rewards_response(self._scorer.describe())

    async def StressReward(
        self, request: reward_pb2.StressRewardRequest, context: grpc.aio.ServicerContext
    ) -> reward_pb2.StressRewardResponse:
        check_stress_counts(len(request.samples), len(request.attacks), self._stress_limits)
        self._scorer.check_counts(len(request.samples), len(request.rewards))
        samples, rewards, threshold, attacks = await asyncio.to_thread(
            codec.decode_stress_request, request, self._scorer.limits
        )
        report = await stress(
            self._scorer, samples, rewards, threshold=threshold, attacks=attacks, limits=self._stress_limits
        )
        return await asyncio.to_thread(codec.encode_stress_response, report)
