"""Settings of the trainer service: the ``--config`` YAML minus its ``server:`` block."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_runtime.config import ConfigError, format_validation_error

DEFAULT_PORT = 50053


class TrainerServiceSettings(BaseModel):
    """What the service itself needs; each run brings its own config (``StartRun``)."""

    model_config = ConfigDict(extra="forbid")

    stop_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="On shutdown, seconds live runs get to reach a step boundary and checkpoint before being "
        "terminated.",
    )


def load_settings(raw: dict[str, Any] | None) -> TrainerServiceSettings:
    """Validates the settings dict; ConfigError names the key (e.g. ``stop_grace_s: ...``)."""
    try:
        return TrainerServiceSettings.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc
