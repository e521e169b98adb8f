"""The ``training.curriculum`` block of the run config: sampling weights from per-prompt pass rates.

prime-rl's difficulty pools: a prompt whose groups all passed is *easy*, one whose groups all failed is
*hard*, the rest (mixed outcomes: the groups GRPO learns from) *normal*. The train sampler draws prompts with
the weight of their pool; unseen prompts count as normal. Logic: :mod:`trainer_service.training.curriculum`.
Torch-free, like the rest of ``config/``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CurriculumConfig(BaseModel):
    """``pass_threshold``: a completion passes when the run's first reward term is at least this.
    ``easy_pass_rate`` / ``hard_pass_rate``: a prompt's pass rate (passes / attempts over all its groups so
    far) at or above / at or below which it is easy / hard. ``*_weight``: each pool's sampling weight."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    pass_threshold: float = 1.0
    easy_pass_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    hard_pass_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    easy_weight: float = Field(default=0.2, gt=0.0, le=1e6)
    normal_weight: float = Field(default=1.0, gt=0.0, le=1e6)
    hard_weight: float = Field(default=0.2, gt=0.0, le=1e6)

    @model_validator(mode="after")
    def _pools_do_not_overlap(self) -> CurriculumConfig:
        if self.hard_pass_rate >= self.easy_pass_rate:
            raise ValueError("hard_pass_rate must be below easy_pass_rate (the pools would overlap)")
        return self
