"""protobuf ↔ domain objects of the reward service (no logic beyond shape)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format, struct_pb2
from grpo.reward.v1 import reward_pb2

from grpo_runtime.errors import InvalidArgument
from reward_service.core.stress import StressReport
from reward_service.core.types import (
    Message,
    RewardDescription,
    RewardRequest,
    Sample,
    SampleResult,
)

# Nesting allowed in metadata and params (objects and lists together). protobuf's decoder already refuses
# about 48 Struct levels; this keeps what parses within what rewards and JSON tools handle comfortably.
MAX_STRUCT_DEPTH = 32


def _struct(value: struct_pb2.Struct, field: str) -> dict[str, Any]:
    """A Struct as plain JSON values; InvalidArgument naming ``field.<path>`` for a NaN/inf number or
    nesting past MAX_STRUCT_DEPTH (no JSON value is either)."""
    return {key: _plain(item, f"{field}.{key}", 1) for key, item in value.fields.items()}


def _plain(value: struct_pb2.Value, field: str, depth: int) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        if not math.isfinite(value.number_value):
            raise InvalidArgument(f"must be a finite number, got {value.number_value}", field=field)
        return value.number_value
    if kind in ("struct_value", "list_value"):
        if depth >= MAX_STRUCT_DEPTH:
            raise InvalidArgument(f"nested deeper than {MAX_STRUCT_DEPTH} levels", field=field)
        if kind == "struct_value":
            return {k: _plain(v, f"{field}.{k}", depth + 1) for k, v in value.struct_value.fields.items()}
        return [_plain(v, f"{field}[{i}]", depth + 1) for i, v in enumerate(value.list_value.values)]
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None  # null_value, or no kind set (JSON null, as json_format reads it)


def _json_value(value: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    else:
        json_format.ParseDict(value, out)
    return out


def sample(message: reward_pb2.Sample, index: int) -> Sample:
    for j, m in enumerate(message.prompt):
        if not m.role:
            raise InvalidArgument("role is required", field=f"samples[{index}].prompt[{j}].role")
    return Sample(
        id=message.id,
        completion=message.completion,
        prompt=tuple(Message(role=m.role, content=m.content) for m in message.prompt),
        completion_ids=tuple(message.completion_ids),
        metadata=_struct(message.metadata, f"samples[{index}].metadata"),
        group=message.group,
    )


def reward_spec(message: reward_pb2.RewardSpec, index: int) -> RewardRequest:
    weight = message.weight if message.HasField("weight") else 1.0
    return RewardRequest(
        name=message.name, weight=weight, params=_struct(message.params, f"rewards[{index}].params")
    )


def score_request(message: reward_pb2.ScoreRequest) -> tuple[list[Sample], list[RewardRequest]]:
    return (
        [sample(s, i) for i, s in enumerate(message.samples)],
        [reward_spec(r, i) for i, r in enumerate(message.rewards)],
    )


def _finite(value: float | None) -> float | None:
    # A NaN/inf would poison the trainer's statistics; such a component is reported as having no value.
    return value if value is not None and math.isfinite(value) else None


def score_response(results: Sequence[SampleResult]) -> reward_pb2.ScoreResponse:
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


def list_rewards_response(descriptions: Sequence[RewardDescription]) -> reward_pb2.ListRewardsResponse:
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


def stress_request(
    message: reward_pb2.StressRewardRequest,
) -> tuple[list[Sample], list[RewardRequest], float | None, list[str]]:
    """(reference samples, rewards, threshold or None, attack names)."""
    return (
        [sample(s, i) for i, s in enumerate(message.samples)],
        [reward_spec(r, i) for i, r in enumerate(message.rewards)],
        message.threshold if message.HasField("threshold") else None,
        list(message.attacks),
    )


def _scores(results: list[SampleResult | None]) -> list[reward_pb2.SampleScore]:
    """One SampleScore per entry; an empty one (no id) for None."""
    scored = iter(score_response([r for r in results if r is not None]).scores)
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
