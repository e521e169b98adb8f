"""The range a weighted reward sum can take, from the rewards' declared bounds."""

from __future__ import annotations

from collections.abc import Sequence

from reward_service.core.types import RewardDescription, RewardRequest


def reward_bounds(
    rewards: Sequence[RewardRequest], descriptions: Sequence[RewardDescription]
) -> tuple[float, float] | None:
    """[Σ weight·min, Σ weight·max] of ``reward = Σ weight·value`` from each reward's declared
    ``min_value``/``max_value`` (the two swapped for a negative weight); None when a reward declares no bound
    on a side (or is not described), or the range is empty."""
    by_name = {d.name: d for d in descriptions}
    low = high = 0.0
    for spec in rewards:
        described = by_name.get(spec.name)
        if described is None or described.min_value is None or described.max_value is None:
            return None
        ends = sorted((spec.weight * described.min_value, spec.weight * described.max_value))
        low, high = low + ends[0], high + ends[1]
    return (low, high) if high > low else None
