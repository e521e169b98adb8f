"""The ``training.agents`` block: agents as rollout workers over ``grpo.agent.v1.AgentService``.

For each prompt row and each of its G samples the trainer opens a session of the rollout service's
OpenAI-compatible gateway, asks the agent at ``target`` to play the row in it, and trains on the session's
recorded tokens (``trainer_service.rollout.agent_episodes``; ``docs/agents.md``, "Bring your own agent").
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from trainer_service.config.fields import StrictModel
from trainer_service.config.rollout_targets import parse_target


def _agent_target(text: str) -> str:
    parse_target(text)
    return text


def _gateway_url(text: str) -> str:
    if not re.fullmatch(r"https?://[^/\s?#]+", text):
        raise ValueError(f"{text!r} is not http(s)://HOST:PORT (no path: sessions add /sessions/<id>/v1)")
    return text


class AgentsConfig(StrictModel):
    """Agents that play episodes against the policy through the rollout service's OpenAI-compatible gateway;
    the trainer trains on the tokens the gateway recorded (mask 1 on sampled tokens only)."""

    target: Annotated[str, AfterValidator(_agent_target)] = Field(
        description="The AgentService address: HOST:PORT, or another gRPC target (unix:PATH, inside the "
        "trainer service's socket_roots for a run started over StartRun), dialled as services.* are."
    )
    gateway_url: Annotated[str, AfterValidator(_gateway_url)] = Field(
        description="The rollout service's OpenAI gateway as the agent reaches it, http://HOST:PORT (its "
        "--openai-port); an episode's base URL is this + /sessions/<id>/v1."
    )
    max_concurrent_episodes: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Episodes running at once, over all rows and samples of a batch.",
    )
    episode_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86400,
        description="Deadline of one episode, seconds: RunEpisode's deadline; the gateway session lives a "
        "little longer.",
    )
    max_episode_retries: int = Field(
        default=1,
        ge=0,
        le=10,
        description="A failed episode (agent error, timeout, a reward that is not finite, no model call) is "
        "played again as a new episode up to this many times; then it stays out of the loss and is counted "
        "in agents/failed_episodes.",
    )
    reward_weight: float = Field(
        default=1.0,
        ge=0.0,
        description="Weight of the agent's own reward (RunEpisodeResponse.reward) beside "
        "training.rewards.reward_fn's terms, which score the decoded completion; 0 = not a reward term.",
    )
