"""The reward service's protobuf ↔ domain codec: both directions of each message, used by the servicer
(:mod:`reward_service.api`) and the client (:mod:`reward_service.client`) alike, so the two cannot drift
apart. No logic beyond shape.

``encode_X`` builds message X from domain values, ``decode_X`` reads it back. Reading a request costs time
linear in its size and refuses early: a Struct stops converting once it is past the size it may have, and a
field path is only spelt out for the error that names it (building one per value would cost the path's
length for every value under it; the Struct reader is :mod:`grpo_runtime.struct_codec`, shared with the
environment codec). Servicers run :func:`decode_score_request` off the event loop: converting
a request near the message limit takes seconds of Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, struct_pb2
from grpo.common.v1 import common_pb2
from grpo.reward.v1 import reward_pb2

from grpo_runtime.chat_codec import content_images, content_text, decode_chat_message
from grpo_runtime.errors import InvalidArgument
from grpo_runtime.struct_codec import struct_dict
from reward_service.core.types import (
    ComponentResult,
    Message,
    ParamInfo,
    RewardDescription,
    RewardRequest,
    Sample,
    SampleResult,
)

if TYPE_CHECKING:  # the server's types: the client imports no more than the domain types above
    from reward_service.core.scorer import ScoreLimits
    from reward_service.core.stress import StressReport


# ------------------------------------------------ Struct (metadata, params)
def _json_value(value: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    else:
        json_format.ParseDict(value, out)
    return out


# -------------------------------------------------------------------- Sample
def encode_sample(sample: Sample) -> reward_pb2.Sample:
    message = reward_pb2.Sample(
        id=sample.id,
        completion=sample.completion,
        completion_ids=list(sample.completion_ids),
        group=sample.group,
    )
    for m in sample.prompt:
        message.prompt.add(role=m.role, content=m.content)
    if sample.metadata:
        message.metadata.update(sample.metadata)
    return message


def _message_text(message: common_pb2.ChatMessage, field: str) -> str:
    """A prompt message's text (its text parts joined by newlines). The rewards read text: an image part
    is refused naming it, never dropped unseen."""
    _, content = decode_chat_message(message, field)
    images = content_images(content)
    if images:
        raise InvalidArgument(
            "the reward service scores text: send a prompt's text parts only",
            field=f"{field}.parts[{images[0][0]}].image",
        )
    return content_text(content)


def decode_sample(message: reward_pb2.Sample, index: int, limits: ScoreLimits | None = None) -> Sample:
    """One Sample. With ``limits`` (the scorer's), what would be past them is refused before it is read:
    the token ids and prompt messages by their counts (a message is at least its role's one character),
    the metadata as soon as its count passes ``max_metadata_chars``."""
    where = f"samples[{index}]"
    if limits is not None:
        limits.check_completion_ids(len(message.completion_ids), where)
        if len(message.prompt) > limits.max_prompt_chars:
            raise InvalidArgument(
                f"{len(message.prompt)} messages, more than max_prompt_chars={limits.max_prompt_chars} "
                "characters",
                field=f"{where}.prompt",
            )
    for j, m in enumerate(message.prompt):
        if not m.role:
            raise InvalidArgument("role is required", field=f"{where}.prompt[{j}].role")
    return Sample(
        id=message.id,
        completion=message.completion,
        prompt=tuple(
            Message(role=m.role, content=_message_text(m, f"{where}.prompt[{j}]"))
            for j, m in enumerate(message.prompt)
        ),
        completion_ids=tuple(message.completion_ids),
        metadata=struct_dict(
            message.metadata,
            f"{where}.metadata",
            max_chars=limits.max_metadata_chars if limits is not None else None,
            limit_name="max_metadata_chars",
        ),
        group=message.group,
    )


# ---------------------------------------------------------------- RewardSpec
def encode_reward_spec(reward: RewardRequest) -> reward_pb2.RewardSpec:
    message = reward_pb2.RewardSpec(name=reward.name, weight=reward.weight)
    if reward.params:
        message.params.update(reward.params)
    return message


def decode_reward_spec(message: reward_pb2.RewardSpec, index: int) -> RewardRequest:
    weight = message.weight if message.HasField("weight") else 1.0
    return RewardRequest(
        name=message.name, weight=weight, params=struct_dict(message.params, f"rewards[{index}].params")
    )


# -------------------------------------------------------------- ScoreRequest
def encode_score_request(
    samples: Iterable[Sample], rewards: Iterable[RewardRequest]
) -> reward_pb2.ScoreRequest:
    return reward_pb2.ScoreRequest(
        samples=[encode_sample(s) for s in samples], rewards=[encode_reward_spec(r) for r in rewards]
    )


def decode_score_request(
    message: reward_pb2.ScoreRequest, limits: ScoreLimits | None = None
) -> tuple[list[Sample], list[RewardRequest]]:
    """(samples, rewards), each sample read only within ``limits`` (:func:`decode_sample`); linear in the
    request's size, seconds of Python near the message limit, so servicers call it off the event loop
    after checking the counts."""
    return (
        [decode_sample(s, i, limits) for i, s in enumerate(message.samples)],
        [decode_reward_spec(r, i) for i, r in enumerate(message.rewards)],
    )


# ------------------------------------------------------------- ScoreResponse
def _finite(value: float | None) -> float | None:
    # A NaN/inf would poison the trainer's statistics; such a component is reported as having no value.
    return value if value is not None and math.isfinite(value) else None


def encode_score_response(results: Sequence[SampleResult]) -> reward_pb2.ScoreResponse:
    response = reward_pb2.ScoreResponse()
    for result in results:
        score = response.scores.add(id=result.id)
        reward = _finite(result.reward)
        if reward is not None:
            score.reward = reward
        for name, component in result.components:
            c = score.components.add(name=name, step_scores=component.step_scores, error=component.error)
            value = _finite(component.value)
            if value is not None:
                c.value = value
            elif component.value is not None and not component.error:
                c.error = f"non-finite value {component.value}"
    return response


def decode_sample_score(score: reward_pb2.SampleScore) -> SampleResult:
    return SampleResult(
        id=score.id,
        reward=score.reward if score.HasField("reward") else None,
        components=[
            (
                c.name,
                ComponentResult(
                    value=c.value if c.HasField("value") else None,
                    step_scores=list(c.step_scores),
                    error=c.error,
                ),
            )
            for c in score.components
        ],
    )


def decode_score_response(response: reward_pb2.ScoreResponse) -> list[SampleResult]:
    """One result per sample, in request order."""
    return [decode_sample_score(score) for score in response.scores]


# -------------------------------------------------------- ListRewardsResponse
def encode_list_rewards_response(descriptions: Sequence[RewardDescription]) -> reward_pb2.ListRewardsResponse:
    response = reward_pb2.ListRewardsResponse()
    for d in descriptions:
        info = response.rewards.add(
            name=d.name,
            description=d.description,
            required_metadata=list(d.required_metadata),
            group_aware=d.group_aware,
            available=d.available,
            status=d.status,
        )
        if d.min_value is not None:
            info.min_value = d.min_value
        if d.max_value is not None:
            info.max_value = d.max_value
        for p in d.params:
            info.params.add(
                name=p.name, type=p.type, default_value=_json_value(p.default), description=p.description
            )
    return response


def decode_reward_info(info: reward_pb2.RewardInfo) -> RewardDescription:
    return RewardDescription(
        name=info.name,
        description=info.description,
        params=tuple(
            ParamInfo(
                name=p.name,
                type=p.type,
                default=json_format.MessageToDict(p.default_value) if p.HasField("default_value") else None,
                description=p.description,
            )
            for p in info.params
        ),
        required_metadata=tuple(info.required_metadata),
        min_value=info.min_value if info.HasField("min_value") else None,
        max_value=info.max_value if info.HasField("max_value") else None,
        group_aware=info.group_aware,
        available=info.available,
        status=info.status,
    )


def decode_list_rewards_response(response: reward_pb2.ListRewardsResponse) -> list[RewardDescription]:
    """In the service's order."""
    return [decode_reward_info(info) for info in response.rewards]


# --------------------------------------------------------- StressReward
# Only the servicer's side: the stress test is run from the command line (reward_service.cli), which prints
# the response message as it is.
def decode_stress_request(
    message: reward_pb2.StressRewardRequest, limits: ScoreLimits | None = None
) -> tuple[list[Sample], list[RewardRequest], float | None, list[str]]:
    """(reference samples, rewards, threshold or None, attack names); like :func:`decode_score_request`."""
    return (
        [decode_sample(s, i, limits) for i, s in enumerate(message.samples)],
        [decode_reward_spec(r, i) for i, r in enumerate(message.rewards)],
        message.threshold if message.HasField("threshold") else None,
        list(message.attacks),
    )


def _scores(results: list[SampleResult | None]) -> list[reward_pb2.SampleScore]:
    """One SampleScore per entry; an empty one (no id) for None."""
    scored = iter(encode_score_response([r for r in results if r is not None]).scores)
    return [next(scored) if r is not None else reward_pb2.SampleScore() for r in results]


def encode_stress_response(report: StressReport) -> reward_pb2.StressRewardResponse:
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
