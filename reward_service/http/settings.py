"""Settings of the HTTP endpoint (the ``http:`` block of the reward service config)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MiB = 1024 * 1024


class HttpReward(BaseModel):
    """One reward of the endpoint's sum, as a RewardSpec: ``reward = Σ weight·value``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    weight: float = Field(1.0, allow_inf_nan=False)
    params: dict[str, Any] = Field(default_factory=dict)


class HttpSettings(BaseModel):
    """The OpenRLHF-compatible endpoint served beside gRPC on the same host (``--http-port``)."""

    model_config = ConfigDict(extra="forbid")

    port: int | None = Field(
        None, ge=0, le=65535, description="HTTP port; None = no HTTP endpoint, 0 = any free port."
    )
    rewards: list[HttpReward] = Field(
        default_factory=list,
        description="Rewards of /get_reward when the request names none (?rewards=...); a name the request "
        "names takes its params (and weight, unless ?weights= gives one) from here.",
    )
    max_body_bytes: int = Field(64 * MiB, ge=1024, description="Largest request body; more is 413.")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a connection has to send a request's headers, from when it opens or from its "
        "previous response; a slower one is closed (slowloris).",
    )
    body_timeout_s: float = Field(
        120.0, gt=0, description="Seconds a request's body may take to arrive; a slower one is 408."
    )
    label_key: str = Field(
        "answer", min_length=1, description="Metadata key a text (or number) label is passed as."
    )
    missing_reward: float = Field(
        0.0,
        allow_inf_nan=False,
        description="Reward (and component value) sent for a sample no component could score; OpenRLHF "
        "needs a number for every sample.",
    )
    score_range: tuple[float, float] | None = Field(
        None,
        description="[low, high] of the reward, mapped linearly onto the [0, 1] 'scores'; default: from the "
        "rewards' declared bounds (Σ weight·min .. Σ weight·max), or the reward clamped to [0, 1] when a "
        "reward has no bound.",
    )
    strip_suffixes: list[str] = Field(
        default_factory=lambda: ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"],
        description="End-of-sequence tokens removed (repeatedly, with trailing whitespace) from the end of "
        "each completion: OpenRLHF sends the decoded sequence with them.",
    )

    @model_validator(mode="after")
    def _range_ordered(self) -> HttpSettings:
        if self.score_range is not None:
            low, high = self.score_range
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError("score_range must be [low, high], finite, with low < high")
        return self
