"""StressReward protobuf ↔ domain objects (the samples and rewards convert as Score's do)."""

from __future__ import annotations

from grpo.reward.v1 import reward_pb2

from reward_service.api import convert
from reward_service.core.stress import StressReport
from reward_service.core.types import RewardRequest, Sample, SampleResult


def stress_request(
    message: reward_pb2.StressRewardRequest,
) -> tuple[list[Sample], list[RewardRequest], float | None, list[str]]:
    """(reference samples, rewards, threshold or None, attack names)."""
    return (
        [convert.sample(s, i) for i, s in enumerate(message.samples)],
        [convert.reward_spec(r, i) for i, r in enumerate(message.rewards)],
        message.threshold if message.HasField("threshold") else None,
        list(message.attacks),
    )


def _scores(results: list[SampleResult | None]) -> list[reward_pb2.SampleScore]:
    """One SampleScore per entry; an empty one (no id) for None."""
    scored = iter(convert.score_response([r for r in results if r is not None]).scores)
    return [next(scored) if r is not None else reward_pb2.SampleScore() for r in results]


def stress_response(report: StressReport) -> reward_pb2.StressRewardResponse:
    response = reward_pb2.StressRewardResponse(threshold=report.threshold, baseline=_scores(report.baseline))
    for outcome in report.attacks:
        attack = response.attacks.add(
            name=outcome.name,
            description=outcome.description,
            example=outcome.example,
            scores=_scores(outcome.results),
            flagged=outcome.flagged,
        )
        if outcome.max_reward is not None:
            attack.max_reward = outcome.max_reward
    return response
