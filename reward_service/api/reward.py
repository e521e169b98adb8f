"""RewardService servicer: protobuf in, one call into the Scorer, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from reward_service.api import convert
from reward_service.core.scorer import Scorer
from reward_service.core.stress import StressLimits, stress
from reward_service.core.types import RewardRequest, Sample


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, scorer: Scorer, stream_window: int, stress_limits: StressLimits):
        self._scorer = scorer
        self._window = stream_window
        self._stress_limits = stress_limits

    async def Score(self, request: reward_pb2.ScoreRequest, context: grpc.aio.ServicerContext):
        samples, rewards = convert.score_request(request)
        return convert.score_response(await self._scorer.score(samples, rewards))

    async def ScoreStream(
        self, request_iterator: AsyncIterator[reward_pb2.ScoreRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[reward_pb2.ScoreResponse]:
        async def requests() -> AsyncIterator[tuple[list[Sample], list[RewardRequest]]]:
            async for request in request_iterator:
                yield convert.score_request(request)

        async for results in self._scorer.score_stream(requests(), self._window):
            yield convert.score_response(results)

    async def ListRewards(self, request: reward_pb2.ListRewardsRequest, context: grpc.aio.ServicerContext):
        return convert.list_rewards_response(self._scorer.describe())

    async def StressReward(
        self, request: reward_pb2.StressRewardRequest, context: grpc.aio.ServicerContext
    ) -> reward_pb2.StressRewardResponse:
        samples, rewards, threshold, attacks = convert.stress_request(request)
        report = await stress(
            self._scorer, samples, rewards, threshold=threshold, attacks=attacks, limits=self._stress_limits
        )
        return convert.stress_response(report)
