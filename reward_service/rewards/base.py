"""What every built-in reward looks like to the scorer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reward_service.types import ComponentResult, RewardDescription, Sample


class Reward(Protocol):
    """A reward: ``description`` for ListRewards, ``score`` for one request.

    ``score`` gets every sample of the request (group-aware rewards need the others) and the params already
    checked and completed with defaults (see ``params.resolve_params``); it returns one result per sample and
    reports per-sample problems in ``ComponentResult.error`` rather than raising.
    """

    description: RewardDescription

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]: ...


class TextReward:
    """A reward computed from each completion's text alone, in-process (cheap regex/counting work)."""

    def __init__(self, description: RewardDescription, fn: Callable[[str, dict[str, Any]], float]):
        self.description = description
        self._fn = fn

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        return [ComponentResult(value=float(self._fn(s.completion, params))) for s in samples]


def missing_metadata(key: str) -> ComponentResult:
    return ComponentResult(error=f"metadata '{key}' is required")


def gold_answer(sample: Sample, key: str) -> str | None:
    """The gold answer as text (numbers are accepted and formatted), or None when absent."""
    value = sample.metadata.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else str(value)
