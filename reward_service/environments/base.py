"""The two interfaces every environment kind implements, and the errors a tool call may end in.

An :class:`Environment` is configured once per server (``calculator``, ``python``, each TRL class, each MCP
server); ``open`` makes a :class:`Session`, the state of one episode, isolated from every other. The episode
registry (``episodes.py``) owns sessions: it parses and validates the model's calls, applies the timeouts
and caps, and turns :class:`ToolError` into the error result the model sees.
"""

from __future__ import annotations

from typing import Any, Protocol

from grpo_runtime.env_types import ToolDefinition


class ToolError(Exception):
    """A tool call failed in a way the model should see (bad input, the tool raised); the episode goes on."""


class SessionBroken(ToolError):
    """The episode cannot go on (its server process died, a tool hung); the episode is done."""


class OpenFailed(Exception):
    """The environment could not start an episode (constructor or reset raised, server did not start)."""


class Session(Protocol):
    """One episode of an environment."""

    tools: tuple[ToolDefinition, ...]
    prompt_suffix: str

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Runs tool ``name`` (one of ``tools``, arguments already checked against its schema); returns the
        tool message text. Raises ToolError for a failure the model should see."""
        ...

    async def reward(self) -> float | None:
        """The environment's reward for the episode so far; None when it has none."""
        ...

    async def close(self) -> None:
        """Frees what the episode holds. Called once; never raises."""
        ...


class Environment(Protocol):
    """A configured kind of episode."""

    name: str
    kind: str
    description: str
    available: bool
    status: str

    async def open(self, metadata: dict[str, Any]) -> Session:
        """A fresh session; ``metadata`` is the sample's dataset columns. Raises OpenFailed."""
        ...
