"""Plain types of the environment contract (``grpo.env.v1``), shared by its client and its servers.

No gRPC here: the environment core of a server and the rollout's episode loop both speak these, and the
protobuf conversion, both directions, is ``grpo_runtime.env_codec``, used by the client and the servicer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolDefinition:
    """One tool as a JSON-schema function definition (transformers' ``get_json_schema`` form, unwrapped).

    ``parameters`` is the JSON schema of the arguments (``{"type": "object", "properties": ...}``).
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def chat_template_form(self) -> dict[str, Any]:
        """``{"type": "function", "function": {...}}``: what ``apply_chat_template(tools=[...])`` takes."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from the model's output; ``arguments_json`` is the model's text, unparsed."""

    name: str
    arguments_json: str = "{}"
    id: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gave: the tool message text, or why the call failed (``error``)."""

    call_id: str
    name: str
    content: str
    error: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class StepOutcome:
    """The results of one Step, in call order, and whether the environment ended the episode."""

    results: tuple[ToolResult, ...]
    done: bool = False


@dataclass(frozen=True)
class Episode:
    """An opened episode: its id, the tools the model may call, text to append to the prompt."""

    episode_id: str
    tools: tuple[ToolDefinition, ...]
    prompt_suffix: str = ""

    def chat_template_tools(self) -> list[dict[str, Any]]:
        """The tools in the form ``apply_chat_template(tools=...)`` takes."""
        return [tool.chat_template_form() for tool in self.tools]


@dataclass(frozen=True)
class EpisodeReward:
    """The environment's reward; ``value`` None when it has none (TRL's None), ``error`` why, if it failed."""

    value: float | None
    error: str = ""


@dataclass(frozen=True)
class EnvironmentInfo:
    """One environment a server can open (ListEnvironments)."""

    name: str
    description: str
    kind: str
    available: bool = True
    status: str = ""


@dataclass(frozen=True)
class EntryError:
    """Why one entry of a batch call (OpenEpisodes, StepEpisodes) failed: the gRPC status code number and
    details its single call would have ended with."""

    code: int
    details: str
    retry_after_s: float | None = None  # the server's pushback (RESOURCE_EXHAUSTED that passes)
