"""The ``training.sampling.curriculum`` block of the run config: sampling weights from per-prompt pass rates.

prime-rl's difficulty pools: a prompt whose groups all passed is *easy*, one whose groups all failed is
*hard*, the rest (mixed outcomes: the groups GRPO learns from) *normal*. The train sampler draws prompts with
the weight of their pool; unseen prompts count as normal. Logic: :mod:`trainer_service.training.curriculum`.
Torch-free, like the rest of ``config/``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from trainer_service.config.fields import StrictModel


class CurriculumConfig(StrictModel):
    """``pass_threshold``: a completion passes when the run's first reward term is at least this.
    ``easy_pass_rate`` / ``hard_pass_rate``: a prompt's pass rate (passes / attempts over all its groups so
    far) at or above / at or below which it is easy / hard. ``*_weight``: each pool's sampling weight."""

    pass_threshold: float = Field(
        default=1.0, description="A completion passes when the run's first reward term is at least this."
    )
    easy_pass_rate: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Pass rate at or above which a prompt is easy."
    )
    hard_pass_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Pass rate at or below which a prompt is hard."
    )
    easy_weight: float = Field(default=0.2, gt=0.0, le=1e6, description="Sampling weight of easy prompts.")
    normal_weight: float = Field(
        default=1.0, gt=0.0, le=1e6, description="Sampling weight of normal prompts."
    )
    hard_weight: float = Field(default=0.2, gt=0.0, le=1e6, description="Sampling weight of hard prompts.")

    @model_validator(mode="after")
    def _pools_do_not_overlap(self) -> CurriculumConfig:
        if self.hard_pass_rate >= self.easy_pass_rate:
            raise ValueError("hard_pass_rate must be below easy_pass_rate (the pools would overlap)")
        return self
