"""The ``training.rewards`` block: which reward functions score a run, with what weights and parameters."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from trainer_service.config.fields import FiniteParams, StrictModel

# |weight| of one reward term; larger weights only overflow the weighted sum.
MAX_REWARD_WEIGHT = 1e6


class RewardTerm(StrictModel):
    """One reward function of the sum ``R = Σ weight·value`` (TRL ``reward_weights``)."""

    name: str
    weight: float = Field(default=1.0, ge=-MAX_REWARD_WEIGHT, le=MAX_REWARD_WEIGHT)
    params: FiniteParams = Field(default_factory=dict)


def parse_reward_fn(spec: str) -> list[tuple[str, float]]:
    """Parse ``"accuracy,format"`` or ``"accuracy:2.0,format:0.5"`` into ``[(name, weight), ...]``.

    A trailing ``:number`` is the weight (default 1.0); other colons belong to the name, so ``prm:math`` is a
    name and ``prm:math:0.5`` is that name with weight 0.5. Names must be unique and the weights finite.
    """
    terms: list[tuple[str, float]] = []
    for index, raw in enumerate(spec.split(",")):
        part = raw.strip()
        if not part:
            raise ValueError(f"entry {index} is empty (expected 'name' or 'name:weight')")
        name, weight = part, 1.0
        head, sep, tail = part.rpartition(":")
        if sep:
            try:
                weight = float(tail)
            except ValueError:
                pass  # not a number: the colon is part of the name (prm:NAME)
            else:
                name = head.strip()
                if not name:
                    raise ValueError(f"entry {index} {part!r} has a weight but no reward name")
                if not math.isfinite(weight) or abs(weight) > MAX_REWARD_WEIGHT:
                    raise ValueError(
                        f"entry {index} {part!r} needs a finite weight of magnitude <= {MAX_REWARD_WEIGHT:g}"
                    )
        if name in {existing for existing, _ in terms}:
            raise ValueError(f"reward {name!r} is listed twice")
        terms.append((name, weight))
    return terms


class RewardsConfig(StrictModel):
    """How completions are scored: the reward service's functions summed with weights,
    ``R = Σ weight·value`` (TRL ``reward_funcs`` / ``reward_weights``), or a loaded process reward model."""

    reward_fn: str = Field(
        default="accuracy",
        description="Reward functions and weights: 'accuracy,format' or 'accuracy:2.0,format:0.5' (default "
        "weight 1.0); a model loaded on the reward service is 'prm:NAME' / 'orm:NAME'.",
    )
    params: dict[str, FiniteParams] = Field(
        default_factory=dict,
        description="Parameters of each reward function, by its name: {length: {max_len: 64}}.",
    )
    prm: str | None = Field(
        default=None,
        description="Name of a process reward model loaded on the reward service; when set it REPLACES "
        "reward_fn (as in soup-cli).",
    )
    prm_aggregate: Literal["min", "prod", "last", "mean"] = Field(
        default="min", description="How the PRM's per-step scores become one reward."
    )
    environment_weight: float = Field(
        default=1.0,
        ge=0.0,
        description="Weight of a tool environment's own reward (grpo.env.v1 GetReward) beside reward_fn's "
        "terms; 0 = not a reward term.",
    )

    @field_validator("reward_fn")
    @classmethod
    def _reward_fn_parses(cls, value: str) -> str:
        parse_reward_fn(value)
        return value

    @property
    def reward_terms(self) -> list[RewardTerm]:
        """The reward functions and weights this run scores with (``prm`` replaces ``reward_fn``)."""
        if self.prm is not None:
            params = {"aggregate": self.prm_aggregate, **self.params.get(self.prm, {})}
            return [RewardTerm(name=f"prm:{self.prm}", weight=1.0, params=params)]
        return [
            RewardTerm(name=name, weight=weight, params=self.params.get(name, {}))
            for name, weight in parse_reward_fn(self.reward_fn)
        ]
