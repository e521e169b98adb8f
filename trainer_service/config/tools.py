"""The ``training.tools`` block: multi-turn episodes with tools, and the one turn limit."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from trainer_service.config.fields import FiniteParams, StrictModel

# The environment of training.tools.functions in a locally spawned reward service's `environments.functions`.
TOOLS_ENVIRONMENT = "tools"


class EnvironmentSpec(StrictModel):
    """A tool environment episodes run against (grpo.env.v1 ``OpenEpisode``): its name and params."""

    name: str = Field(min_length=1, description="Environment name, as the environment service lists it.")
    params: FiniteParams = Field(default_factory=dict, description="Parameters passed to OpenEpisode.")


def _environment_spec(value: Any) -> Any:
    """``calculator`` is ``{name: calculator}``."""
    return {"name": value} if isinstance(value, str) else value


EnvironmentEntry = Annotated[EnvironmentSpec, BeforeValidator(_environment_spec)]


def _function_path(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        raise ValueError(f"{value!r} is not 'module:function'")
    return value


FunctionPath = Annotated[str, AfterValidator(_function_path)]


class ToolsConfig(StrictModel):
    """Multi-turn tool episodes (TRL's names): the model calls tools, their results join the conversation,
    and the trainer trains on the model's tokens only. Unset environment, environments and functions =
    single-turn generation."""

    functions: list[FunctionPath] | None = Field(
        default=None,
        min_length=1,
        description="TRL's tools=: plain functions ('module:function') as the episodes' tools, served by the "
        "locally spawned reward service (written into its settings: it imports code only from its own "
        "settings). Over StartRun only entries in the trainer service's allowed_tools pass.",
    )
    environment: EnvironmentEntry | None = Field(
        default=None,
        description="One tool environment (a name, or {name, params}), served by services.environment or "
        "else services.reward.",
    )
    environments: list[EnvironmentEntry] | None = Field(
        default=None,
        min_length=1,
        description="Several tool environments; a data row picks one by its `environment` column, default "
        "the first.",
    )
    max_tool_calling_iterations: int | None = Field(
        default=None,
        ge=0,
        description="The turn limit: tool-calling rounds per episode (TRL's name), so an episode has at most "
        "this + 1 model turns. None = the rollout service's limit.",
    )
    max_tool_calls: int | None = Field(
        default=None, ge=0, description="Tool calls per episode at most; None = the rollout service's limit."
    )

    @model_validator(mode="after")
    def _one_environment_form(self) -> ToolsConfig:
        if self.environment is not None and self.environments is not None:
            raise ValueError("set environment or environments, not both")
        if self.functions is not None and (self.environment is not None or self.environments is not None):
            raise ValueError(
                "set functions or environment(s), not both: to combine them, list the functions in the "
                "reward service's environments.functions settings and name that environment in environments"
            )
        return self

    @property
    def episode_environments(self) -> list[EnvironmentSpec]:
        """The environments of a tool-using run ([] = single-turn generation)."""
        if self.functions is not None:
            return [EnvironmentSpec(name=TOOLS_ENVIRONMENT)]
        if self.environment is not None:
            return [self.environment]
        return list(self.environments or [])

    @property
    def max_model_turns(self) -> int | None:
        """Model turns per episode at most: the tool-calling rounds and the answer turn (None = unset)."""
        if self.max_tool_calling_iterations is None:
            return None
        return self.max_tool_calling_iterations + 1
