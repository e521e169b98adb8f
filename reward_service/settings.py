"""Settings of the reward service: the ``--config`` YAML minus its ``server:`` block."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from grpo_runtime.config import ConfigError, format_validation_error
from reward_service.checkers.settings import CheckerSettings
from reward_service.environments.settings import EnvironmentSettings
from reward_service.http.settings import HttpSettings
from reward_service.judges.settings import RemoteJudgeSettings
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import MODEL_NAME_RE
from reward_service.sandbox.settings import SandboxSettings


class RewardSettings(BaseModel):
    """Request limits plus one block per backend (checker pool, code sandbox, reward models)."""

    model_config = ConfigDict(extra="forbid")

    max_samples: int = Field(
        4096, ge=1, description="Samples allowed in one ScoreRequest; more is RESOURCE_EXHAUSTED."
    )
    max_rewards: int = Field(
        32, ge=1, description="RewardSpecs allowed in one ScoreRequest; more is RESOURCE_EXHAUSTED."
    )
    max_completion_chars: int = Field(
        1 << 20, ge=1, description="Characters of one Sample.completion; longer is INVALID_ARGUMENT."
    )
    max_completion_ids: int = Field(
        1 << 18, ge=1, description="Token ids in one Sample.completion_ids; more is INVALID_ARGUMENT."
    )
    max_prompt_chars: int = Field(
        1 << 20,
        ge=1,
        description="Characters of one Sample's prompt messages together; longer is INVALID_ARGUMENT.",
    )
    max_metadata_chars: int = Field(
        1 << 20,
        ge=1,
        description="Characters of one Sample's metadata (strings and keys, plus one per other value); "
        "more is INVALID_ARGUMENT.",
    )
    max_concurrent_requests: int = Field(
        64, ge=1, description="Score requests scored at once; more are refused with RESOURCE_EXHAUSTED."
    )
    text_deadline_s: float = Field(
        2.0,
        gt=0,
        description="Seconds one sample of a text reward (format, tag_count, reasoning_steps, "
        "repetition_penalty) may take; past it the component is an error.",
    )
    text_budget_s: float = Field(
        60.0, gt=0, description="Seconds all samples of one request may take in one text reward."
    )
    text_threads: int = Field(
        16,
        ge=1,
        description="Worker threads of the text rewards (their regex engine releases the GIL, so more "
        "threads than cores keep one slow request from queueing the others).",
    )
    stream_window: int = Field(4, ge=1, description="Requests of one ScoreStream scored at the same time.")
    stress_max_samples: int = Field(
        16,
        ge=1,
        le=1024,
        description="Reference samples of one StressReward request (each becomes one completion per "
        "attack); more is RESOURCE_EXHAUSTED.",
    )
    checkers: CheckerSettings = Field(default_factory=CheckerSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    models: ModelSettings = Field(default_factory=ModelSettings)
    environments: EnvironmentSettings = Field(default_factory=EnvironmentSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    judges: dict[str, RemoteJudgeSettings] = Field(
        default_factory=dict,
        description="Remote judges by name, scored as `judge:<name>` (OpenAI-compatible endpoints).",
    )

    @field_validator("judges")
    @classmethod
    def _judge_names(cls, judges: dict[str, RemoteJudgeSettings]) -> dict[str, RemoteJudgeSettings]:
        for name in judges:
            if not MODEL_NAME_RE.match(name):
                raise ValueError(f"{name!r}: names are lowercase letters, digits, '-', '_' or '.'")
        return judges


def load_settings(raw: dict[str, Any] | None) -> RewardSettings:
    """Validates the settings dict; ConfigError names the key (e.g. ``sandbox.memory_mb: ...``)."""
    try:
        return RewardSettings.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc
